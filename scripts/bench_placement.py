#!/usr/bin/env python3
"""The placement grid on a real link: every fixed cut and `auto`, for each
pipeline, link and storage-core count, measured end to end on the rig of
`scripts/rig.sh` (a storage host and the coordinator in network
namespaces, the storage host's egress shaped by the kernel's token bucket
filter, each side pinned to its own CPUs); and, on the embedded default
(one process, one pool of cores), `auto` against `offload=storage` and
`offload=compute` on photos with the standard training transform.

Grid: pipeline {small JPEG classification, large photos -> 224^2, npz
volume crop, video clips} x link {100 Mbit/s, 1 Gbit/s, 10 Gbit/s} x
storage cores {1; and 2 on a machine of 4 cores or more}. The rig is
brought up once per (link, storage cores), its storage node holding every
dataset. Each cell runs every fixed cut (`--offload K`) and `auto` as
`sluice sql ... --connect <coordinator> --format arrow` (output
discarded; the client pinned to the compute CPUs, as a trainer would be),
in interleaved rounds after a warm-up round (auto's warm-up calibrates;
the warm-up also sizes each measurement: a configuration's query is
repeated back to back until it lasts --seconds, start-up included, at
most 50 times), and prints samples/s (median of --runs, the client's
start-up, measured on an empty query, taken off every query) and the
bytes per sample the storage host really sent (the qdisc's byte
counter). With --json the results are written for scripts/report.py.

Needs root (the rig); where the kernel refuses network namespaces the rig
says so and this bench skips the grid with that message.
"""

import argparse
import atexit
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_udfs import write_clips, write_images  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RIG = os.path.join(ROOT, "scripts", "rig.sh")

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
LINKS = ["100Mbit", "1Gbit", "10Gbit"]
# The standard training transform, on the embedded default.
STANDARD = ("SELECT key, normalize(random_horizontal_flip(random_resized_crop(decode_image(data), 224, 224)), "
            "[0.485, 0.456, 0.406], [0.229, 0.224, 0.225]) AS img FROM photos")


def write_volumes(d, n):
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        vol = rng.standard_normal((64, 128, 128), dtype=np.float32)
        np.savez(os.path.join(d, f"vol{i:04d}.npz"), image=vol)


def imagenet_like(d, n):
    """ImageNet's spread of sides: most 500 on the long side, some smaller,
    a few up to 2,000 (photo-like pixels: smooth fields and fine noise)."""
    os.makedirs(d, exist_ok=True)
    from bench_udfs import photo
    rng = np.random.default_rng(7)
    for i in range(n):
        r = rng.random()
        long = 500 if r < 0.75 else (int(rng.integers(200, 500)) if r < 0.93 else int(rng.integers(600, 2000)))
        short = int(long * rng.uniform(0.66, 0.8))
        w, h = (long, short) if rng.random() < 0.7 else (short, long)
        photo(w, h, 10_000 + i).save(os.path.join(d, f"img{i:05d}.jpg"), quality=90)


def cpu_count(cpus):
    """CPUs in a taskset list such as `0`, `0-1` or `0,2-3`."""
    n = 0
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def rig(*args, env):
    return subprocess.run(["bash", RIG, *args], env=env, capture_output=True, text=True)


def sent_bytes(ns):
    """Bytes the storage host's qdisc has sent so far."""
    out = subprocess.run(["ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", "eth0"],
                         capture_output=True, text=True).stdout
    m = re.search(r"Sent (\d+) bytes", out)
    return int(m.group(1)) if m else 0


def timed(cmd, runs, ns=None, warm=True):
    """Median wall time of `cmd` over `runs` runs (after a warm-up unless
    `warm` is false), and the median bytes the storage host sent per run."""
    def once():
        before = sent_bytes(ns) if ns else 0
        t = time.perf_counter()
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed: {p.stderr}")
        return wall, (sent_bytes(ns) - before) if ns else 0
    if warm:
        once()
    runs = [once() for _ in range(max(runs, 1))]
    return statistics.median(w for w, _ in runs), statistics.median(b for _, b in runs)


# Most back-to-back queries one measurement may take.
MAX_REPEAT = 50


