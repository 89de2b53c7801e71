"""A torch ``IterableDataset`` over a sluice job.

``Dataset(job)`` yields this rank's batches of one epoch, whole (use
``DataLoader(dataset, batch_size=None, num_workers=N)``):

- the rank and world size come from ``torch.distributed`` when it is
  initialised (else ``RANK``/``WORLD_SIZE``, else 0 and the job's);
- DataLoader workers split the rank's share into contiguous runs of whole
  batches, so no two read the same sample and every sample is read once;
- ``set_epoch(e)`` picks the epoch (the job's shuffle is a function of the
  seed and the epoch);
- ``state_dict()`` / ``load_state_dict()`` save and restore the position
  reached, in the shape torchdata's ``StatefulDataLoader`` expects (it
  calls them in each worker); with ``num_workers=0`` they work on a plain
  DataLoader too;
- tensor columns become tensors sharing the received Arrow buffers (no
  copy); other columns are lists or numpy arrays;
- a DataLoader worker forked from the process that made the dataset hands
  its batches over in a shared-memory ring (see ``sluice._ring``): one
  copy into a slot, instead of a new shared-memory segment per batch that
  both processes fault in page by page.

Safe across fork: a worker forked from a process that already read over
Flight relays its reads through a fresh process (see ``sluice._relay``).
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from typing import Any, Dict, Iterator, Optional, Tuple

import torch
from torch.utils.data import IterableDataset, get_worker_info

from ._ring import Ring
from .client import Job

# Tensors share the received Arrow buffers, which numpy marks read-only;
# torch warns about that on every batch otherwise.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable",
                        category=UserWarning, module=__name__)


def worker_range(per_rank: int, batch_size: int, worker: int, workers: int) -> Tuple[int, int]:
    """Positions ``[lo, hi)`` of a rank's share that DataLoader worker
    ``worker`` of ``workers`` reads: contiguous runs of whole batches that
    together cover ``[0, per_rank)`` exactly once."""
    if workers < 1 or not 0 <= worker < workers:
        raise ValueError(f"worker {worker} of {workers}")
    batches = -(-per_rank // batch_size)
    lo_b = batches * worker // workers
    hi_b = batches * (worker + 1) // workers
    return min(lo_b * batch_size, per_rank), min(hi_b * batch_size, per_rank)


def rank_and_world() -> Tuple[int, Optional[int]]:
    """This process's rank and world size: ``torch.distributed`` when
    initialised, else ``RANK``/``WORLD_SIZE``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    world = os.environ.get("WORLD_SIZE")
    return int(os.environ.get("RANK", "0")), int(world) if world else None


def to_torch(batch: Dict[str, Any]) -> Dict[str, Any]:
    """A reader's numpy batch with numeric arrays as tensors (no copy)."""
    return {k: torch.from_numpy(v) if v.dtype != object else list(v) for k, v in batch.items()}


class Dataset(IterableDataset):
    """Batches of ``job`` for this rank and ``epoch`` (see the module docs)."""

    def __init__(self, job: Job, epoch: int = 0, rank: Optional[int] = None,
                 shm_slots: int = 16, shm_slot_bytes: int = 64 << 20):
        super().__init__()
        self.job = job
        # Virtual until touched: workers only use the slots they fill.
        self._ring = Ring(shm_slots, shm_slot_bytes) if shm_slots else None
        # In shared memory: persistent DataLoader workers hold copies of
        # this dataset made once, and must still see set_epoch.
        self._epoch = multiprocessing.Value("q", epoch, lock=False)
        self.rank = rank
        # Where this process's reader is (epoch, offset), and where the next
        # iteration resumes if load_state_dict said so.
        self._position: Optional[Tuple[int, int]] = None
        self._resume: Optional[Tuple[int, int]] = None

    @property
    def epoch(self) -> int:
        """The epoch read next."""
        return int(self._epoch.value)

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._epoch.value = int(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Reads ``epoch`` next (also in persistent DataLoader workers)."""
        self.epoch = epoch

    def state_dict(self) -> Dict[str, Any]:
        """The position reached: ``{"epoch", "offset"}`` (offset in the
        rank's share; in a worker, in that worker's run)."""
        epoch, offset = self._position if self._position else (self.epoch, None)
        return {"epoch": epoch, "offset": offset}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes at a position :meth:`state_dict` saved."""
        self.epoch = int(state["epoch"])
        offset = state.get("offset")
        self._resume = (self.epoch, int(offset)) if offset is not None else None

    def _share(self) -> Tuple[int, int, int]:
        st = self.job.wait()
        rank, world = rank_and_world()
        if self.rank is not None:
            rank = self.rank
        spec = st["spec"]
        if world is not None and world != spec["world_size"]:
            raise ValueError(
                f"job {self.job.id} has world_size {spec['world_size']}, this trainer {world}")
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        lo, hi = worker_range(st["samples_per_rank"], spec["batch_size"], worker, workers)
        return rank, lo, hi

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        rank, lo, hi = self._share()
        epoch, start = self.epoch, lo
        if self._resume and self._resume[0] == epoch and lo <= self._resume[1] <= hi:
            start = self._resume[1]
        self._resume = None  # a restored position is used once
        self._position = (epoch, start)
        reader = self.job.reader(rank, epoch, offset=start, limit=hi - start, numpy=True)
        info = get_worker_info()
        ring = self._ring if info is not None and self._ring and self._ring.usable() else None
        for batch in reader:
            self._position = (epoch, reader.offset)
            packed = ring.pack(batch, info.id, info.num_workers) if ring else None
            yield packed if packed is not None else to_torch(batch)
