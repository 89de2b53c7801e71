"""Ingest from an object store, against a real S3-compatible server
(`s3s-fs`, started by `s3server.py` as its own process on loopback).

Each layout read from the store must equal the same layout read from
local files: the same keys, bytes and labels. A store's faults (a wrong
credential, a missing bucket, the server stopped mid-ingest) fail the
ingest with the store's own code named and commit nothing, or are
retried through; an object's own fault (a manifest row naming a missing
key) is that sample's. A server's allow list is checked before any
request is sent."""

import contextlib
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pyarrow as pa

import sluice

from s3server import s3_server
from serve import SLUICE, serve_env, start_serve

ENV = dict(os.environ, SLUICE_DEVICE_SIZE="256MiB", SLUICE_CHUNK_SIZE="1MiB")


def run(data, env, *args):
    return subprocess.run([SLUICE, "--data-dir", data, *args], env=env,
                          capture_output=True, text=True, timeout=600)


def ingest(data, env, name, source, *args):
    p = run(data, env, "ingest", name, source, "--format", "json", *args)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def rows(data, query):
    p = subprocess.run([SLUICE, "--data-dir", data, "sql", query, "--format", "arrow"],
                       env=ENV, capture_output=True, check=True)
    return pa.ipc.open_stream(p.stdout).read_all().to_pylist()


def datasets(data):
    p = run(data, ENV, "datasets", "--format", "json")
    assert p.returncode == 0, p.stderr
    return [d["name"] for d in json.loads(p.stdout)]


def folder(d, classes=3, per_class=4):
    src = os.path.join(d, "folder")
    subprocess.run([SLUICE, "gen-sample", src, "--classes", str(classes),
                    "--per-class", str(per_class)], env=ENV, check=True, capture_output=True)
    return src


def npy(i):
    """A small .npy array whose values are `i`: a valid sample of its own."""
    header = "{'descr': '<u4', 'fortran_order': False, 'shape': (64,), }"
    header += " " * (63 - len(header) % 64) + "\n"
    return (b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode()
            + i.to_bytes(4, "little") * 64)


def upload_tree(server, bucket, prefix, src):
    for dirpath, _, files in os.walk(src):
        for f in files:
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src)
            with open(path, "rb") as fh:
                server.put(bucket, f"{prefix}/{rel}", fh.read())


def put_manifest(store, src):
    """A CSV manifest of `src`'s files (relative paths, and a `split`
    column) written as `src/m.csv` and put beside them as `pets/m.csv` in
    bucket `train`."""
    files = sorted(os.path.relpath(os.path.join(p, f), src)
                   for p, _, fs in os.walk(src) for f in fs)
    manifest = "path,split\n" + "".join(
        f"{f},{'val' if i % 3 == 0 else 'train'}\n" for i, f in enumerate(files))
    with open(os.path.join(src, "m.csv"), "w") as f:
        f.write(manifest)
    store.put("train", "pets/m.csv", manifest.encode())


def test_each_layout_from_the_store_equals_the_local_one():
    with tempfile.TemporaryDirectory() as d, s3_server(d) as s3:
        data = os.path.join(d, "data")
        env = s3.env(ENV)
        src = folder(d)
        upload_tree(s3, "train", "pets", src)
        # ImageFolder: class prefixes become `label`.
        ingest(data, ENV, "local", src)
        report = ingest(data, env, "remote", "s3://train/pets")
        assert report["samples"] == 12
        assert report["requests"]["requests"] >= 13  # a listing, then a GET each
        q = "SELECT key, label, data, crc32c FROM {} ORDER BY key"
        assert rows(data, q.format("remote")) == rows(data, q.format("local"))
        # Flat: one class's prefix holds only files.
        cls = sorted(os.listdir(src))[0]
        ingest(data, ENV, "flat_local", os.path.join(src, cls))
        ingest(data, env, "flat_remote", f"s3://train/pets/{cls}/")
        q = "SELECT key, data FROM {} ORDER BY key"
        assert rows(data, q.format("flat_remote")) == rows(data, q.format("flat_local"))
        # A manifest in the bucket, its rows relative to it, with a column.
        put_manifest(s3, src)
        ingest(data, ENV, "man_local", os.path.join(src, "m.csv"))
        ingest(data, env, "man_remote", "s3://train/pets/m.csv")
        q = "SELECT key, split, data FROM {} ORDER BY key"
        got = rows(data, q.format("man_remote"))
        assert got == rows(data, q.format("man_local"))
        assert len(got) == 12


