#!/usr/bin/env python3
"""What replicas cost and what they buy, on the rig of `scripts/rig.sh`
(2 storage nodes, the coordinator serving the trainer):

- ingest of the same photos with 1 and 2 replicas: seconds and bytes
  written over the nodes;
- the epoch rate of a decode-heavy job (photos -> decode -> resize 224^2
  -> tensor) over each, read by one trainer over Flight (median of --runs);
- with 2 replicas, the trainer's stall when a storage node is killed -9
  a third into an epoch: the longest wait for a batch beside the median
  wait, the windows run again, and a check that every sample came once;
- repair: --flip objects corrupted on one node's device, then one scrub
  (`POST /v1/scrub`): objects and MB read back a second, objects repaired;
- moving replicas: a third storage node joins and a node is drained onto
  it (`POST /v1/nodes/storage/{id}/drain`): samples copied, MB written
  anew on the nodes, seconds.

Needs root (the rig) and an optimized build (`cargo build --release`):
    python scripts/bench_replicas.py [--photos 400] [--runs 3] [--flip 20] [--json out.json]
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cluster import cpus, rig  # noqa: E402
from bench_udfs import write_images  # noqa: E402

SQL = "SELECT key, to_tensor(resize(decode_image(data), 224, 224)) AS img FROM {}"


def read_epoch(client, table, n, kill=None):
    """One epoch of a new job over `table`: (seconds, the waits between
    batches, the job's status). `kill()` is called a third of the way in."""
    job = client.submit(SQL.format(table), batch_size=32, on_error="skip", shuffle={"seed": 7})
    job.wait()
    keys, waits = [], []
    t0 = last = time.monotonic()
    for b in job.reader(0, transport="flight").batches():
        now = time.monotonic()
        waits.append(now - last)
        last = now
        keys += b.column("key").to_pylist()
        if kill and len(keys) >= n // 3:
            kill()
            kill = None
    took = time.monotonic() - t0
    assert len(keys) == n and len(set(keys)) == n, f"{len(set(keys))} distinct of {n}"
    return took, waits, job.status()


def flip_objects(device, paths):
    """Flips the last byte of each file's bytes in the device file."""
    with open(device, "r+b") as f:
        data = f.read()
        for p in paths:
            with open(p, "rb") as g:
                needle = g.read()
            at = data.find(needle)
            assert at >= 0, p
            f.seek(at + len(needle) - 1)
            f.write(bytes([data[at + len(needle) - 1] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--photos", type=int, default=400)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--flip", type=int, default=20)
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

    out = {"photos": args.photos, "runs": args.runs, "sql": SQL.format("…")}
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "src")
        photos = os.path.join(src, "photos")
        write_images(photos, args.photos, 640, 480)
        rig_dir = os.path.join(d, "rig")
        # No object cache on the nodes: every epoch and scrub reads the device.
        env = dict(os.environ, SLUICE_RIG_DIR=rig_dir, SLUICE_BIN=binary,
                   SLUICE_CACHE_MEMORY="0", SLUICE_OUTPUT_CACHE_MEMORY="0")
        up = rig("up", "--storage", "2", "--compute", "0", "--ingest-root", src, env=env)
        try:
            os.sched_setaffinity(0, cpus(up["COMPUTE_CPUS"]))
            client = sluice.Client(up["REST"])
            for r in (1, 2):
                t0 = time.monotonic()
                report = client.ingest(f"r{r}", photos, replicas=r)
                out[f"ingest_r{r}"] = {"seconds": time.monotonic() - t0,
                                       "bytes": report["bytes"],
                                       "stored_bytes": report["stored_bytes"]}
                read_epoch(client, f"r{r}", args.photos)  # warm-up
                runs = [read_epoch(client, f"r{r}", args.photos)[0] for _ in range(args.runs)]
                out[f"epoch_r{r}"] = {"samples_per_s": statistics.median(args.photos / s
                                                                         for s in runs),
                                      "seconds": runs}
                print(f"replicas {r}: ingest {out[f'ingest_r{r}']['seconds']:.2f} s, "
                      f"{report['stored_bytes'] / 1e6:.1f} MB written; epoch "
                      f"{out[f'epoch_r{r}']['samples_per_s']:.1f} samples/s", flush=True)

            pids = {}
            with open(os.path.join(rig_dir, "pids")) as f:
                for line in f:
                    pid, log = line.split()[:2]
                    pids[os.path.basename(os.path.dirname(log))] = int(pid)
            took, waits, status = read_epoch(
                client, "r2", args.photos,
                kill=lambda: os.kill(pids["storage1"], signal.SIGKILL))
            steady = statistics.median(waits)
            out["stall"] = {"longest_wait_s": max(waits), "median_wait_s": steady,
                            "epoch_s": took, "failovers": status.get("failovers", [])}
            print(f"storage node killed mid-epoch: longest wait {max(waits):.3f} s, "
                  f"median {steady:.3f} s, windows run again "
                  f"{sum(f['windows'] for f in status.get('failovers', []))}", flush=True)

            rig("restart-storage", "1", env=env)
            time.sleep(12)  # past the lost mark, so the node is read again
            names = sorted(os.listdir(photos))[:args.flip]
            flip_objects(os.path.join(rig_dir, "storage1", "data", "device.img"),
                         [os.path.join(photos, n) for n in names])
            t0 = time.monotonic()
            nodes = client._request("POST", "/v1/scrub", {})
            scrub_s = time.monotonic() - t0
            read = sum(n["report"]["bytes"] for n in nodes)
            objects = sum(n["report"]["objects"] for n in nodes)
            repaired = sum(1 for n in nodes for x in n["repairs"] if x["outcome"] == "repaired")
            out["scrub"] = {"seconds": scrub_s, "objects": objects, "bytes": read,
                            "repaired": repaired, "flipped": len(names)}
            print(f"scrub of both nodes: {objects} objects, {read / 1e6:.1f} MB in {scrub_s:.2f} s "
                  f"({read / 1e6 / scrub_s:.0f} MB/s), {repaired} of {len(names)} repaired",
                  flush=True)

            added = rig("add-storage", env=env)["STORAGE_URL"]
            while added not in {n["name"] for n in client._request("GET", "/v1/nodes")["nodes"]}:
                time.sleep(0.5)
            drained = up["STORAGE"].split(",")[1].split("://")[1]
            t0 = time.monotonic()
            reports = client._request("POST", f"/v1/nodes/storage/{drained}/drain")
            drain_s = time.monotonic() - t0
            copied = sum(v["copied"] for r in reports for v in r["versions"])
            written = sum(v["bytes"] for r in reports for v in r["versions"])
            out["drain"] = {"seconds": drain_s, "samples_copied": copied,
                            "bytes_written": written,
                            "moves": sum(len(r["moves"]) for r in reports)}
            print(f"drain of a node onto a new one: {copied} samples copied, "
                  f"{written / 1e6:.1f} MB written in {drain_s:.2f} s "
                  f"({written / 1e6 / drain_s:.0f} MB/s)", flush=True)
            assert read_epoch(client, "r2", args.photos)[0] > 0
        finally:
            os.sched_setaffinity(0, set(range(os.cpu_count())))
            rig("down", env=env)
    r1, r2 = out["epoch_r1"]["samples_per_s"], out["epoch_r2"]["samples_per_s"]
    print("\n| | replicas 1 | replicas 2 |")
    print("|---|---|---|")
    print(f"| ingest, s | {out['ingest_r1']['seconds']:.2f} | {out['ingest_r2']['seconds']:.2f} |")
    print(f"| bytes written, MB | {out['ingest_r1']['stored_bytes'] / 1e6:.1f} | "
          f"{out['ingest_r2']['stored_bytes'] / 1e6:.1f} |")
    print(f"| epoch, samples/s (median) | {r1:.1f} | {r2:.1f} ({r2 / r1:.2f}x) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
