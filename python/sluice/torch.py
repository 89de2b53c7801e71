"""A torch ``IterableDataset`` over a sluice job.

Each rank reads its share of an epoch (rank from ``torch.distributed`` when
initialised, else the ``RANK`` environment variable, else 0); within a rank
the share is split into contiguous runs of whole batches, one per
DataLoader worker, so no two workers read the same sample. Batches come out
whole: use ``DataLoader(dataset, batch_size=None, num_workers=N)``.
Tensor columns become torch tensors sharing the Arrow buffers.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, Optional, Tuple

from .client import Job


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
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    world = os.environ.get("WORLD_SIZE")
    return int(os.environ.get("RANK", "0")), int(world) if world else None


try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError:  # torch is optional
    torch = None

if torch is not None:

    class Dataset(IterableDataset):
        """Batches of ``job`` for this rank and ``epoch`` (see the module docs)."""

        def __init__(self, job: Job, epoch: int = 0, rank: Optional[int] = None):
            super().__init__()
            self.job = job
            self.epoch = epoch
            self.rank = rank

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __iter__(self) -> Iterator[Dict[str, Any]]:
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
            reader = self.job.reader(rank, self.epoch, offset=lo, limit=hi - lo, numpy=True)
            for batch in reader:
                yield {k: torch.from_numpy(v) if v.dtype != object else list(v)
                       for k, v in batch.items()}
