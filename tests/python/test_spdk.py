"""The SPDK backend end to end, with a sluice built with `--features spdk`
(SLUICE_SPDK_BIN; scripts/test.sh builds it and sets it when SPDK_DIR
points at an SPDK build) and a real SPDK AIO bdev over a file:

- `serve` on the bdev: ingest over REST, a job read by the Python client,
  the same tensors as the same job on sluice's io_uring backend;
- a storage node on the bdev serving a compute node: a pipeline over
  Flight gives the same rows as the embedded io_uring default.

Without SLUICE_SPDK_BIN every test here is skipped, saying so."""

import json
import os
import subprocess
import tempfile

import numpy as np
import pytest

import sluice

from serve import SLUICE, serve_env, start_serve

SPDK_BIN = os.environ.get("SLUICE_SPDK_BIN")
pytestmark = pytest.mark.skipif(
    not SPDK_BIN,
    reason="SPDK tests need a sluice built with --features spdk (SLUICE_SPDK_BIN); "
    "scripts/test.sh builds one when SPDK_DIR points at an SPDK build")

SQL = "SELECT key, label, to_tensor(decode_resize(data, 24, 24)) AS image FROM pets"
PIPELINE = ("SELECT key, to_tensor(random_resized_crop(decode_image(data), 16, 16)) AS t "
            "FROM pets ORDER BY key")


def hugepages_free_mib():
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            fields[k] = int(v.split()[0])
    return fields.get("HugePages_Free", 0) * fields.get("Hugepagesize", 0) // 1024


def spdk_env(d, bdev_file):
    """A server environment on an AIO bdev over `bdev_file`."""
    config = os.path.join(d, "bdevs.json")
    with open(config, "w") as f:
        json.dump({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_aio_create",
             "params": {"name": "aio0", "filename": bdev_file, "block_size": 4096}}]}]}, f)
    env = serve_env(d, SLUICE_DEVICE_BACKEND="spdk", SLUICE_DEVICE="bdev:aio0",
                    SLUICE_SPDK_CONFIG=config, SLUICE_SPDK_MEM="1GiB")
    if hugepages_free_mib() < 1024:
        env["SLUICE_SPDK_NO_HUGE"] = "true"
    return env


@pytest.fixture(scope="module")
def dirs():
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "pets")
        subprocess.run([SPDK_BIN, "gen-sample", src, "--classes", "3", "--per-class", "7"],
                       check=True, capture_output=True)
        bdev_file = os.path.join(d, "bdev.img")
        with open(bdev_file, "wb") as f:
            f.truncate(256 << 20)
        spdk_dir = os.path.join(d, "spdk")
        uring_dir = os.path.join(d, "uring")
        os.makedirs(spdk_dir)
        os.makedirs(uring_dir)
        yield {"root": d, "src": src, "spdk": spdk_dir, "uring": uring_dir, "bdev": bdev_file}


def job_tensors(rest, src):
    client = sluice.Client(rest)
    client.ingest("pets", src)
    job = client.submit(SQL, batch_size=8)
    job.wait()
    keys, images = [], []
    for b in job.reader(0, numpy=True):
        keys.extend(b["key"])
        images.append(b["image"])
    return keys, np.concatenate(images)


def test_a_job_on_an_spdk_bdev_reads_what_io_uring_reads(dirs):
    env = spdk_env(dirs["spdk"], dirs["bdev"])
    proc, rest = start_serve(dirs["root"], env, bin=SPDK_BIN)
    try:
        spdk_keys, spdk_images = job_tensors(rest, dirs["src"])
        assert len(spdk_keys) == 21
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0, open(os.path.join(dirs["root"], "serve.log")).read()
    uring = serve_env(dirs["uring"], SLUICE_DEVICE_BACKEND="uring")
    proc, rest = start_serve(dirs["root"], uring, bin=SPDK_BIN)
    try:
        uring_keys, uring_images = job_tensors(rest, dirs["src"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert spdk_keys == uring_keys
    assert np.array_equal(spdk_images, uring_images)
    # `info` on the data dir names the bdev and the backend.
    out = subprocess.run([SPDK_BIN, "info", "--format", "json"], env=env,
                         capture_output=True, text=True, check=True).stdout
    device = json.loads(out)["device"]
    assert device["backend"] == "spdk" and device["path"] == "bdev:aio0", device


def test_a_storage_node_on_an_spdk_bdev_serves_a_compute_node(dirs):
    env = spdk_env(dirs["spdk"], dirs["bdev"])
    # The data dir of the test above (same bdev), served by a storage node.
    if not os.path.exists(os.path.join(dirs["spdk"], "data")):
        subprocess.run([SPDK_BIN, "ingest", "pets", dirs["src"]], env=env, check=True,
                       capture_output=True)
    storage = subprocess.Popen([SPDK_BIN, "storage-node", "--listen", "127.0.0.1:0"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True)
    compute = None
    try:
        url = "http://" + storage.stdout.readline().split("listening on ")[1].split()[0]
        compute_env = serve_env(os.path.join(dirs["spdk"], "compute"))
        os.makedirs(os.path.join(dirs["spdk"], "compute"), exist_ok=True)
        compute = subprocess.Popen(
            [SPDK_BIN, "compute-node", "--listen", "127.0.0.1:0", "--storage", url],
            env=compute_env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        curl = "http://" + compute.stdout.readline().split("listening on ")[1].split()[0]
        for how in [["--connect", curl], ["--storage", url, "--offload", "storage"]]:
            remote = subprocess.run(
                [SPDK_BIN, "sql", PIPELINE, "--format", "csv", "--seed", "7", *how],
                env=compute_env, capture_output=True, text=True)
            assert remote.returncode == 0, remote.stderr
            uring_env = serve_env(dirs["uring"], SLUICE_DEVICE_BACKEND="uring")
            if not os.path.exists(os.path.join(dirs["uring"], "data")):
                subprocess.run([SPDK_BIN, "ingest", "pets", dirs["src"]], env=uring_env,
                               check=True, capture_output=True)
            local = subprocess.run([SPDK_BIN, "sql", PIPELINE, "--format", "csv", "--seed", "7"],
                                   env=uring_env, capture_output=True, text=True, check=True)
            assert remote.stdout == local.stdout, how
            assert remote.stdout.count("\n") == 22
    finally:
        for p in [compute, storage]:
            if p is not None:
                p.terminate()
                p.wait(timeout=30)
