"""sluice under real PyTorch: `import sluice` alone gives `sluice.torch`; a
DataLoader with workers reads every sample once, also when the parent used
Flight before the workers forked; ranks come from an initialised
torch.distributed (gloo, two processes); set_epoch; and a saved
state_dict resumes exactly where it stopped."""

import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader

import sluice
from serve import sample_server

SQL = ("SELECT key, label, to_tensor(resize(decode_image(data), 16, 16)) AS image "
       "FROM pets")


@pytest.fixture(scope="module")
def job_server():
    with sample_server(3, 30) as (_, c, _, _):
        yield c


def keys(loader):
    out = []
    for b in loader:
        assert isinstance(b["image"], torch.Tensor) and b["image"].dtype == torch.uint8
        assert b["image"].shape[1:] == (16, 16, 3), b["image"].shape
        out.extend(b["key"])
    return out


def test_import_sluice_is_enough():
    code = "import sluice; print(sluice.torch.Dataset.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "Dataset", out.stderr


def test_workers_read_every_sample_once_even_after_the_parent_used_flight(job_server):
    job = job_server.submit(SQL, batch_size=8, epochs=2, shuffle={"seed": 3})
    job.wait()
    # The parent reads over gRPC first: forked workers must not hang.
    whole = [k for b in job.reader(0, 0, numpy=True) for k in b["key"]]
    assert len(whole) == 90
    for workers in [0, 2, 3]:
        loader = DataLoader(sluice.torch.Dataset(job), batch_size=None, num_workers=workers,
                            timeout=120 if workers else 0)
        got = keys(loader)
        # Workers take the rank's batches in turn: the epoch's order.
        assert got == whole, workers


def test_worker_batches_are_the_same_bytes_whether_held_or_dropped(job_server):
    """Workers hand batches over in a shared-memory ring of 4 slots here:
    a trainer that keeps every batch (more than the slots) and one that
    drops each at once see the same tensors as a plain reader."""
    job = job_server.submit(SQL, batch_size=4, shuffle={"seed": 5})
    job.wait()
    want = {}
    for b in job.reader(0, 0, numpy=True):
        for k, img in zip(b["key"], b["image"]):
            want[k] = img.copy()
    ds = sluice.torch.Dataset(job, shm_slots=4)
    held = list(DataLoader(ds, batch_size=None, num_workers=2, timeout=120))
    for b in held:
        for k, img in zip(b["key"], b["image"]):
            assert (img.numpy() == want[k]).all(), k
    assert sum(len(b["key"]) for b in held) == len(want)
    seen = 0
    for b in DataLoader(ds, batch_size=None, num_workers=2, timeout=120):
        for k, img in zip(b["key"], b["image"]):
            assert (img.numpy() == want[k]).all(), k
            seen += 1
        del b
    assert seen == len(want)


def test_set_epoch_changes_the_order_not_the_samples(job_server):
    job = job_server.submit(SQL, batch_size=8, epochs=2, shuffle={"seed": 3})
    ds = sluice.torch.Dataset(job)
    e0 = keys(DataLoader(ds, batch_size=None))
    ds.set_epoch(1)
    e1 = keys(DataLoader(ds, batch_size=None))
    assert sorted(e0) == sorted(e1) and e0 != e1
    # Persistent workers keep their copy of the dataset: they still see it.
    ds = sluice.torch.Dataset(job)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True, timeout=120)
    p0 = keys(loader)
    ds.set_epoch(1)
    p1 = keys(loader)
    assert sorted(p0) == sorted(e0) and sorted(p1) == sorted(e1)
    assert p0 != p1


def test_state_dict_resumes_where_it_stopped(job_server):
    job = job_server.submit(SQL, batch_size=8, epochs=1, shuffle={"seed": 9})
    whole = keys(DataLoader(sluice.torch.Dataset(job), batch_size=None))
    ds = sluice.torch.Dataset(job)
    seen = []
    for i, b in enumerate(DataLoader(ds, batch_size=None)):
        seen.extend(b["key"])
        if i == 4:
            break
    state = ds.state_dict()
    assert state["epoch"] == 0 and state["offset"] == 40 and state["position"] == 40
    fresh = sluice.torch.Dataset(job)
    fresh.load_state_dict(state)
    rest = keys(DataLoader(fresh, batch_size=None))
    assert seen + rest == whole


RANK = """
import os, sys, json
import torch.distributed as dist
import sluice
dist.init_process_group("gloo", init_method=sys.argv[2], rank=int(sys.argv[3]), world_size=2)
job = sluice.Client(sys.argv[1]).job(sys.argv[4])
keys = [k for b in sluice.torch.Dataset(job) for k in b["key"]]
print(json.dumps({"rank": dist.get_rank(), "keys": keys}))
dist.destroy_process_group()
"""


def test_ranks_come_from_torch_distributed(job_server):
    job = job_server.submit(SQL, batch_size=5, world_size=2, shuffle={"seed": 1})
    job.wait()
    import json
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen([sys.executable, "-c", RANK, job_server.url, init, str(r), job.id],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    by_rank = {o["rank"]: o["keys"] for o in outs}
    assert set(by_rank) == {0, 1}
    for r in (0, 1):
        assert by_rank[r] == [k for b in job.reader(r, 0, numpy=True) for k in b["key"]]
    assert not set(by_rank[0]) & set(by_rank[1])
    assert len(by_rank[0]) + len(by_rank[1]) == 90
