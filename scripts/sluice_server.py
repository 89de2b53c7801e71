"""A `sluice serve` process for the benchmarks: started on free loopback
ports over a fresh data dir, stopped with SIGTERM."""

import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import sluice  # noqa: E402


class Server:
    """`with Server(binary, work_dir, ingest_root) as client:` — a
    `sluice.Client` of a running server."""

    def __init__(self, binary, work, ingest_root, extra=(), device_size="4GiB", preexec=None):
        self.binary = binary
        self.preexec = preexec
        self.device_size = device_size
        self.work = work
        self.root = ingest_root
        self.extra = list(extra)
        self.proc = None

    def __enter__(self):
        env = dict(os.environ, SLUICE_DATA_DIR=os.path.join(self.work, "data"),
                   SLUICE_DEVICE_SIZE=self.device_size)
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--rest", "127.0.0.1:0", "--flight", "127.0.0.1:0",
             "--ingest-root", self.root, *self.extra],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            preexec_fn=self.preexec)
        rest = None
        for _ in range(2):
            line = self.proc.stdout.readline()
            if line.startswith("REST API on "):
                rest = line.split()[3]
        if rest is None:
            self.proc.kill()
            sys.exit("sluice serve did not start")
        return sluice.Client(rest)

    def cpu_seconds(self):
        """CPU time (user + system) the server has used so far."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def cpu_by_thread(self):
        """CPU seconds the server's threads have used so far, summed by
        thread name: `sluice-cpu` (the executor its jobs and in-process
        storage node compute on), `sluice-service` (the runtime that
        answers Flight and REST, and its blocking pool, which writes the
        shared-memory slots), `sluice-storage` (a storage node's own
        executor), the I/O threads. Threads that ended are not counted."""
        out = {}
        tick = os.sysconf("SC_CLK_TCK")
        task = f"/proc/{self.proc.pid}/task"
        for tid in os.listdir(task):
            try:
                with open(f"{task}/{tid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat.rsplit(")", 1)[1].split()
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        return out

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        return False
