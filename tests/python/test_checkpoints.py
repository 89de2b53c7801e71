"""Checkpoints through the real `sluice serve`: round trips of many sizes
(up to past 2 GiB), concurrent writers, a writer killed mid-stream, a
flipped byte on the device, auth, REST and the CLI, and torch.save /
torch.load of a real model bit-identical."""

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


def test_round_trips_of_every_size(server):
    _, _, rest = server
    ck = sluice.Checkpoint(sluice.Client(rest, token="s3cret"), "sizes",
                           chunk_size=3 * CHUNK, workers=3)
    for n in [0, 1, CHUNK - 1, CHUNK, 3 * CHUNK, 3 * CHUNK + 1, 10 * CHUNK + 12345]:
        data = pattern(n, n % 97)
        with ck.writer(f"f{n}.bin") as w:
            # Odd-sized writes, as torch.save makes them.
            for lo in range(0, n, 777_777):
                w.write(data[lo:lo + 777_777])
        assert w.info["size"] == n
        with ck.reader(f"f{n}.bin") as r:
            assert r.size == n
            assert r.read() == data, n
            r.seek(n // 2)
            assert r.read(10) == data[n // 2:n // 2 + 10]
    assert sorted(ck.list()) == sorted(f"f{n}.bin" for n in
                                       [0, 1, CHUNK - 1, CHUNK, 3 * CHUNK, 3 * CHUNK + 1,
                                        10 * CHUNK + 12345])


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
print("written", flush=True)
time.sleep(60)
"""


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
    assert proc.stdout.readline().strip() == "written"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # Nothing partial is listed, the previous version reads back whole...
    assert [v["version"] for v in ck.list(versions=True)] == [1]
    with ck.reader("model.pt") as r:
        assert r.read() == good
    # ... and once the upload's idle timeout (1 s here) passes, its space is back.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if free(client) == free_from(before):
            break
        time.sleep(0.2)
    assert free(client) == free_from(before)


def free_from(metrics):
    for line in metrics.splitlines():
        if line.startswith("sluice_device_free_bytes "):
            return int(float(line.split()[1]))
    raise AssertionError(f"no sluice_device_free_bytes in {metrics[:500]}")


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
            ck = sluice.Checkpoint(sluice.Client(rest), "flip", chunk_size=CHUNK)
            with pytest.raises(sluice.SluiceError) as e:
                ck.reader("m.pt").read()
            assert "flip/m.pt" in e.value.message and "corrupt" in e.value.message
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0
