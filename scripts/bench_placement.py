#!/usr/bin/env python3
"""The placement grid: every fixed cut and `auto`, under different links and
storage cores, measured end to end in one run.

Grid: pipeline {small JPEG classification, large photos -> 224^2, npz volume
crop, video clips} x link {unlimited, 10 Gbit/s, 1 Gbit/s} x storage cores
{1, 2}. The storage side is sluice's in-process storage node with its own
runtime of N threads (`--storage-cores`) and a token bucket on its outgoing
link (`--link-limit`); compute runs with 2 cores. Each cell runs every fixed
cut (`--offload K`) and `--offload auto` as `sluice sql ... --format arrow`
(output discarded) and prints samples/s (median of --runs, minus the
process's start-up time measured on an empty query), the bytes over the link
per sample that the planner estimates for the cut, and auto's ratio to the
best fixed cut.

The two sides share the machine's cores, so on a 2-core machine a cell with
2 storage cores oversubscribes it: the planner assumes separate machines.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_udfs import write_clips, write_images  # noqa: E402

PIPELINES = [
    ("small JPEG classification", "small",
     "SELECT key, normalize(random_horizontal_flip(random_resized_crop(decode_image(data), 224, 224)), "
     "[0.485, 0.456, 0.406], [0.229, 0.224, 0.225]) AS img FROM small"),
    ("large photos -> 224^2", "large",
     "SELECT key, to_tensor(resize(decode_image(data), 224, 224)) AS img FROM large"),
    ("npz volume crop", "vols",
     "SELECT key, to_tensor(crop3d(npz(data, 'image'), 16, 32, 32, 32, 64, 64), 'float32') AS v FROM vols"),
    ("video clips", "clips",
     "SELECT key, decode_video(data, 16, 112, 112) AS clip FROM clips"),
]
LINKS = [("unlimited", None), ("10 Gbit/s", "10Gbit"), ("1 Gbit/s", "1Gbit")]
CORES = [1, 2]


def write_volumes(d, n):
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        vol = rng.standard_normal((64, 128, 128), dtype=np.float32)
        np.savez(os.path.join(d, f"vol{i:04d}.npz"), image=vol)


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {p.stderr}")


def timed(cmd, runs):
    walls = []
    for _ in range(runs):
        t = time.perf_counter()
        run(cmd)
        walls.append(time.perf_counter() - t)
    return statistics.median(walls)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sluice", default="sluice")
    ap.add_argument("--small", type=int, default=400)
    ap.add_argument("--large", type=int, default=16)
    ap.add_argument("--vols", type=int, default=24)
    ap.add_argument("--clips", type=int, default=24)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", default=None, help="directory for inputs and data (default: a temp dir)")
    a = ap.parse_args()

    work = a.work or tempfile.mkdtemp(prefix="sluice-placement-")
    data = os.path.join(work, "data")
    base = [a.sluice, "--data-dir", data]
    counts = {"small": a.small, "large": a.large, "vols": a.vols, "clips": a.clips}
    if not os.path.exists(data):
        print(f"generating inputs in {work} …", file=sys.stderr)
        write_images(os.path.join(work, "small"), a.small, 500, 375)
        write_images(os.path.join(work, "large"), a.large, 4000, 3000)
        write_volumes(os.path.join(work, "vols"), a.vols)
        write_clips(os.path.join(work, "clips"), a.clips)
        for name in counts:
            run(base + ["ingest", name, os.path.join(work, name)])

    startup = timed(base + ["sql", "SELECT 1"], max(a.runs, 3))
    print(f"process start-up: {startup * 1000:.0f} ms (subtracted)\n")
    print("| pipeline | link | storage cores | cut | on storage | est bytes/sample | samples/s | auto / best |")
    print("|---|---|---|---|---|---|---|---|")
    summary = []
    for title, ds, sql in PIPELINES:
        n = counts[ds]
        for link_name, link in LINKS:
            for cores in CORES:
                knobs = ["--storage-cores", str(cores), "--compute-cores", "2"]
                if link:
                    knobs += ["--link-limit", link]
                out = subprocess.run(base + ["explain", sql, "--format", "json"] + knobs,
                                     capture_output=True, text=True, check=True).stdout
                plan = json.loads(out)["pipelines"][0]
                rates = {}
                for c in plan["candidates"]:
                    wall = timed(base + ["sql", sql, "--format", "arrow", "--offload", str(c["cut"])] + knobs, a.runs)
                    rates[c["cut"]] = n / max(wall - startup, 1e-3)
                wall = timed(base + ["sql", sql, "--format", "arrow", "--offload", "auto"] + knobs, a.runs)
                auto = n / max(wall - startup, 1e-3)
                best_cut = max(rates, key=rates.get)
                ratio = auto / rates[best_cut]
                choice = plan["choice"]
                chosen = f"cut {choice['cut']}" if choice["kind"] == "cut" else \
                    f"split {choice['above']}/{choice['below']}"
                for c in plan["candidates"]:
                    on = ", ".join(c["on_storage"]) or "(read only)"
                    mark = " (best)" if c["cut"] == best_cut else ""
                    print(f"| {title} | {link_name} | {cores} | {c['cut']}{mark} | {on} | "
                          f"{c['rates']['bytes_per_sample'] / 1024:.0f} KiB | {rates[c['cut']]:.1f} | |")
                print(f"| {title} | {link_name} | {cores} | auto → {chosen} | | "
                      f"{plan['rates']['bytes_per_sample'] / 1024:.0f} KiB | {auto:.1f} | {ratio:.2f} |")
                compute_only = rates[0]
                summary.append((title, link_name, cores, ratio, auto / compute_only,
                                plan["candidates"][0]["rates"]["bytes_per_sample"]
                                / max(plan["rates"]["bytes_per_sample"], 1.0)))
                sys.stdout.flush()
    print("\n| pipeline | link | storage cores | auto / best cut | auto / compute-only | bytes: compute-only / auto |")
    print("|---|---|---|---|---|---|")
    for t, l, c, r, vs_compute, bytes_ratio in summary:
        print(f"| {t} | {l} | {c} | {r:.2f} | {vs_compute:.2f} | {bytes_ratio:.1f}x |")
    within = sum(1 for s in summary if s[3] >= 0.95)
    print(f"\nauto within 95% of the best fixed cut in {within} of {len(summary)} cells")


if __name__ == "__main__":
    main()
