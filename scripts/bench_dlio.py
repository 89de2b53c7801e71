#!/usr/bin/env python3
"""MLPerf Storage's workloads through DLIO (python/dlio/workload/): unet3d,
retinanet and llama3 8B checkpointing, each through sluice's plugins and
through DLIO's own POSIX reader and torch.save checkpoints, on the same
data, at 1, 2 and 4 simulated accelerators (MPI ranks), under the same
limits, in one run on this machine.

The fair baseline (run as root):

- each side runs in a memory cgroup of its own (v2's memory.max, or v1's
  memory.limit_in_bytes where the memory controller is on v1): the DLIO
  ranks, and for sluice the `sluice serve` it reads from, started inside
  it under the limit (so the budgets it sizes from the memory available
  fit it). Both get the same limit at each rank count: a calibration run
  of each side (one epoch; one save and load) measures what its processes
  hold (anonymous and shared memory, the pages they map: a DLIO rank
  holds about 1 GiB of torch and TensorFlow), and the limit is the larger
  plus --cache-room. The bench samples how much of each side's data files
  sits in the page cache (fincore: the dataset's files; sluice's device)
  and prints the peak: the datasets (3 GiB) are made large enough that
  the POSIX side's is a fraction. sluice's own caches are off
  (--sluice-caches turns them on): it reads every sample from its device
  with O_DIRECT;
- the page cache is dropped before every run (and, for checkpoints,
  between the save and the load phase, as MLPerf's rules require);
- llama3's saves and loads run in --rounds rounds a side, the sides'
  order turned each round (POSIX then sluice, sluice then POSIX, ...),
  and each side's GB/s is from the median over all its rounds: the VM's
  disk moves by 2x within minutes, and one side run wholly after the
  other would take that drift for a difference;
- both sides are pinned to the same cores (--cpus, with taskset), and
  the MPI ranks yield the CPU while they wait in DLIO's barrier after
  every step (MPICH's MPIR_CVAR_POLLS_BEFORE_YIELD and ENABLE_HEAVY_YIELD;
  spinning, 4 ranks on 2 cores take the cores either side's data path
  needs).

Per workload and rank count it prints AU %, samples/s and GB/s (of the
dataset's bytes) for the training workloads, save and load GB/s for
llama3, and per side the largest number of simulated accelerators held
at or above the workload's AU threshold (MLPerf Storage's figure); JSON
goes to --json-dir (docs/results/dlio-<workload>.json).

    sudo python scripts/bench_dlio.py --sluice target/release/sluice \\
        --workload unet3d,retinanet,llama3 --ranks 1,2,4
"""

import argparse
import contextlib
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DLIO = os.path.normpath(os.path.join(HERE, "..", "python", "dlio"))
sys.path.insert(0, HERE)
from sluice_server import Server  # noqa: E402


BIN = os.path.dirname(sys.executable)
GiB = 1 << 30
# Training workloads: the AU threshold and what each sample is in its files.
TRAINING = {"unet3d": 0.90, "retinanet": 0.85}


def size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().rstrip("ib")
    return int(float(t[:-1]) * units[t[-1]]) if t[-1] in units else int(t)


