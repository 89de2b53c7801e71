#!/usr/bin/env python3
"""Checkpoints on a cluster, on the rig (`scripts/rig.sh`: each storage
node and the coordinator a host of its own in a network namespace, the
storage nodes pinned to their own CPUs): what striping over more storage
nodes buys a writer and a reader of a cluster checkpoint.

For each link (`--links`: `unlimited`, or a rate each storage node's
link has in both directions, like a NIC: the rig's own shaping of its
egress plus a token bucket on the bridge's side of its veth) and each
(storage nodes, replicas) of `--layouts`, a rig comes up, and a
`sluice.Checkpoint` of `--size` MiB (random bytes) is written through the
coordinator and read back, `--runs` times; GB/s, medians, and the ratio
to one node with one copy. Each write and each read is timed two ways in
the same run, alternating: the trainer sending its stripes to the storage
nodes and reading them from there itself (upload and read passes, the
default) and every part and range relayed by the coordinator
(`direct=False`). A local file written with fsync and read cold
on the same disk is printed beside, for scale. Run it on the optimized
build (`--sluice target/release/sluice`) as root.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RIG = os.path.join(HERE, "rig.sh")
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import sluice  # noqa: E402


def rig(rig_dir, binary, *args):
    env = dict(os.environ, SLUICE_RIG_DIR=rig_dir, SLUICE_BIN=binary)
    p = subprocess.run(["bash", RIG, *args], env=env, capture_output=True, text=True,
                       timeout=300)
    if p.returncode == 3:
        # rig.sh's word for a machine that cannot run one (no namespaces).
        print(f"SKIP: {p.stderr.strip()}")
        raise SystemExit(0)
    if p.returncode != 0:
        raise SystemExit(f"rig.sh {' '.join(args)}: {p.stderr.strip()}")
    return dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)


def shape_inbound(nodes, rate):
    """The bridge's side of each storage host's veth: traffic into the
    host, at `rate` (the rig shapes what leaves it)."""
    for i in range(nodes):
        subprocess.run(["tc", "qdisc", "replace", "dev", f"slr-s{i}", "root", "tbf", "rate",
                        rate, "burst", "256k", "latency", "50ms"], check=True)


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def local_rates(work, data, runs):
    """A local file on the same disk: write + fsync, and a cold read."""
    path = os.path.join(work, "local.bin")
    writes, reads = [], []

    def write():
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def read():
        with open(path, "rb") as f:
            f.read()

    for _ in range(runs):
        writes.append(timed(write))
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        reads.append(timed(read))
    os.unlink(path)
    return len(data) / statistics.median(writes) / 1e9, len(data) / statistics.median(reads) / 1e9


def one_layout(binary, work, nodes, replicas, link, data, runs):
    rig_dir = os.path.join(work, "rig")
    args = ["up", "--storage", str(nodes), "--compute", "0"]
    if link != "unlimited":
        args += ["--link", link]
    env = rig(rig_dir, binary, *args, "--", "--checkpoint-replicas", str(replicas))
    try:
        if link != "unlimited":
            shape_inbound(nodes, link)
        client = sluice.Client(env["REST"])
        # The trainer's two routes: its stripes straight to the storage
        # nodes (upload passes), and every part through the coordinator.
        cks = {"direct": sluice.Checkpoint(client, "bench", workers=4),
               "relayed": sluice.Checkpoint(client, "bench", workers=4, direct=False)}
        want = {"direct": "direct", "relayed": "flight"}
        writes = {route: [] for route in cks}
        reads = {route: [] for route in cks}
        for i in range(runs):
            # Alternated, so neither route always runs first.
            order = list(cks) if i % 2 == 0 else list(cks)[::-1]
            for route in order:
                ck = cks[route]

                def write():
                    with ck.writer(f"ckpt{i}-{route}") as w:
                        w.write(data)
                    assert w.transport == want[route], (route, w.transport)

                writes[route].append(timed(write))
            for route in order:
                ck = cks[route]

                got = []

                def read():
                    with ck.reader(f"ckpt{i}-{route}") as r:
                        got.append(r.read())
                    assert r.transport == want[route], (route, r.transport)

                reads[route].append(timed(read))
                # Checked after the clock, as the local read is not.
                assert got[0] == data, route
            for route in cks:
                cks[route].delete(f"ckpt{i}-{route}")

        def gbps(times):
            return {route: len(data) / statistics.median(t) / 1e9 for route, t in times.items()}

        w, r = gbps(writes), gbps(reads)
        return {
            "nodes": nodes, "replicas": replicas, "link": link,
            "write_gbps": w["direct"], "write_relayed_gbps": w["relayed"],
            "read_gbps": r["direct"], "read_relayed_gbps": r["relayed"],
            "write_s": writes["direct"], "write_relayed_s": writes["relayed"],
            "read_s": reads["direct"], "read_relayed_s": reads["relayed"],
        }
    finally:
        rig(rig_dir, binary, "down")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sluice", required=True, help="the sluice binary (release build)")
    ap.add_argument("--size", type=int, default=256, help="MiB per checkpoint")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--links", default="unlimited,1Gbit")
    ap.add_argument("--layouts", default="1x1,2x1,2x2,3x2",
                    help="storage nodes x replicas, comma-separated")
    ap.add_argument("--work", default=None, help="a directory on the disk to measure")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the rig needs root (network namespaces, veth, tc)")
    data = os.urandom(a.size << 20)
    work = a.work or tempfile.mkdtemp(prefix="sluice-bench-cluster-")
    local_w, local_r = local_rates(work, data, a.runs)
    print(f"local file on the same disk: write+fsync {local_w:.2f} GB/s, cold read "
          f"{local_r:.2f} GB/s ({a.size} MiB, median of {a.runs})")
    results = []
    for link in a.links.split(","):
        base = None
        print(f"\nlink per storage node: {link}")
        print(f"{'':>12} {'write, GB/s':^40} {'read, GB/s':^40}")
        print(f"{'nodes':>5} {'copies':>6} {'direct':>8} {'vs 1x1':>7} {'relayed':>8} "
              f"{'direct/relayed':>15} {'direct':>8} {'vs 1x1':>7} {'relayed':>8} "
              f"{'direct/relayed':>15}")
        for layout in a.layouts.split(","):
            nodes, replicas = (int(x) for x in layout.split("x"))
            r = one_layout(a.sluice, work, nodes, replicas, link, data, a.runs)
            base = base or r
            r["write_vs_one"] = r["write_gbps"] / base["write_gbps"]
            r["read_vs_one"] = r["read_gbps"] / base["read_gbps"]
            r["direct_vs_relayed"] = r["write_gbps"] / r["write_relayed_gbps"]
            r["read_direct_vs_relayed"] = r["read_gbps"] / r["read_relayed_gbps"]
            results.append(r)
            print(f"{nodes:>5} {replicas:>6} {r['write_gbps']:>8.3f} {r['write_vs_one']:>6.2f}x "
                  f"{r['write_relayed_gbps']:>8.3f} {r['direct_vs_relayed']:>14.2f}x "
                  f"{r['read_gbps']:>8.3f} {r['read_vs_one']:>6.2f}x "
                  f"{r['read_relayed_gbps']:>8.3f} {r['read_direct_vs_relayed']:>14.2f}x",
                  flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"size_mib": a.size, "runs": a.runs, "local_write_gbps": local_w,
                       "local_read_gbps": local_r, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
