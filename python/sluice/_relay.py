"""Reads one job range over Flight and writes it to stdout as an Arrow IPC
stream, each batch's ``{"from", "next_offset"}`` as its custom metadata.

A process forked from one that used gRPC cannot use gRPC itself (gRPC's
threads do not survive a fork; a new channel waits forever), so a
``Reader`` in such a process (a DataLoader worker forked after the parent
read a job) runs ``python -m sluice._relay`` — a fresh interpreter — and
reads the stream it writes. The request arrives as JSON on stdin.
"""

import json
import sys

import pyarrow as pa


def main() -> None:
    req = json.loads(sys.stdin.readline())
    from .client import Client, Job, Reader

    client = Client(req["url"], req.get("token"), ca=req.get("ca"))
    client._flight_address = req["flight"]
    job = Job(client, req["job"])
    reader = Reader(job, req["rank"], req["epoch"], req["offset"], req.get("limit"), False,
                    prefetch=0, transport=req.get("transport"),
                    worker=req.get("worker", 0), workers=req.get("workers", 1))
    out = sys.stdout.buffer
    writer = None
    for batch in reader.batches():
        if writer is None:
            writer = pa.ipc.new_stream(out, reader.schema)
        meta = {"from": str(reader.last_from), "next_offset": str(reader.offset)}
        writer.write_batch(batch, custom_metadata=meta)
    if writer is None:
        writer = pa.ipc.new_stream(out, reader.schema)
    writer.close()
    out.flush()


if __name__ == "__main__":
    main()
