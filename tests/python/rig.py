"""The multi-host rig (`scripts/rig.sh`) for the Python tests: each test
that needs it takes the `rig` fixture-maker, which skips the test with the
rig's own message where the kernel refuses network namespaces (or the
tests do not run as root), and always tears the rig down."""

import os
import subprocess

import pytest

from serve import SLUICE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "rig.sh")


def rig_cmd(*args, rig_dir, check=True, extra_env=None):
    """Runs `rig.sh ARGS` against the rig in `rig_dir`; the processes it
    starts see `extra_env` too."""
    env = dict(os.environ, SLUICE_RIG_DIR=rig_dir, SLUICE_BIN=SLUICE, **(extra_env or {}))
    p = subprocess.run(["bash", SCRIPT, *args], env=env, capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"rig.sh {' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return p


def parse_env(stdout):
    """The KEY=value lines `rig.sh up` prints last."""
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


def up(rig_dir, *args, extra_env=None):
    """Starts a rig (its processes seeing `extra_env`), or skips the test
    where this machine cannot run one."""
    if os.geteuid() != 0:
        pytest.skip("the rig needs root (network namespaces, veth, tc)")
    p = rig_cmd("up", *args, rig_dir=rig_dir, check=False, extra_env=extra_env)
    if p.returncode == 3:
        pytest.skip(p.stderr.strip())
    if p.returncode != 0:
        rig_cmd("down", rig_dir=rig_dir, check=False)
        raise AssertionError(f"rig.sh up failed ({p.returncode}): {p.stderr}")
    return parse_env(p.stdout)


def compute_nodes(client, n, within=30):
    """Waits until `n` compute nodes registered with the coordinator that
    `client` speaks to; their locations."""
    import time

    deadline = time.monotonic() + within
    while True:
        live = {node["location"] for node in client._request("GET", "/v1/nodes")["compute"]}
        if len(live) >= n:
            return live
        assert time.monotonic() < deadline, f"{len(live)} of {n} compute nodes registered"
        time.sleep(0.5)


def ours():
    """This rig's namespaces in `ip netns list`."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith("slrig-")]
