"""Starting the real `sluice serve` for the Python tests: on free loopback
ports, over a data dir of its own, stderr to a log file (a pipe nobody
reads could fill and stall the server)."""

import contextlib
import os
import re
import tempfile
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


def generate(d, env, name, classes, per_class):
    """`sluice gen-sample`'s ImageFolder under `d/name`; returns its path."""
    src = os.path.join(d, name)
    subprocess.run([SLUICE, "gen-sample", src, "--classes", str(classes),
                    "--per-class", str(per_class)], env=env, check=True, capture_output=True)
    return src


@contextlib.contextmanager
def sample_server(classes, per_class, args=()):
    """A `sluice serve` (with `args`) over a temp dir, holding `pets`: a
    generated ImageFolder of `classes` x `per_class` images. Yields
    (process, sluice.Client, the temp dir, the server's environment);
    the server must stop cleanly."""
    import sluice

    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d)
        src = generate(d, env, "pets", classes, per_class)
        proc, rest = start_serve(d, env, args)
        try:
            c = sluice.Client(rest)
            c.ingest("pets", src)
            yield proc, c, d, env
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0


@contextlib.contextmanager
def serving(d, env, kill=False):
    """`sluice serve` over `d` (see `start_serve`): yields a
    sluice.Client; stopped cleanly after, or killed (SIGKILL) if `kill`."""
    import signal

    import sluice

    proc, rest = start_serve(d, env)
    try:
        yield sluice.Client(rest)
    finally:
        if kill:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        else:
            proc.terminate()
            assert proc.wait(timeout=30) == 0


def vm_hwm_mib(pid):
    """Peak resident memory of process `pid` (since start, or since
    `reset_hwm`), in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def reset_hwm(pid):
    """Starts a new peak: VmHWM reads the resident memory from now on."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def node_pieces(url, token=None):
    """The pieces of the cluster's checkpoints a storage node at `url`
    holds, asked of it directly (presenting `token`): {name: size}."""
    import json

    import pyarrow.flight as flight

    c = flight.FlightClient(url.replace("http://", "grpc://"))
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    try:
        body = json.dumps({"prefix": ".stripes/"}).encode()
        [reply] = list(c.do_action(flight.Action("checkpoint.list", body),
                                   flight.FlightCallOptions(headers=headers)))
        return {v["name"]: v["size"] for v in json.loads(reply.body.to_pybytes())}
    finally:
        c.close()


def flip_in_device(device, needle):
    """Flips the last byte of the first copy of `needle` in the device file
    `device` (a node's objects are packed from its start as ingested; the
    file is read a few MiB at a time until the copy is found)."""
    with open(device, "r+b") as f:
        seen, at = b"", -1
        while at < 0:
            more = f.read(4 << 20)
            assert more, f"the object is not in {device}"
            base = max(0, len(seen) - len(needle))
            seen = seen[base:] + more
            found = seen.find(needle)
            at = -1 if found < 0 else f.tell() - len(seen) + found
        f.seek(at + len(needle) - 1)
        last = f.read(1)
        f.seek(at + len(needle) - 1)
        f.write(bytes([last[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())
