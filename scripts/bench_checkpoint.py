#!/usr/bin/env python3
"""Checkpoints through sluice against the local disk, in one run on the
same machine (the successor of bench_torch.py's checkpoint table):

1. `torch.save` of a state dict of random float32 tensors (4 MiB each)
   through `sluice.Checkpoint` (the commit makes it durable: the device is
   flushed before the version is visible), over shared memory (the same
   host) and over Flight (what a remote writer gets), vs `torch.save` to a
   file on the same disk followed by `os.fsync`;
2. loading it: `torch.load` over `Checkpoint.reader`, and
   `Checkpoint.load` (the tensors over the region the server read the
   version into, `torch.load(mmap=True)`), vs `torch.load` of the file with
   its pages dropped first (`posix_fadvise(DONTNEED)`; sluice reads with
   O_DIRECT, so never from a cache either);
3. `torch.distributed.checkpoint` (one process): `dcp.save`/`dcp.load`
   through `sluice.dcp` vs DCP's own `FileSystemWriter(sync_files=True)`
   and `FileSystemReader` on the same disk, pages dropped before the load;
4. the limit: the disk's own O_DIRECT rate (fio, io_uring, 16 MiB blocks,
   4 in flight) over a file of the same size.

GB/s, median of `--runs`, and the ratios. Run it on the optimized build
(`cargo build --release`); a debug build's figures mean little.
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from sluice_server import Server  # noqa: E402

import sluice  # noqa: E402
from sluice.dcp import SluiceReader, SluiceWriter  # noqa: E402


def state_of(nbytes):
    """A model-like state dict: tensors of 4 MiB or less, `nbytes` in all."""
    g = torch.Generator().manual_seed(0)
    left, i, state = nbytes, 0, {}
    while left > 0:
        n = min(left, 4 << 20) // 4
        state[f"layer{i}.weight"] = torch.rand(max(n, 1), generator=g)
        left -= n * 4
        i += 1
    return state


def drop_pages(path):
    for p in [path] if os.path.isfile(path) else glob.glob(os.path.join(path, "*")):
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def local_save(state, path):
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def local_load(path):
    drop_pages(path)
    with open(path, "rb") as f:
        return torch.load(f, weights_only=True)


def sluice_save(state, ck, name):
    with ck.writer(name) as f:
        torch.save(state, f)
    return f.transport


def sluice_load(ck, name):
    with ck.reader(name) as f:
        return torch.load(f, weights_only=True)


def dcp_empty(state):
    return {k: torch.empty_like(v) for k, v in state.items()}


def fio_rate(work, nbytes):
    """The disk's O_DIRECT write and read GB/s over a file of `nbytes`."""
    path = os.path.join(work, "fio.img")
    out = {}
    for rw in ("write", "read"):
        r = subprocess.run(
            ["fio", "--name=ckpt", f"--filename={path}", f"--size={nbytes}", "--bs=16m",
             "--direct=1", "--ioengine=io_uring", "--iodepth=4", f"--rw={rw}",
             "--end_fsync=1", "--output-format=json"],
            capture_output=True, text=True)
        if r.returncode != 0:
            return None
        job = json.loads(r.stdout)["jobs"][0][rw]
        out[rw] = job["io_bytes"] / (job["runtime"] / 1000) / 1e9 if job["runtime"] else 0.0
    os.remove(path)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sluice", required=True, help="the sluice binary (a release build)")
    p.add_argument("--sizes", default="64,1024,4096", help="checkpoint sizes in MiB")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--work", default=None, help="a directory on the disk to measure")
    p.add_argument("--json", default=None, help="write the figures here too")
    a = p.parse_args()
    # One process, no process group: DCP says so on every call.
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    if "/debug/" in a.sluice:
        print("warning: a debug build of sluice; these figures mean little", file=sys.stderr)
    sizes = [int(s) << 20 for s in a.sizes.split(",")]
    device = f"{max(4, 3 * max(sizes) // 2**30 + 2)}GiB"
    results = []
    with tempfile.TemporaryDirectory(dir=a.work) as work:
        with Server(a.sluice, work, work, device_size=device) as client:
            shm = sluice.Checkpoint(client, "bench", transport="shm")
            fl = sluice.Checkpoint(client, "bench", transport="flight")
            print(f"checkpoints: GB/s, median of {a.runs}; ratio = sluice / local")
            head = (f"{'size':>7} {'what':<30} {'local':>7} {'shm':>7} {'ratio':>6} "
                    f"{'flight':>7} {'ratio':>6}")
            print(head)
            for size in sizes:
                state = state_of(size)
                nbytes = sum(t.numel() * t.element_size() for t in state.values())
                t = {k: [] for k in ("lw", "lr", "sw", "sr", "sm", "fw", "fr",
                                     "dlw", "dlr", "dsw", "dsr")}
                local = os.path.join(work, "local.pt")
                ddir = os.path.join(work, "dcp")
                for run in range(a.runs):
                    t["lw"].append(timed(lambda: local_save(state, local))[0])
                    t["lr"].append(timed(lambda: local_load(local))[0])
                    os.remove(local)
                    t["sw"].append(timed(lambda: sluice_save(state, shm, "s.pt"))[0])
                    t["sr"].append(timed(lambda: sluice_load(shm, "s.pt"))[0])
                    t["sm"].append(timed(lambda: shm.load("s.pt", weights_only=True))[0])
                    t["fw"].append(timed(lambda: sluice_save(state, fl, "f.pt"))[0])
                    t["fr"].append(timed(lambda: sluice_load(fl, "f.pt"))[0])
                    t["dlw"].append(timed(lambda: dcp.save(
                        state, storage_writer=dcp.FileSystemWriter(ddir, sync_files=True)))[0])
                    drop_pages(ddir)
                    t["dlr"].append(timed(lambda: dcp.load(
                        dcp_empty(state), storage_reader=dcp.FileSystemReader(ddir)))[0])
                    shutil.rmtree(ddir)
                    t["dsw"].append(timed(lambda: dcp.save(
                        state, storage_writer=SluiceWriter(shm), checkpoint_id=f"d{run}"))[0])
                    t["dsr"].append(timed(lambda: dcp.load(
                        dcp_empty(state), storage_reader=SluiceReader(shm),
                        checkpoint_id=f"d{run}"))[0])
                    for n in shm.list():
                        shm.delete(n)
                g = {k: nbytes / statistics.median(v) / 1e9 for k, v in t.items()}
                dev = fio_rate(work, nbytes)
                row = {"bytes": nbytes, "gbps": g, "runs": a.runs,
                       "device_o_direct": dev, "seconds": t}
                results.append(row)
                mib = f"{nbytes / 2**20:.0f}Mi"
                lines = [
                    ("torch.save (+fsync / commit)", "lw", "sw", "fw"),
                    ("torch.load (cold / reader)", "lr", "sr", "fr"),
                    ("torch.load, tensors mapped", "lr", "sm", None),
                    ("dcp.save (sync_files / commit)", "dlw", "dsw", None),
                    ("dcp.load (cold)", "dlr", "dsr", None),
                ]
                for what, lk, sk, fk in lines:
                    fpart = (f"{g[fk]:>7.2f} {g[fk] / g[lk]:>5.2f}x" if fk else "")
                    print(f"{mib:>7} {what:<30} {g[lk]:>7.2f} {g[sk]:>7.2f} "
                          f"{g[sk] / g[lk]:>5.2f}x {fpart}", flush=True)
                if dev:
                    print(f"{mib:>7} {'disk O_DIRECT (fio) w / r':<30} {dev['write']:>7.2f} "
                          f"{dev['read']:>7.2f}   sluice shm at {g['sw'] / dev['write']:.2f} / "
                          f"{g['sr'] / dev['read']:.2f} of it", flush=True)
                state = None  # its memory, before the next size
            shm.close()
            fl.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
