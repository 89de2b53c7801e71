#!/usr/bin/env python3
"""Read IOPS and bandwidth through sluice's SPDK device against SPDK's own
`bdevperf` on the same bdev, and against sluice's io_uring backend on the
same file, all in one run.

Needs a sluice built with `--features spdk` (release: the figures are a
deployment's) and an SPDK build (SPDK_DIR, for `build/examples/bdevperf`).
Configurations, each for every workload:

  sluice uring       the file, O_DIRECT io_uring (sluice's default backend)
  sluice spdk aio    an SPDK AIO bdev over the same file
  bdevperf aio       the same AIO bdev, SPDK's own benchmark
  sluice spdk malloc a malloc bdev (RAM: the software path's own limit)
  bdevperf malloc    the same malloc bdev

Both SPDK programs poll on one core (core 0); sluice moves its other
threads (tokio's workers) off that core. The file is read once, untimed, before anything is measured;
runs of the configurations interleave in a rotating order, and medians are
reported; the ratio column is
sluice's SPDK device over bdevperf on the same bdev (the goal: >= 0.90).

  python scripts/bench_spdk.py --sluice target-release/release/sluice \\
      --spdk-dir ~/spdk --seconds 10 --runs 3
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile


def hugepages_free_mib():
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            fields[k] = int(v.split()[0])
    return fields.get("HugePages_Free", 0) * fields.get("Hugepagesize", 0) // 1024


def write_file(path, size):
    """A fully written file (no holes: a hole reads without touching the disk)."""
    chunk = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(size >> 20):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def bdev_config(path, bdevs):
    with open(path, "w") as f:
        json.dump({"subsystems": [{"subsystem": "bdev", "config": bdevs}]}, f)


def run_sluice(args, env_extra, device, backend, workload, seconds):
    """One timed run (after the command's own warm-up second): IOPS."""
    io_size, depth, pattern = workload
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [args.sluice, "--device-backend", backend, "--device", device,
               "bench", "device", "--pattern", pattern, "--io-size", str(io_size),
               "--depth", str(depth), "--seconds", str(seconds), "--runs", "1",
               "--json", out.name]
        env = dict(os.environ, **env_extra)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr}")
        report = json.load(open(out.name))
    return report["iops"]


def run_bdevperf(args, config, bdev, workload, seconds, no_huge):
    """One timed run of SPDK's bdevperf: IOPS."""
    io_size, depth, pattern = workload
    exe = os.path.join(args.spdk_dir, "build", "examples", "bdevperf")
    lib_dirs = [os.path.join(args.spdk_dir, "build", "lib"),
                os.path.join(args.spdk_dir, "isa-l", ".libs")]
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(
        [d for d in lib_dirs if os.path.isdir(d)] + [os.environ.get("LD_LIBRARY_PATH", "")]))
    cmd = [exe, "--json", config, "-T", bdev, "-m", "0x1", "-s", str(args.mem_mib),
           "-q", str(depth), "-o", str(io_size), "-w", pattern, "-t", str(round(seconds))]
    if no_huge:
        cmd.append("--no-huge")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    total = re.search(r"^\s*Total\s*:\s*([\d.]+)\s+([\d.]+)", r.stdout, re.M)
    if r.returncode != 0 or not total:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return float(total.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sluice", required=True, help="a sluice built with --features spdk")
    p.add_argument("--spdk-dir", default=os.environ.get("SPDK_DIR"),
                   help="SPDK build tree (default: $SPDK_DIR)")
    p.add_argument("--size", type=int, default=1024, help="file size in MiB")
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--mem-mib", type=int, default=1024, help="SPDK memory (MiB)")
    p.add_argument("--work", default=None, help="directory for the file (default: a temp dir)")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args()
    if not args.spdk_dir:
        sys.exit("--spdk-dir or SPDK_DIR is needed (for bdevperf)")

    work = tempfile.mkdtemp(dir=args.work)
    data = os.path.join(work, "bdev.img")
    print(f"writing {args.size} MiB to {data} ...", file=sys.stderr)
    write_file(data, args.size << 20)
    # Let writeback finish before anything is timed (all reads are O_DIRECT).
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except OSError:
        pass
    # One untimed O_DIRECT pass over the file: whatever caches sit below the
    # guest (a VM host's) are then equally warm for every configuration.
    subprocess.run(["dd", f"if={data}", "of=/dev/null", "bs=4M", "iflag=direct"],
                   check=True, capture_output=True)
    config = os.path.join(work, "bdevs.json")
    bdev_config(config, [
        {"method": "bdev_aio_create",
         "params": {"name": "aio0", "filename": data, "block_size": 4096}},
        {"method": "bdev_malloc_create",
         "params": {"name": "malloc0", "num_blocks": (256 << 20) // 4096, "block_size": 4096}},
    ])
    no_huge = hugepages_free_mib() < args.mem_mib
    spdk_env = {"SLUICE_SPDK_CONFIG": config, "SLUICE_SPDK_MEM": f"{args.mem_mib}MiB",
                "SLUICE_SPDK_CORE_MASK": "0x1"}
    if no_huge:
        spdk_env["SLUICE_SPDK_NO_HUGE"] = "true"
    print(f"SPDK memory: {'no-huge mode' if no_huge else 'hugepages'}, {args.mem_mib} MiB",
          file=sys.stderr)

    workloads = [(4096, 32, "randread"), (131072, 16, "randread"), (1 << 20, 4, "read")]
    results = []
    print(f"{'workload':<22} {'configuration':<20} {'IOPS':>10} {'MiB/s':>9} {'vs bdevperf':>11}")
    for wl in workloads:
        io_size, depth, pattern = wl
        name = f"{pattern} {io_size // 1024}KiB qd{depth}"
        confs = {
            "sluice uring": lambda: run_sluice(args, {}, data, "uring", wl, args.seconds),
            "sluice spdk aio": lambda: run_sluice(args, spdk_env, "bdev:aio0", "spdk", wl,
                                                  args.seconds),
            "bdevperf aio": lambda: run_bdevperf(args, config, "aio0", wl, args.seconds,
                                                 no_huge),
            "sluice spdk malloc": lambda: run_sluice(args, spdk_env, "bdev:malloc0", "spdk",
                                                     wl, args.seconds),
            "bdevperf malloc": lambda: run_bdevperf(args, config, "malloc0", wl, args.seconds,
                                                    no_huge),
        }
        # Runs interleave, in an order that rotates, so drift in the
        # machine's state favours no configuration.
        names = list(confs)
        samples = {n: [] for n in names}
        for run in range(args.runs):
            for n in names[run % len(names):] + names[:run % len(names)]:
                samples[n].append(confs[n]())
        rows = {n: (statistics.median(v), v) for n, v in samples.items()}
        for conf, (iops, runs) in rows.items():
            base = {"sluice spdk aio": "bdevperf aio",
                    "sluice spdk malloc": "bdevperf malloc"}.get(conf)
            ratio = iops / rows[base][0] if base else None
            mib = iops * io_size / (1 << 20)
            print(f"{name:<22} {conf:<20} {iops:>10.0f} {mib:>9.1f} "
                  f"{'' if ratio is None else f'{ratio:.2f}':>11}")
            results.append({"workload": name, "configuration": conf, "iops": iops,
                            "mib_per_s": mib, "runs": runs, "vs_bdevperf": ratio})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"no_huge": no_huge, "results": results}, f, indent=2)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
