#!/usr/bin/env python3
"""Ingest from shards against ingest from the unpacked files, in one run.

The same images (`sluice gen-sample`, `--classes` x `--per-class`) are
ingested twice into fresh data dirs, alternately, `--runs` times each:

* as an ImageFolder (one file per image, class directories);
* as WebDataset shards of `--per-shard` samples (`<key>.jpg` + `<key>.cls`),
  made here with Python's `tarfile`: read in place, one pread per object.

It prints each ingest's median wall time and samples/s, their ratio, and
the system calls each made (`strace -c -f`, one extra run each, not
timed: strace slows what it counts). Then one full pass over each
ingested dataset — `sluice sql` decoding and resizing every image — so
the shard-ingested dataset is shown to read as fast as the other.

The page cache is dropped before each timed ingest when this runs as
root (`/proc/sys/vm/drop_caches`), so both read their sources from the
device; otherwise both read them warm, and it says so. Use the optimized
build (`cargo build --release`); only the standard library is needed:

    python3 scripts/bench_shards.py --sluice $CARGO_TARGET_DIR/release/sluice
"""

import argparse
import io
import os
import re
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time


def drop_caches():
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def shards(src, out, per_shard):
    """`src` (an ImageFolder) as WebDataset shards under `out`."""
    os.makedirs(out)
    files = sorted(
        (cls, f) for cls in sorted(os.listdir(src)) for f in os.listdir(os.path.join(src, cls)))
    tar = None
    for i, (cls, f) in enumerate(files):
        if i % per_shard == 0:
            if tar:
                tar.close()
            tar = tarfile.open(os.path.join(out, f"shard-{i // per_shard:05d}.tar"), "w")
        key = f"{cls}/{f}"
        tar.add(os.path.join(src, cls, f), arcname=key)
        info = tarfile.TarInfo(key.rsplit(".", 1)[0] + ".cls")
        label = cls.encode()
        info.size = len(label)
        tar.addfile(info, io.BytesIO(label))
    if tar:
        tar.close()
    return len(files)


def folder_and_shards(sluice, work, classes, per_class, per_shard, env):
    """The bench's data under `work`: a generated ImageFolder (`folder`,
    kept between runs) and the same samples as WebDataset tars of
    `per_shard` samples (`shards`, made afresh). Returns both paths and the
    sample count."""
    src = os.path.join(work, "folder")
    if not os.path.isdir(src):
        subprocess.run([sluice, "gen-sample", src, "--classes", str(classes),
                        "--per-class", str(per_class)], env=env, check=True,
                       capture_output=True)
    tars = os.path.join(work, "shards")
    shutil.rmtree(tars, ignore_errors=True)
    return src, tars, shards(src, tars, per_shard)


def ingest(sluice, data, name, source, env, strace=None):
    shutil.rmtree(data, ignore_errors=True)
    cmd = [sluice, "--data-dir", data, "ingest", name, source]
    if strace:
        cmd = ["strace", "-c", "-f", "-o", strace] + cmd
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return time.perf_counter() - t


def syscalls(path):
    """Total calls in an `strace -c` summary."""
    with open(path) as f:
        text = f.read()
    total = re.search(r"^\s*100\.00\s+\S+\s+\S+\s+(\d+)\s+(?:\d+\s+)?total$", text, re.M)
    return int(total.group(1)) if total else -1


def full_pass(sluice, data, name, env):
    sql = (f"SELECT key, resize(decode_image(data), 64, 64) AS img FROM {name}")
    t = time.perf_counter()
    subprocess.run([sluice, "--data-dir", data, "sql", sql, "--format", "arrow"],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sluice", required=True, help="the sluice binary (release build)")
    ap.add_argument("--classes", type=int, default=20)
    ap.add_argument("--per-class", type=int, default=1000)
    ap.add_argument("--per-shard", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", help="scratch directory (default: a temp dir)")
    args = ap.parse_args()
    if "/debug/" in os.path.realpath(args.sluice):
        raise SystemExit("use the optimized build (cargo build --release): this is a debug binary")
    work = args.work or tempfile.mkdtemp(prefix="sluice-bench-shards-")
    env = dict(os.environ, SLUICE_DEVICE_SIZE="8GiB", SLUICE_CHUNK_SIZE="16MiB")
    src, tars, n = folder_and_shards(args.sluice, work, args.classes, args.per_class,
                                     args.per_shard, env)
    size = sum(os.path.getsize(os.path.join(tars, f)) for f in os.listdir(tars))
    cold = drop_caches()
    print(f"{n} images ({size / n / 1024:.0f} KiB each on average), "
          f"{len(os.listdir(tars))} shards of {args.per_shard}; "
          f"{'page cache dropped before each ingest' if cold else 'sources warm (not root)'}")
    times = {"folder": [], "shards": []}
    data = os.path.join(work, "data")
    for _ in range(args.runs):
        for kind, source in (("folder", src), ("shards", tars)):
            drop_caches()
            times[kind].append(ingest(args.sluice, data, kind, source, env))
    for kind in times:
        med = statistics.median(times[kind])
        print(f"  ingest from {kind:7s} {med:7.2f} s median  {n / med:8.0f} samples/s  "
              f"(runs: {', '.join(f'{t:.2f}' for t in times[kind])})")
    ratio = statistics.median(times["folder"]) / statistics.median(times["shards"])
    print(f"  shards / folder: {ratio:.2f}x the samples/s")
    calls = {}
    for kind, source in (("folder", src), ("shards", tars)):
        out = os.path.join(work, f"strace-{kind}.txt")
        ingest(args.sluice, data, kind, source, env, strace=out)
        calls[kind] = syscalls(out)
    print(f"  system calls: folder {calls['folder']}, shards {calls['shards']}")
    # Both datasets in one data dir, each read once in full.
    both = os.path.join(work, "both")
    ingest(args.sluice, both, "folder", src, env)
    subprocess.run([args.sluice, "--data-dir", both, "ingest", "shards", tars],
                   env=env, check=True, capture_output=True)
    for kind in ("folder", "shards"):
        t = full_pass(args.sluice, both, kind, env)
        print(f"  a full pass (decode + resize) over the {kind:7s} dataset: {n / t:8.0f} images/s")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
