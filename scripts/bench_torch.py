#!/usr/bin/env python3
"""sluice under PyTorch, measured in one run on the same machine:

1. Checkpoints: `torch.save` of a state dict of random float32 tensors
   through `sluice.Checkpoint` (the commit makes it durable: the device is
   flushed before the version is visible) vs `torch.save` to a local file on
   the same disk followed by `os.fsync`; then `torch.load(weights_only=True)`
   through `sluice.Checkpoint.reader` vs from the local file, with the
   file's page cache dropped first (`posix_fadvise(DONTNEED)`; sluice reads
   with O_DIRECT, so it never reads from the page cache either). GB/s,
   median of `--runs`, and the ratios.
2. DataLoader: samples/s of one epoch of a job read through
   `sluice.torch.Dataset` under `torch.utils.data.DataLoader` with
   `num_workers` 0 and 2 (workers started per epoch, DataLoader's default,
   and persistent), beside the plain reader, median of `--runs` epochs
   after a warm-up.

Run it on the optimized build (`cargo build --release`); a debug build is
slower at everything and its figures mean little.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from sluice_server import Server  # noqa: E402

import sluice  # noqa: E402


def state_of(nbytes):
    """A model-like state dict: tensors of 4 MiB or less, `nbytes` in all."""
    g = torch.Generator().manual_seed(0)
    left, i, state = nbytes, 0, {}
    while left > 0:
        n = min(left, 4 << 20) // 4
        state[f"layer{i}.weight"] = torch.rand(max(n, 1), generator=g)
        left -= n * 4
        i += 1
    return state


def local_round(state, path):
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    write = time.perf_counter() - t0
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        torch.load(f, weights_only=True)
    return write, time.perf_counter() - t0


def sluice_round(state, ck, name):
    t0 = time.perf_counter()
    with ck.writer(name) as f:
        torch.save(state, f)
    write = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ck.reader(name) as f:
        torch.load(f, weights_only=True)
    return write, time.perf_counter() - t0


def bench_checkpoints(client, sizes, runs, work):
    ck = sluice.Checkpoint(client, "bench")
    print("checkpoints (GB/s, median of %d; local: torch.save + fsync, cold torch.load)" % runs)
    print(f"{'size':>9} {'local w':>8} {'sluice w':>9} {'ratio':>6} {'local r':>8} "
          f"{'sluice r':>9} {'ratio':>6}")
    for size in sizes:
        state = state_of(size)
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        lw, lr, sw, sr = [], [], [], []
        for run in range(runs):
            w, r = local_round(state, os.path.join(work, "local.pt"))
            lw.append(w)
            lr.append(r)
            w, r = sluice_round(state, ck, f"s{size}.pt")
            sw.append(w)
            sr.append(r)
        os.remove(os.path.join(work, "local.pt"))
        ck.delete(f"s{size}.pt")
        g = lambda ts: nbytes / statistics.median(ts) / 1e9  # noqa: E731
        print(f"{nbytes / 2**20:>7.0f}Mi {g(lw):>8.2f} {g(sw):>9.2f} {g(sw) / g(lw):>5.2f}x "
              f"{g(lr):>8.2f} {g(sr):>9.2f} {g(sr) / g(lr):>5.2f}x", flush=True)


def epoch_rate(make_iter, samples):
    t0 = time.perf_counter()
    n = 0
    for b in make_iter():
        n += len(b["key"])
    assert n == samples, (n, samples)
    return n / (time.perf_counter() - t0)


def bench_loader(binary, client, root, per_class, runs, size):
    subprocess.run([binary, "gen-sample", os.path.join(root, "imgs"), "--classes", "8",
                    "--per-class", str(per_class)], check=True, capture_output=True)
    client.ingest("imgs", os.path.join(root, "imgs"))
    sql = (f"SELECT key, label, to_tensor(random_resized_crop(decode_image(data), {size}, "
           f"{size})) AS image FROM imgs")
    job = client.submit(sql, batch_size=32, epochs=4 * (runs + 1), shuffle={"seed": 1})
    samples = job.wait()["samples_per_rank"]
    ds = sluice.torch.Dataset(job)
    epoch = iter(range(100))

    def plain():
        return job.reader(0, next(epoch), numpy=True)

    def loader(workers, persistent=False):
        dl = DataLoader(ds, batch_size=None, num_workers=workers,
                        persistent_workers=persistent)

        def make():
            ds.set_epoch(next(epoch))
            return dl
        return make

    print(f"DataLoader over a job ({samples} samples/epoch, {size}x{size} crops; samples/s, "
          f"median of {runs} epochs after a warm-up)")
    # Workers first: forked before this process used Flight, they read
    # over Flight themselves (forked after, they would relay through a new
    # process each, see sluice._relay).
    for label, make in [("num_workers=2, persistent", loader(2, True)),
                        ("num_workers=2", loader(2)), ("num_workers=0", loader(0)),
                        ("plain reader", plain)]:
        epoch_rate(make, samples)
        rates = [epoch_rate(make, samples) for _ in range(runs)]
        print(f"  {label:<26} {statistics.median(rates):>8.0f}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sluice", required=True, help="the sluice binary (a release build)")
    p.add_argument("--sizes", default="64,512", help="checkpoint sizes in MiB")
    p.add_argument("--per-class", type=int, default=100, help="images per class (8 classes)")
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--work", default=None, help="a directory on the disk to measure")
    p.add_argument("--skip-loader", action="store_true", help="checkpoints only")
    a = p.parse_args()
    if "/debug/" in a.sluice:
        print("warning: a debug build of sluice; these figures mean little", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=a.work) as work:
        with Server(a.sluice, work, work) as client:
            if not a.skip_loader:
                bench_loader(a.sluice, client, work, a.per_class, a.runs, a.crop)
            bench_checkpoints(client, [int(s) << 20 for s in a.sizes.split(",")], a.runs, work)


if __name__ == "__main__":
    main()
