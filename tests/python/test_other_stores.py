"""Ingest from GCS (``gs://``), Azure Blob Storage (``az://``) and a plain
HTTP store (``http://``, listed over WebDAV), each against a real server
of its protocol run as its own process on loopback (``stores.py``): the
same layouts as from S3 (test_object_store.py) and from local files, with
the same keys, bytes and labels; a store's own faults named by the URL
and the store's code, committing nothing."""

import os
import tempfile

import pytest

from stores import AzureServer, DavServer, GcsServer, started
from test_object_store import (ENV, datasets, folder, ingest, put_manifest, rows, run,
                               upload_tree)

KINDS = [GcsServer, AzureServer, DavServer]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_each_layout_from_the_store_equals_the_local_one(kind):
    from test_shards import hub_shards, images, webdataset

    with tempfile.TemporaryDirectory() as d, started(kind, d) as store:
        data = os.path.join(d, "data")
        env = store.env(ENV)
        # ImageFolder: class prefixes become `label`.
        src = folder(d)
        upload_tree(store, "train", "pets", src)
        ingest(data, ENV, "local", src)
        report = ingest(data, env, "remote", store.url("train", "pets"))
        assert report["samples"] == 12, report
        assert report["requests"]["requests"] >= 13, report  # a listing, then a GET each
        q = "SELECT key, label, data, crc32c FROM {} ORDER BY key"
        assert rows(data, q.format("remote")) == rows(data, q.format("local"))
        # A manifest in the store, its rows relative to it.
        put_manifest(store, src)
        ingest(data, ENV, "man_local", os.path.join(src, "m.csv"))
        ingest(data, env, "man_remote", store.url("train", "pets/m.csv"))
        q = "SELECT key, split, data FROM {} ORDER BY key"
        got = rows(data, q.format("man_remote"))
        assert got == rows(data, q.format("man_local")) and len(got) == 12
        # WebDataset tar shards, members read as byte ranges.
        os.makedirs(os.path.join(d, "shards"))
        _, samples = images(os.path.join(d, "shards"))
        wds = webdataset(os.path.join(d, "wds"), samples, shards=3)
        upload_tree(store, "train", "wds", wds)
        ingest(data, ENV, "wds_local", wds)
        ingest(data, env, "wds_remote", store.url("train", "wds"))
        q = "SELECT key, label, source_shard, source_offset, data FROM {} ORDER BY key"
        got = rows(data, q.format("wds_remote"))
        assert got == rows(data, q.format("wds_local")) and len(got) == 12
        # Parquet with the images inside (the Hugging Face Hub's layout).
        hub = os.path.join(d, "hub")
        os.makedirs(hub)
        hub_shards(hub, samples, sorted({cls for _, cls, _ in samples}))
        upload_tree(store, "train", "hub", hub)
        ingest(data, ENV, "hub_local", hub)
        ingest(data, env, "hub_remote", store.url("train", "hub"))
        q = "SELECT key, label, text, source_shard, data, crc32c FROM {} ORDER BY key"
        got = rows(data, q.format("hub_remote"))
        assert got == rows(data, q.format("hub_local")) and len(got) == 12


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_a_missing_bucket_or_path_is_named_and_commits_nothing(kind):
    with tempfile.TemporaryDirectory() as d, started(kind, d) as store:
        data = os.path.join(d, "data")
        store.put("train", "pets/a.npy", b"x")
        url = store.url("no-such-bucket", "pets")
        p = run(data, store.env(ENV), "ingest", "pets", url)
        assert p.returncode != 0, p.stdout
        assert url in p.stderr, p.stderr
        # The store's own word for it (fake-gcs-server answers a listing of
        # a missing bucket with a 500 that names it, GCS itself a 404; an
        # HTTP store's 404 to PROPFIND is an empty listing to object_store).
        said = {"fake-gcs-server": ["no bucket named no-such-bucket", "notFound"],
                "azurite": ["ContainerNotFound"],
                "wsgidav": ["no objects under this prefix"]}[kind.name]
        assert any(w.lower() in p.stderr.lower() for w in said), p.stderr
        assert datasets(data) == []


def test_a_wrong_azure_key_is_named_and_never_shown():
    with tempfile.TemporaryDirectory() as d, started(AzureServer, d) as store:
        data = os.path.join(d, "data")
        src = folder(d, classes=2, per_class=2)
        upload_tree(store, "train", "pets", src)
        wrong = "d3Jvbmcta2V5LW5vdC10aGUtZW11bGF0b3JzLW93bi1rZXktYXQtYWxs"
        p = run(data, store.env(ENV, key=wrong), "ingest", "pets", store.url("train", "pets"))
        assert p.returncode != 0, p.stdout
        # Azurite's code for it; Azure itself says AuthenticationFailed.
        assert "AuthorizationFailure" in p.stderr or "AuthenticationFailed" in p.stderr, p.stderr
        assert "az://train/pets" in p.stderr and wrong not in p.stderr, p.stderr
        assert datasets(data) == []
        # The right key (the emulator's own, the default) reads it.
        assert ingest(data, store.env(ENV), "pets", store.url("train", "pets"))["samples"] == 4


def test_a_gzipped_shard_on_a_plain_web_server_is_read_in_one_get():
    """Python's own http.server answers no Range and no PROPFIND: a
    .tar.gz named by its URL is still read (one GET of the whole object,
    inflated as it arrives), equal to the same shard read locally."""
    import gzip
    import subprocess
    import sys

    from s3server import free_port
    from stores import wait_listening
    from test_shards import images, webdataset

    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "data")
        _, samples = images(d)
        wds = webdataset(os.path.join(d, "wds"), samples, shards=1)
        web = os.path.join(d, "web")
        os.makedirs(web)
        with open(os.path.join(wds, "train-0000.tar"), "rb") as f:
            packed = gzip.compress(f.read())
        for where in (web, os.path.join(d, "local")):
            os.makedirs(where, exist_ok=True)
            with open(os.path.join(where, "train-0000.tar.gz"), "wb") as f:
                f.write(packed)
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                                 "127.0.0.1", "--directory", web],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_listening(proc, port, "http.server")
            report = ingest(data, ENV, "web", f"http://127.0.0.1:{port}/train-0000.tar.gz")
            assert report["samples"] == len(samples), report
            ingest(data, ENV, "local", os.path.join(d, "local"))
            q = "SELECT key, label, source_shard, data FROM {} ORDER BY key"
            assert rows(data, q.format("web")) == rows(data, q.format("local"))
        finally:
            proc.kill()
            proc.wait(timeout=30)
