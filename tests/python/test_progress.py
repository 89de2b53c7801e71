"""Progress on long work: `sluice ingest` shows samples, samples/s,
bytes/s and an ETA when stderr is a terminal (a pseudo-terminal made by
`script`), and stays quiet when it is a pipe."""

import os
import shlex
import subprocess
import tempfile

from serve import SLUICE, generate, serve_env


def test_ingest_shows_progress_on_a_terminal_and_not_in_pipes():
    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d)
        src = generate(d, env, "pets", 4, 150)
        data = os.path.join(d, "data")
        cmd = [SLUICE, "--data-dir", data, "ingest", "tty", src]
        tty = subprocess.run(["script", "-q", "-e", "-c", shlex.join(cmd), "/dev/null"],
                             env=env, capture_output=True, text=True, timeout=300)
        assert tty.returncode == 0, tty.stdout + tty.stderr
        out = tty.stdout
        assert "/600 samples (" in out and "eta" in out and "/s)" in out, out[-2000:]
        assert "ingested 'tty' version 1: 600 samples" in out, out[-2000:]

        piped = subprocess.run([SLUICE, "--data-dir", data, "ingest", "piped", src], env=env,
                               capture_output=True, text=True, timeout=300)
        assert piped.returncode == 0, piped.stderr
        assert "ingested 'piped' version 1: 600 samples" in piped.stdout
        assert "eta" not in piped.stderr and "samples (" not in piped.stderr, piped.stderr
        assert "\x1b[" not in piped.stdout + piped.stderr, "escape codes in a pipe"
