#!/usr/bin/env python3
"""Flight throughput of tensor batches to a pyarrow client: sluice's trainer
Flight service vs pyarrow's own C++ Flight server (FlightServerBase)
serving the same batches, on loopback, measured in one run.

sluice reads `--samples` float32 arrays of `--shape` from its device, decodes
them (`npy`), copies them into a fixed-shape tensor column and streams a
job's epoch in batches of `--batch`; pyarrow's server streams the very
batches the client received from sluice, from memory. The same client code
reads both (read_chunk until the end). sluice therefore does more work per
byte than the baseline. A second job streams the raw objects (the `data`
column, no decoding) to separate the Flight path from the decoding.
Each epoch is read twice from sluice, in turn: over Flight (the ticket
alone, as any Flight client) and through shared memory (sluice's Reader,
which the server on the same host answers with a segment; the batches are
built over the mapping). The three are timed in turn, epoch by epoch,
after one warm-up epoch of each, so that every one meets the client
process in the same state (a client that has read more epochs reads
faster over Flight, from either server; why is not found yet). Figures: MB/s
and batches/s, median of `--runs` epochs, and sluice's ratio to pyarrow.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluice_server import Server  # noqa: E402


class MemoryServer(flight.FlightServerBase):
    """Serves one list of batches on any ticket."""

    def __init__(self, batches):
        super().__init__("grpc://127.0.0.1:0")
        self.table = pa.Table.from_batches(batches)

    def do_get(self, context, ticket):
        return flight.RecordBatchStream(self.table)


def drain(client, ticket, options=None):
    """Reads a whole stream; returns (seconds, bytes, batches, batch list)."""
    t0 = time.perf_counter()
    reader = client.do_get(ticket, options) if options else client.do_get(ticket)
    nbytes, got = 0, []
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            break
        if chunk.data is not None:
            nbytes += chunk.data.nbytes
            got.append(chunk.data)
    return time.perf_counter() - t0, nbytes, len(got), got


def drain_shm(job, epoch):
    """The same through sluice's Reader over shared memory."""
    t0 = time.perf_counter()
    r = job.reader(0, epoch, prefetch=0, transport="shm")
    nbytes = n = 0
    for b in r.batches():
        nbytes += b.nbytes
        n += 1
    assert r.transport_used == "shm"
    return time.perf_counter() - t0, nbytes, n


def timed(server, read, cpu):
    """Runs `read`, appending (server CPU s, client CPU s) it cost to `cpu`."""
    s0, c0 = server.cpu_seconds() if server else 0.0, time.process_time()
    out = read()
    cpu.append(((server.cpu_seconds() - s0) if server else 0.0, time.process_time() - c0))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sluice", required=True)
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--shape", default="8,128,128")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work")
    args = ap.parse_args()
    shape = tuple(int(s) for s in args.shape.split(","))
    if args.work:
        run(args, shape, args.work)
    else:
        # Its device file and sources are half a GiB: gone after the run.
        with tempfile.TemporaryDirectory(prefix="sluice-flight-") as work:
            run(args, shape, work)


def run(args, shape, work):
    src = os.path.join(work, "src", "arrays")
    os.makedirs(os.path.join(src, "c0"), exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(args.samples):
        np.save(os.path.join(src, "c0", f"a{i:05d}.npy"), rng.standard_normal(shape, dtype=np.float32))

    d, h, w = shape
    pipelines = [
        ("tensors", "device read + npy + tensor + Flight",
         f"SELECT key, to_tensor(crop3d(npy(data), 0, 0, 0, {d}, {h}, {w}), 'float32') AS x FROM arrays"),
        ("raw objects", "device read + Flight",
         "SELECT key, data FROM arrays"),
    ]
    rows = []
    server = Server(args.sluice, work, os.path.join(work, "src"))
    with server as client:
        client.ingest("arrays", src)
        fl = client.flight()
        for name, what, sql in pipelines:
            job = client.submit(sql, batch_size=args.batch, epochs=args.runs + 1, offload="storage")
            job.wait()

            def ticket(epoch):
                return flight.Ticket(json.dumps(
                    {"type": "job", "job": job.id, "rank": 0, "epoch": epoch}).encode())

            # Warm-up: sluice's epoch 0 (which fills the node cache) gives
            # the batches pyarrow's server then serves from memory.
            _, _, _, batches = drain(fl, ticket(0))
            drain_shm(job, 0)
            memory_server = MemoryServer(batches)
            threading.Thread(target=memory_server.serve, daemon=True).start()
            base_client = flight.FlightClient(f"grpc://127.0.0.1:{memory_server.port}")
            drain(base_client, flight.Ticket(b"x"))
            # Then each epoch from each server in turn: the client process
            # (its allocator, its gRPC windows) is in the same state for all.
            # Each is timed with the CPU it cost: the sluice server's (over
            # shared memory its own work alone: read, decode, batch; no
            # socket) and this client process's (pyarrow's gRPC threads
            # included). pyarrow's server runs in this process, so its
            # row has the two together.
            ours, shm, base = [], [], []
            cpu = {"flight": [], "shm": [], "base": []}
            for epoch in range(1, args.runs + 1):
                ours.append(timed(server, lambda: drain(fl, ticket(epoch))[:3], cpu["flight"]))
                shm.append(timed(server, lambda: drain_shm(job, epoch), cpu["shm"]))
                base.append(timed(None, lambda: drain(base_client, flight.Ticket(b"x"))[:3],
                                  cpu["base"]))
            memory_server.shutdown()
            medians = {k: tuple(statistics.median(c[i] for c in v) for i in range(2))
                       for k, v in cpu.items()}
            rows.append((name, what, ours, shm, base, medians))

    def summary(rows):
        mbps = statistics.median(b / s / 1e6 for s, b, _ in rows)
        bps = statistics.median(n / s for s, _, n in rows)
        return mbps, bps

    print(f"flight throughput: {args.samples} float32 arrays {list(shape)}, batches of {args.batch}, "
          f"median of {args.runs} epochs after a warm-up, same client code")
    for name, what, ours, shm, base, cpu in rows:
        o_mb, o_b = summary(ours)
        s_mb, s_b = summary(shm)
        b_mb, b_b = summary(base)
        via_shm = what.replace("Flight", "shared memory")
        print(f"  {name}: {ours[0][1] / 1e6:.1f} MB per epoch")
        print(f"    sluice ({what}){'':<{max(1, 40 - len(what))}} {o_mb:9.1f} MB/s  {o_b:8.1f} batches/s")
        print(f"    sluice ({via_shm}){'':<{max(1, 40 - len(via_shm))}} {s_mb:9.1f} MB/s  {s_b:8.1f} batches/s")
        print(f"    pyarrow FlightServerBase (memory + Flight){'':<6} {b_mb:9.1f} MB/s  {b_b:8.1f} batches/s")
        print(f"    ratio sluice / pyarrow: Flight {o_mb / b_mb:.2f}x, shared memory {s_mb / b_mb:.2f}x")
        mb = ours[0][1] / 1e6
        for label, key in (("Flight", "flight"), ("shared memory", "shm")):
            srv, cli = cpu[key]
            print(f"    CPU per epoch, sluice over {label}: server {srv:.3f} s "
                  f"({mb / max(srv, 1e-9):.0f} MB per CPU second), client {cli:.3f} s")
        print(f"    CPU per epoch, pyarrow (server and client in one process): {cpu['base'][1]:.3f} s")


if __name__ == "__main__":
    main()