def test_store_faults_are_named_and_commit_nothing():
    with tempfile.TemporaryDirectory() as d, s3_server(d) as s3:
        data = os.path.join(d, "data")
        src = folder(d, classes=2, per_class=2)
        upload_tree(s3, "train", "pets", src)
        # A wrong secret: the store's code, and nothing committed.
        bad = s3.env(ENV, AWS_SECRET_ACCESS_KEY="not-the-secret")
        p = run(data, bad, "ingest", "pets", "s3://train/pets")
        assert p.returncode != 0
        assert "SignatureDoesNotMatch" in p.stderr or "AccessDenied" in p.stderr, p.stderr
        assert "s3://train/pets" in p.stderr and "not-the-secret" not in p.stderr
        # A missing bucket.
        env = s3.env(ENV)
        p = run(data, env, "ingest", "pets", "s3://no-such-bucket/pets")
        assert p.returncode != 0 and "NoSuchBucket" in p.stderr, p.stderr
        assert "s3://no-such-bucket/pets" in p.stderr
        # ... also named by one shard's URL (a HEAD, whose answer has no body).
        p = run(data, env, "ingest", "pets", "s3://no-such-bucket/pets/train-0.tar")
        assert p.returncode != 0 and "NoSuchBucket" in p.stderr, p.stderr
        # An empty prefix.
        p = run(data, env, "ingest", "pets", "s3://train/nothing-here")
        assert p.returncode != 0 and "no objects" in p.stderr, p.stderr
        assert datasets(data) == []
        # A manifest row naming a missing key: that sample, named; under
        # `fail`, the ingest, and nothing committed.
        s3.put("train", "pets/m.csv", b"path\nmissing/x.png\n" + "".join(
            f"{os.path.relpath(os.path.join(p, f), src)}\n"
            for p, _, fs in os.walk(src) for f in fs).encode())
        p = run(data, env, "ingest", "pets", "s3://train/pets/m.csv", "--on-error", "fail")
        assert p.returncode != 0 and "s3://train/pets/missing/x.png" in p.stderr, p.stderr
        assert datasets(data) == []
        report = ingest(data, env, "pets", "s3://train/pets/m.csv")
        assert report["samples"] == 4
        [skipped] = report["skipped"]
        assert skipped["key"] == "missing/x.png"
        assert "NoSuchKey" in skipped["reason"] or "not found" in skipped["reason"].lower()


