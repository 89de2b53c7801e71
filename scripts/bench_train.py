#!/usr/bin/env python3
"""End to end: samples/s of the example training loop (examples/train.py's
softmax step) fed by a sluice job, vs a PyTorch-DataLoader-style baseline
reading the same files from the filesystem with PIL in a multiprocessing
pool, on the same cores, measured in one run.

Both produce uint8 [size, size, 3] images in shuffled batches of `--batch`
and run the same training step on them. sluice: `sluice serve` on this
machine, the job `decode_resize(data, size, size)` (JPEG decoded at a
reduced DCT scale), read with the Python client as numpy views. Baseline:
`multiprocessing.Pool(--workers)` mapping batches of paths to
`PIL.Image.open(p).convert("RGB").resize((size, size), BILINEAR)` stacked
with numpy — what a DataLoader with PIL transforms does, without torch (a
5 GB install; the numbers with torch are in docs/benchmarks.md when
measured). Figures: samples/s per epoch, median of `--runs` epochs after a
warm-up epoch each, and the ratio; and sluice's samples/s with the `block`
shuffle beside `full` (the read-pattern trade-off).
"""

import argparse
import atexit
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
from sluice_server import Server  # noqa: E402
from train import Softmax, features  # noqa: E402

SIZE = 64


def load(paths):
    """A batch of images as uint8 [n, SIZE, SIZE, 3] (the baseline's loader)."""
    out = np.empty((len(paths), SIZE, SIZE, 3), np.uint8)
    for i, p in enumerate(paths):
        with Image.open(p) as im:
            out[i] = np.asarray(im.convert("RGB").resize((SIZE, SIZE), Image.BILINEAR))
    return out


def step(model, images, labels):
    x = features(images)
    if model[0] is None:
        model[0] = Softmax(x.shape[1], 16)
    model[0].step(x, labels % 16)


def baseline_epoch(paths, labels, batch, workers, epoch, model):
    order = np.random.default_rng(epoch).permutation(len(paths))
    batches = [order[i:i + batch] for i in range(0, len(order), batch)]
    t0 = time.perf_counter()
    with multiprocessing.Pool(workers) as pool:
        n = 0
        for idx, images in zip(batches, pool.imap(load, [[paths[i] for i in b] for b in batches])):
            step(model, images, labels[idx])
            n += len(idx)
    return n / (time.perf_counter() - t0)


def sluice_epoch(job, epoch, classes, model):
    t0 = time.perf_counter()
    n = 0
    for b in job.reader(0, epoch, numpy=True):
        y = np.array([classes.setdefault(str(l), len(classes)) for l in b["label"]])
        step(model, b["image"], y)
        n += len(y)
    return n / (time.perf_counter() - t0)


def main():
    global SIZE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sluice", required=True)
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--per-class", type=int, default=100)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work")
    args = ap.parse_args()
    SIZE = args.size
    work = args.work or tempfile.mkdtemp(prefix="sluice-train-")
    if not args.work:
        atexit.register(shutil.rmtree, work, ignore_errors=True)
    src = os.path.join(work, "src", "pets")
    subprocess.run([args.sluice, "gen-sample", src, "--classes", str(args.classes),
                    "--per-class", str(args.per_class)], check=True, capture_output=True)
    paths, labels, names = [], [], {}
    for root, _, files in sorted(os.walk(src)):
        for f in sorted(files):
            paths.append(os.path.join(root, f))
            labels.append(names.setdefault(os.path.basename(root), len(names)))
    labels = np.array(labels)

    ours, base = [], []
    with Server(args.sluice, work, os.path.join(work, "src")) as client:
        client.ingest("pets", src)
        sql = f"SELECT key, label, to_tensor(decode_resize(data, {SIZE}, {SIZE})) AS image FROM pets"
        modes = {}
        for mode in ("full", "block"):
            job = client.submit(sql, batch_size=args.batch, epochs=2 * args.runs,
                                shuffle={"seed": 1, "mode": mode, "block_size": 16, "window": 256})
            job.wait()
            model, classes = [None], {}
            rates = []
            for r in range(args.runs):
                sluice_epoch(job, 2 * r, classes, model)  # warm-up
                rates.append(sluice_epoch(job, 2 * r + 1, classes, model))
            modes[mode] = statistics.median(rates)
            if mode == "full":
                ours = rates
    model = [None]
    for r in range(args.runs):
        baseline_epoch(paths, labels, args.batch, args.workers, 2 * r, model)  # warm-up
        base.append(baseline_epoch(paths, labels, args.batch, args.workers, 2 * r + 1, model))
    o, b = statistics.median(ours), statistics.median(base)
    print(f"end to end: {len(paths)} images (JPEG/PNG, ImageFolder) -> uint8 {SIZE}x{SIZE}x3, "
          f"batches of {args.batch}, softmax step, median of {args.runs} epochs")
    print(f"  sluice job (serve on this machine) + Python client  {o:9.1f} samples/s")
    print(f"  PIL + multiprocessing.Pool({args.workers}) from files          {b:9.1f} samples/s")
    print(f"  ratio sluice / baseline: {o / b:.2f}x")
    print(f"  sluice with block shuffle (runs of 16, window 256): {modes['block']:9.1f} samples/s "
          f"({modes['block'] / modes['full']:.2f}x full shuffle)")


if __name__ == "__main__":
    main()