class Cgroup:
    """A memory cgroup with a limit; v2 where its memory controller is,
    else v1's. Samples its page cache and usage while `watching`."""

    def __init__(self, name):
        v2_root = "/sys/fs/cgroup"
        controllers = os.path.join(v2_root, "cgroup.controllers")
        if os.path.exists(controllers) and "memory" in open(controllers).read().split():
            with open(os.path.join(v2_root, "cgroup.subtree_control"), "w") as f:
                f.write("+memory")
            self.dir, self.v2 = os.path.join(v2_root, name), True
        elif os.path.isdir("/sys/fs/cgroup/memory"):
            self.dir, self.v2 = os.path.join("/sys/fs/cgroup/memory", name), False
        else:
            sys.exit("no memory cgroup controller here (v2 memory.max or v1 memory)")
        os.makedirs(self.dir, exist_ok=True)
        self.limit = None
        self.peak_held = self.peak_usage = self.peak_resident = 0
        self.files = []

    def set_limit(self, limit):
        self._write("memory.max" if self.v2 else "memory.limit_in_bytes", str(limit))
        self.limit = limit

    def _write(self, name, text):
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(text)

    def _read(self, name):
        with open(os.path.join(self.dir, name)) as f:
            return f.read()

    def join(self):
        """Moves the calling process in (a subprocess's preexec_fn)."""
        self._write("cgroup.procs", str(os.getpid()))

    def ooms(self):
        if self.v2:
            events = dict(line.split() for line in self._read("memory.events").splitlines())
            return int(events.get("oom_kill", 0))
        control = dict(line.split() for line in self._read("memory.oom_control").splitlines())
        return int(control.get("oom_kill", 0))

    def sample(self):
        stat = {k: int(v) for k, v in
                (line.split() for line in self._read("memory.stat").splitlines())}
        if self.v2:
            held = stat["anon"] + stat["file_mapped"] + stat["shmem"]
        else:
            held = stat["rss"] + stat["mapped_file"] + stat.get("shmem", 0)
        usage = int(self._read("memory.current" if self.v2 else "memory.usage_in_bytes"))
        # What the processes hold and map (not the page cache they merely
        # read: imports leave a GB of libraries' pages, reclaimed first).
        self.peak_held = max(self.peak_held, held)
        self.peak_usage = max(self.peak_usage, usage)

    def resident(self):
        """Bytes of the watched files in the page cache (fincore)."""
        if not self.files:
            return 0
        p = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES",
                            *self.files], capture_output=True, text=True)
        return sum(int(x) for x in p.stdout.split() if x.isdigit())

    @contextlib.contextmanager
    def watching(self, files=()):
        """Samples every 0.2 s (the residency of `files`, every second)
        while the block runs, from zero peaks."""
        self.peak_held = self.peak_usage = self.peak_resident = 0
        self.files = list(files)
        stop = threading.Event()
        ooms = self.ooms()

        def run():
            tick = 0
            while not stop.wait(0.2):
                self.sample()
                tick += 1
                if tick % 5 == 0:
                    self.peak_resident = max(self.peak_resident, self.resident())

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
            self.sample()
            self.peak_resident = max(self.peak_resident, self.resident())
            if self.ooms() > ooms:
                print(f"warning: the OOM killer ran in {self.dir}", file=sys.stderr)

    def remove(self):
        for _ in range(50):
            try:
                os.rmdir(self.dir)
                return
            except OSError:
                time.sleep(0.1)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def run(cmd, cgroup, cpus, env, cwd, what):
    """`cmd` pinned to `cpus` inside `cgroup`, after the page cache is dropped."""
    drop_caches()
    full = ["taskset", "-c", cpus, *cmd]
    p = subprocess.run(full, cwd=cwd, env=env, capture_output=True, text=True,
                       preexec_fn=cgroup.join, timeout=3600)
    if p.returncode != 0:
        sys.exit(f"{what} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def mpi(cmd, ranks):
    return [os.path.join(BIN, "mpirun"), "-np", str(ranks), *cmd] if ranks > 1 else cmd


def dlio_cmd(workload, data, out, overrides):
    return [os.path.join(BIN, "dlio_benchmark"), "--config-dir", DLIO, f"workload={workload}",
            f"++workload.dataset.data_folder={data}", f"++workload.output.folder={out}",
            *overrides]


def generate(model, data, overrides, env, cwd):
    """DLIO writes the dataset (two ranks), unless it is there."""
    train = os.path.join(data, "train")
    if os.path.isdir(train) and os.listdir(train):
        return
    cmd = dlio_cmd(f"{model}_posix", data, os.path.join(cwd, f"gen-{model}"),
                   [*overrides, "++workload.workflow.generate_data=True",
                    "++workload.workflow.train=False", "++workload.workflow.checkpoint=False"])
    subprocess.run(mpi(cmd, 2), cwd=cwd, env=env, check=True, capture_output=True)


def dataset_files(data):
    return sorted(glob.glob(os.path.join(data, "train", "**", "*.*"), recursive=True))


def data_files(work_dir):
    """The files a sluice server keeps its data in (its device, catalog)."""
    return [os.path.join(d, f) for d, _, fs in os.walk(work_dir) for f in fs]


def accelerators_held(rows, threshold):
    """MLPerf's figure: the most simulated accelerators at or above the AU
    threshold, over the rank counts run (0 where none is)."""
    return max([r["ranks"] for r in rows if r["au"] >= 100 * threshold], default=0)


def set_limits(a, cgroups, held):
    """The same limit on both sides: what the hungrier side held (its
    processes' memory and the pages they map) in its calibration run,
    plus the cache room."""
    limit = max(held.values()) + a.cache_room
    for cg in cgroups.values():
        cg.set_limit(limit)
    return limit


def training(a, model, work, cgroups, env):
    data = os.path.join(work, f"data-{model}")
    overrides = [f"++workload.train.epochs={a.epochs}"]
    if a.files:
        overrides.append(f"++workload.dataset.num_files_train={a.files}")
    generate(model, data, overrides, env, work)
    files = dataset_files(data)
    total = sum(os.path.getsize(f) for f in files)
    print(f"\n{model}: {len(files)} files, {total / GiB:.2f} GiB, {a.epochs} epochs, AU "
          f"threshold {TRAINING[model]:.2f}")
    sides = [("posix", f"{model}_posix", [], {})]
    if model == "retinanet":
        sides.append(("posix bytes", f"{model}_posix",
                      ["++workload.reader.reader_classname=sluice.dlio.PosixBytesReader"], {}))
    sides.append(("sluice", f"{model}_sluice", [], {"SLUICE_DLIO_READ": "decode"}))
    if model == "retinanet":
        sides.append(("sluice bytes", f"{model}_sluice", [], {"SLUICE_DLIO_READ": "bytes"}))
    rows, limits = [], {}
    server_args = [] if a.sluice_caches else [
        "--cache-memory", "0", "--output-cache-memory", "0", "--stage-cache-memory", "0"]
    served = os.path.join(work, f"sluice-{model}")
    device = f"{max(2, int(total * 1.3 / GiB) + 1)}GiB"

    def server():
        # Started inside sluice's cgroup under the limit of the moment,
        # so the budgets it sizes from the memory available fit it.
        return Server(a.sluice, served, data, server_args, device_size=device,
                      preexec=cgroups["sluice"].join)

    for cg in cgroups.values():
        cg.set_limit(a.host_limit)
    with server() as client:
        client.ingest(model, os.path.join(data, "train"), on_error="fail")
    watched = {"posix": files, "sluice": data_files(served)}

    def one(ranks, label, workload, extra, side_env, epochs, url):
        out = os.path.join(work, f"out-{model}-{ranks}-{label.replace(' ', '-')}-{epochs}")
        side = "sluice" if label.startswith("sluice") else "posix"
        cg = cgroups[side]
        e = dict(env, SLUICE_URL=url or "", SLUICE_DLIO_DATASET=model,
                 SLUICE_DLIO_PREFIX=f"dlio/{model}-{ranks}", **side_env)
        more = [*overrides, *extra, f"++workload.train.epochs={epochs}"]
        with cg.watching(watched[side]):
            run(mpi(dlio_cmd(workload, data, out, more), ranks), cg, a.cpus, e, work,
                f"{model} {label} on {ranks} ranks")
        shutil.rmtree(os.path.join(work, "checkpoints"), ignore_errors=True)
        with open(os.path.join(out, "summary.json")) as f:
            return json.load(f)["metric"], cg

    def each_side(ranks, epochs):
        """Runs every side once: POSIX's, then sluice's with a server of
        their own; yields (label, DLIO's metrics, its cgroup)."""
        for label, *rest in sides:
            if label.startswith("posix"):
                yield (label, *one(ranks, label, *rest, epochs, None))
        with server() as client:
            for label, *rest in sides:
                if label.startswith("sluice"):
                    yield (label, *one(ranks, label, *rest, epochs, client.url))

    for ranks in a.ranks:
        # Calibration: one epoch of each side under no limit of its own.
        for cg in cgroups.values():
            cg.set_limit(a.host_limit)
        held = {label: cg.peak_held for label, _, cg in each_side(ranks, 1)}
        limit = limits[ranks] = set_limits(a, cgroups, held)
        print(f"{ranks} ranks: limit {limit / GiB:.2f} GiB (held at most: " +
              ", ".join(f"{k} {v / GiB:.2f}" for k, v in held.items()) + ")")
        print(f"{'ranks':>5} {'side':<14} {'AU %':>6} {'samples/s':>10} {'GB/s':>6} "
              f"{'data cached MiB':>15} {'held MiB':>9} {'mem peak MiB':>12}")
        for label, m, cg in each_side(ranks, a.epochs):
            sps = m["train_throughput_mean_samples_per_second"]
            row = {"ranks": ranks, "side": label, "au": m["train_au_mean_percentage"],
                   "samples_per_s": sps, "gb_per_s": sps * total / len(files) / 1e9,
                   "data_cached_peak_bytes": cg.peak_resident,
                   "held_peak_bytes": cg.peak_held, "memory_peak_bytes": cg.peak_usage,
                   "memory_limit_bytes": limit}
            rows.append(row)
            print(f"{ranks:>5} {label:<14} {row['au']:>6.1f} {sps:>10.1f} "
                  f"{row['gb_per_s']:>6.3f} {cg.peak_resident >> 20:>15} "
                  f"{cg.peak_held >> 20:>9} {cg.peak_usage >> 20:>12}", flush=True)
    figure = {label: accelerators_held([r for r in rows if r["side"] == label], TRAINING[model])
              for label, *_ in sides}
    print("accelerators held at or above the threshold: " +
          ", ".join(f"{k} {v}" for k, v in figure.items()))
    return {"dataset_bytes": total, "files": len(files), "epochs": a.epochs,
            "au_threshold": TRAINING[model], "memory_limit_bytes": limits, "rows": rows,
            "accelerators_held": figure}


def checkpointing(a, work, cgroups, env):
    workload = os.path.join(DLIO, "workload", "llama3_8b.yaml")
    print(f"\nllama3 8B checkpointing (1/128 of a rank's shard of 8): {a.saves} saves, then "
          f"{a.loads} loads, page cache dropped between, in {a.rounds} rounds a side "
          f"(the order turned each round); GB/s from the median over all rounds")
    rows, limits = [], {}
    for ranks in a.ranks:
        # A file takes whole chunks (4 MiB): 34 files of 110 MB a rank take
        # about 240 MB of the device.
        need = int(ranks * 0.25 * a.saves) + 2
        served = os.path.join(work, f"sluice-llama3-{ranks}")
        folder = os.path.join(work, f"ckpt-{ranks}")

        def one(side, saves, loads):
            os.makedirs(folder, exist_ok=True)
            out = os.path.join(work, f"llama3-{ranks}-{side}.json")
            cmd = [sys.executable, os.path.join(DLIO, "checkpointing.py"), "--workload",
                   workload, "--mechanism", side, "--folder", folder, "--saves",
                   str(saves), "--loads", str(loads), "--drop-caches", "--json", out]
            cg = cgroups[side]
            # sluice's server starts inside its cgroup under the limit of
            # the moment, and goes with the run (so do its checkpoints).
            with Server(a.sluice, served, work,
                        [] if a.sluice_caches else ["--cache-memory", "0"],
                        device_size=f"{need}GiB", preexec=cgroups["sluice"].join) as client:
                e = dict(env, SLUICE_URL=client.url, SLUICE_DLIO_PREFIX=f"llama3-{ranks}")
                with cg.watching():
                    run(mpi(cmd, ranks), cg, a.cpus, e, work, f"llama3 {side} on {ranks} ranks")
            shutil.rmtree(folder, ignore_errors=True)
            shutil.rmtree(served, ignore_errors=True)
            with open(out) as f:
                return json.load(f), cg

        for cg in cgroups.values():
            cg.set_limit(a.host_limit)
        held = {side: one(side, 1, 1)[1].peak_held for side in ("posix", "sluice")}
        limit = limits[ranks] = set_limits(a, cgroups, held)
        print(f"{ranks} ranks: limit {limit / GiB:.2f} GiB (held at most: " +
              ", ".join(f"{k} {v / GiB:.2f}" for k, v in held.items()) + ")")
        print(f"{'ranks':>5} {'side':<7} {'GB/ckpt':>8} {'save GB/s':>10} {'load GB/s':>10} "
              f"{'held MiB':>9}")
        # The saves and loads in rounds, the sides' order turned each round
        # (POSIX, sluice; sluice, POSIX; ...): the VM's disk moves by 2x
        # within minutes, and one side run wholly after the other takes
        # its drift as a difference. Each round's medians pool into one.
        runs = {"posix": [], "sluice": []}
        saves, loads = max(1, a.saves // a.rounds), max(1, a.loads // a.rounds)
        for r in range(a.rounds):
            for side in ("posix", "sluice") if r % 2 == 0 else ("sluice", "posix"):
                res, cg = one(side, saves, loads)
                runs[side].append((res, cg.peak_held))
        for side in ("posix", "sluice"):
            done = runs[side]
            save_s = [t for res, _ in done for t in res["save_seconds"]]
            load_s = [t for res, _ in done for t in res["load_seconds"]]
            gb = done[0][0]["bytes_per_checkpoint"]
            held_peak = max(h for _, h in done)
            row = {"ranks": ranks, "side": side, "bytes_per_checkpoint": gb,
                   "save_gbps": gb / 1e9 / statistics.median(save_s),
                   "load_gbps": gb / 1e9 / statistics.median(load_s),
                   "save_seconds": save_s, "load_seconds": load_s,
                   "rounds": [{"save_gbps": res["save_gbps"], "load_gbps": res["load_gbps"]}
                              for res, _ in done],
                   "held_peak_bytes": held_peak, "memory_limit_bytes": limit}
            rows.append(row)
            print(f"{ranks:>5} {side:<7} {gb / 1e9:>8.2f} "
                  f"{row['save_gbps']:>10.2f} {row['load_gbps']:>10.2f} "
                  f"{held_peak >> 20:>9}   rounds: " +
                  ", ".join(f"{x['save_gbps']:.2f}/{x['load_gbps']:.2f}" for x in row["rounds"]),
                  flush=True)
    return {"saves": a.saves, "loads": a.loads, "rounds": a.rounds,
            "memory_limit_bytes": limits, "rows": rows}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sluice", required=True, help="the sluice binary (a release build)")
    p.add_argument("--workload", default="unet3d,retinanet,llama3")
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--files", type=int, default=0, help="dataset files (default: the workload's)")
    p.add_argument("--saves", type=int, default=10)
    p.add_argument("--loads", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2,
                   help="llama3: the saves and loads split into rounds, the sides' order "
                        "turned each round (POSIX first, then sluice first, ...)")
    p.add_argument("--cache-room", default="256MiB",
                   help="what the limit leaves above what the hungrier side holds")
    p.add_argument("--cpus", default=f"0-{os.cpu_count() - 1}", help="the cores both sides run on")
    p.add_argument("--sluice-caches", action="store_true", help="leave sluice's caches on")
    p.add_argument("--work", default=None, help="where the data goes (kept there if given)")
    p.add_argument("--json-dir", default=None, help="write dlio-<workload>.json here")
    a = p.parse_args()
    a.ranks = [int(r) for r in a.ranks.split(",")]
    a.cache_room = size(a.cache_room)
    if os.geteuid() != 0:
        sys.exit("bench_dlio.py needs root: memory cgroups, the page cache dropped")
    if "/debug/" in a.sluice:
        print("warning: a debug build of sluice; these figures mean little", file=sys.stderr)
    with open("/proc/meminfo") as f:
        a.host_limit = int(f.readline().split()[1]) * 1024
    cgroups = {side: Cgroup(f"sluice-bench-dlio-{side}") for side in ("posix", "sluice")}
    print(f"both sides: the same memory limit per rank count (what the hungrier side held in "
          f"its calibration run + {a.cache_room >> 20} MiB), cores {a.cpus}, page "
          f"cache dropped before each run; sluice's caches {'on' if a.sluice_caches else 'off'}")
    # MPI ranks yield the CPU while they wait (DLIO's barrier after every
    # step), as ranks on cores of their own would not take it: 4 ranks
    # spinning on 2 cores otherwise starve the data path of either side.
    env = dict(os.environ, PYTHONUNBUFFERED="1", MPIR_CVAR_POLLS_BEFORE_YIELD="1",
               MPIR_CVAR_ENABLE_HEAVY_YIELD="1")
    os.makedirs(a.work, exist_ok=True) if a.work else None
    work = a.work or tempfile.mkdtemp(prefix="bench-dlio-")
    results = {}
    try:
        for w in a.workload.split(","):
            if w in TRAINING:
                results[w] = training(a, w, work, cgroups, env)
            elif w == "llama3":
                results[w] = checkpointing(a, work, cgroups, env)
            else:
                sys.exit(f"unknown workload {w!r}: expected unet3d, retinanet or llama3")
            if a.json_dir:
                conditions = {"cache_room_bytes": a.cache_room,
                              "cpus": a.cpus, "sluice_caches": a.sluice_caches,
                              "sluice": a.sluice, "date": time.strftime("%Y-%m-%d")}
                with open(os.path.join(a.json_dir, f"dlio-{w}.json"), "w") as f:
                    json.dump({"conditions": conditions, **results[w]}, f, indent=1)
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
        for cg in cgroups.values():
            cg.remove()
    if "llama3" in results:
        rows = results["llama3"]["rows"]
        for kind in ("save", "load"):
            ratios = [s[f"{kind}_gbps"] / p[f"{kind}_gbps"] for p, s in zip(rows[::2], rows[1::2])]
            print(f"llama3 {kind}: sluice / POSIX {statistics.median(ratios):.2f}x (median over "
                  f"rank counts)")


if __name__ == "__main__":
    main()
