"""Shared-memory delivery to a trainer on the server's host: the same bytes
as Flight; chosen by itself and forced either way; a trainer killed
mid-read gives the server's segment back; a trainer that keeps every batch
slows the stream down (Flight takes over) without growing the server; a
trainer's next stream reuses the segment it still maps, which both sides
let go of once the server stops keeping it; and DataLoader workers read
every sample once through it."""

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import sluice
from sluice import _shm
from serve import SLUICE, metric, sample_server

if not os.access("/dev/shm", os.W_OK):
    pytest.skip("no writable /dev/shm on this machine: shared-memory delivery cannot be used "
                "here (readers fall back to Flight)", allow_module_level=True)

SQL = ("SELECT key, label, to_tensor(random_resized_crop(decode_image(data), 32, 32)) AS image "
       "FROM pets")


@pytest.fixture(scope="module")
def server():
    with sample_server(3, 40) as (proc, c, _, _):
        job = c.submit(SQL, batch_size=8, epochs=2, shuffle={"seed": 5}, on_error="null")
        job.wait()
        yield proc, c, job


def segments_of(pid):
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"sluice-seg-{pid}-")]


def test_shm_and_flight_deliver_the_same_bytes(server):
    _, c, job = server
    before = job.status()["bytes"]
    r_shm = job.reader(0, 1, transport="auto")
    shm = pa.Table.from_batches(list(r_shm.batches()))
    mid = job.status()["bytes"]
    r_flight = job.reader(0, 1, transport="flight")
    fl = pa.Table.from_batches(list(r_flight.batches()))
    after = job.status()["bytes"]
    assert r_shm.transport_used == "shm"
    assert r_flight.transport_used == "flight"
    assert shm.num_rows == 120
    assert shm.equals(fl)
    # Job status tells which way the bytes went.
    assert mid["shm"] > before["shm"]
    assert after["shm"] == mid["shm"]
    assert after["trainer"] > mid["trainer"]


NORMALIZED = ("SELECT key, normalize(resize(decode_image(data), 20, 16), [0.485, 0.456, 0.406], "
              "[0.229, 0.224, 0.225]) AS image FROM pets")


