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
run reads one epoch of a new job; the figure is the median of --runs.
Every run checks that the two ranks together hold every sample once.

Needs root (the rig) and an optimized build (`cargo build --release`):
    python scripts/bench_cluster.py [--photos 400] [--runs 3] [--json out.json]
"""

import argparse
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


def read_epoch(client, n_samples):
    """One epoch of a new job, both ranks read at once: (seconds, samples,
    fragments the storage nodes ran, streams they opened)."""
    # Shuffled, as training reads: unshuffled, rank r's positions
    # (r, r + 2, ...) would be exactly the objects a position-sharded
    # ingest put on storage node r, and each rank would read one node.
    job = client.submit(SQL, batch_size=32, world_size=2, on_error="skip",
                        shuffle={"seed": 7})
    job.wait()
    before = counters(client)
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
    if errors:
        raise errors[0]
    got = keys[0] + keys[1]
    assert len(set(got)) == n_samples, f"{len(set(got))} distinct of {n_samples}"
    after = counters(client)
    return took, len(got), after[0] - before[0], after[1] - before[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--photos", type=int, default=400)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bin", default=None, help="sluice binary (default: the release build)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("the rig needs root")
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/sluice/target"))
    binary = args.bin or os.path.join(target, "release", "sluice")
    if not os.path.exists(binary):
        sys.exit(f"no optimized build at {binary}: cargo build --release -p sluice")
    import sluice

    results = []
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "src")
        write_images(os.path.join(src, "photos"), args.photos, 640, 480)
        env = dict(os.environ, SLUICE_RIG_DIR=os.path.join(d, "rig"), SLUICE_BIN=binary)
        for storage, compute in CONFIGS:
            up = rig("up", "--storage", str(storage), "--compute", str(compute),
                     "--ingest-root", src, env=env)
            try:
                os.sched_setaffinity(0, cpus(up["COMPUTE_CPUS"]))
                client = sluice.Client(up["REST"])
                deadline = time.monotonic() + 30
                while len(client._request("GET", "/v1/nodes")["compute"]) < compute:
                    assert time.monotonic() < deadline, "compute nodes never registered"
                    time.sleep(0.5)
                read_epoch(client, args.photos)  # warm-up: calibration, caches
                runs = [read_epoch(client, args.photos) for _ in range(args.runs)]
            finally:
                os.sched_setaffinity(0, set(range(os.cpu_count())))
                rig("down", env=env)
            rate = statistics.median(n / s for s, n, _, _ in runs)
            frags = statistics.median(f for _, _, f, _ in runs)
            streams = statistics.median(t for _, _, _, t in runs)
            row = {"storage": storage, "compute": compute, "samples_per_s": rate,
                   "fragments_per_epoch": frags, "streams_per_epoch": streams,
                   "samples_per_fragment": args.photos / frags if frags else None,
                   "runs": [{"seconds": s, "samples": n, "fragments": f, "streams": t}
                            for s, n, f, t in runs]}
            results.append(row)
            print(f"{storage} storage x {compute} compute: {rate:7.1f} samples/s, "
                  f"{frags:.0f} fragments/epoch ({row['samples_per_fragment'] or 0:.1f} "
                  f"samples each) over {streams:.0f} streams", flush=True)
    base = results[0]["samples_per_s"]
    print("\n| storage | compute | samples/s (median) | vs 1x1 | fragments per epoch | "
          "samples per fragment | streams (round trips) per epoch |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['storage']} | {r['compute']} | {r['samples_per_s']:.1f} | "
              f"{r['samples_per_s'] / base:.2f} | {r['fragments_per_epoch']:.0f} | "
              f"{r['samples_per_fragment'] or 0:.1f} | {r['streams_per_epoch']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"photos": args.photos, "runs": args.runs, "sql": SQL,
                       "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
