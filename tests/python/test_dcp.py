"""`torch.distributed.checkpoint` through `sluice.dcp` with real torch:
ranks on gloo (CPU) in their own processes against a real `sluice serve`.

- a save from 2 ranks loads on 1 and on 4 ranks (resharding), equal to the
  original state dict;
- `async_save` returns before its bytes have left, and a training step
  runs while they do;
- a save killed -9 half-way leaves the previous step loadable and nothing
  of its own listed;
- files larger than the reader's window load through it, whole tensors
  straight into their targets and the rest (a non-contiguous target) by
  a copy, equal to the original.
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import torch

import sluice
from serve import serve_env, start_serve

sys.path.insert(0, os.path.dirname(__file__))
from dcp_rank import original  # noqa: E402

RANK = os.path.join(os.path.dirname(__file__), "dcp_rank.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks(world, *args, wait=True):
    """`world` processes of dcp_rank.py with `args`; their exit codes (or
    the processes, with `wait=False`)."""
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, RANK, *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    if not wait:
        return procs
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"rank exited {p.returncode}:\n{out}\n{err[-3000:]}"
    return outs


@pytest.fixture(scope="module")
def server():
    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d, SLUICE_DEVICE_SIZE="2GiB")
        proc, rest = start_serve(d, env, ["--checkpoint-idle-timeout", "2"])
        try:
            yield d, rest
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0


def assert_original(path):
    got = torch.load(path, weights_only=True)
    want = original()
    assert set(got) == set(want)
    for k, v in want.items():
        if torch.is_tensor(v):
            assert got[k].dtype == v.dtype, k
            assert torch.equal(got[k], v), k
        else:
            assert got[k] == v, k


def test_a_save_on_2_ranks_loads_on_1_and_on_4(server):
    d, rest = server
    ranks(2, "save", rest, "step-1", "-")
    ck = sluice.Checkpoint(sluice.Client(rest), "dcp")
    files = sorted(n for n in ck.list() if n.startswith("step-1/"))
    assert files == ["step-1/.metadata", "step-1/__0.distcp", "step-1/__1.distcp"]
    versions = ck.list(versions=True)
    # One transaction: one commit time for the whole save.
    assert len({v["created_unix_ms"] for v in versions if v["name"].startswith("dcp/step-1/")}) == 1
    for world in (1, 4):
        out = os.path.join(d, f"loaded-{world}.pt")
        ranks(world, "load", rest, "step-1", out)
        assert_original(out)


def test_async_save_overlaps_a_training_step(server):
    d, rest = server
    out = os.path.join(d, "async.txt")
    ranks(2, "async", rest, "step-2", out)
    steps, _ = open(out).read().split()
    # The loop ran while the save's bytes left (it polls the future).
    assert int(steps) >= 1
    loaded = os.path.join(d, "loaded-async.pt")
    ranks(1, "load", rest, "step-2", loaded)
    assert_original(loaded)


def test_a_save_killed_half_way_leaves_the_previous_step(server):
    d, rest = server
    ranks(2, "save", rest, "step-3", "-")
    client = sluice.Client(rest)
    procs = ranks(2, "killed", rest, "step-4", "-", wait=False)
    try:
        assert procs[0].stdout.readline().strip() == "saving"
        # Kill both once uploads are being written.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            metrics = client._request("GET", "/metrics")
            up = [line for line in metrics.splitlines()
                  if line.startswith("sluice_checkpoint_uploads ")]
            if up and float(up[0].split()[1]) >= 1:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the save never began an upload")
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
    ck = sluice.Checkpoint(client, "dcp")
    assert not [n for n in ck.list() if n.startswith("step-4/")]
    out = os.path.join(d, "loaded-3.pt")
    ranks(1, "load", rest, "step-3", out)
    assert_original(out)
    for p in procs:
        assert not [f for f in os.listdir("/dev/shm") if f.startswith("sluice-") and
                    f.split("-")[2] == str(p.pid)]


def test_files_larger_than_the_window_load_through_it(server):
    """One process, no process group: a save whose file is several times
    the Checkpoint's `read_window` loads through the window into fresh
    targets, one of them a transposed (non-contiguous) view, equal to
    what was saved; the window is the one region kept."""
    import torch.distributed.checkpoint as dcp
    from sluice.dcp import SluiceReader, SluiceWriter

    _, rest = server
    ck = sluice.Checkpoint(sluice.Client(rest), "dcpwin", chunk_size=1 << 20, workers=2,
                           read_window=2 << 20, transport="shm")
    g = torch.Generator().manual_seed(77)
    state = {"a": torch.randn(1000, 1500, generator=g), "b": torch.randn(300, 513, generator=g),
             "c": torch.arange(1000, dtype=torch.int16), "d": torch.randn(3, generator=g),
             "step": 9}
    dcp.save(state, storage_writer=SluiceWriter(ck), checkpoint_id="w1")
    assert ck.stat("w1/__0.distcp")["size"] > 2 * (2 << 20)
    target = {"a": torch.zeros(1000, 1500), "b": torch.zeros(513, 300).T,
              "c": torch.zeros(1000, dtype=torch.int16), "d": torch.zeros(3), "step": 0}
    assert not target["b"].is_contiguous()
    dcp.load(target, storage_reader=SluiceReader(ck), checkpoint_id="w1")
    for k, v in state.items():
        if torch.is_tensor(v):
            assert torch.equal(target[k], v), k
        else:
            assert target[k] == v, k
    # The window, kept; no region the size of the file.
    assert max(r.size for r in ck._idle_gets) == 2 << 20
    ck.close()
