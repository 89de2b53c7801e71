#!/usr/bin/env python3
"""sluice as a cluster on the rig of `scripts/rig.sh`: aggregate samples/s
of a decode-heavy job (photos -> decode -> resize 224^2 -> tensor) with 1
or 2 storage nodes and 1 or 2 compute nodes, and what a window costs on
the storage link per epoch: fragments the storage nodes ran (one per
window per node holding some of its rows) and fragment streams they opened
(the round trips: one feed per job stream and node carries all of that
stream's windows; before feeds, one per fragment).

Each configuration brings the rig up (storage nodes on --storage-cpus,
the coordinator and compute nodes on --compute-cpus: on a 2-core machine
one core each, so the figures show the overhead of spreading and its
correctness, not scale), ingests the photos over REST (spread over the
storage nodes), submits a shuffled job with two trainer ranks, and reads both
ranks at once over Flight (as remote trainers would; shared memory is
off) from the nodes that serve them, pinned to the compute CPUs. Every
run reads one epoch of a new job, with the output cache off
(SLUICE_OUTPUT_CACHE_MEMORY=0) so that it reads the storage nodes; the figure is the median of --runs.
Every run checks that the two ranks together hold every sample once.

Data planes: a job's feed on a storage node reached by network runs on
the distributed engine (an engine query per stream and node). The feeds
over Flight it replaced were measured beside it before they were removed:
a binary built from commit 3571708 ("Data plane A/B for the cluster
benchmark") still has them, behind SLUICE_DATA_PLANE=flight in the nodes'
environment, and `--data-plane both --bin <that binary>` measures both
with the same binary, each configuration on a rig of its own brought up
once per plane (--rounds times, the planes taking turns: this machine
drifts by more than the planes differ), and prints the engine's
samples/s as a ratio of the feeds' (the gate: docs/benchmarks.md). A
binary built later ignores SLUICE_DATA_PLANE: both planes would be the
engine.

`--kill` adds the time from a storage node killed -9 mid-epoch to the
epoch going on (2 storage nodes, each part on both; the trainer reads
with no prefetch): the wait for the first batch after the kill, the
longest wait after it, and the windows the job ran again.

Needs root (the rig) and an optimized build (`cargo build --release`):
    python scripts/bench_cluster.py [--photos 3000] [--runs 5] [--rounds 1]
        [--data-plane engine] [--kill] [--json out.json]
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_udfs import write_images  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RIG = os.path.join(ROOT, "scripts", "rig.sh")
PYTHON = os.path.join(ROOT, "python")
sys.path.insert(1, PYTHON)
SQL = "SELECT key, to_tensor(resize(decode_image(data), 224, 224)) AS img FROM photos"
CONFIGS = [(1, 1), (2, 1), (1, 2), (2, 2)]


def cpus(spec):
    out = set()
    for part in spec.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def rig(*args, env):
    p = subprocess.run(["bash", RIG, *args], env=env, capture_output=True, text=True,
                       timeout=600)
    if p.returncode == 3:
        sys.exit(f"the rig cannot run here: {p.stderr.strip()}")
    if p.returncode != 0:
        raise SystemExit(f"rig.sh {' '.join(args)} failed: {p.stderr}")
    return dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)


def counters(client):
    """Fragments run and fragment streams opened, over all storage nodes."""
    nodes = client._request("GET", "/v1/nodes")["nodes"]
    return (sum(n.get("fragments", 0) for n in nodes),
            sum(n.get("streams", 0) for n in nodes))


def cpu_seconds(rig_dir):
    """CPU seconds (user + system) the rig's storage nodes and its compute
    side (coordinator and compute nodes) have used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"storage": 0.0, "compute": 0.0}
    with open(os.path.join(rig_dir, "pids")) as f:
        for line in f:
            pid, _, what = line.partition(" ")
            try:
                with open(f"/proc/{int(pid)}/stat") as st:
                    fields = st.read().rsplit(")", 1)[1].split()
            except (OSError, ValueError):
                continue
            node = os.path.basename(os.path.dirname(what.strip()))
            side = "storage" if node.startswith("storage") else "compute"
            out[side] += (int(fields[11]) + int(fields[12])) / tick
    return out


