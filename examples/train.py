#!/usr/bin/env python3
"""A minimal CPU training loop fed by sluice.

Submits a pipeline (SQL or YAML plan) as a job to a running `sluice serve`,
prints where its stages run, then trains a softmax classifier with numpy on
the batches of rank 0 (or every rank in turn with --world-size N) and prints
samples/s per epoch. The tensors arrive as numpy views of the Arrow buffers.

    python examples/train.py --url http://127.0.0.1:8080 --pipeline examples/pipelines/pets.yaml
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import sluice  # noqa: E402


class Softmax:
    """Multinomial logistic regression on flattened, scaled pixels."""

    def __init__(self, features: int, classes: int, lr: float = 0.05, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.w = rng.normal(0, 0.01, (features, classes)).astype(np.float32)
        self.b = np.zeros(classes, np.float32)
        self.lr = lr

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """One SGD step on a batch; returns its loss."""
        logits = x @ self.w + self.b
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        n = len(y)
        loss = float(-np.log(p[np.arange(n), y] + 1e-9).mean())
        p[np.arange(n), y] -= 1
        self.w -= self.lr * (x.T @ p) / n
        self.b -= self.lr * p.mean(axis=0)
        return loss


def features(images: np.ndarray) -> np.ndarray:
    """[n, ...] uint8 or float tensors → [n, f] float32 in about [-1, 1]."""
    x = images.reshape(len(images), -1).astype(np.float32)
    return x / 127.5 - 1.0 if images.dtype == np.uint8 else x


def train(batches, model_holder, classes, column="image"):
    """Trains on `batches` (dicts of numpy arrays); returns (samples, loss)."""
    samples, losses = 0, []
    for b in batches:
        x = features(b[column])
        y = np.array([classes.setdefault(str(l), len(classes)) for l in b["label"]])
        if model_holder[0] is None:
            model_holder[0] = Softmax(x.shape[1], 16)
        losses.append(model_holder[0].step(x, y % 16))
        samples += len(y)
    return samples, (float(np.mean(losses)) if losses else float("nan"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default=os.environ.get("SLUICE_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--token", default=os.environ.get("SLUICE_TOKEN"))
    ap.add_argument("--pipeline", default=os.path.join(os.path.dirname(__file__), "pipelines", "pets.yaml"))
    ap.add_argument("--column", default="image", help="the tensor column to train on")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--offload", default="auto")
    args = ap.parse_args()

    client = sluice.Client(args.url, token=args.token)
    with open(args.pipeline) as f:
        pipeline = f.read()
    if args.pipeline.endswith(".sql"):
        pipeline = "\n".join(l for l in pipeline.splitlines() if not l.strip().startswith("--"))
    job = client.submit(pipeline, batch_size=args.batch_size, epochs=args.epochs,
                        world_size=args.world_size, shuffle={"seed": args.seed},
                        on_error="skip", offload=args.offload)
    st = job.wait()
    print(f"job {job.id}: {st['samples']} samples, {st['samples_per_rank']} per rank per epoch")
    print(job.explain()["text"])
    model, classes = [None], {}
    total, t_all = 0, time.perf_counter()
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        n, loss = 0, float("nan")
        for rank in range(args.world_size):
            got, loss = train(job.reader(rank, epoch, numpy=True), model, classes, args.column)
            n += got
        dt = time.perf_counter() - t0
        total += n
        print(f"epoch {epoch}: {n} samples, loss {loss:.3f}, {n / dt:.1f} samples/s")
    dt = time.perf_counter() - t_all
    st = job.status()
    print(f"trained on {total} samples in {dt:.2f} s: {total / dt:.1f} samples/s "
          f"(job {st['state']}, progress {st['progress']:.0%}, skipped {st['skipped']}, "
          f"bytes link {st['bytes']['link']} trainer {st['bytes']['trainer']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
