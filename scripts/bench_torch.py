#!/usr/bin/env python3
"""sluice under PyTorch's DataLoader, measured in one run on the same
machine: samples/s of one epoch of a job read through
`sluice.torch.Dataset` under `torch.utils.data.DataLoader` with
`num_workers` 0 and 2 (workers started per epoch, DataLoader's default,
and persistent), beside the plain reader, median of `--runs` epochs after
a warm-up. Checkpoints have their own bench, `bench_checkpoint.py`.

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

from torch.utils.data import DataLoader

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from sluice_server import Server  # noqa: E402

import sluice  # noqa: E402


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
    p.add_argument("--per-class", type=int, default=100, help="images per class (8 classes)")
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--work", default=None, help="a directory on the disk to measure")
    a = p.parse_args()
    if "/debug/" in a.sluice:
        print("warning: a debug build of sluice; these figures mean little", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=a.work) as work:
        with Server(a.sluice, work, work) as client:
            bench_loader(a.sluice, client, work, a.per_class, a.runs, a.crop)


if __name__ == "__main__":
    main()
