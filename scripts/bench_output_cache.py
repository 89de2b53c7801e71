#!/usr/bin/env python3
"""Epochs of a job with one of the node's caches of computed values on and
off, in one run.

A `sluice serve` (the optimized build) over `--data` (an ImageFolder, e.g.
the loader bench's JPEGs) runs `--sql` for `--epochs` epochs, once with
the cache at its default and once with it off:

* `--cache output` (the default): the compute node's output cache, with
  a deterministic job (decode + resize: no random stage, so its rows may
  be kept), off with `SLUICE_OUTPUT_CACHE_MEMORY=0`;
* `--cache stage`: the stage cache, with a random job (decode + resize,
  then a random flip: the decode is kept, the flip is made every epoch),
  off with `SLUICE_STAGE_CACHE_MEMORY=0`.

One trainer rank reads every epoch through the Python client (shared
memory on this host), dropping each batch as a trainer does. Printed per
epoch: samples/s, the server's and the client's CPU seconds, the cache's
hits; and whether every row (by key) is the same bytes with the cache on
and off, epoch by epoch (and, for the deterministic job, in every epoch).
"""

import argparse
import hashlib
import os
import re
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluice_server import Server  # noqa: E402

SQL = {
    "output": "SELECT key, label, to_tensor(resize(decode_image(data), 160, 160)) AS x FROM ds",
    "stage": "SELECT key, label, to_tensor(random_horizontal_flip("
             "resize(decode_image(data), 160, 160))) AS x FROM ds",
}


def metric(url, name):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def run(args, cache_off):
    """Each epoch's (samples/s, server CPU s, client CPU s, hits) and the
    rows' digests by key per epoch."""
    env = os.environ.copy()
    if cache_off:
        os.environ[f"SLUICE_{args.cache.upper()}_CACHE_MEMORY"] = "0"
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-outcache-") as work:
            server = Server(args.sluice, work, os.path.dirname(os.path.abspath(args.data)))
            with server as c:
                c.ingest("ds", args.data)
                job = c.submit(args.sql, batch_size=args.batch, epochs=args.epochs,
                               shuffle={"seed": 1})
                job.wait()
                rows, digests = [], []
                for e in range(args.epochs):
                    s0, c0, t0 = server.cpu_seconds(), time.process_time(), time.perf_counter()
                    n, digest = 0, {}
                    for b in job.reader(0, e).batches():
                        n += b.num_rows
                        flat = b.column("x").storage.flatten().to_numpy()
                        size = len(flat) // max(b.num_rows, 1)
                        for i, k in enumerate(b.column("key").to_pylist()):
                            digest[k] = hashlib.sha1(flat[i * size:(i + 1) * size].tobytes()).digest()
                        del b, flat
                    wall = time.perf_counter() - t0
                    rows.append((n / wall, server.cpu_seconds() - s0, time.process_time() - c0,
                                 metric(c.url, f"sluice_{args.cache}_cache_hits_total")))
                    digests.append(digest)
                return rows, digests
    finally:
        os.environ.clear()
        os.environ.update(env)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sluice", required=True, help="the optimized sluice binary")
    ap.add_argument("--data", required=True, help="an ImageFolder of images")
    ap.add_argument("--cache", choices=sorted(SQL), default="output")
    ap.add_argument("--sql", help="the job (default: one for --cache)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    args.sql = args.sql or SQL[args.cache]
    results = {}
    on_label, off_label = f"{args.cache} cache on", f"{args.cache} cache off"
    for label, off in ((on_label, False), (off_label, True)):
        results[label] = run(args, off)
    print(f"{args.sql}\n{args.epochs} epochs, batches of {args.batch}, one rank, shared memory")
    for label, (rows, _) in results.items():
        print(f"  {label}:")
        for e, (rate, srv, cli, hits) in enumerate(rows):
            print(f"    epoch {e}: {rate:9.1f} samples/s  server CPU {srv:.2f} s  "
                  f"client CPU {cli:.2f} s  cache hits so far {hits:.0f}")
    on, off = results[on_label], results[off_label]
    later = [a[0] / b[0] for a, b in zip(on[0][1:], off[0][1:])]
    if later:
        print("  later epochs, on / off: " + ", ".join(f"{r:.1f}x" for r in later))
    same = all(a == b for a, b in zip(on[1], off[1]))
    if args.cache == "output":
        same = same and all(d == on[1][0] for d in on[1])
    print(f"  every row the same bytes with the cache on and off (and, for a deterministic "
          f"job, in every epoch): {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