def test_a_store_stopped_mid_ingest_is_retried_through():
    with tempfile.TemporaryDirectory() as d, s3_server(d) as s3:
        data = os.path.join(d, "data")
        n = 20000
        for i in range(n):
            s3.put("big", f"objs/{i:05d}.npy", npy(i))
        env = s3.env(ENV)
        proc = subprocess.Popen(
            [SLUICE, "--data-dir", data, "ingest", "objs", "s3://big/objs", "--format", "json"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        assert proc.poll() is None, "the ingest ended before the server was stopped"
        s3.stop()
        time.sleep(2.0)
        s3.start()
        out, err = proc.communicate(timeout=600)
        # object_store retries a refused connection with backoff for up to
        # two minutes, and sluice retries a fetch cut off mid-answer: a
        # 2 s outage costs retries, not the ingest.
        assert proc.returncode == 0, err
        report = json.loads(out)
        assert report["samples"] == n and report["skipped"] == []
        assert report["requests"]["retries"] >= 1, report
        got = rows(data, "SELECT key, data FROM objs ORDER BY key")
        assert [r["key"] for r in got] == [f"{i:05d}.npy" for i in range(n)]
        assert all(r["data"] == npy(i) for i, r in enumerate(got))


def info(data):
    p = run(data, ENV, "info", "--format", "json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def free_bytes(data):
    return info(data)["free_bytes"]


def failed_then_mended(s3, data, env, url, n, bad):
    """Ingests `url` (of `n` objects in bucket `big`'s `objs/`, object
    `bad` not an array) under `--on-error fail`, which fails naming it and
    commits nothing; mends it, rewrites object 5 at the same size (another
    ETag) and ingests again: that run's report."""
    p = run(data, env, "ingest", "objs", url, "--on-error", "fail")
    assert p.returncode != 0 and f"{bad:05d}.npy" in p.stderr, p.stderr
    assert datasets(data) == []
    s3.put("big", f"objs/{bad:05d}.npy", npy(bad))
    s3.put("big", "objs/00005.npy", npy(9999))
    report = ingest(data, env, "objs", url)
    assert report["samples"] == n and report["skipped"] == []
    return report


def test_a_failed_ingest_is_resumed_without_fetching_again_what_it_verified():
    """An ingest that fails part-way (a bad object under --on-error fail)
    commits nothing, but keeps what it wrote and verified; once the object
    is mended, the re-run takes those objects from the device, with no
    request for them, and fetches only the rest. An object changed in the
    store since (same size, another ETag) is fetched again. The version
    equals the store's objects; `sluice gc` frees what a failed run kept."""
    with tempfile.TemporaryDirectory() as d, s3_server(d) as s3:
        data = os.path.join(d, "data")
        n, bad = 400, 300
        for i in range(n):
            s3.put("big", f"objs/{i:05d}.npy", npy(i) if i != bad else b"not an array")
        env = s3.env(ENV)
        report = failed_then_mended(s3, data, env, "s3://big/objs", n, bad)
        req = report["requests"]
        assert req["resumed"] == bad - 1, req
        assert req["resumed_bytes"] == (bad - 1) * len(npy(0)), req
        # One listing page, then a GET for each object not kept.
        assert req["requests"] <= 1 + (n - bad + 1), req
        got = rows(data, "SELECT key, data FROM objs ORDER BY key")
        want = [npy(9999 if i == 5 else i) for i in range(n)]
        assert [r["key"] for r in got] == [f"{i:05d}.npy" for i in range(n)]
        assert [r["data"] for r in got] == want
        # The commit took the record's chunks; nothing is left to drop.
        p = run(data, ENV, "gc", "--dry-run", "--format", "json")
        assert json.loads(p.stdout)["resume_records"] == [], p.stdout

        # A failed run of another dataset holds its chunks until gc.
        s3.put("big", f"objs/{bad:05d}.npy", b"not an array")
        before = free_bytes(data)
        p = run(data, env, "ingest", "again", "s3://big/objs", "--on-error", "fail")
        assert p.returncode != 0, p.stderr
        assert free_bytes(data) < before
        p = run(data, ENV, "gc", "--format", "json")
        assert json.loads(p.stdout)["resume_records"] == ["again"], p.stdout
        assert free_bytes(data) == before
        assert datasets(data) == ["objs"]


def test_a_manifests_kept_rows_are_resumed_after_a_head_each():
    """A manifest's rows are never listed: a failed run keeps them with
    the size and stamp their GETs answered, and the re-run sends a HEAD
    for each kept row (no bytes) and takes it when it matches; a row
    rewritten since (same size, another ETag) is fetched again."""
    with tempfile.TemporaryDirectory() as d, s3_server(d) as s3:
        data = os.path.join(d, "data")
        n, bad = 200, 150
        for i in range(n):
            s3.put("big", f"objs/{i:05d}.npy", npy(i) if i != bad else b"not an array")
        s3.put("big", "objs/m.csv",
               ("path\n" + "".join(f"{i:05d}.npy\n" for i in range(n))).encode())
        env = s3.env(ENV)
        report = failed_then_mended(s3, data, env, "s3://big/objs/m.csv", n, bad)
        req = report["requests"]
        assert req["resumed"] == bad - 1, req
        # The manifest, a HEAD for each kept row, a GET for each other.
        assert req["requests"] <= 4 + bad + (n - bad + 1), req
        got = rows(data, "SELECT data FROM objs ORDER BY key")
        assert [r["data"] for r in got] == [npy(9999 if i == 5 else i) for i in range(n)]


def test_an_ingest_killed_mid_run_resumes_from_the_record_it_kept():
    """`kill -9` of an ingest from a store, mid-run: nothing is committed,
    and the re-run takes from the device every object of the record the
    killed run kept while it went on (every few seconds, after a device
    flush), fetching only the rest; the version equals the store's
    objects, and no chunk of the killed run is lost."""
    with tempfile.TemporaryDirectory() as d, s3_server(d) as s3:
        data = os.path.join(d, "data")
        n = 6000
        for i in range(n):
            s3.put("big", f"objs/{i:05d}.npy", npy(i))
        env = s3.env(ENV, SLUICE_LOG="sluice_storage=info")
        proc = subprocess.Popen(
            [SLUICE, "--data-dir", data, "ingest", "objs", "s3://big/objs", "--format", "json"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        kept = None
        try:
            for line in proc.stderr:
                m = re.search(r"(\d+) objects verified so far are kept", line)
                if m:
                    kept = int(m.group(1))
                    break
        finally:
            proc.kill()
            proc.wait(timeout=60)
        assert kept, "the killed run kept no record while it ran"
        assert datasets(data) == []
        report = ingest(data, env, "objs", "s3://big/objs")
        assert report["samples"] == n and report["skipped"] == []
        req = report["requests"]
        assert kept <= req["resumed"] < n, req
        assert req["requests"] <= 1 + n - req["resumed"] + 5, req
        got = rows(data, "SELECT key, data FROM objs ORDER BY key")
        assert [r["key"] for r in got] == [f"{i:05d}.npy" for i in range(n)]
        assert all(r["data"] == npy(i) for i, r in enumerate(got))
        # The record's chunks went to the version, nothing is left to drop,
        # and the killed run's other chunks were free again at open: every
        # chunk in use is the version's.
        p = run(data, ENV, "gc", "--dry-run", "--format", "json")
        assert json.loads(p.stdout)["resume_records"] == [], p.stdout
        space = info(data)["space"]
        assert space["total_chunks"] - space["free_chunks"] == report["chunks"], (space, report)


def test_a_servers_allow_list_is_checked_before_any_request():
    with tempfile.TemporaryDirectory() as d, s3_server(d) as s3:
        src = folder(d, classes=2, per_class=2)
        upload_tree(s3, "train", "pets", src)
        upload_tree(s3, "train", "secret", src)
        s3.put("train", "pets/m.csv", b"path\ns3://train/secret/" +
               os.path.relpath(os.path.join(src, sorted(os.listdir(src))[0]),
                               src).encode() + b"\n")
        env = s3.env(serve_env(d))
        proc, rest = start_serve(d, env, ["--ingest-url-allow", "s3://train/pets"])

        def post(body):
            req = urllib.request.Request(rest + "/v1/datasets", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        try:
            status, body = post({"name": "pets", "path": "s3://train/pets"})
            assert status == 201, body
            assert body["samples"] == 4
            # The CLI through the server sends the URL as it is.
            p = subprocess.run([SLUICE, "ingest", "pets2", "s3://train/pets", "--url", rest],
                               env=env, capture_output=True, text=True, timeout=120)
            assert p.returncode == 0 and "4 samples" in p.stdout, p.stdout + p.stderr
            for outside in ("s3://train/secret", "s3://train/petsx", "s3://other/pets"):
                status, body = post({"name": "nope", "path": outside})
                assert status == 403, body
                assert "s3://train/pets" in body["message"], body
            # A manifest beneath the prefix may not name objects outside it.
            status, body = post({"name": "nope", "path": "s3://train/pets/m.csv",
                                 "on_error": "fail"})
            assert status == 400 and "outside" in body["message"], body
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0
        shutil.rmtree(os.path.join(d, "data"), ignore_errors=True)


def test_storage_nodes_each_read_their_own_part_from_the_store():
    """Over two storage nodes, each node reads its own part from the store
    with its own credentials: the coordinator has none, so a byte through
    it would have failed the ingest."""
    with tempfile.TemporaryDirectory() as d, s3_server(d) as s3:
        n = 40
        for i in range(n):
            s3.put("train", f"arrays/{i:03d}.npy", npy(i))
        base = serve_env(d)
        node_env = s3.env(base, SLUICE_LOG="info")
        coord_env = {k: v for k, v in base.items() if not k.startswith("AWS_")}
        procs, urls = [], []
        coord = None
        try:
            for i in range(2):
                env = dict(node_env, SLUICE_DATA_DIR=os.path.join(d, f"node{i}"))
                log = open(os.path.join(d, f"node{i}.log"), "a")
                p = subprocess.Popen([SLUICE, "storage-node", "--listen", "127.0.0.1:0",
                                      "--ingest-url-allow", "s3://train/arrays"],
                                     env=env, stdout=subprocess.PIPE, stderr=log, text=True)
                log.close()
                procs.append(p)
                line = p.stdout.readline()
                assert " listening on " in line, line
                urls.append("http://" + line.split(" listening on ")[1].split()[0])
            coord, rest = start_serve(d, coord_env, ["--storage", ",".join(urls),
                                                     "--ingest-url-allow", "s3://train"])
            req = urllib.request.Request(
                rest + "/v1/datasets", headers={"Content-Type": "application/json"},
                data=json.dumps({"name": "arrays", "path": "s3://train/arrays",
                                 "replicas": 1}).encode())
            with urllib.request.urlopen(req, timeout=120) as r:
                report = json.loads(r.read())
            assert report["samples"] == n, report
            parts = report["parts"]
            assert len(parts) == 2 and all(p["samples"] == n // 2 for p in parts), parts
            job = sluice.Client(rest).submit("SELECT key, data FROM arrays")
            job.wait()
            got = [(k, v) for b in job.reader(0) for k, v in
                   zip(b.column("key").to_pylist(), b.column("data").to_pylist())]
            assert sorted(got) == [(f"{i:03d}.npy", npy(i)) for i in range(n)]
            # A node's own allow list holds too: the coordinator allows all of
            # the bucket, the nodes only `arrays/`.
            s3.put("train", "other/x.npy", npy(1))
            req = urllib.request.Request(
                rest + "/v1/datasets", headers={"Content-Type": "application/json"},
                data=json.dumps({"name": "other", "path": "s3://train/other"}).encode())
            try:
                urllib.request.urlopen(req, timeout=120)
                raise AssertionError("a node read outside its allow list")
            except urllib.error.HTTPError as e:
                body = json.loads(e.read())
                assert "s3://train/arrays" in body["message"], body

            # A part that fails aborts both; each node keeps what it
            # verified (node 0 a whole prepared part, node 1 what came
            # before its bad object), and the re-run resumes on both.
            for i in range(n):
                s3.put("train", f"arrays/more/{i:03d}.npy", npy(i) if i != 39 else b"bad")

            def post_more():
                req = urllib.request.Request(
                    rest + "/v1/datasets", headers={"Content-Type": "application/json"},
                    data=json.dumps({"name": "more", "path": "s3://train/arrays/more",
                                     "replicas": 1, "on_error": "fail"}).encode())
                try:
                    with urllib.request.urlopen(req, timeout=120) as r:
                        return r.status, json.loads(r.read())
                except urllib.error.HTTPError as e:
                    return e.code, json.loads(e.read())

            status, body = post_more()
            assert status >= 400 and "039.npy" in body["message"], body
            s3.put("train", "arrays/more/039.npy", npy(39))
            status, body = post_more()
            assert status == 201 and body["samples"] == n, body
            logs = [open(os.path.join(d, f"node{i}.log")).read() for i in range(2)]
            assert "20 objects (" in logs[0] and "kept for a re-run" in logs[0], logs[0][-2000:]
            assert "19 objects (" in logs[1] and "kept for a re-run" in logs[1], logs[1][-2000:]
            for log, resumed in zip(logs, (20, 19)):
                assert f"{resumed} objects ({resumed * len(npy(0))} bytes) are on the device" \
                    in log, log[-2000:]
            job = sluice.Client(rest).submit("SELECT key, data FROM more")
            job.wait()
            got = [(k, v) for b in job.reader(0) for k, v in
                   zip(b.column("key").to_pylist(), b.column("data").to_pylist())]
            assert sorted(got) == [(f"{i:03d}.npy", npy(i)) for i in range(n)]
        finally:
            for p in ([coord] if coord else []) + procs:
                p.terminate()
                p.wait(timeout=30)


def test_a_prefix_of_100000_objects_is_ingested_in_bounded_memory():
    """100,000 small objects, listed 1,000 a page: sluice keeps one compact
    entry per object (never the listing's pages, never the objects), and
    the test server's peak is measured too."""
    with tempfile.TemporaryDirectory() as d, s3_server(d) as s3:
        data = os.path.join(d, "data")
        n = 100_000
        for i in range(n):
            s3.put("many", f"objs/{i // 1000:03d}/{i:06d}.npy", npy(i % 1000))
        out_path, err_path = os.path.join(d, "out.json"), os.path.join(d, "err.txt")
        with open(out_path, "w") as out, open(err_path, "w") as err:
            proc = subprocess.Popen(
                [SLUICE, "--data-dir", data, "ingest", "many", "s3://many/objs",
                 "--format", "json"], env=s3.env(ENV), stdout=out, stderr=err)
        # The process's own peak: its VmHWM, read every 20 ms until it ends.
        # (A child's ru_maxrss would count the forked test runner's pages:
        # Linux keeps the larger across execve.)
        peak = 0
        while proc.poll() is None:
            with contextlib.suppress(OSError, StopIteration, ValueError):
                with open(f"/proc/{proc.pid}/status") as f:
                    peak = max(peak, next(int(line.split()[1]) for line in f
                                          if line.startswith("VmHWM:")))
            time.sleep(0.02)
        with open(err_path) as f:
            assert proc.returncode == 0, f.read()
        with open(out_path) as f:
            report = json.load(f)
        assert report["samples"] == n and report["skipped"] == []
        # 100 listing pages and a GET each; none retried on a healthy store.
        assert report["requests"]["requests"] >= n + 100, report
        [(count, first, last)] = [tuple(r.values()) for r in rows(
            data, "SELECT count(*) AS n, min(key) AS a, max(key) AS b FROM many")]
        assert (count, first, last) == (n, "000/000000.npy", "099/099999.npy")
        with open(f"/proc/{s3.proc.pid}/status") as f:
            server_mib = next(int(line.split()[1]) for line in f
                              if line.startswith("VmHWM:")) / 1024
        sluice_mib = peak / 1024
        print(f"100,000 objects: sluice peak {sluice_mib:.0f} MiB, "
              f"server peak {server_mib:.0f} MiB")
        # The objects are 26 MiB in all and their entries some 20 MiB; a
        # sluice that held listing pages or objects whole would show it
        # here (a debug build's baseline is about 60 MiB).
        assert sluice_mib < 320, sluice_mib
        assert server_mib < 512, server_mib


def test_webdataset_and_tfrecord_shards_in_the_store_equal_the_local_ones():
    from test_shards import example, images, record, webdataset

    with tempfile.TemporaryDirectory() as d, s3_server(d) as s3:
        data = os.path.join(d, "data")
        env = s3.env(ENV)
        _, samples = images(d)
        wds = webdataset(os.path.join(d, "wds"), samples, shards=3)
        tf = os.path.join(d, "tf")
        os.makedirs(tf)
        with open(os.path.join(tf, "train-00000-of-00001.tfrecord"), "wb") as f:
            for key, cls, blob in samples:
                f.write(record(example({"image/encoded": blob, "image/filename": key.encode(),
                                        "image/class/text": cls.encode()})))
        open(os.path.join(tf, "train-00000-of-00001.tfrecord.index"), "w").close()
        upload_tree(s3, "train", "wds", wds)
        upload_tree(s3, "train", "tf", tf)
        ingest(data, ENV, "wds_local", wds)
        report = ingest(data, env, "wds_remote", "s3://train/wds")
        assert report["samples"] == len(samples)
        q = ("SELECT key, label, json, source_shard, source_index, source_offset, data "
             "FROM {} ORDER BY key")
        got = rows(data, q.format("wds_remote"))
        assert got == rows(data, q.format("wds_local")) and len(got) == 12
        # One shard named by its URL; and a storage node's part of three
        # files: its own files only.
        ingest(data, env, "one", "s3://train/wds/train-0001.tar")
        assert {r["source_shard"] for r in rows(data, "SELECT source_shard FROM one")} == \
            {"train-0001.tar"}
        # A pattern in the URL's last part: the shards beside each other
        # that match it; one that matches a file that is no shard, or
        # nothing, is refused by name.
        ingest(data, env, "glob", "s3://train/wds/train-000[0-1].t*")
        assert {r["source_shard"] for r in rows(data, "SELECT source_shard FROM glob")} == \
            {"train-0000.tar", "train-0001.tar"}
        upload_tree(s3, "train", "mixed", wds)
        s3.put("train", "mixed/notes.txt", b"not a shard")
        p = run(data, env, "ingest", "bad_glob", "s3://train/mixed/*")
        assert p.returncode != 0 and "notes.txt matches but is not a shard" in p.stderr, p.stderr
        p = run(data, env, "ingest", "no_glob", "s3://train/wds/val-*.tar")
        assert p.returncode != 0 and "no shards" in p.stderr, p.stderr
        assert not {"bad_glob", "no_glob"} & set(datasets(data))
        part = os.path.join(d, "part")
        ingest(part, env, "wds", "s3://train/wds", "--shard", "1/2")
        assert {r["source_shard"] for r in rows(part, "SELECT source_shard FROM wds")} == \
            {"train-0001.tar"}
        ingest(data, ENV, "tf_local", tf)
        ingest(data, env, "tf_remote", "s3://train/tf")
        q = "SELECT key, image_class_text, data FROM {} ORDER BY key"
        got = rows(data, q.format("tf_remote"))
        assert got == rows(data, q.format("tf_local")) and len(got) == 12


def test_gzipped_tar_shards_in_the_store_equal_the_local_ones():
    """A .tar.gz in the store is inflated as it streams in (into an
    unlinked file in the data dir) and its objects read from there: the
    same rows as the same shards ingested from a local folder, one GET a
    shard. A damaged one is that shard's refusal, named; a kind sluice
    does not inflate is refused by name."""
    import gzip

    from test_shards import images, webdataset

    with tempfile.TemporaryDirectory() as d, s3_server(d) as s3:
        data = os.path.join(d, "data")
        env = s3.env(ENV)
        _, samples = images(d)
        wds = webdataset(os.path.join(d, "wds"), samples, shards=3)
        gz = os.path.join(d, "gz")
        os.makedirs(gz)
        for name in sorted(os.listdir(wds)):
            with open(os.path.join(wds, name), "rb") as f:
                packed = gzip.compress(f.read())
            with open(os.path.join(gz, name + ".gz"), "wb") as f:
                f.write(packed)
        upload_tree(s3, "train", "gz", gz)
        ingest(data, ENV, "gz_local", gz)
        report = ingest(data, env, "gz_remote", "s3://train/gz")
        assert report["samples"] == len(samples), report
        # A listing and one streamed GET a shard: no object fetched again.
        assert report["requests"]["requests"] <= 1 + 3 + 1, report["requests"]
        q = ("SELECT key, label, json, source_shard, source_index, source_offset, data "
             "FROM {} ORDER BY key")
        got = rows(data, q.format("gz_remote"))
        assert got == rows(data, q.format("gz_local")) and len(got) == 12
        assert {r["source_shard"] for r in got} == {f"train-000{i}.tar.gz" for i in range(3)}
        # One shard cut short: its refusal, named; the others are read.
        whole = open(os.path.join(gz, "train-0001.tar.gz"), "rb").read()
        s3.put("train", "cut/train-0000.tar.gz", open(os.path.join(gz, "train-0000.tar.gz"),
                                                     "rb").read())
        s3.put("train", "cut/train-0001.tar.gz", whole[: len(whole) // 2])
        report = ingest(data, env, "cut", "s3://train/cut")
        assert report["samples"] == 4, report
        assert any("train-0001.tar.gz" in s["key"] and "gzip" in s["reason"]
                   for s in report["skipped"]), report["skipped"]
        s3.put("train", "zst/train-0000.tar.zst", b"(zstd)")
        p = run(data, env, "ingest", "zst", "s3://train/zst")
        assert p.returncode != 0 and "train-0000.tar.zst" in p.stderr, p.stderr
        assert "decompress this one" in p.stderr, p.stderr
        assert "zst" not in datasets(data)


def test_parquet_shards_in_the_store_equal_the_local_ones():
    """The Hugging Face Hub's layout (image {bytes, path}, label, text) in
    small row groups, so that a shard's rows span several and a load
    group several of them: from the store equal to from local files. A
    .parquet URL with a `path` column is still a manifest; one with the
    images inside is one shard; a file that is no Parquet is named."""
    import pyarrow.parquet as pq
    from test_shards import hub_shards, images

    with tempfile.TemporaryDirectory() as d, s3_server(d) as s3:
        data = os.path.join(d, "data")
        env = s3.env(ENV)
        src, samples = images(d)
        hub = os.path.join(d, "hub")
        os.makedirs(hub)
        classes = sorted({cls for _, cls, _ in samples})
        hub_shards(hub, samples, classes)
        upload_tree(s3, "train", "hub", hub)
        ingest(data, ENV, "hub_local", hub)
        report = ingest(data, env, "hub_remote", "s3://train/hub")
        assert report["samples"] == len(samples), report
        q = ("SELECT key, label, text, image_path, source_shard, source_index, source_offset, "
             "data, crc32c FROM {} ORDER BY key")
        got = rows(data, q.format("hub_remote"))
        assert got == rows(data, q.format("hub_local")) and len(got) == 12
        # One shard named by its URL.
        one = ingest(data, env, "one", "s3://train/hub/train-00001-of-00002.parquet")
        assert one["samples"] == 5, one
        assert rows(data, "SELECT key, data FROM one ORDER BY key") == \
            [{"key": k, "data": b} for k, _, b in sorted(samples[7:])]
        # 96 rows in one row group span three load groups: its image
        # column is read once (a listing, the footer once, the other
        # columns, the images: some 5 requests; 13 or more if each load
        # group read the row group again).
        many = [(f"copy{i}/{k}", c, b) for i in range(8) for k, c, b in samples]
        table = pa.table({
            "image": pa.array([{"bytes": b, "path": k} for k, _, b in many],
                              pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            "text": pa.array([c for _, c, _ in many]),
        })
        buf = pa.BufferOutputStream()
        pq.write_table(table, buf, row_group_size=len(many))
        s3.put("train", "many/all.parquet", buf.getvalue().to_pybytes())
        report = ingest(data, env, "many", "s3://train/many")
        assert report["samples"] == 96, report
        assert report["requests"]["requests"] < 12, report["requests"]
        # A Parquet manifest in the bucket is still one.
        listed = [{"path": key} for key, _, _ in samples]
        upload_tree(s3, "train", "pets", src)
        buf = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist(listed), buf)
        s3.put("train", "pets/m.parquet", buf.getvalue().to_pybytes())
        man = ingest(data, env, "man", "s3://train/pets/m.parquet")
        assert man["samples"] == len(samples), man
        # Not Parquet at all: named, nothing else lost; nothing committed
        # when errors fail the ingest.
        s3.put("train", "bad/a.parquet", b"PAR1 this is no parquet file PAR1")
        s3.put("train", "bad/b.parquet", open(os.path.join(hub, "train-00000-of-00002.parquet"),
                                              "rb").read())
        p = run(data, env, "ingest", "bad", "s3://train/bad", "--on-error", "fail")
        assert p.returncode != 0 and "a.parquet" in p.stderr, p.stderr
        assert "bad" not in datasets(data)
        skipped = ingest(data, env, "bad", "s3://train/bad")
        assert skipped["samples"] == 7, skipped
        assert any("a.parquet" in json.dumps(b) for b in skipped["skipped"]), skipped


def test_keys_with_spaces_accents_and_signs_are_read_as_named():
    """A key is sent as it is listed or named, never percent-encoded
    (`été 1.npy` is another key than `%C3%A9t%C3%A9 1.npy`)."""
    with tempfile.TemporaryDirectory() as d, s3_server(d) as s3:
        data = os.path.join(d, "data")
        env = s3.env(ENV)
        keys = ["cat s/été 1.npy", "cat s/a+b=c.npy", "dog/x (1).npy"]
        for i, k in enumerate(keys):
            s3.put("odd", f"set/{k}", npy(i))
        report = ingest(data, env, "listed", "s3://odd/set")
        assert report["samples"] == 3 and report["skipped"] == [], report
        got = rows(data, "SELECT key, label, data FROM listed ORDER BY key")
        assert got == [{"key": k, "label": k.split("/")[0], "data": npy(keys.index(k))}
                       for k in sorted(keys)]
        manifest = "".join(json.dumps({"path": k, "n": i}) + "\n" for i, k in enumerate(keys))
        s3.put("odd", "set/m.jsonl", manifest.encode())
        report = ingest(data, env, "named", "s3://odd/set/m.jsonl")
        assert report["samples"] == 3 and report["skipped"] == [], report
        got = rows(data, "SELECT key, n, data FROM named ORDER BY n")
        assert got == [{"key": k, "n": i, "data": npy(i)} for i, k in enumerate(keys)]
        # A prefix with an accent is listed as named too.
        assert ingest(data, env, "one", "s3://odd/set/cat s")["samples"] == 2
