"""Ingest from the layouts datasets already have: WebDataset tar shards,
TFRecord files of tf.train.Example, and Parquet with the images inside,
read in place by the real binary.

The shards are made here from `sluice gen-sample`'s ImageFolder — with
Python's `tarfile`, and a TFRecord writer written from the format (length,
masked CRC-32C, data, masked CRC-32C; the Example protobuf encoded by
hand) — and ingested beside the ImageFolder itself: the same keys, bytes
and labels. Broken shards (a sample without its image, a key twice, a
member that is not an image, a shard cut short, a record whose CRC does
not match) have each fault named under the skip policy, and nothing else
lost."""

import gzip
import io
import json
import os
import struct
import subprocess
import tarfile
import tempfile

import pyarrow as pa
import pytest

from serve import SLUICE, serve_env, start_serve, vm_hwm_mib

ENV = dict(os.environ, SLUICE_DEVICE_SIZE="256MiB", SLUICE_CHUNK_SIZE="1MiB")


# -- the formats, written from their descriptions ---------------------------

def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data):
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked(length)) + data + struct.pack("<I", masked(data))


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(tag, payload):
    """A length-delimited protobuf field."""
    return varint(tag << 3 | 2) + varint(len(payload)) + payload


def example(features):
    """A tf.train.Example: {name: bytes | int}."""
    entries = b""
    for name, value in features.items():
        if isinstance(value, int):
            feature = field(3, field(1, varint(value & (2**64 - 1))))
        else:
            feature = field(1, field(1, value))
        entries += field(1, field(1, name.encode()) + field(2, feature))
    return field(1, entries)


# -- helpers -----------------------------------------------------------------

def sql(data, query):
    p = subprocess.run([SLUICE, "--data-dir", data, "sql", query, "--format", "arrow"],
                       env=ENV, capture_output=True, check=True)
    return pa.ipc.open_stream(p.stdout).read_all()


