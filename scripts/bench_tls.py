#!/usr/bin/env python3
"""What TLS costs: samples/s of the standard training job (photos ->
random_resized_crop 224^2 -> flip -> normalize, float32 out: ~600 KB a
sample on the wire) read over Flight in plain text and over TLS, measured
in the same run.

- loopback: two `sluice serve` on this machine over the same photos, one
  plain and one with a certificate of a CA made by `sluice certs`; epochs
  alternate between them (plain, TLS, plain, ...), each a new job read by
  one trainer over Flight (`transport="flight"`: shared memory would
  bypass the link). This is the trainer path's cost.
- `--rig`: the rig of `scripts/rig.sh` (1 storage node, 1 compute node,
  the coordinator) brought up plain, then with `--tls`; the trainer reads
  from the compute node, which reads the storage node: the trainer path
  and the storage->compute link both encrypted. The two rigs run one
  after the other (a rig takes the bridge's addresses).

Figures: the median samples/s of --runs epochs after a warm-up epoch, and
TLS / plain. Needs an optimized build (`cargo build --release -p sluice`):
    python scripts/bench_tls.py [--photos 300] [--runs 5] [--rig] [--json out.json]
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
sys.path.insert(0, HERE)
from bench_udfs import write_images  # noqa: E402
from sluice_server import Server  # noqa: E402

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
SQL = (
    "SELECT key, normalize(random_horizontal_flip(random_resized_crop("
    f"decode_image(data), 224, 224)), {MEAN}, {STD}) AS image FROM photos"
)
RIG = os.path.join(os.path.dirname(HERE), "scripts", "rig.sh")


def epoch(client, n):
    """Seconds to read one epoch of a new job over Flight, and its bytes."""
    job = client.submit(SQL, batch_size=32, on_error="skip", shuffle={"seed": 11})
    job.wait()
    t0 = time.monotonic()
    rows = nbytes = 0
    for b in job.reader(0, transport="flight").batches():
        rows += b.num_rows
        nbytes += b.nbytes
    took = time.monotonic() - t0
    assert rows == n, f"{rows} of {n} samples"
    return took, nbytes


def certs(binary, d):
    """A CA and a certificate for 127.0.0.1 (`sluice certs`): the flags."""
    pki = os.path.join(d, "pki")
    subprocess.run([binary, "certs", "ca", pki], check=True, capture_output=True)
    subprocess.run([binary, "certs", "node", pki, "bench", "127.0.0.1"], check=True,
                   capture_output=True)
    return pki, ["--tls-cert", os.path.join(pki, "bench.pem"),
                 "--tls-key", os.path.join(pki, "bench.key")]


def loopback(binary, d, src, photos, runs):
    pki, tls = certs(binary, d)
    os.environ["SLUICE_TLS_CA"] = os.path.join(pki, "ca.pem")
    times = {"plain": [], "tls": []}
    nbytes = 0
    with Server(binary, os.path.join(d, "plain"), src) as plain, \
            Server(binary, os.path.join(d, "tls"), src, tls) as secure:
        assert secure.url.startswith("https://"), secure.url
        clients = {"plain": plain, "tls": secure}
        for c in clients.values():
            c.ingest("photos", os.path.join(src, "photos"))
            epoch(c, photos)  # warm-up
        for _ in range(runs):
            for mode, c in clients.items():
                s, nbytes = epoch(c, photos)
                times[mode].append(s)
    return summary("loopback", times, photos, nbytes)


def rig(binary, d, src, photos, runs):
    import sluice

    times = {}
    nbytes = 0
    for mode in ("plain", "tls"):
        env = dict(os.environ, SLUICE_RIG_DIR=os.path.join(d, f"rig-{mode}"), SLUICE_BIN=binary)
        # The loopback run's CA is not the rig's.
        env.pop("SLUICE_TLS_CA", None)
        args = ["up", "--storage", "1", "--compute", "1", "--ingest-root", src]
        if mode == "tls":
            args.append("--tls")
        p = subprocess.run(["bash", RIG, *args], env=env, capture_output=True, text=True,
                           timeout=600)
        if p.returncode != 0:
            sys.exit(f"rig.sh up failed ({p.returncode}): {p.stderr.strip()}")
        up = dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)
        try:
            c = sluice.Client(up["REST"], ca=up.get("CA"))
            deadline = time.monotonic() + 30
            while not c._request("GET", "/v1/nodes")["compute"]:
                assert time.monotonic() < deadline, "the compute node never registered"
                time.sleep(0.5)
            epoch(c, photos)  # warm-up
            times[mode] = []
            for _ in range(runs):
                s, nbytes = epoch(c, photos)
                times[mode].append(s)
        finally:
            subprocess.run(["bash", RIG, "down"], env=env, capture_output=True, timeout=300)
    return summary("rig (1 storage, 1 compute)", times, photos, nbytes)


def summary(where, times, photos, nbytes):
    row = {"where": where, "photos": photos, "bytes_per_epoch": nbytes}
    for mode, ts in times.items():
        row[mode] = {"samples_per_s": statistics.median(photos / s for s in ts),
                     "seconds": ts}
    row["tls_vs_plain"] = row["tls"]["samples_per_s"] / row["plain"]["samples_per_s"]
    print(f"{where}: plain {row['plain']['samples_per_s']:.1f} samples/s, "
          f"TLS {row['tls']['samples_per_s']:.1f} samples/s, "
          f"TLS/plain {row['tls_vs_plain']:.3f} ({nbytes / 1e6:.0f} MB an epoch)", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--photos", type=int, default=300)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rig", action="store_true", help="also on the rig (needs root)")
    ap.add_argument("--bin", default=None, help="sluice binary (default: the release build)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/sluice/target"))
    binary = args.bin or os.path.join(target, "release", "sluice")
    if not os.path.exists(binary):
        sys.exit(f"no optimized build at {binary}: cargo build --release -p sluice")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "src")
        write_images(os.path.join(src, "photos"), args.photos, 640, 480)
        rows.append(loopback(binary, d, src, args.photos, args.runs))
        if args.rig:
            rows.append(rig(binary, d, src, args.photos, args.runs))
    print("\n| where | plain samples/s | TLS samples/s | TLS / plain |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['where']} | {r['plain']['samples_per_s']:.1f} | "
              f"{r['tls']['samples_per_s']:.1f} | {r['tls_vs_plain']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sql": SQL, "runs": args.runs, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
