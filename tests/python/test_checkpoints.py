"""Checkpoints through the real `sluice serve`: round trips of many sizes
(up to past 2 GiB) over shared memory and over Flight, the two giving the
same bytes, a version larger than the reader's window streamed through
it, concurrent writers, a writer and the server killed -9
mid-stream (nothing partial listed, nothing left in /dev/shm), a flipped
byte on the device, auth, REST and the CLI, and torch.save / torch.load
of a real model bit-identical (also with its tensors over the mapping)."""

import gc
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import sluice
from serve import SLUICE, serve_env, start_serve

CHUNK = 1 << 20  # the test server's chunk size (serve_env)


def pattern(n, seed):
    """`n` bytes that differ at every position and between seeds."""
    block = bytes((seed * 31 + i * 7) % 251 for i in range(251))
    return (block * (n // 251 + 1))[:n]


@pytest.fixture(scope="module")
def server():
    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d, SLUICE_DEVICE_SIZE="6GiB", SLUICE_TOKEN="s3cret")
        proc, rest = start_serve(d, env, ["--checkpoint-idle-timeout", "1"])
        try:
            yield d, env, rest
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0


def shm_files(pid):
    """Files a process `pid` has in /dev/shm (sluice's segments, regions
    and probes are named with their maker's pid)."""
    return [f for f in os.listdir("/dev/shm") if f.startswith("sluice-") and
            f.split("-")[2] == str(pid)]


@pytest.mark.parametrize("transport", ["shm", "flight"])
def test_round_trips_of_every_size(server, transport):
    _, _, rest = server
    ck = sluice.Checkpoint(sluice.Client(rest, token="s3cret"), f"sizes-{transport}",
                           chunk_size=3 * CHUNK, workers=3, transport=transport)
    for n in [0, 1, CHUNK - 1, CHUNK, 3 * CHUNK, 3 * CHUNK + 1, 10 * CHUNK + 12345]:
        data = pattern(n, n % 97)
        with ck.writer(f"f{n}.bin") as w:
            assert w.transport == transport
            # Odd-sized writes, as torch.save makes them.
            for lo in range(0, n, 777_777):
                w.write(data[lo:lo + 777_777])
        assert w.info["size"] == n
        with ck.reader(f"f{n}.bin") as r:
            assert r.transport == transport
            assert r.size == n
            assert r.read() == data, n
            r.seek(n // 2)
            assert r.read(10) == data[n // 2:n // 2 + 10]
            assert bytes(r.view()) == data
    assert sorted(ck.list()) == sorted(f"f{n}.bin" for n in
                                       [0, 1, CHUNK - 1, CHUNK, 3 * CHUNK, 3 * CHUNK + 1,
                                        10 * CHUNK + 12345])
    ck.close()
    assert not shm_files(os.getpid())


def test_shared_memory_and_flight_give_the_same_checkpoint(server):
    """Written through one transport, read through the other: the same
    bytes, the same checksummed extents on the server."""
    _, _, rest = server
    client = sluice.Client(rest, token="s3cret")
    shm = sluice.Checkpoint(client, "cross", chunk_size=2 * CHUNK, transport="shm")
    fl = sluice.Checkpoint(client, "cross", chunk_size=2 * CHUNK, transport="flight")
    data = pattern(9 * CHUNK + 4321, 11)
    for writer, reader, name in [(shm, fl, "a.bin"), (fl, shm, "b.bin")]:
        with writer.writer(name) as w:
            w.write(data)
        with reader.reader(name) as r:
            assert r.transport == reader.transport
            assert r.read() == data
    assert shm.stat("a.bin")["size"] == fl.stat("b.bin")["size"] == len(data)
    # A region is the writer's lanes: the next save reuses it...
    kept = shm._put_slots.region.id
    with shm.writer("c.bin") as w:
        w.write(data[:CHUNK])
    assert shm._put_slots.region.id == kept
    # ... unless the server let it go (idle past its timeout, 1 s here).
    time.sleep(2.5)
    with shm.writer("d.bin") as w:
        w.write(data)
    assert w.transport == "shm"
    assert shm._put_slots.region.id != kept
    with fl.reader("d.bin") as r:
        assert r.read() == data
    shm.close()
    fl.close()


def test_a_readers_region_is_kept_for_the_next_read(server):
    """A reader that copied its bytes out leaves its region to the
    Checkpoint: the next version that fits is read into it (the same
    region, its pages in place; one request when it is small), never
    while a view of it lives, never once mapped by torch, never after the
    server let it go; and what is read is always the version's own."""
    _, _, rest = server
    client = sluice.Client(rest, token="s3cret")
    ck = sluice.Checkpoint(client, "keptreads", chunk_size=2 * CHUNK, transport="shm")
    files = {"big.bin": pattern(5 * CHUNK + 17, 1), "small.bin": pattern(CHUNK // 3, 2),
             "other.bin": pattern(5 * CHUNK + 17, 3)}
    for name, data in files.items():
        with ck.writer(name) as w:
            w.write(data)
    with ck.reader("big.bin") as r:
        assert r.read() == files["big.bin"]
    [kept] = [g.id for g in ck._idle_gets]
    with ck.reader("small.bin") as r:
        # get_open read it whole: no range is fetched after.
        assert all(f.done() for f in r._futures.values())
        assert r.region_size == 5 * CHUNK + 17 and r.size == CHUNK // 3
        assert r.read() == files["small.bin"]
        assert bytes(r.view()) == files["small.bin"]
    assert [g.id for g in ck._idle_gets] == [kept]
    # A view that outlives its reader keeps the region from the next read.
    with ck.reader("other.bin") as r:
        view = r.slice(CHUNK, 2 * CHUNK)
    assert ck._idle_gets == []
    with ck.reader("big.bin") as r:
        assert r.read() == files["big.bin"]
    assert bytes(view) == files["other.bin"][CHUNK:3 * CHUNK]
    del view
    # Tensors over a mapped region: that region is never read into again.
    torch.manual_seed(5)
    state = {f"w{i}": torch.randn(1 << 19) for i in range(5)}  # 10 MiB
    with ck.writer("model.pt") as w:
        torch.save(state, w)
    kept_before = [g.id for g in ck._idle_gets]
    loaded = ck.load("model.pt", weights_only=True)
    # It mapped a region of its own: the kept ones are still there.
    assert [g.id for g in ck._idle_gets] == kept_before != []
    for name, data in files.items():
        with ck.reader(name) as r:
            assert r.read() == data
    for k in state:
        assert torch.equal(loaded[k], state[k]), k
    # The server lets idle regions go (after 1 s here): the next read
    # gets a new one, and the client lets the old go too.
    before = {g.id for g in ck._idle_gets}
    assert before
    time.sleep(2.5)
    with ck.reader("small.bin") as r:
        assert r.read() == files["small.bin"]
    assert not before & {g.id for g in ck._idle_gets}
    ck.close()
    assert ck._idle_gets == []
    assert not shm_files(os.getpid())


def test_a_kept_read_region_goes_back_when_unused(server):
    """A trainer that loads once holds no region for long: a kept read
    region is let go, on both sides, `keep_read_seconds` after its last
    read, with no call from the trainer."""
    _, _, rest = server
    client = sluice.Client(rest, token="s3cret")
    ck = sluice.Checkpoint(client, "keptidle", chunk_size=2 * CHUNK, transport="shm",
                           keep_read_seconds=0.5)
    data = pattern(3 * CHUNK + 5, 4)
    with ck.writer("a.bin") as w:
        w.write(data)
    with ck.reader("a.bin") as r:
        assert r.read() == data
    [kept] = [g.id for g in ck._idle_gets]
    # Read again before it expires: the same region, its clock restarted.
    time.sleep(0.3)
    with ck.reader("a.bin") as r:
        assert r.read() == data
    assert [g.id for g in ck._idle_gets] == [kept]
    time.sleep(0.3)
    assert [g.id for g in ck._idle_gets] == [kept]
    deadline = time.monotonic() + 5
    while ck._idle_gets and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ck._idle_gets == []
    # Let go here (and closed on the server): the next read gets a new one.
    with ck.reader("a.bin") as r:
        assert r.read() == data
    assert [g.id for g in ck._idle_gets] != [kept]
    ck.close()
    assert not shm_files(os.getpid())


def test_a_version_larger_than_the_window_streams_through_it(server):
    """A version larger than `read_window` is read through a region of
    the window's size: sequential reads, seeks back and to the end,
    reads at an offset and copies of a slice all give the version's own
    bytes, and torch.load of a model through it is bit-identical; the
    window is kept for the next read and nothing is left in /dev/shm."""
    _, _, rest = server
    client = sluice.Client(rest, token="s3cret")
    before = regions(client)
    ck = sluice.Checkpoint(client, "windowed", chunk_size=CHUNK, workers=2,
                           read_window=3 * CHUNK, transport="shm")
    data = pattern(11 * CHUNK + 333, 7)
    with ck.writer("w.bin") as w:
        w.write(data)
    with ck.reader("w.bin") as r:
        assert r.windowed and r.region_size == 3 * CHUNK and r.size == len(data)
        assert r.mapped_path() is None
        # In pieces that straddle ranges, as torch.load reads them.
        got = bytearray()
        while True:
            piece = r.read(777_777)
            if not piece:
                break
            got += piece
        assert got == data
        # Back to the start, to the end, and about, at odd places.
        for lo in [0, len(data) - 5, 5 * CHUNK - 3, CHUNK + 1, 10 * CHUNK, 17]:
            r.seek(lo)
            assert r.read(2 * CHUNK + 11) == data[lo:lo + 2 * CHUNK + 11], lo
        out = bytearray(4 * CHUNK)
        assert r.readinto_at(6 * CHUNK + 9, out) == 4 * CHUNK
        assert out == data[6 * CHUNK + 9:10 * CHUNK + 9]
        # A slice is a copy through a window (its slots are reused).
        assert bytes(r.slice(2 * CHUNK - 1, 3 * CHUNK)) == data[2 * CHUNK - 1:5 * CHUNK - 1]
    [kept] = ck._idle_gets
    assert kept.size == 3 * CHUNK

    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(700, 900), torch.nn.Linear(900, 300))
    want = model.state_dict()
    with ck.writer("model.pt") as w:
        torch.save(want, w)
    assert w.info["size"] > 3 * CHUNK
    with ck.reader("model.pt") as r:
        assert r.windowed
        got = torch.load(r, weights_only=True)
    for k, v in want.items():
        assert torch.equal(got[k], v), k
    # The same window, read into again.
    assert [g.id for g in ck._idle_gets] == [kept.id]
    # read_window=0: a region the version's size, as before.
    whole = sluice.Checkpoint(client, "windowed", chunk_size=CHUNK, read_window=0,
                              transport="shm")
    with whole.reader("w.bin") as r:
        assert not r.windowed and r.region_size == len(data)
        assert bytes(r.view()) == data
    with pytest.raises(ValueError, match="read_window"):
        sluice.Checkpoint(client, "windowed", chunk_size=CHUNK, read_window=CHUNK)
    whole.close()
    ck.close()
    assert not shm_files(os.getpid())
    assert regions(client) == before


def test_a_client_that_is_not_on_the_host_gets_flight(server):
    """A probe the server cannot find (another host's /dev/shm) is
    refused with shm_unavailable: `auto` falls back to Flight, `shm`
    says why."""
    _, _, rest = server
    client = sluice.Client(rest, token="s3cret")
    real = sluice._lanes._shm.Probe

    class Elsewhere(real):
        def __init__(self):
            super().__init__()
            self.remove()  # the server looks for it and finds nothing
            self.path = "/nonexistent"

    sluice._lanes._shm.Probe = Elsewhere
    try:
        auto = sluice.Checkpoint(client, "remote", chunk_size=CHUNK)
        with auto.writer("x.bin") as w:
            w.write(pattern(3 * CHUNK, 1))
        assert w.transport == "flight"
        with auto.reader("x.bin") as r:
            assert r.transport == "flight"
            assert r.read() == pattern(3 * CHUNK, 1)
        with pytest.raises(sluice.SluiceError) as e:
            sluice.Checkpoint(client, "remote", transport="shm").reader("x.bin")
        assert e.value.code == "shm_unavailable" and "not on this host" in e.value.message
    finally:
        sluice._lanes._shm.Probe = real


def test_tensors_load_over_the_mapping(server):
    """`Checkpoint.load` on the server's host: torch.load(mmap=True) over
    the region the server read the version into; equal to the model."""
    _, _, rest = server
    ck = sluice.Checkpoint(sluice.Client(rest, token="s3cret"), "mapped")
    torch.manual_seed(3)
    state = {"w": torch.randn(256, 129), "b": torch.arange(7, dtype=torch.int64),
             "h": torch.randn(33).to(torch.bfloat16)}
    with ck.writer("m.pt") as w:
        torch.save(state, w)
    got = ck.load("m.pt", weights_only=True)
    assert set(got) == set(state)
    for k in state:
        assert torch.equal(got[k], state[k]), k
    assert not shm_files(os.getpid())


def test_load_all_reads_a_models_files_into_one_kept_region(server):
    """`Checkpoint.load_all`: many files of a model (small ones and larger
    ones) read into one shared region side by side, equal to what was
    saved, in order; the writers' idle region is let go; tensors over the
    region (copy-on-write) hold it until they are gone, then the next
    load takes it again; a load it cannot map copies out and keeps it at
    once; what a load returned stays intact as others come; old
    versions by number; a bound on kept bytes reads what does not fit
    alone; Flight gives the same; an unknown name fails naming it and
    leaves nothing in /dev/shm."""
    _, _, rest = server
    client = sluice.Client(rest, token="s3cret")
    ck = sluice.Checkpoint(client, "group", chunk_size=CHUNK)
    g = torch.Generator().manual_seed(11)
    states = {f"layer_{i}.pt": {"w": torch.randint(-128, 127, (50_000 + i,), dtype=torch.int8,
                                                   generator=g)} for i in range(8)}
    states["model.pt"] = {"w": torch.randn(3 * CHUNK // 4 + 5, generator=g)}
    states["optimizer.pt"] = {"m": torch.randn(CHUNK // 2, generator=g),
                              "v": torch.randn(CHUNK // 3, generator=g).to(torch.bfloat16)}
    for name, state in states.items():
        with ck.writer(name) as w:
            torch.save(state, w)
    names = list(states)

    def same(got, want):
        assert len(got) == len(want)
        for name, a, b in zip(names, got, want):
            assert set(a) == set(b), name
            for k in b:
                assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), (name, k)

    before = regions(client)
    assert ck._put_slots is not None
    first = ck.load_all(names, weights_only=True)
    same(first, [states[n] for n in names])
    # The load let the writers' idle region go; its own is held by the
    # tensors built over it (copy-on-write): writing one changes only it.
    assert ck._put_slots is None and ck._idle_gets == [] and regions(client) <= before
    first[0]["w"][0] += 1
    assert first[0]["w"][0] == states[names[0]]["w"][0] + 1
    del first
    gc.collect()
    ck._take_returned()
    [kept] = ck._idle_gets
    assert kept.size >= sum(ck.stat(n)["size"] for n in names)
    # Once they are gone the next load of the same shape takes it again.
    with ck.writer("layer_3.pt") as w:
        torch.save({"w": torch.zeros(7, dtype=torch.int8)}, w)
    second = ck.load_all(names, weights_only=True)
    assert ck._idle_gets == []
    assert torch.equal(second[3]["w"], torch.zeros(7, dtype=torch.int8))
    same(second[:3], [states[n] for n in names[:3]])
    # Loads it cannot map (a map_location) copy out, and the region is
    # kept at once; what a load returned stays intact as others come.
    copied = ck.load_all(names, weights_only=True, map_location="cpu")
    assert [r.id for r in ck._idle_gets] != []
    assert torch.equal(copied[3]["w"], second[3]["w"])
    third = ck.load_all(names, weights_only=True, map_location="cpu")
    same(second[4:], [states[n] for n in names[4:]])
    same(copied[4:], [states[n] for n in names[4:]])
    del second, copied, third
    gc.collect()
    ck._take_returned()
    # Two regions: the mapped load's, back now, and the one the copying
    # loads shared while the mapped tensors held the first.
    ids = [r.id for r in ck._idle_gets]
    assert len(ids) == 2 and kept.id in ids
    old = ck.stat("layer_3.pt")["version"] - 1
    third = ck.load_all(names, [old if n == "layer_3.pt" else None for n in names],
                        weights_only=True)
    same(third, [states[n] for n in names])
    # A bound below the large files: they are read alone, the rest together.
    small = sluice.Checkpoint(client, "group", chunk_size=CHUNK, keep_read_bytes=CHUNK)
    same(small.load_all(names, [old if n == "layer_3.pt" else None for n in names],
                        weights_only=True), [states[n] for n in names])
    small.close()
    flight = sluice.Checkpoint(client, "group", chunk_size=CHUNK, transport="flight")
    same(flight.load_all(names, [old if n == "layer_3.pt" else None for n in names],
                         weights_only=True), [states[n] for n in names])
    with pytest.raises(sluice.SluiceError) as e:
        ck.load_all(names + ["nope.pt"], weights_only=True)
    assert "group/nope.pt" in e.value.message
    # torch.save's legacy format loads beside the zip files (not mapped);
    # a file that is no torch file fails with torch's error, naming it.
    with ck.writer("legacy.pt") as w:
        torch.save({"x": torch.arange(10)}, w, _use_new_zipfile_serialization=False)
    with ck.writer("notes.txt") as w:
        w.write(b"not a torch file")
    got = ck.load_all(["model.pt", "legacy.pt"], weights_only=True)
    assert torch.equal(got[1]["x"], torch.arange(10))
    assert torch.equal(got[0]["w"], states["model.pt"]["w"])
    with pytest.raises(Exception) as e:
        ck.load_all(["notes.txt"], weights_only=True)
    if sys.version_info >= (3, 11):
        assert any("group/notes.txt" in n for n in e.value.__notes__), e.value
    ck.close()
    assert not shm_files(os.getpid())


def test_load_maps_a_mid_sized_version_and_streams_a_larger_one(server, monkeypatch):
    """`Checkpoint.load` maps a version from MAPPED_LOAD_MIN bytes (its
    own region, torch.load(mmap=True)) and streams one of MAPPED_LOAD_MAX
    and more through the window (torch.load over the reader); both equal
    the state saved, and nothing is left in /dev/shm."""
    import sluice.checkpoint as checkpoint_mod

    _, _, rest = server
    ck = sluice.Checkpoint(sluice.Client(rest, token="s3cret"), "mapped",
                           chunk_size=1 << 20, read_window=2 << 20, transport="shm")
    monkeypatch.setattr(checkpoint_mod, "MAPPED_LOAD_MIN", 1 << 20)
    monkeypatch.setattr(checkpoint_mod, "MAPPED_LOAD_MAX", 4 << 20)
    torch.manual_seed(4)
    states = {"mid.pt": {"w": torch.randn(400_000)}, "big.pt": {"w": torch.randn(1_500_000)}}
    for name, state in states.items():
        with ck.writer(name) as w:
            torch.save(state, w)
    mapped = []
    real = torch.load

    def spy(f, *a, **k):
        mapped.append(isinstance(f, str))
        return real(f, *a, **k)

    monkeypatch.setattr(torch, "load", spy)
    for name, state in states.items():
        got = ck.load(name, weights_only=True)
        assert torch.equal(got["w"], state["w"]), name
    assert mapped == [True, False]
    ck.close()
    assert not shm_files(os.getpid())


def test_a_multi_gib_checkpoint_streams_with_bounded_client_memory(server):
    _, _, rest = server
    ck = sluice.Checkpoint(sluice.Client(rest, token="s3cret"), "big", chunk_size=32 << 20)
    n = (2 << 30) + 4097  # past 2^31: offsets must not be 32-bit anywhere
    block = pattern(8 << 20, 5)
    with ck.writer("state.pt") as w:
        left = n
        while left:
            take = min(left, len(block))
            w.write(block[:take])
            left -= take
    assert w.info["size"] == n
    with ck.reader("state.pt") as r:
        assert r.size == n
        piece = bytearray(len(block))
        for lo in range(0, n, len(block)):
            got = r.readinto(piece)
            assert got == min(len(block), n - lo)
            assert piece[:got] == block[:got], lo
        assert r.readinto(piece) == 0
    ck.delete("state.pt")


def test_concurrent_writers_of_different_names(server):
    _, _, rest = server
    errors = []

    def rank(r):
        try:
            ck = sluice.Checkpoint(sluice.Client(rest, token="s3cret"), "ranks",
                                   chunk_size=CHUNK, workers=2)
            with ck.writer(f"rank{r}.pt") as w:
                w.write(pattern(5 * CHUNK + r, r))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    ck = sluice.Checkpoint(sluice.Client(rest, token="s3cret"), "ranks")
    for r in range(4):
        with ck.reader(f"rank{r}.pt") as f:
            assert f.read() == pattern(5 * CHUNK + r, r)


WRITER = """
import sys, time, sluice
ck = sluice.Checkpoint(sluice.Client(sys.argv[1], token="s3cret"), "killed", chunk_size=1 << 20)
w = ck.writer("model.pt")
w.write(b"x" * (6 << 20))
print("written", w.transport, flush=True)
time.sleep(60)
"""


def test_writers_at_once_share_one_region(server):
    """A Checkpoint's writers share one put region (workers + 1 slots):
    writers on several threads, and more writers open at once on one
    thread than there are slots (each holding one it fills), all commit
    their own bytes; one that finds every slot being filled gets a region
    of its own, let go when it closes; one region is kept after."""
    _, _, rest = server
    client = sluice.Client(rest, token="s3cret")
    ck = sluice.Checkpoint(client, "sharedputs", chunk_size=CHUNK, workers=2, transport="shm")
    data = {f"f{i}.bin": pattern(2 * CHUNK + 1000 * i + 1, i) for i in range(5)}
    with ThreadPoolExecutor(4) as pool:
        def save(kv):
            with ck.writer(kv[0]) as w:
                for lo in range(0, len(kv[1]), 100_000):
                    w.write(kv[1][lo:lo + 100_000])

        list(pool.map(save, data.items()))
    [kept] = [ck._put_slots.region.id]
    before = regions(client)
    # Five open on one thread, three slots: they fill in turn.
    writers = {name: ck.writer(name + ".again") for name in data}
    for lo in range(0, 3 * CHUNK, CHUNK // 2):
        for name, w in writers.items():
            w.write(data[name][lo:lo + CHUNK // 2])
    for w in writers.values():
        w.close()
    assert ck._put_slots.region.id == kept and regions(client) <= before
    for name, want in data.items():
        for stored in (name, name + ".again"):
            with ck.reader(stored) as r:
                assert r.read() == want, stored
    ck.close()
    assert not shm_files(os.getpid())


def uploads(client):
    for line in client._request("GET", "/metrics").splitlines():
        if line.startswith("sluice_checkpoint_uploads "):
            return int(float(line.split()[1]))
    raise AssertionError("no sluice_checkpoint_uploads in /metrics")


@pytest.mark.parametrize("transport", ["shm", "flight"])
def test_save_all_commits_a_models_files_together(server, transport):
    """`save_all` begins every file's upload in one request and commits
    them in one transaction: each loads back bit-identical, all share one
    version time; a state that cannot be saved fails the whole save,
    naming nothing new, with no upload left behind; a bad or repeated
    name is refused before anything is begun."""
    _, _, rest = server
    client = sluice.Client(rest, token="s3cret")
    ck = sluice.Checkpoint(client, f"saveall-{transport}", chunk_size=CHUNK, workers=3,
                           transport=transport)
    g = torch.Generator().manual_seed(7)
    states = {f"layer_{i}.pt": {"w": torch.randn(64 + 97 * i, 33, generator=g),
                                "step": torch.tensor(i)} for i in range(12)}
    states["model.pt"] = torch.randint(-128, 127, (3 * CHUNK + 5,), dtype=torch.int8,
                                       generator=g)
    infos = ck.save_all(states)
    assert [i["name"] for i in infos] == [f"saveall-{transport}/{n}" for n in states]
    assert len({i["created_unix_ms"] for i in infos}) == 1
    loaded = ck.load_all(list(states), weights_only=True)
    for (name, want), got in zip(states.items(), loaded):
        if isinstance(want, dict):
            assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want), name
        else:
            assert torch.equal(got, want), name
    versions = {i["name"]: i["version"] for i in infos}
    before = uploads(client)

    bad = dict(states, **{"layer_3.pt": {"fn": lambda x: x}})
    with pytest.raises(Exception):
        ck.save_all(bad)
    assert uploads(client) == before
    for name in states:
        assert ck.stat(name)["version"] == versions[f"saveall-{transport}/{name}"], name

    for names in (["a.pt", "../b.pt"], ["a.pt", "a.pt"]):
        with pytest.raises(sluice.SluiceError) as e:
            ck.save_all([(n, torch.zeros(3)) for n in names])
        assert "b.pt" in str(e.value) or "two uploads of" in str(e.value), str(e.value)
        assert uploads(client) == before
    assert ck.save_all({}) == []
    ck.close()


def test_a_writer_killed_mid_stream(server):
    _, _, rest = server
    client = sluice.Client(rest, token="s3cret")
    ck = sluice.Checkpoint(client, "killed")
    good = pattern(3 * CHUNK + 5, 3)
    with ck.writer("model.pt") as w:
        w.write(good)
    before = client._request("GET", "/metrics")
    proc = subprocess.Popen([sys.executable, "-c", WRITER, rest], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "written shm"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # It wrote through shared memory, and left nothing in /dev/shm: its
    # probe went at once, the region's name as soon as it was mapped.
    assert not shm_files(proc.pid)
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("sluice-seg-") and "-r" in f]
    # Nothing partial is listed, the previous version reads back whole...
    assert [v["version"] for v in ck.list(versions=True)] == [1]
    with ck.reader("model.pt") as r:
        assert r.read() == good
    # ... and once the upload's idle timeout (1 s here) passes, its space
    # is back and the region it wrote through is let go.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if free(client) == free_from(before) and regions(client) == 0:
            break
        time.sleep(0.2)
    assert free(client) == free_from(before)
    assert regions(client) == 0


STREAMING_WRITER = """
import sys, sluice
ck = sluice.Checkpoint(sluice.Client(sys.argv[1]), "crash", chunk_size=1 << 20)
w = ck.writer("m.pt")
print("writing", w.transport, flush=True)
try:
    for i in range(100000):
        w.write(bytes([i % 251]) * (1 << 20))
except sluice.SluiceError as e:
    print("failed", e.code, flush=True)
    sys.exit(3)
"""


def test_serve_killed_mid_save_keeps_the_previous_version():
    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d, SLUICE_DEVICE_SIZE="1GiB")
        proc, rest = start_serve(d, env)
        try:
            ck = sluice.Checkpoint(sluice.Client(rest), "crash", chunk_size=CHUNK)
            good = pattern(4 * CHUNK + 3, 9)
            with ck.writer("m.pt") as w:
                w.write(good)
            writer = subprocess.Popen([sys.executable, "-c", STREAMING_WRITER, rest],
                                      stdout=subprocess.PIPE, text=True)
            assert writer.stdout.readline().strip() == "writing shm"
            time.sleep(0.5)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        # The writer's next part fails: its server is gone.
        assert writer.wait(timeout=60) == 3, writer.stdout.read()
        dead = proc.pid
        proc, rest = start_serve(d, env)
        try:
            ck = sluice.Checkpoint(sluice.Client(rest), "crash")
            assert [v["version"] for v in ck.list(versions=True)] == [1]
            with ck.reader("m.pt") as r:
                assert r.transport == "shm"
                assert r.read() == good
            # That read lent a region, which swept what the dead server left.
            assert not shm_files(dead)
            assert not shm_files(writer.pid)
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0


def free_from(metrics):
    for line in metrics.splitlines():
        if line.startswith("sluice_device_free_bytes "):
            return int(float(line.split()[1]))
    raise AssertionError(f"no sluice_device_free_bytes in {metrics[:500]}")


def regions(client):
    for line in client._request("GET", "/metrics").splitlines():
        if line.startswith("sluice_checkpoint_regions "):
            return int(float(line.split()[1]))
    raise AssertionError("no sluice_checkpoint_regions in /metrics")


def free(client):
    return free_from(client._request("GET", "/metrics"))


def test_auth_is_required(server):
    _, _, rest = server
    for token in [None, "wrong"]:
        ck = sluice.Checkpoint(sluice.Client(rest, token=token), "auth")
        with pytest.raises(sluice.SluiceError) as e:
            ck.writer("x.pt")
        assert e.value.code == "unauthorized", e.value
        with pytest.raises(sluice.SluiceError):
            ck.list()


def test_rest_lists_and_deletes(server):
    _, _, rest = server
    client = sluice.Client(rest, token="s3cret")
    ck = sluice.Checkpoint(client, "rest")
    for _ in range(3):
        with ck.writer("a.pt") as w:
            w.write(b"abc")
    listed = client._request("GET", "/v1/checkpoints?prefix=rest/")
    assert [(c["name"], c["version"]) for c in listed] == [("rest/a.pt", 2), ("rest/a.pt", 3)]
    gone = client._request("DELETE", "/v1/checkpoints?name=rest/a.pt&version=2")
    assert [c["version"] for c in gone] == [2]
    with pytest.raises(sluice.SluiceError) as e:
        client._request("DELETE", "/v1/checkpoints?name=rest/nope.pt")
    assert e.value.status == 404 and "rest/nope.pt" in e.value.message
    with pytest.raises(sluice.SluiceError) as e:
        ck.reader("nope.pt")
    assert e.value.code == "checkpoint_not_found" and "rest/nope.pt" in e.value.message
    for bad in ["my run.pt", "../up.pt"]:
        with pytest.raises(sluice.SluiceError) as e:
            ck.writer(bad)
        assert e.value.status == 400 and "invalid checkpoint name" in e.value.message, e.value


def test_torch_save_and_load_of_a_real_model_are_bit_identical(server):
    _, _, rest = server
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(16 * 30 * 30, 100), torch.nn.Linear(100, 10))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3}
    ck = sluice.Checkpoint(sluice.Client(rest, token="s3cret"), "torch", chunk_size=CHUNK)
    with ck.writer("epoch3.pt") as f:
        torch.save(state, f)
    with ck.reader("epoch3.pt") as f:
        back = torch.load(f, weights_only=True)
    assert back["epoch"] == 3
    for k, v in state["model"].items():
        assert torch.equal(v, back["model"][k]), k
    assert torch.equal(state["optim"]["state"][0]["exp_avg"], back["optim"]["state"][0]["exp_avg"])
    # The bytes are exactly what torch.save writes to any stream.
    local = io.BytesIO()
    torch.save(state, local)
    with ck.reader("epoch3.pt") as b:
        assert local.getvalue() == b.read()


def test_a_flipped_byte_on_the_device_is_named_on_read():
    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d)
        proc, rest = start_serve(d, env)
        try:
            ck = sluice.Checkpoint(sluice.Client(rest), "flip", chunk_size=CHUNK)
            with ck.writer("m.pt") as w:
                w.write(pattern(2 * CHUNK, 1))
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0
        # Find the extent on the device with the CLI's view of the record...
        listed = json.loads(subprocess.run(
            [SLUICE, "checkpoints", "list", "--format", "json"], env=env, check=True,
            capture_output=True, text=True).stdout)
        assert [(c["name"], c["size"]) for c in listed] == [("flip/m.pt", 2 * CHUNK)]
        device = os.path.join(d, "data", "device.img")
        with open(device, "r+b") as f:
            data = f.read()
            at = data.find(pattern(2 * CHUNK, 1)[CHUNK + 100:CHUNK + 164])
            assert at > 0
            f.seek(at)
            f.write(bytes([data[at] ^ 1]))
        out = os.path.join(d, "out.pt")
        cli = subprocess.run([SLUICE, "checkpoints", "get", "flip/m.pt", out], env=env,
                             capture_output=True, text=True)
        assert cli.returncode != 0 and "flip/m.pt" in cli.stderr and "corrupt" in cli.stderr
        proc, rest = start_serve(d, env)
        try:
            # Read into the shared region O_DIRECT (checked there) or over Flight.
            for transport in ("shm", "flight"):
                ck = sluice.Checkpoint(sluice.Client(rest), "flip", chunk_size=CHUNK,
                                       transport=transport)
                with pytest.raises(sluice.SluiceError) as e:
                    ck.reader("m.pt").read()
                assert "flip/m.pt" in e.value.message and "corrupt" in e.value.message
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0
