"""A real headless Chromium, driven over the Chrome DevTools Protocol on
its `--remote-debugging-pipe` (fd 3 in, fd 4 out, messages ended by a NUL
byte): no WebDriver, no websocket library, no port to open. Enough for
the dashboard's test: open a page, evaluate JavaScript, wait for a
condition, take a screenshot."""

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time


def chromium():
    """The Chromium binary, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class BrowserError(Exception):
    pass


class Browser:
    """One headless Chromium with one page; close it with `close()` (or
    use it as a context manager)."""

    def __init__(self, binary, width=1280, height=1600):
        self.profile = tempfile.mkdtemp(prefix="sluice-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def fds():
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.log = open(os.path.join(self.profile, "chromium.log"), "w")
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
             "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
            preexec_fn=fds, close_fds=False)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next = 0
        self._buf = b""
        self.session = None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.console = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.call("Browser.close", timeout=5, session=False)
            except Exception:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def _read(self, deadline):
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise BrowserError("Chromium did not answer in time")
            if self.proc.poll() is not None:
                raise BrowserError(f"Chromium exited with {self.proc.returncode}")
            ready, _, _ = select.select([self._from_chrome], [], [], 0.2)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    raise BrowserError("Chromium closed its pipe")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, timeout=30, session=True, **params):
        """Sends a command (to the page's session unless `session` is
        False) and returns its result."""
        self._next += 1
        msg = {"id": self._next, "method": method, "params": params}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read(deadline)
            if m.get("method") == "Runtime.consoleAPICalled":
                self.console.append(" ".join(
                    str(a.get("value", a.get("description", ""))) for a in m["params"]["args"]))
            if m.get("id") == self._next:
                if "error" in m:
                    raise BrowserError(f"{method}: {m['error']}")
                return m.get("result", {})

    def open(self, url):
        self.call("Page.navigate", url=url)
        self.wait("document.readyState === 'complete'", timeout=30)

    def eval(self, expression):
        """The value of a JavaScript expression (promises awaited)."""
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                      awaitPromise=True)
        if "exceptionDetails" in r:
            raise BrowserError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expression, timeout=30, what=None):
        """Waits until `expression` is truthy; returns its value (a DOM
        node comes back as an empty object: wait on `!!node`)."""
        deadline = time.monotonic() + timeout
        while True:
            v = self.eval(expression)
            if v:
                return v
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out waiting for {what or expression}")
            time.sleep(0.2)

    def screenshot(self, path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path