def rounds(cmds, n, a, startup, ns=None):
    """Interleaved rounds of `cmds` (mode -> command reading `n` samples):
    every mode once per round, a warm-up round first, so the machine's
    drift lands on every mode alike. A measurement is a mode's command
    repeated back to back until it lasts --seconds, start-up included
    (the warm-up round sizes it; at most MAX_REPEAT queries): a run of a
    fraction of a second is mostly the machine's noise. Returns, per
    mode, samples/s per round (the client's `startup` taken off every
    query), the bytes the storage host sent per query per round (with
    `ns`), and the repeats."""
    rates = {m: [] for m in cmds}
    sents = {m: [] for m in cmds}
    repeat = {m: 1 for m in cmds}
    for r in range(max(a.runs, 1) + 1):
        for m, cmd in cmds.items():
            walls, sent, whole = [], 0, 0.0
            for _ in range(repeat[m]):
                wall, bytes_sent = timed(cmd, 1, ns, warm=False)
                walls.append(max(wall - startup, 1e-3))
                sent += bytes_sent
                whole += wall
            if r == 0:
                # Sized on whole queries, start-up included, so a query
                # that is nearly all start-up cannot ask for thousands.
                repeat[m] = min(MAX_REPEAT, max(1, math.ceil(a.seconds / whole)))
            else:
                rates[m].append(n * len(walls) / sum(walls))
                sents[m].append(sent / len(walls))
    return rates, sents, repeat


def choice_text(choice):
    if choice["kind"] == "cut":
        return f"cut {choice['cut']}"
    return f"split {choice['above']}/{choice['below']}"


def grid(a, work, counts, results):
    cpus = os.cpu_count() or 2
    layouts = [("0", ",".join(str(c) for c in range(1, cpus)) if cpus > 2 else "1")]
    if cpus >= 4:
        layouts.append(("0-1", "2-3"))
    rig_env = dict(os.environ, SLUICE_RIG_DIR=os.path.join(work, "rig"), SLUICE_BIN=a.sluice)
    client_dir = os.path.join(work, "client")
    for link in a.links.split(","):
        for storage_cpus, compute_cpus in layouts:
            cores = cpu_count(storage_cpus)
            up = rig("up", "--storage", "1", "--compute", "0", "--link", link,
                     "--storage-cpus", storage_cpus, "--compute-cpus", compute_cpus,
                     "--ingest-root", os.path.join(work, "root"), "--bin", a.sluice, env=rig_env)
            if up.returncode == 3:
                print(f"grid skipped: {up.stderr.strip()}")
                results["grid_skipped"] = up.stderr.strip()
                return
            if up.returncode != 0:
                rig("down", env=rig_env)
                sys.exit(f"rig up failed: {up.stderr}")
            env = dict(line.split("=", 1) for line in up.stdout.splitlines() if "=" in line)
            try:
                pin = ["taskset", "-c", compute_cpus]
                client = pin + [a.sluice, "--data-dir", client_dir, "sql"]
                startup, _ = timed(client + ["SELECT 1", "--connect", env["FLIGHT"]], 3)
                for title, ds, sql in PIPELINES:
                    n = counts[ds]
                    explain = subprocess.run(
                        [a.sluice, "--data-dir", client_dir, "explain", sql, "--connect", env["FLIGHT"],
                         "--format", "json"], capture_output=True, text=True, check=True).stdout
                    plan = json.loads(explain)["pipelines"][0]
                    cell = {"pipeline": title, "link": link, "storage_cores": cores, "samples": n,
                            "cuts": {}, "auto": {}, "auto_choice": choice_text(plan["choice"]),
                            "auto_estimate": plan["rates"]["per_s"],
                            "calibration": plan.get("calibration", {}).get("kind", "none")}
                    modes = [str(c["cut"]) for c in plan["candidates"]] + ["auto"]
                    cmds = {m: client + [sql, "--connect", env["FLIGHT"], "--format", "arrow",
                                         "--offload", m] for m in modes}
                    rates, sents, repeat = rounds(cmds, n, a, startup, "slrig-s0")
                    cell["repeat"] = repeat
                    for c in plan["candidates"]:
                        m = str(c["cut"])
                        cell["cuts"][m] = {
                            "per_s": statistics.median(rates[m]),
                            "bytes_per_sample": statistics.median(sents[m]) / n,
                            "on_storage": c["on_storage"]}
                    cell["auto"] = {"per_s": statistics.median(rates["auto"]),
                                    "bytes_per_sample": statistics.median(sents["auto"]) / n}
                    best = max(cell["cuts"].values(), key=lambda r: r["per_s"])
                    cell["auto_vs_best"] = cell["auto"]["per_s"] / best["per_s"]
                    cell["auto_vs_compute"] = cell["auto"]["per_s"] / cell["cuts"]["0"]["per_s"]
                    cell["bytes_compute_vs_auto"] = (cell["cuts"]["0"]["bytes_per_sample"]
                                                     / max(cell["auto"]["bytes_per_sample"], 1.0))
                    results["grid"].append(cell)
                    cuts = "  ".join(f"{k}: {v['per_s']:.1f}/s {v['bytes_per_sample'] / 1024:.0f} KiB"
                                     for k, v in cell["cuts"].items())
                    print(f"{title} | {link} | {cores} core(s) | {cuts} | auto ({cell['auto_choice']}): "
                          f"{cell['auto']['per_s']:.1f}/s, {cell['auto_vs_best']:.2f} of best", flush=True)
            finally:
                rig("down", env=rig_env)


