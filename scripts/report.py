#!/usr/bin/env python3
"""The placement report: regenerates the placement section of
docs/benchmarks.md and the PNG plots beside it from the benchmark's
results.

    python3 scripts/report.py                       # from docs/results/*.json
    python3 scripts/report.py --run --sluice BIN    # run bench_placement.py first (root: the rig)

Plots (docs/img/):
- placement-link.png: samples/s and bytes per sample vs link bandwidth,
  for each fixed cut and for auto, one row per pipeline;
- placement-heatmap.png: auto / best fixed cut in every cell of the grid;
- loaders.png: one trainer's images/s with sluice and with the loaders
  people use today (docs/results/loaders.json, written by
  scripts/bench_loaders.py --json).

matplotlib lives in a venv of the report's own (~/.cache/sluice/report-venv),
made on first use, never in the test command's venv.
"""

import argparse
import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
BEGIN = "<!-- report:placement begin (scripts/report.py writes this section) -->"
END = "<!-- report:placement end -->"
LINK_BITS = {"100Mbit": 1e8, "1Gbit": 1e9, "10Gbit": 1e10}


def ensure_matplotlib():
    """Re-runs this script in the report's venv when matplotlib is missing here."""
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    venv = os.path.expanduser("~/.cache/sluice/report-venv")
    py = os.path.join(venv, "bin", "python")
    # (A venv's python is a link to the system's: tell them by prefix.)
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        sys.exit("matplotlib is missing from the report venv even after installing it")
    if not os.path.exists(py):
        print(f"== matplotlib into {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "matplotlib", "numpy"], check=True)
    os.execv(py, [py, *sys.argv])


def link_plot(grid, path):
    import matplotlib.pyplot as plt
    pipelines = list(dict.fromkeys(c["pipeline"] for c in grid))
    fig, axes = plt.subplots(len(pipelines), 2, figsize=(11, 3.2 * len(pipelines)), squeeze=False)
    for row, name in zip(axes, pipelines):
        cells = sorted((c for c in grid if c["pipeline"] == name and c["storage_cores"] == 1),
                       key=lambda c: LINK_BITS.get(c["link"], 0))
        if not cells:
            continue
        x = [LINK_BITS.get(c["link"], 0) for c in cells]
        for cut in cells[0]["cuts"]:
            label = f"cut {cut}" + (" (compute only)" if cut == "0" else "")
            row[0].plot(x, [c["cuts"][cut]["per_s"] for c in cells], marker="o", label=label)
            row[1].plot(x, [c["cuts"][cut]["bytes_per_sample"] / 1024 for c in cells], marker="o",
                        label=label)
        row[0].plot(x, [c["auto"]["per_s"] for c in cells], marker="s", color="black", linewidth=2,
                    label="auto")
        row[1].plot(x, [c["auto"]["bytes_per_sample"] / 1024 for c in cells], marker="s",
                    color="black", linewidth=2, label="auto")
        for ax, what in ((row[0], "samples/s"), (row[1], "KiB per sample over the link")):
            ax.set_xscale("log")
            ax.set_xticks(x, [c["link"] for c in cells])
            ax.set_ylabel(what)
            ax.set_title(name)
            ax.grid(alpha=0.3)
        row[1].set_yscale("log")
        row[0].legend(fontsize=7)
    fig.suptitle("Placement on the rig: each cut and auto vs the link (1 storage core)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def heatmap(grid, path):
    import matplotlib.pyplot as plt
    import numpy as np
    pipelines = list(dict.fromkeys(c["pipeline"] for c in grid))
    cols = sorted({(c["link"], c["storage_cores"]) for c in grid},
                  key=lambda lc: (lc[1], LINK_BITS.get(lc[0], 0)))
    m = np.full((len(pipelines), len(cols)), np.nan)
    for c in grid:
        m[pipelines.index(c["pipeline"]), cols.index((c["link"], c["storage_cores"]))] = c["auto_vs_best"]
    fig, ax = plt.subplots(figsize=(1.6 * len(cols) + 3, 0.8 * len(pipelines) + 1.5))
    im = ax.imshow(m, cmap="RdYlGn", vmin=0.5, vmax=1.1)
    ax.set_xticks(range(len(cols)), [f"{l}\n{k} storage core(s)" for l, k in cols], fontsize=8)
    ax.set_yticks(range(len(pipelines)), pipelines, fontsize=8)
    for i in range(len(pipelines)):
        for j in range(len(cols)):
            if not np.isnan(m[i, j]):
                ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=9)
    fig.colorbar(im, ax=ax, label="auto / best fixed cut")
    ax.set_title("auto / best fixed cut (goal: >= 0.95 everywhere)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def loaders_plot(loaders, path):
    import matplotlib.pyplot as plt
    rows = sorted(loaders["images_per_s"].items(), key=lambda kv: kv[1])
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
    colors = ["tab:blue" if "sluice" in k else "tab:gray" for k, _ in rows]
    ax.barh([k for k, _ in rows], [v for _, v in rows], color=colors)
    for i, (_, v) in enumerate(rows):
        ax.text(v, i, f" {v:.0f}", va="center", fontsize=8)
    ax.set_xlabel("images/s, one trainer (higher is better)")
    ax.set_title(textwrap.fill(loaders.get("title", "End-to-end loaders"), 90), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def section(results, loaders):
    grid = results.get("grid", [])
    out = [BEGIN, "", "## Placement on a real link: the rig", ""]
    out += [
        "Regenerated by `python3 scripts/report.py` from `docs/results/placement.json`,",
        "which `scripts/bench_placement.py --json` writes (`python3 scripts/report.py --run",
        "--sluice BIN` does both). Machine: "
        f"{results['machine']['cpus']} CPUs; binary: `{os.path.basename(results['sluice'])}`"
        f" ({results.get('build', 'see the command')}); {results['runs']} timed rounds after a"
        " warm-up round, each round running every cut and auto in turn"
        + (f", each query repeated back to back until it lasts {results['seconds']:g} s"
           if results.get("seconds") else "")
        + "; medians. Samples per query: "
        + ", ".join(f"{k} {v}" for k, v in results.get("counts", {}).items()) + ".",
        "",
        "Each cell is the rig of `scripts/rig.sh`: one storage host and the coordinator in",
        "network namespaces on a bridge, the storage host's egress shaped by the kernel's",
        "token bucket filter (a real TCP link), storage pinned to CPU 0 and the coordinator",
        "and the client (a trainer's stand-in) to the other CPUs. Every fixed cut and `auto`",
        "run end to end (`sluice sql … --connect <coordinator> --format arrow`); bytes per",
        "sample are what the storage host's qdisc really sent. `auto` is calibrated on the",
        "dataset's own objects on the storage host.",
        "",
    ]
    if results.get("grid_skipped"):
        out += [f"The grid was not run: {results['grid_skipped']}.", ""]
    if grid:
        out += ["| pipeline | link | storage cores | auto's choice | auto samples/s | best fixed cut |"
                " auto / best | auto / compute-only | bytes: compute-only / auto |",
                "|---|---|---|---|---|---|---|---|---|"]
        for c in grid:
            best = max(c["cuts"], key=lambda k: c["cuts"][k]["per_s"])
            out.append(f"| {c['pipeline']} | {c['link']} | {c['storage_cores']} | {c['auto_choice']} | "
                       f"{c['auto']['per_s']:.1f} | cut {best}: {c['cuts'][best]['per_s']:.1f} | "
                       f"{c['auto_vs_best']:.2f} | {c['auto_vs_compute']:.2f} | "
                       f"{c['bytes_compute_vs_auto']:.1f}x |")
        within = sum(1 for c in grid if c["auto_vs_best"] >= 0.95)
        out += ["", f"**auto within 95% of the best fixed cut in {within} of {len(grid)} cells.**", ""]
        # Where auto ran the very cut that was best, auto / best is the
        # run-to-run noise of one configuration: say so beside the count.
        same = [c for c in grid if c["auto_choice"] == "cut " + max(
            c["cuts"], key=lambda k: c["cuts"][k]["per_s"])]
        if same:
            worst = min(same, key=lambda c: c["auto_vs_best"])
            out += [f"Noise: in {len(same)} cells auto chose the cut that measured best, so "
                    "auto / best there compares one configuration with itself; it ranged from "
                    f"{min(c['auto_vs_best'] for c in same):.2f} to "
                    f"{max(c['auto_vs_best'] for c in same):.2f} ({worst['pipeline']}, "
                    f"{worst['link']}). A miss smaller than that spread is not a wrong choice.", ""]
        reducing = [c for c in grid if c["link"] == "1Gbit"
                    and c["pipeline"] in ("large photos -> 224^2", "npz volume crop")]
        for c in reducing:
            out.append(f"- {c['pipeline']} under 1 Gbit/s ({c['storage_cores']} storage core(s)): "
                       f"{c['bytes_compute_vs_auto']:.1f}x fewer bytes and {c['auto_vs_compute']:.2f}x "
                       "the samples/s of compute-only (goals: 10x and 5x).")
        out += ["", "![samples/s and bytes vs link](img/placement-link.png)", "",
                "![auto / best fixed cut](img/placement-heatmap.png)", ""]
    e = results.get("embedded")
    if e:
        per = e["per_s"]
        out += ["### The embedded default", "",
                f"One process (storage and compute co-located, one pool of "
                f"{results['machine']['cpus']} cores), {e['samples']} ImageNet-like generated photos "
                "(not real photographs: none can be fetched here), the standard training transform "
                "(random resized crop 224, flip, normalize), interleaved rounds, medians:", "",
                "| offload | samples/s |", "|---|---|"]
        out += [f"| {k} | {v:.0f} |" for k, v in per.items()]
        out += ["", f"**auto / the better of storage and compute: {e['auto_vs_better']:.2f}** (goal >= 0.95).",
                ""]
    if loaders:
        out += ["### One trainer vs the loaders in use today", "",
                f"{loaders.get('title', '')} (from `{loaders.get('source', 'bench_loaders.py')}`).", "",
                "![loaders](img/loaders.png)", ""]
    out.append(END)
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(DOCS, "results", "placement.json"))
    ap.add_argument("--loaders", default=os.path.join(DOCS, "results", "loaders.json"))
    ap.add_argument("--run", action="store_true", help="run scripts/bench_placement.py first")
    ap.add_argument("--sluice", help="with --run: the sluice binary (a release build)")
    ap.add_argument("bench_args", nargs="*", help="with --run: more bench_placement.py arguments")
    a = ap.parse_args()
    ensure_matplotlib()
    if a.run:
        if not a.sluice:
            sys.exit("--run needs --sluice (the release build)")
        os.makedirs(os.path.dirname(a.results), exist_ok=True)
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_placement.py"),
                        "--sluice", a.sluice, "--json", a.results, *a.bench_args], check=True)
    with open(a.results) as f:
        results = json.load(f)
    loaders = None
    if os.path.exists(a.loaders):
        with open(a.loaders) as f:
            loaders = json.load(f)
    img = os.path.join(DOCS, "img")
    os.makedirs(img, exist_ok=True)
    if results.get("grid"):
        link_plot(results["grid"], os.path.join(img, "placement-link.png"))
        heatmap(results["grid"], os.path.join(img, "placement-heatmap.png"))
    if loaders:
        loaders_plot(loaders, os.path.join(img, "loaders.png"))
    bench = os.path.join(DOCS, "benchmarks.md")
    text = open(bench).read()
    new = section(results, loaders)
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = head + new + tail
    else:
        marker = "## A job's epoch at scale"
        text = text.replace(marker, new + "\n\n" + marker, 1) if marker in text else text + "\n" + new + "\n"
    with open(bench, "w") as f:
        f.write(text)
    print(f"wrote {bench} and the plots in {img}")


if __name__ == "__main__":
    main()
