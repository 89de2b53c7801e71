#!/usr/bin/env python3
"""MLPerf Storage's checkpointing workflow, run with DLIO 2.0's own
checkpoint layout and mechanisms: every rank writes its shard of the
model and optimizer state ``--saves`` times, each file fsynced, then reads
checkpoints back ``--loads`` times; the save and load GB/s are the
figures.

DLIO 2.0 (the release on PyPI) only saves, from inside its training loop,
and times rank 0 alone to 10 ms. MLPerf Storage's fork of DLIO adds the
load phase; this driver gives DLIO 2.0 one, around the same classes:

- the layout is DLIO's ``BaseCheckpointing``, configured by the
  workload file's ``checkpoint`` section (``python/dlio/workload/
  llama3_8b.yaml``): per rank a model tensor, one file per layer and the
  optimizer groups (``a``, ``b`` and ``combined``, as DLIO writes them);
- ``--mechanism posix`` is DLIO's ``PyTorchCheckpointing`` (``torch.save``
  to a file) with the ``fsync`` MLPerf requires, and ``torch.load`` of
  the file to read back; both mechanisms write and load a checkpoint's
  files on the same number of threads; ``--mechanism sluice`` is
  ``sluice.dlio.SluiceCheckpointing`` (a commit flushes the device);
- the state's tensors are filled with random bytes, seeded by rank, so
  both mechanisms write the same bytes (DLIO's own are zeros) and a load
  can be checked against what was saved (``--verify``);
- each save and each load is timed across all ranks, barrier to barrier;
- between the phases the page cache is dropped (``--drop-caches``, root
  only), as MLPerf's rules require where the data does not exceed 3x the
  client's memory.

Run under MPI; rank 0 prints one JSON object (and writes ``--json``)::

    mpirun -np 4 python python/dlio/checkpointing.py \\
        --workload python/dlio/workload/llama3_8b.yaml --mechanism posix \\
        --folder /data/ckpt --saves 10 --loads 10 --drop-caches
"""

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Tuple

import torch
import yaml
from dlio_benchmark.checkpointing.pytorch_checkpointing import PyTorchCheckpointing
from dlio_benchmark.utils.config import ConfigArguments, LoadConfig
from dlio_benchmark.utils.utility import DLIOMPI
from sluice.dlio import LANES, CheckpointFiles, SluiceCheckpointing


class FsyncCheckpointing(CheckpointFiles, PyTorchCheckpointing):
    """DLIO's ``torch.save`` to a file, fsynced as MLPerf requires; loads
    with ``torch.load`` of the file. A checkpoint's files are written, and
    loaded, on as many threads as sluice's mechanism uses (both share
    ``CheckpointFiles``), so neither side is timed with less parallelism."""

    def _write(self, item: Tuple[str, Any]) -> None:
        suffix, state = item
        with open(self.get_name(suffix), "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())

    def write_files(self, files: List[Tuple[str, Any]]) -> None:
        with ThreadPoolExecutor(LANES) as pool:
            list(pool.map(self._write, files))

    def load_state(self, suffix: str) -> Any:
        return torch.load(self.get_name(suffix), weights_only=True)

    def stored_bytes(self, suffix: str) -> int:
        return os.path.getsize(self.get_name(suffix))


def mechanism(kind: str) -> Any:
    if kind == "posix":
        return FsyncCheckpointing()
    return SluiceCheckpointing()


def tensors(state: Any) -> List[torch.Tensor]:
    """The state's tensors, in a fixed order."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for k in sorted(state) for t in tensors(state[k])]
    return []


def states(mech: Any) -> List[Any]:
    return [s for s in (mech.model_state, mech.optimization_state, mech.layer_state) if s]


def fill(mech: Any, rank: int) -> None:
    """Random bytes in every tensor of the rank's state, seeded by rank."""
    g = torch.Generator().manual_seed(1234 + rank)
    for state in states(mech):
        for t in tensors(state):
            t.random_(-128, 128, generator=g)


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def timed(comm: Any, work: Any) -> float:
    """Seconds from a barrier before ``work`` on every rank to one after."""
    comm.barrier()
    t0 = time.perf_counter()
    work()
    comm.barrier()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", required=True, help="a DLIO workload file with a checkpoint section")
    p.add_argument("--mechanism", choices=["posix", "sluice"], required=True)
    p.add_argument("--folder", required=True, help="DLIO's checkpoint folder (posix)")
    p.add_argument("--saves", type=int, default=10)
    p.add_argument("--loads", type=int, default=10)
    p.add_argument("--drop-caches", action="store_true", help="drop the page cache between phases")
    p.add_argument("--verify", action="store_true", help="check every load against what was saved")
    p.add_argument("--json", help="write rank 0's result here too")
    a = p.parse_args()

    mpi = DLIOMPI.get_instance()
    mpi.initialize()
    comm, rank, size = mpi.comm(), mpi.rank(), mpi.size()
    args = ConfigArguments.get_instance()
    with open(a.workload) as f:
        LoadConfig(args, yaml.safe_load(f))
    args.checkpoint_folder = a.folder
    mech = mechanism(a.mechanism)
    fill(mech, rank)

    # Saves: checkpoint i is DLIO's (epoch 1, step i + 1).
    saved: List[Tuple[str, Any]] = []

    def save(i: int) -> None:
        mech.checkpoint(1, i + 1)
        saved.extend(mech.written)

    save_s = [timed(comm, lambda i=i: save(i)) for i in range(a.saves)]
    per_save = len(saved) // max(1, a.saves)
    my_bytes = sum(mech.stored_bytes(s) for s, _ in saved[:per_save])
    total = comm.allreduce(my_bytes)

    if a.drop_caches:
        comm.barrier()
        if rank == 0:
            drop_caches()
    bad: List[str] = []

    def load(i: int) -> None:
        part = saved[i * per_save:(i + 1) * per_save]
        suffixes = [suffix for suffix, _ in part]
        states = mech.load_states(suffixes)
        for (suffix, state), got in zip(part, states):
            if a.verify:
                want, have = tensors(state), tensors(got)
                if len(want) != len(have) or any(not torch.equal(x, y) for x, y in zip(want, have)):
                    bad.append(suffix)

    load_s = [timed(comm, lambda i=i: load(i % a.saves)) for i in range(a.loads)]
    bad = sum(comm.allgather(bad), [])
    if rank == 0:
        gb = total / 1e9
        out: Dict[str, Any] = {
            "mechanism": a.mechanism, "ranks": size, "files_per_rank": per_save,
            "bytes_per_checkpoint": total, "save_seconds": save_s, "load_seconds": load_s,
            "save_gbps": gb / statistics.median(save_s) if save_s else None,
            "load_gbps": gb / statistics.median(load_s) if load_s else None,
            "mismatched": bad,
        }
        print(json.dumps(out), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
    comm.barrier()
    mech.finalize()
    if bad:
        sys.exit(f"{len(bad)} loads differ from what was saved: {bad[:5]}")


if __name__ == "__main__":
    main()