def read_epoch(client, n_samples, offload, rig_dir):
    """One epoch of a new job, both ranks read at once: (seconds, samples,
    fragments the storage nodes ran, streams they opened)."""
    # Shuffled, as training reads: unshuffled, rank r's positions
    # (r, r + 2, ...) would be exactly the objects a position-sharded
    # ingest put on storage node r, and each rank would read one node.
    job = client.submit(SQL, batch_size=32, world_size=2, on_error="skip",
                        shuffle={"seed": 7}, offload=offload)
    job.wait()
    before = counters(client)
    cpu_before = cpu_seconds(rig_dir)
    keys = [[], []]
    errors = []

    def read(rank):
        try:
            for b in job.reader(rank, transport="flight").batches():
                keys[rank] += b.column("key").to_pylist()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t0 = time.monotonic()
    threads = [threading.Thread(target=read, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - t0
    cpu = {k: v - cpu_before[k] for k, v in cpu_seconds(rig_dir).items()}
    if errors:
        raise errors[0]
    got = keys[0] + keys[1]
    assert len(set(got)) == n_samples, f"{len(set(got))} distinct of {n_samples}"
    after = counters(client)
    # The plan the auto placement chose last and the re-plans that led to
    # it: both planes must be compared on the same plan.
    choice = job.explain()["placement"]["pipelines"][0]["choice"]
    plan = f"{choice['kind']} {choice.get('cut', '')}".strip()
    replans = len(job.status().get("replans", []))
    plan = plan if not replans else f"{plan} after {replans} re-plans"
    return took, len(got), after[0] - before[0], after[1] - before[1], plan, cpu


def killed_mid_epoch(client, n_samples, rig_dir):
    """One epoch of a new job (one rank, no prefetch) with storage node 1
    killed -9 after the first batch: (seconds from the kill to the next
    batch, the longest wait between batches after it, windows run again)."""
    job = client.submit(SQL, batch_size=32, on_error="skip")
    job.wait()
    batches = job.reader(0, transport="flight", prefetch=0).batches()
    keys = next(batches).column("key").to_pylist()
    with open(os.path.join(rig_dir, "pids")) as f:
        pid = next(int(line.split()[0]) for line in f if "storage1/" in line)
    t = time.monotonic()
    os.kill(pid, 9)
    first = None
    longest = 0.0
    for b in batches:
        now = time.monotonic()
        if first is None:
            first = now - t
        longest = max(longest, now - t)
        t = now
        keys += b.column("key").to_pylist()
    assert len(set(keys)) == n_samples == len(keys), f"{len(set(keys))} of {n_samples}"
    status = job.status()
    redone = sum(f.get("windows", 0) for f in status.get("failovers", []))
    return first, longest, redone


def up_rig(storage, compute, src, env):
    up = rig("up", "--storage", str(storage), "--compute", str(compute),
             "--ingest-root", src, env=env)
    import sluice  # this checkout's client (see PYTHON), imported once the rig is needed

    client = sluice.Client(up["REST"])
    deadline = time.monotonic() + 30
    while len(client._request("GET", "/v1/nodes")["compute"]) < compute:
        assert time.monotonic() < deadline, "compute nodes never registered"
        time.sleep(0.5)
    return up, client


@contextlib.contextmanager
def warm_rig(storage, compute, plane, src, rig_dir, binary, args):
    """A rig of `storage` x `compute` nodes on `plane`, brought up, this
    process pinned to the compute CPUs and a warm-up epoch read
    (calibration, caches): its client; taken down on leaving."""
    # No output cache: each run's job reads the storage nodes (with it, a
    # later run of the same query is served from the compute node's
    # memory, and the figure is the cache's).
    env = dict(os.environ, SLUICE_RIG_DIR=rig_dir, SLUICE_BIN=binary,
               SLUICE_DATA_PLANE=plane, SLUICE_OUTPUT_CACHE_MEMORY="0")
    up, client = up_rig(storage, compute, src, env)
    try:
        os.sched_setaffinity(0, cpus(up["COMPUTE_CPUS"]))
        read_epoch(client, args.photos, args.offload, rig_dir)
        yield client
    finally:
        os.sched_setaffinity(0, set(range(os.cpu_count())))
        rig("down", env=env)


def block(storage, compute, plane, src, rig_dir, binary, args):
    """--runs epochs read on a warm rig of their own (see `warm_rig`)."""
    with warm_rig(storage, compute, plane, src, rig_dir, binary, args) as client:
        return [read_epoch(client, args.photos, args.offload, rig_dir) for _ in range(args.runs)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--photos", type=int, default=3000)
    ap.add_argument("--runs", type=int, default=5, help="epochs per rig brought up")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rigs brought up per configuration and plane, the planes taking "
                         "turns; the figures are medians over every round's epochs")
    ap.add_argument("--bin", default=None, help="sluice binary (default: the release build)")
    ap.add_argument("--data-plane", choices=["engine", "flight", "both"], default="engine",
                    help="the data plane of jobs' remote feeds; flight and both need a binary "
                         "from before the Flight feed's removal (see the module docs)")
    ap.add_argument("--kill", action="store_true",
                    help="also time a storage node killed mid-epoch, per plane")
    ap.add_argument("--offload", default="auto",
                    help="the jobs' offload: auto (placed and re-placed by measurement), "
                         "storage, compute or a cut; a fixed one compares planes on one plan")
    ap.add_argument("--configs", default=",".join(f"{s}x{c}" for s, c in CONFIGS),
                    help="storage x compute configurations, e.g. 1x2,2x2")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("the rig needs root")
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/sluice/target"))
    binary = args.bin or os.path.join(target, "release", "sluice")
    if not os.path.exists(binary):
        sys.exit(f"no optimized build at {binary}: cargo build --release -p sluice")
    configs = [tuple(int(n) for n in c.split("x")) for c in args.configs.split(",")]
    planes = ["engine", "flight"] if args.data_plane == "both" else [args.data_plane]
    results = []
    kills = []
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "src")
        write_images(os.path.join(src, "photos"), args.photos, 640, 480)
        rig_dir = os.path.join(d, "rig")
        for storage, compute in configs:
            # Each plane's epochs, over every round; with --rounds > 1
            # the planes take turns (each round in the other order), so
            # a machine that drifts slower or faster over minutes weighs
            # on both alike rather than on the one measured second.
            epochs = {plane: [] for plane in planes}
            for round_ in range(args.rounds):
                for plane in (planes if round_ % 2 == 0 else planes[::-1]):
                    epochs[plane].append(block(storage, compute, plane, src, rig_dir, binary, args))
            for plane in planes:
                runs = [run for block_ in epochs[plane] for run in block_]
                rate = statistics.median(n / s for s, n, *_ in runs)
                frags = statistics.median(r[2] for r in runs)
                streams = statistics.median(r[3] for r in runs)
                plans = sorted({r[4] for r in runs})
                # CPU milliseconds a sample costs each side (medians): the
                # storage side is the bottleneck here, and its CPU a less
                # noisy measure of a data plane's cost than samples/s.
                cpu_ms = {side: statistics.median(1000 * r[5][side] / r[1] for r in runs)
                          for side in ("storage", "compute")}
                row = {"plane": plane, "storage": storage, "compute": compute,
                       "samples_per_s": rate, "cpu_ms_per_sample": cpu_ms,
                       "fragments_per_epoch": frags, "streams_per_epoch": streams,
                       "samples_per_fragment": args.photos / frags if frags else None,
                       "rounds": [statistics.median(n / s for s, n, *_ in b)
                                  for b in epochs[plane]],
                       "runs": [{"seconds": s, "samples": n, "fragments": f, "streams": t,
                                 "plan": p, "cpu_s": c} for s, n, f, t, p, c in runs]}
                results.append(row)
                print(f"{plane:6} {storage} storage x {compute} compute: {rate:7.1f} samples/s, "
                      f"{frags:.0f} fragments/epoch ({row['samples_per_fragment'] or 0:.1f} "
                      f"samples each) over {streams:.0f} streams; CPU ms/sample storage "
                      f"{cpu_ms['storage']:.2f}, compute {cpu_ms['compute']:.2f}; "
                      f"plans: {', '.join(plans)}; by round: "
                      f"{', '.join(f'{r:.0f}' for r in row['rounds'])}",
                      flush=True)
        if args.kill:
            for plane in planes:
                with warm_rig(2, 0, plane, src, rig_dir, binary, args) as client:
                    first, longest, redone = killed_mid_epoch(client, args.photos, rig_dir)
                kills.append({"plane": plane, "to_next_batch_s": first,
                              "longest_wait_s": longest, "windows_run_again": redone})
                print(f"{plane:6} storage node killed: next batch after {first:.2f} s, "
                      f"longest wait {longest:.2f} s, {redone} windows run again", flush=True)
    print("\n| plane | storage | compute | samples/s (median) | vs 1x1 | fragments per epoch | "
          "samples per fragment | streams (round trips) per epoch |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        base = next(b["samples_per_s"] for b in results if b["plane"] == r["plane"])
        print(f"| {r['plane']} | {r['storage']} | {r['compute']} | {r['samples_per_s']:.1f} | "
              f"{r['samples_per_s'] / base:.2f} | {r['fragments_per_epoch']:.0f} | "
              f"{r['samples_per_fragment'] or 0:.1f} | {r['streams_per_epoch']:.0f} |")
    if len(planes) == 2:
        print("\n| storage | compute | engine / feeds, samples/s | streams, engine / feeds | "
              "storage CPU/sample, engine / feeds | compute CPU/sample, engine / feeds |")
        print("|---|---|---|---|---|---|")
        for e in (r for r in results if r["plane"] == "engine"):
            f = next(r for r in results if r["plane"] == "flight"
                     and (r["storage"], r["compute"]) == (e["storage"], e["compute"]))
            print(f"| {e['storage']} | {e['compute']} | "
                  f"{e['samples_per_s'] / f['samples_per_s']:.3f} | "
                  f"{e['streams_per_epoch']:.0f} / {f['streams_per_epoch']:.0f} | "
                  f"{e['cpu_ms_per_sample']['storage'] / f['cpu_ms_per_sample']['storage']:.3f} | "
                  f"{e['cpu_ms_per_sample']['compute'] / f['cpu_ms_per_sample']['compute']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"photos": args.photos, "runs": args.runs, "rounds": args.rounds, "sql": SQL,
                       "results": results, "killed": kills}, f, indent=2)


if __name__ == "__main__":
    main()