def test_a_normalize_written_into_the_slot_is_the_query_s_normalize(server):
    """A job's last stage, normalize, runs as its rows are written out (into
    the slot, or into the Flight message): the bytes are those of the same
    SQL run as a query, where normalize is a stage of the plan."""
    proc, c, _ = server
    job = c.submit(NORMALIZED, batch_size=7, epochs=1)
    job.wait()
    r_shm = job.reader(0, 0, transport="shm")
    shm = pa.Table.from_batches(list(r_shm.batches()))
    fl = pa.Table.from_batches(list(job.reader(0, 0, transport="flight").batches()))
    assert r_shm.transport_used == "shm"
    assert shm.num_rows == 120
    assert shm.equals(fl)
    assert isinstance(shm.schema.field("image").type, pa.FixedShapeTensorType)
    out = subprocess.run([SLUICE, "sql", "--connect",
                          c.flight_address(), "--format", "arrow", NORMALIZED + " ORDER BY key"],
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    want = pa.ipc.open_stream(out.stdout).read_all()
    got = shm.sort_by("key")
    assert got.schema.equals(want.schema)
    assert got.column("key").equals(want.column("key"))
    assert got.column("image").equals(want.column("image"))


def test_forcing_shm_without_the_host_says_why(server):
    _, c, job = server
    ticket = {"type": "job", "job": job.id, "transport": "shm",
              "probe": {"name": "sluice-probe-nowhere-0", "nonce": "abc"}}
    with pytest.raises(pa.ArrowException, match="not on this host"):
        c.flight().do_get(flight.Ticket(json.dumps(ticket).encode()), c.call_options()).read_all()
    ticket = {"type": "job", "job": job.id, "transport": "shm"}
    with pytest.raises(pa.ArrowException, match="needs the trainer's probe"):
        c.flight().do_get(flight.Ticket(json.dumps(ticket).encode()), c.call_options()).read_all()
    # Forced and possible: shared memory.
    r = job.reader(0, 0, transport="shm")
    assert sum(b.num_rows for b in r.batches()) == 120
    assert r.transport_used == "shm"


def test_a_killed_trainer_gives_the_segment_back(server):
    proc, c, job = server
    code = (
        "import os, signal, sys, sluice\n"
        f"job = sluice.Client({c.url!r}).job({job.id!r})\n"
        "r = job.reader(0, 0, transport='shm', prefetch=0)\n"
        "it = iter(r.batches())\n"
        "b = next(it)\n"
        "print(r.transport_used, b.num_rows, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert child.stdout.split() == ["shm", "8"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if metric(c.url, "sluice_shm_mapped_bytes") == 0 and not segments_of(proc.pid):
            break
        time.sleep(0.2)
    assert metric(c.url, "sluice_shm_mapped_bytes") == 0
    assert segments_of(proc.pid) == []


def test_a_trainer_that_keeps_every_batch_slows_the_stream_without_growing_it(server):
    _, c, job = server
    before = job.status()["bytes"]
    r = job.reader(0, 0, transport="shm")
    held = []
    peak = 0.0
    for b in r.batches():
        held.append(b)  # never released: every slot stays taken
        peak = max(peak, metric(c.url, "sluice_shm_mapped_bytes"))
    after = job.status()["bytes"]
    assert sum(b.num_rows for b in held) == 120
    # The segment's slots went first, then Flight carried the rest.
    assert after["shm"] > before["shm"]
    assert after["trainer"] > before["trainer"]
    assert 0 < peak <= 256 << 20
    # The held batches are intact (no slot was rewritten under them).
    again = pa.Table.from_batches(list(job.reader(0, 0, transport="flight").batches()))
    assert pa.Table.from_batches(held).equals(again)


def test_a_trainers_next_stream_reuses_its_segment_until_the_server_lets_go(server):
    proc, c, job = server
    flight_bytes = pa.Table.from_batches(list(job.reader(0, 1, transport="flight").batches()))
    paths, tables = [], []
    for _ in range(3):
        r = job.reader(0, 1, transport="shm", prefetch=0)
        tables.append(pa.Table.from_batches(list(r.batches())))
        assert r.transport_used == "shm"
        paths.append(list(_shm.held()))
    # One segment carried all three streams, on both sides, with the same
    # bytes as Flight.
    assert len(paths[0]) >= 1 and paths[0] == paths[1] == paths[2], paths
    assert all(t.equals(flight_bytes) for t in tables)
    path = paths[0][-1]  # the one used last
    assert path.startswith(f"/dev/shm/sluice-seg-{proc.pid}-")
    assert metric(c.url, "sluice_shm_mapped_bytes") > 0
    # Not asked for again, the server drops it after a while and marks it
    # retired; the trainer lets go of its mapping at its next ticket.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and metric(c.url, "sluice_shm_mapped_bytes") > 0:
        time.sleep(0.5)
    assert metric(c.url, "sluice_shm_mapped_bytes") == 0
    assert path not in _shm.held()


def test_dataloader_workers_read_every_sample_once_through_shm(server):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    _, c, job = server
    before = job.status()["bytes"]["shm"]
    for workers in (0, 2):
        ds = sluice.torch.Dataset(job)
        ds.set_epoch(1)
        keys = []
        for b in DataLoader(ds, batch_size=None, num_workers=workers):
            assert isinstance(b["image"], torch.Tensor)
            keys.extend(b["key"])
        assert len(keys) == 120 and len(set(keys)) == 120, workers
    assert job.status()["bytes"]["shm"] > before


def test_a_slot_overwritten_is_an_exception_not_a_crash(tmp_path):
    """A slot whose batch was overwritten (offsets past the values) raises
    in Python; pyarrow never reads out of bounds."""
    keys = pa.array([f"key-{i:04d}" for i in range(64)])
    batch = pa.record_batch([keys], names=["key"])
    message = batch.serialize().to_pybytes()
    offsets = (pa.array(range(0, 8 * 65, 8), pa.int32())).buffers()[1].to_pybytes()
    at = message.find(offsets)
    assert at > 0
    bad = bytearray(message)
    bad[at + 4 * 10: at + 4 * 11] = (1 << 30).to_bytes(4, "little")
    slot_bytes = 1 << 16
    path = tmp_path / "segment"
    image = bytearray(_shm.HEADER + 2 * slot_bytes)
    image[:8] = _shm.MAGIC
    image[_shm.HEADER:_shm.HEADER + len(message)] = message
    image[_shm.HEADER + slot_bytes:_shm.HEADER + slot_bytes + len(bad)] = bad
    path.write_bytes(bytes(image))
    seg = _shm.Segment({"path": str(path), "size": len(image), "slots": 2,
                        "slot_bytes": slot_bytes})
    assert seg.batch(0, len(message), batch.schema).equals(batch)
    with pytest.raises(ValueError, match="slot 1"):
        seg.batch(1, len(bad), batch.schema)
    with pytest.raises(ValueError, match="slot 0"):
        seg.batch(0, 40, batch.schema)


def test_a_killed_trainers_probe_is_swept_by_the_next_process():
    # A process killed between making its probe and its server's answer
    # leaves the file; the next process's first probe removes it (its pid
    # is gone), and leaves a live process's probe alone.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = f"/dev/shm/sluice-probe-{dead.pid}-0123456789abcdef"
    live = f"/dev/shm/sluice-probe-{os.getpid()}-fedcba9876543210"
    for path in (stale, live):
        with open(path, "w") as f:
            f.write("nonce")
    try:
        subprocess.run([sys.executable, "-c", "from sluice import _shm; _shm.Probe().remove()"],
                       check=True)
        assert not os.path.exists(stale)
        assert os.path.exists(live)
    finally:
        for path in (stale, live):
            if os.path.exists(path):
                os.unlink(path)
