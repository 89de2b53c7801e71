"""Starting the real `sluice serve` for the Python tests: on free loopback
ports, over a data dir of its own, stderr to a log file (a pipe nobody
reads could fill and stall the server)."""

import os
import re
import subprocess
import urllib.request

SLUICE = os.environ["SLUICE_BIN"]


def serve_env(d, **extra):
    """The environment of a server whose data dir is under `d` (no token
    unless `extra` gives one)."""
    env = dict(os.environ, SLUICE_DATA_DIR=os.path.join(d, "data"),
               SLUICE_DEVICE_SIZE="256MiB", SLUICE_CHUNK_SIZE="1MiB")
    env.pop("SLUICE_TOKEN", None)
    env.update(extra)
    return env


def start_serve(d, env, args=(), bin=SLUICE):
    """`sluice serve` (the binary `bin`) with `d` as its ingest root (and
    `args`): (process, REST URL)."""
    log = open(os.path.join(d, "serve.log"), "a")
    proc = subprocess.Popen(
        [bin, "serve", "--rest", "127.0.0.1:0", "--flight", "127.0.0.1:0", "--ingest-root", d,
         *args],
        env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    log.close()
    rest = None
    for _ in range(2):
        line = proc.stdout.readline()
        if line.startswith("REST API on "):
            rest = line.split()[3]
    assert rest, open(os.path.join(d, "serve.log")).read()
    return proc, rest


def metric(url, name):
    """The value of the unlabelled metric `name` in the server's /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))
