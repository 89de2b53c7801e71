#!/usr/bin/env python3
"""Many trainers at once against one `sluice serve`: `--streams` readers
(one rank each of a job with that world size) read epochs concurrently
over Flight — one epoch, or epoch after epoch for `--duration` seconds —
while a thread sends careless requests (bad SQL, unknown jobs, oversized
bodies). Every epoch a reader finishes must hold its share exactly once,
and the ranks of each epoch that all finished must cover the dataset.
Prints the aggregate samples/s, the time to each reader's first batch
(median, p99), the server's RSS over the run (a curve, its baseline before
the readers and after they left), and whether the server answered
/healthz throughout. A reader that fails is reported by name; the script
exits non-zero if any did, if a share was wrong, or if the server stopped
answering.

    python scripts/bench_load.py --sluice target/release/sluice --streams 64 --duration 600
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from sluice_server import Server  # noqa: E402


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def careless(url, stop, errors):
    """Bad requests in a loop; every answer must be a 4xx, never a hang."""
    bodies = [b'{"sql": "SELEC nonsense"}', b'{"sql": "SELECT * FROM nosuch"}',
              b"{not json", b'{"sql": "' + b"x" * (3 << 20) + b'"}']
    i = 0
    while not stop.is_set():
        req = urllib.request.Request(url + "/v1/jobs", data=bodies[i % len(bodies)],
                                     method="POST", headers={"content-type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=30)
            errors.append(f"bad request {i % len(bodies)} was accepted")
        except urllib.error.HTTPError as e:
            if not 400 <= e.code < 500:
                errors.append(f"bad request {i % len(bodies)}: HTTP {e.code}")
        except Exception as e:  # noqa: BLE001 (reported)
            errors.append(f"bad request {i % len(bodies)}: {e!r}")
        try:
            urllib.request.urlopen(url + "/v1/jobs/job-0-nosuch", timeout=30)
        except urllib.error.HTTPError as e:
            if e.code != 404:
                errors.append(f"unknown job: HTTP {e.code}")
        i += 1
        time.sleep(0.05)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sluice", required=True)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--per-class", type=int, default=200, help="images per class (8 classes)")
    p.add_argument("--size", type=int, default=96, help="crop side")
    p.add_argument("--duration", type=float, default=0,
                   help="read epoch after epoch for this many seconds (0: one epoch)")
    p.add_argument("--work", default=None)
    a = p.parse_args()
    if "/debug/" in a.sluice:
        print("warning: a debug build of sluice; these figures mean little", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=a.work) as work:
        subprocess.run([a.sluice, "gen-sample", os.path.join(work, "imgs"), "--classes", "8",
                        "--per-class", str(a.per_class)], check=True, capture_output=True)
        server = Server(a.sluice, work, work)
        with server as client:
            client.ingest("imgs", os.path.join(work, "imgs"))
            sql = (f"SELECT key, label, to_tensor(random_resized_crop(decode_image(data), "
                   f"{a.size}, {a.size})) AS image FROM imgs")
            epochs = 1 << 20 if a.duration else 1
            job = client.submit(sql, batch_size=8, world_size=a.streams, epochs=epochs,
                                shuffle={"seed": 1})
            status = job.wait()
            per_rank, samples = status["samples_per_rank"], status["samples"]
            first, failures, wrong = {}, [], []
            keys = {}  # (rank, epoch) -> keys read, for epochs read whole
            stop = threading.Event()
            errors = []
            bad = threading.Thread(target=careless, args=(client.url, stop, errors), daemon=True)
            curve = []  # (seconds since the readers started, RSS MB)
            health = []
            baseline = rss_mb(server.proc.pid)

            def watch():
                while not stop.is_set():
                    curve.append((time.perf_counter() - t0, rss_mb(server.proc.pid)))
                    try:
                        urllib.request.urlopen(client.url + "/healthz", timeout=10)
                        health.append(True)
                    except Exception:  # noqa: BLE001 (counted)
                        health.append(False)
                    time.sleep(0.5)

            def read(rank):
                start = time.perf_counter()
                epoch = 0
                try:
                    while True:
                        got = []
                        for b in job.reader(rank, epoch, numpy=True):
                            if rank not in first:
                                first[rank] = time.perf_counter() - start
                            got.extend(b["key"])
                        keys[(rank, epoch)] = got
                        if len(got) != per_rank or len(set(got)) != len(got):
                            wrong.append(f"rank {rank} epoch {epoch}: {len(got)} samples, "
                                         f"{len(set(got))} distinct, {per_rank} expected")
                        epoch += 1
                        if epoch >= epochs or time.perf_counter() - t0 >= a.duration:
                            return
                except Exception as e:  # noqa: BLE001 (reported)
                    failures.append(f"rank {rank} epoch {epoch}: {e}")

            t0 = time.perf_counter()
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            bad.start()
            readers = [threading.Thread(target=read, args=(r,)) for r in range(a.streams)]
            for t in readers:
                t.start()
            for t in readers:
                t.join()
            wall = time.perf_counter() - t0
            time.sleep(10)  # idle: what the server keeps once the readers left
            stop.set()
            bad.join(timeout=60)
            idle = rss_mb(server.proc.pid)
            total = sum(len(k) for k in keys.values())
            done = sorted({e for (_, e) in keys})
            for e in done:
                ranks = [keys[(r, e)] for r in range(a.streams) if (r, e) in keys]
                if len(ranks) == a.streams and len({k for r in ranks for k in r}) != samples:
                    wrong.append(f"epoch {e}: the ranks cover "
                                 f"{len({k for r in ranks for k in r})} of {samples} samples")
            ttfb = sorted(first.values())
            print(f"{a.streams} streams x {per_rank} samples ({a.size}x{a.size} crops), "
                  f"{len(keys)} rank-epochs read whole, epochs {done[0] if done else '-'}"
                  f"..{done[-1] if done else '-'}")
            print(f"  aggregate          {total / wall:8.0f} samples/s ({total} in {wall:.1f} s)")
            if ttfb:
                p99 = ttfb[min(len(ttfb) - 1, int(len(ttfb) * 0.99))]
                print(f"  first batch        median {statistics.median(ttfb):.2f} s, p99 {p99:.2f} s")
            peak = max((r for _, r in curve), default=0.0)
            print(f"  server RSS         baseline {baseline:.0f} MB, peak {peak:.0f} MB, "
                  f"idle after {idle:.0f} MB")
            step = max(1, len(curve) // 20)
            print("  RSS curve (s: MB)  " + ", ".join(
                f"{t:.0f}: {r:.0f}" for t, r in curve[::step]))
            print(f"  /healthz answered  {sum(health)}/{len(health)}")
            print(f"  careless requests  {'all 4xx' if not errors else errors[:3]}")
            print(f"  shares             {'exact' if not wrong else wrong[:3]}")
            ok = not failures and not errors and not wrong and all(health) and len(first) == a.streams
            for f in failures[:5]:
                print("  FAILED", f)
            sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
