#!/usr/bin/env python3
"""DLIO's unet3d workload (scaled: python/dlio/workload/) read through sluice
vs DLIO's own PyTorch loader and NPZ reader on the same files, at 1, 2 and 4
simulated accelerators (MPI ranks), measured in one run on this machine.

Per row: DLIO's accelerator utilisation (AU %, the MLPerf Storage figure),
samples/s, and the mean checkpoint duration DLIO reports (sluice:
`sluice.Checkpoint`; POSIX: `torch.save` to a file). DLIO generates the
data first; `sluice serve` (the build given, a release build for figures
that mean something) ingests it from its --ingest-root.

    python scripts/bench_dlio.py --sluice target/release/sluice --ranks 1,2,4
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(HERE, "..", "python", "dlio")
sys.path.insert(0, HERE)
from sluice_server import Server  # noqa: E402


def dlio(work, workload, data, ranks, overrides, env):
    """Runs DLIO; returns (summary, mean checkpoint seconds)."""
    out = os.path.join(work, f"out-{workload}-{ranks}")
    bindir = os.path.dirname(sys.executable)
    cmd = [os.path.join(bindir, "dlio_benchmark"), "--config-dir", CONFIGS,
           f"workload={workload}", f"++workload.dataset.data_folder={data}",
           f"++workload.output.folder={out}", *overrides]
    if ranks > 1:
        cmd = [os.path.join(bindir, "mpirun"), "-np", str(ranks), *cmd]
    run = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"DLIO failed ({workload}, {ranks} ranks):\n{run.stdout[-3000:]}\n"
                 f"{run.stderr[-3000:]}")
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    ckpts = []
    for path in glob.glob(os.path.join(out, "per_epoch_stats.json")):
        with open(path) as f:
            for epoch in json.load(f).values():
                ckpts += [float(v["duration"]) for k, v in epoch.items() if k.startswith("ckpt")]
    return summary, (sum(ckpts) / len(ckpts) if ckpts else float("nan"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sluice", required=True, help="the sluice binary")
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--files", type=int, default=64)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--record", type=int, default=4 << 20, help="bytes per .npz volume")
    p.add_argument("--computation", type=float, default=0.05, help="seconds per batch")
    p.add_argument("--model-size", type=int, default=32 << 20, help="checkpointed model bytes")
    p.add_argument("--work", default=None)
    a = p.parse_args()
    if "/debug/" in a.sluice:
        print("warning: a debug build of sluice; these figures mean little", file=sys.stderr)
    overrides = [f"++workload.dataset.num_files_train={a.files}",
                 f"++workload.dataset.record_length={a.record}",
                 f"++workload.train.epochs={a.epochs}",
                 f"++workload.train.computation_time={a.computation}",
                 f"++workload.checkpoint.model_size={a.model_size}"]
    with tempfile.TemporaryDirectory(dir=a.work) as work:
        data = os.path.join(work, "data")
        gen = [os.path.join(os.path.dirname(sys.executable), "dlio_benchmark"),
               "--config-dir", CONFIGS, "workload=unet3d_posix", f"++workload.dataset.data_folder={data}",
               "++workload.workflow.generate_data=True", "++workload.workflow.train=False",
               "++workload.workflow.checkpoint=False", *overrides]
        subprocess.run(gen, cwd=work, check=True, capture_output=True)
        with Server(a.sluice, os.path.join(work, "sluice"), data) as client:
            env = dict(os.environ, SLUICE_URL=client.url)
            print(f"DLIO unet3d (scaled): {a.files} x {a.record >> 20} MiB .npz, {a.epochs} epochs, "
                  f"{a.computation} s/batch, {a.model_size >> 20} MiB model checkpoints")
            print(f"{'ranks':>5} {'loader':<7} {'AU %':>6} {'samples/s':>10} {'ckpt s':>7}")
            for ranks in [int(r) for r in a.ranks.split(",")]:
                for workload, label in [("unet3d_posix", "posix"), ("unet3d_sluice", "sluice")]:
                    summary, ckpt = dlio(work, workload, data, ranks, overrides, env)
                    m = summary["metric"]
                    print(f"{ranks:>5} {label:<7} {m['train_au_mean_percentage']:>6.1f} "
                          f"{m['train_throughput_mean_samples_per_second']:>10.1f} {ckpt:>7.2f}",
                          flush=True)
                    shutil.rmtree(os.path.join(work, "checkpoints"), ignore_errors=True)


if __name__ == "__main__":
    main()