def ingest(data, name, source, *args):
    p = subprocess.run([SLUICE, "--data-dir", data, "ingest", name, source, *args],
                       env=ENV, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout + p.stderr


def images(d):
    """A generated ImageFolder: its path and [(key, class, bytes)] by key."""
    src = os.path.join(d, "folder")
    subprocess.run([SLUICE, "gen-sample", src, "--classes", "3", "--per-class", "4"],
                   env=ENV, check=True, capture_output=True)
    out = []
    for cls in sorted(os.listdir(src)):
        for f in sorted(os.listdir(os.path.join(src, cls))):
            with open(os.path.join(src, cls, f), "rb") as fh:
                out.append((f"{cls}/{f}", cls, fh.read()))
    return src, out


def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def webdataset(dirname, samples, shards=2):
    """`samples` as WebDataset shards: `cls/stem.jpg`, `.cls`, `.json`."""
    os.makedirs(dirname, exist_ok=True)
    for s in range(shards):
        with tarfile.open(os.path.join(dirname, f"train-{s:04d}.tar"), "w") as tar:
            for i, (key, cls, data) in enumerate(samples):
                if i % shards != s:
                    continue
                stem = key.rsplit(".", 1)[0]
                add(tar, key, data)
                add(tar, stem + ".cls", cls.encode())
                add(tar, stem + ".json", json.dumps({"i": i}).encode())
    return dirname


def folder_rows(data):
    return sql(data, "SELECT key, label, data FROM folder ORDER BY key").to_pylist()


# -- tests -------------------------------------------------------------------

def test_webdataset_shards_ingest_as_the_imagefolder_they_came_from():
    with tempfile.TemporaryDirectory() as d:
        src, samples = images(d)
        data = os.path.join(d, "data")
        ingest(data, "folder", src)
        shards = webdataset(os.path.join(d, "shards"), samples)
        report = ingest(data, "wds", shards)
        want = folder_rows(data)
        got = sql(data, "SELECT key, label, data FROM wds ORDER BY key").to_pylist()
        assert got == want
        assert len(got) == 12
        # Each sample says where it came from; its JSON member is a column.
        t = sql(data, "SELECT key, source_shard, source_index, json FROM wds ORDER BY key")
        rows = t.to_pylist()
        for i, (key, _, _) in enumerate(samples):
            row = next(r for r in rows if r["key"] == key)
            assert row["source_shard"] == f"train-{i % 2:04d}.tar"
            assert row["source_index"] == i // 2
            assert json.loads(row["json"]) == {"i": i}
        # The report names the columns the shards gave.
        for column in ("label", "json", "source_shard"):
            assert column in report, report
        # A glob picks shards by name: one of the two.
        ingest(data, "half", os.path.join(shards, "train-0000.*"))
        n = sql(data, "SELECT count(*) AS n FROM half").column("n")[0].as_py()
        assert n == 6


def test_gzipped_webdataset_shards_ingest_as_the_tars_do():
    with tempfile.TemporaryDirectory() as d:
        _, samples = images(d)
        data = os.path.join(d, "data")
        shards = webdataset(os.path.join(d, "shards"), samples)
        ingest(data, "tars", shards)
        gz = os.path.join(d, "gz")
        os.makedirs(gz)
        for name in sorted(os.listdir(shards)):
            with open(os.path.join(shards, name), "rb") as f:
                tar = f.read()
            # The second as two gzip members, as pigz and bgzip write.
            body = (gzip.compress(tar) if name.endswith("0.tar")
                    else gzip.compress(tar[:5000]) + gzip.compress(tar[5000:]))
            with open(os.path.join(gz, name + ".gz"), "wb") as f:
                f.write(body)
        # A damaged one is refused by name; the others are kept.
        with open(os.path.join(gz, "train-0002.tar.gz"), "wb") as f:
            f.write(gzip.compress(b"x" * 1000)[:-20] + b"garbage")
        report = ingest(data, "gz", gz)
        assert "train-0002.tar.gz" in report and "gzip" in report, report
        query = "SELECT key, label, json, data, source_index FROM {} ORDER BY key"
        want = sql(data, query.format("tars")).to_pylist()
        assert sql(data, query.format("gz")).to_pylist() == want
        assert len(want) == 12
        # Nothing is left behind in the data dir.
        assert not [n for n in os.listdir(data) if "tmp" in n.lower()]


def test_storage_nodes_each_read_their_own_shard_files():
    with tempfile.TemporaryDirectory() as d:
        _, samples = images(d)
        shards = webdataset(os.path.join(d, "shards"), samples, shards=3)
        parts = []
        for i in range(2):
            data = os.path.join(d, f"node{i}")
            ingest(data, "wds", shards, "--shard", f"{i}/2")
            parts.append(sql(data, "SELECT key, source_shard FROM wds").to_pylist())
        # Three files over two nodes: files 0 and 2 on node 0, file 1 on
        # node 1; each node read only its own.
        assert {r["source_shard"] for r in parts[0]} == {"train-0000.tar", "train-0002.tar"}
        assert {r["source_shard"] for r in parts[1]} == {"train-0001.tar"}
        keys = [r["key"] for part in parts for r in part]
        assert sorted(keys) == sorted(k for k, _, _ in samples)
        # One file for two nodes: both read it, each keeps every other sample.
        one = os.path.join(shards, "train-0001.tar")
        halves = []
        for i in range(2):
            data = os.path.join(d, f"one{i}")
            ingest(data, "wds", one, "--shard", f"{i}/2")
            halves.append({r["key"] for r in sql(data, "SELECT key FROM wds").to_pylist()})
        assert halves[0] and halves[1] and not halves[0] & halves[1]
        assert len(halves[0] | halves[1]) == 4


def test_tfrecord_files_ingest_as_the_imagefolder_they_came_from():
    with tempfile.TemporaryDirectory() as d:
        src, samples = images(d)
        data = os.path.join(d, "data")
        ingest(data, "folder", src)
        classes = sorted({cls for _, cls, _ in samples})
        tf = os.path.join(d, "tf")
        os.makedirs(tf)
        with open(os.path.join(tf, "train-00000-of-00001.tfrecord"), "wb") as f:
            for key, cls, blob in samples:
                f.write(record(example({
                    "image/encoded": blob,
                    "image/class/label": classes.index(cls),
                    "image/filename": key.encode(),
                    "image/class/text": cls.encode(),
                })))
        # An index companion sits beside it, as TensorFlow tools write one.
        open(os.path.join(tf, "train-00000-of-00001.tfrecord.index"), "w").close()
        ingest(data, "tf", tf)
        want = folder_rows(data)
        got = sql(data, "SELECT key, image_class_text AS label, data, image_class_label "
                        "FROM tf ORDER BY key").to_pylist()
        assert [(r["key"], r["label"], r["data"]) for r in got] == \
            [(r["key"], r["label"], r["data"]) for r in want]
        assert [r["image_class_label"] for r in got] == \
            [classes.index(r["label"]) for r in want]


def hub_shards(hub, samples, classes):
    """`samples` as two Parquet shards in the Hub's layout: image {bytes,
    path}, label, text; row groups of 3, so objects come from several."""
    import pyarrow.parquet as pq

    for part, rows in enumerate([samples[:7], samples[7:]]):
        table = pa.table({
            "image": pa.array([{"bytes": b, "path": k} for k, _, b in rows],
                              pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            "label": pa.array([classes.index(c) for _, c, _ in rows], pa.int64()),
            "text": pa.array([c for _, c, _ in rows]),
        })
        pq.write_table(table, os.path.join(hub, f"train-{part:05d}-of-00002.parquet"),
                       row_group_size=3)


def test_parquet_with_the_images_inside_ingests_as_the_imagefolder():
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as d:
        src, samples = images(d)
        data = os.path.join(d, "data")
        ingest(data, "folder", src)
        hub = os.path.join(d, "hub")
        os.makedirs(hub)
        classes = sorted({cls for _, cls, _ in samples})
        # The Hub's layout: image {bytes, path}, label, text; small row
        # groups, so objects come from several.
        hub_shards(hub, samples, classes)
        report = ingest(data, "hub", hub)
        assert "image_path" in report and "label" in report, report
        want = folder_rows(data)
        got = sql(data, "SELECT key, text AS label, data, label AS idx, source_shard "
                        "FROM hub ORDER BY key").to_pylist()
        assert [(r["key"], r["label"], r["data"]) for r in got] == \
            [(r["key"], r["label"], r["data"]) for r in want]
        assert [r["idx"] for r in got] == [classes.index(r["label"]) for r in want]
        # A Parquet file with a `path` column is still a manifest.
        manifest = os.path.join(d, "manifest.parquet")
        pq.write_table(pa.table({"path": [os.path.join(src, k) for k, _, _ in samples]}),
                       manifest)
        ingest(data, "listed", manifest)
        n = sql(data, "SELECT count(*) AS n FROM listed").column("n")[0].as_py()
        assert n == len(samples)


def test_what_breaks_a_shard_is_named_and_nothing_else_is_lost():
    with tempfile.TemporaryDirectory() as d:
        _, samples = images(d)
        data = os.path.join(d, "data")
        shards = os.path.join(d, "broken")
        os.makedirs(shards)
        with tarfile.open(os.path.join(shards, "a.tar"), "w") as tar:
            for key, cls, blob in samples[:4]:
                add(tar, key, blob)
                add(tar, key.rsplit(".", 1)[0] + ".cls", cls.encode())
            add(tar, "lonely.cls", b"0")                 # no image member
            add(tar, samples[0][0], samples[0][2])        # its key again
            add(tar, "junk.jpg", b"not a jpeg at all")   # not an image
        whole = os.path.join(shards, "b.tar")
        with tarfile.open(whole, "w") as tar:
            for key, cls, blob in samples[4:8]:
                add(tar, key, blob)
        # Cut inside the last member's bytes.
        with tarfile.open(whole) as t:
            cut = t.getmembers()[-1].offset_data + 100
        with open(whole, "r+b") as f:
            f.truncate(cut)
        with open(os.path.join(shards, "c.tfrecord"), "wb") as f:
            for i, (key, cls, blob) in enumerate(samples[8:]):
                r = bytearray(record(example({"image/encoded": blob,
                                              "image/filename": key.encode()})))
                if i == 1:
                    r[20] ^= 0xFF
                f.write(r)
        report = ingest(data, "broken", shards, "--on-error", "skip")
        keys = sql(data, "SELECT key FROM broken ORDER BY key").column("key").to_pylist()
        good = sorted([k for k, _, _ in samples[:4]] + [k for k, _, _ in samples[4:7]]
                      + [samples[8][0]] + [k for k, _, _ in samples[10:]])
        assert keys == good, report
        lines = report.lower().splitlines()

        def said(name, why):
            return any(name.lower() in ln and why in ln for ln in lines)

        assert said("lonely", "no image"), report
        assert said(samples[0][0], "duplicate key"), report
        assert said("junk.jpg", "jpeg") or said("junk.jpg", "format"), report
        assert said(samples[7][0], "truncated"), report
        assert said("c.tfrecord/1", "crc"), report


def test_a_glob_of_shards_is_ingested_over_rest_beneath_the_ingest_root():
    import sluice

    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d)
        _, samples = images(d)
        shards = webdataset(os.path.join(d, "shards"), samples, shards=3)
        proc, rest = start_serve(d, env)
        try:
            c = sluice.Client(rest)
            report = c.ingest("wds", os.path.join(shards, "train-*.tar"))
            assert report["samples"] == 12, report
            assert "label" in report["columns"], report
            with pytest.raises(Exception) as outside:
                c.ingest("escape", "/etc/*.tar")
            assert "outside" in str(outside.value).lower() or "root" in str(outside.value)
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0


def test_a_1_gib_shard_is_ingested_in_bounded_memory():
    import numpy as np
    import sluice

    member = 8 << 20
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (member // 4,)})
    blob = header.getvalue() + bytes(member)
    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d, SLUICE_DEVICE_SIZE="2GiB", SLUICE_CHUNK_SIZE="4MiB")
        shard = os.path.join(d, "big.tar")
        with tarfile.open(shard, "w") as tar:
            for i in range(128):
                add(tar, f"{i:04d}.npy", blob)
                add(tar, f"{i:04d}.cls", str(i % 10).encode())
        assert os.path.getsize(shard) > 1 << 30
        proc, rest = start_serve(d, env)
        try:
            c = sluice.Client(rest)
            before = vm_hwm_mib(proc.pid)
            report = c.ingest("big", shard)
            grew = vm_hwm_mib(proc.pid) - before
            assert report["samples"] == 128 and not report["skipped"], report
            # Objects are read a member at a time: at most the load budget
            # (256 MiB) of them is held, plus the writer's writes in
            # flight. Measured: 300-560 MiB; reading the shard whole would
            # be over 1 GiB.
            assert grew < 640, f"peak RSS grew by {grew:.0f} MiB over a 1 GiB shard"
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0
