"""A real S3-compatible server for the object-store tests: `s3s-fs`, the
file-backed server of the `s3s` project (crates.io), which the test
command installs (scripts/s3server.sh) and names in SLUICE_S3_SERVER.

It speaks S3's REST protocol with Signature V4, ranged GETs and paginated
ListObjectsV2, and keeps each bucket as a directory and each object as a
file under its root, so a test can lay a tree of objects down with plain
file writes and the server serves them. It runs as its own process on a
loopback port, and can be stopped and started again on the same port."""

import contextlib
import os
import shutil
import socket
import subprocess
import time

import pytest

ACCESS_KEY = "sluice-test-key"
SECRET_KEY = "sluice-test-secret-0123456789"


def server_binary():
    """The s3s-fs binary: SLUICE_S3_SERVER, else on PATH. Where the test
    command ran, it is there; a missing one fails under the test command
    (SLUICE_REQUIRE_S3=1) and is a named skip elsewhere."""
    path = os.environ.get("SLUICE_S3_SERVER") or shutil.which("s3s-fs")
    if path and os.path.exists(path):
        return path
    why = ("no S3 server: scripts/s3server.sh installs s3s-fs and sets SLUICE_S3_SERVER "
           "(the test command runs it)")
    if os.environ.get("SLUICE_REQUIRE_S3") == "1":
        raise AssertionError(why)
    pytest.skip(why)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """An s3s-fs over `root` on a loopback port (see the module docs)."""

    def __init__(self, root):
        self.root = root
        self.port = free_port()
        self.proc = None
        os.makedirs(root, exist_ok=True)

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        log = open(os.path.join(os.path.dirname(self.root), "s3s.log"), "a")
        self.proc = subprocess.Popen(
            [server_binary(), "--host", "127.0.0.1", "--port", str(self.port),
             "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY, self.root],
            stdout=log, stderr=log, env=dict(os.environ, RUST_LOG="warn"))
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "s3s-fs exited at start"
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=1):
                return self
            time.sleep(0.05)
        raise AssertionError("s3s-fs did not listen within 30 s")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None

    def put(self, bucket, key, data):
        """Lays object `key` of `bucket` down as the server keeps it."""
        path = os.path.join(self.root, bucket, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

    def bucket(self, bucket):
        os.makedirs(os.path.join(self.root, bucket), exist_ok=True)

    def env(self, base, **extra):
        """`base` with the credentials and endpoint of this server."""
        env = dict(base)
        for k in list(env):
            if k.startswith("AWS_"):
                del env[k]
        env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                   AWS_REGION="us-east-1", AWS_ENDPOINT_URL=self.endpoint)
        env.update(extra)
        return env


@contextlib.contextmanager
def s3_server(d):
    """A started S3Server under `d`, stopped after."""
    server = S3Server(os.path.join(d, "s3")).start()
    try:
        yield server
    finally:
        server.stop()