def embedded(a, work, results):
    """auto vs offload=storage vs offload=compute on the embedded default,
    interleaved rounds."""
    data = os.path.join(work, "embedded")
    base = [a.sluice, "--data-dir", data]
    if not os.path.exists(data):
        subprocess.run(base + ["ingest", "photos", os.path.join(work, "photos")], check=True,
                       stdout=subprocess.DEVNULL)
    startup, _ = timed(base + ["sql", "SELECT 1"], 3)
    cmds = {m: base + ["sql", STANDARD, "--format", "arrow", "--offload", m]
            for m in ("auto", "storage", "compute")}
    rates, _, repeat = rounds(cmds, a.photos, a, startup)
    med = {k: statistics.median(v) for k, v in rates.items()}
    results["embedded"] = {"samples": a.photos, "rounds": a.runs, "seconds": a.seconds,
                           "per_s": med, "runs": rates, "repeat": repeat,
                           "auto_vs_better": med["auto"] / max(med["storage"], med["compute"])}
    print(f"embedded default, {a.photos} photos, standard transform: " +
          ", ".join(f"{k} {v:.0f}/s" for k, v in med.items()) +
          f"; auto / better fixed = {results['embedded']['auto_vs_better']:.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sluice", default="sluice", help="the sluice binary (the release build a user runs)")
    ap.add_argument("--small", type=int, default=400)
    ap.add_argument("--large", type=int, default=16)
    ap.add_argument("--vols", type=int, default=24)
    ap.add_argument("--clips", type=int, default=24)
    ap.add_argument("--photos", type=int, default=400, help="photos of the embedded-default comparison")
    ap.add_argument("--links", default=",".join(LINKS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0,
                    help="repeat a configuration's query until a measurement lasts this long "
                         f"(at most {MAX_REPEAT} times; 0: once)")
    ap.add_argument("--json", help="write the results here (for scripts/report.py)")
    ap.add_argument("--only", choices=["grid", "embedded"],
                    help="run one part; with --json, the file keeps the other part's results")
    ap.add_argument("--work", default=None, help="directory for inputs and data (default: a temp dir)")
    a = ap.parse_args()
    a.sluice = os.path.abspath(a.sluice) if os.path.sep in a.sluice else a.sluice

    work = a.work or tempfile.mkdtemp(prefix="sluice-placement-")
    if not a.work:
        atexit.register(shutil.rmtree, work, ignore_errors=True)
    counts = {"small": a.small, "large": a.large, "vols": a.vols, "clips": a.clips}
    root = os.path.join(work, "root")
    if not os.path.exists(root):
        print(f"generating inputs in {work} …", file=sys.stderr)
        write_images(os.path.join(root, "small"), a.small, 500, 375)
        write_images(os.path.join(root, "large"), a.large, 4000, 3000)
        write_volumes(os.path.join(root, "vols"), a.vols)
        write_clips(os.path.join(root, "clips"), a.clips)
        imagenet_like(os.path.join(work, "photos"), a.photos)
    results = {"machine": {"cpus": os.cpu_count()}, "sluice": a.sluice, "runs": a.runs,
               "seconds": a.seconds, "counts": counts, "grid": []}
    if a.only and a.json and os.path.exists(a.json):
        # One part again: the other keeps what the file holds, with the
        # settings it was run with (the embedded part keeps its own).
        with open(a.json) as f:
            results = dict(json.load(f), sluice=a.sluice)
    if a.only != "embedded":
        results.update(runs=a.runs, seconds=a.seconds, counts=counts, grid=[])
        results.pop("grid_skipped", None)
        if os.geteuid() != 0:
            print("grid skipped: the rig needs root")
            results["grid_skipped"] = "the rig needs root"
        else:
            grid(a, work, counts, results)
    if a.only != "grid":
        embedded(a, work, results)
    cells = results["grid"]
    if cells:
        within = sum(1 for c in cells if c["auto_vs_best"] >= 0.95)
        print(f"\nauto within 95% of the best fixed cut in {within} of {len(cells)} cells")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
