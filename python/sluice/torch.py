"""A torch ``IterableDataset`` over a sluice job.

``Dataset(job)`` yields this rank's batches of one epoch, whole (use
``DataLoader(dataset, batch_size=None, num_workers=N)``):

- the rank and world size come from ``torch.distributed`` when it is
  initialised (else ``RANK``/``WORLD_SIZE``, else 0 and the job's);
- DataLoader workers take the rank's batches in turn (worker ``w`` of
  ``N`` reads batches ``w``, ``w + N``, …), as the DataLoader hands them
  out: no two read the same sample, and the trainer receives the rank's
  batches in the epoch's order whatever the number of workers;
- ``set_epoch(e)`` picks the epoch (the job's shuffle is a function of the
  seed and the epoch);
- ``state_dict()`` / ``load_state_dict()`` save and restore the position
  reached, in the shape torchdata's ``StatefulDataLoader`` expects (it
  calls them in each worker: ``{"epoch", "offset", "worker", "workers"}``,
  restored with as many workers). Read without workers, the state is also
  the training's **global** position (``{"sluice": 1, "epoch",
  "position", …}``, see ``Job.state_dict``);
- :class:`DataLoader` (a ``torch.utils.data.DataLoader``) counts the
  batches the trainer took, so its ``state_dict()`` is the global
  position with any number of workers: a job submitted with
  ``resume=state`` continues the same global order with any world size,
  batch size or number of workers;
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


def worker_offset(rank_offset: int, batch_size: int, worker: int, workers: int) -> int:
    """The position in DataLoader worker ``worker``'s part (the rank's
    batches ``worker``, ``worker + workers``, …) where that worker resumes
    when the rank has read ``rank_offset`` positions, a whole number of
    batches."""
    if workers < 1 or not 0 <= worker < workers:
        raise ValueError(f"worker {worker} of {workers}")
    if rank_offset % batch_size:
        raise ValueError(f"offset {rank_offset} is not a whole number of batches of "
                         f"{batch_size}")
    read = rank_offset // batch_size
    return max(0, -(-(read - worker) // workers)) * batch_size


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

    def __init__(self, job: Job, epoch: Optional[int] = None, rank: Optional[int] = None,
                 shm_slots: int = 16, shm_slot_bytes: int = 64 << 20):
        super().__init__()
        self.job = job
        # Virtual until touched: workers only use the slots they fill.
        self._ring = Ring(shm_slots, shm_slot_bytes) if shm_slots else None
        # In shared memory: persistent DataLoader workers hold copies of
        # this dataset made once, and must still see set_epoch.
        # -1: the job's first epoch (0, or the one a resumed job continues).
        self._epoch = multiprocessing.Value("q", -1 if epoch is None else epoch, lock=False)
        self.rank = rank
        # Where this process's reader is (epoch, offset in its part), its
        # part (worker, workers), and the state the next iteration resumes
        # from if load_state_dict gave one.
        self._position: Optional[Tuple[int, int]] = None
        self._part: Tuple[int, int] = (0, 1)
        self._resume: Optional[Dict[str, Any]] = None

    @property
    def epoch(self) -> int:
        """The epoch read next."""
        if self._epoch.value < 0:
            self._epoch.value = self.job.first_epoch()
        return int(self._epoch.value)

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._epoch.value = int(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Reads ``epoch`` next (also in persistent DataLoader workers)."""
        self.epoch = epoch

    def state_dict(self) -> Dict[str, Any]:
        """The position reached: ``{"epoch", "offset"}`` (offset in the
        rank's share; in a worker, in that worker's part, with ``worker``
        and ``workers``). Read whole (no workers), also the global
        position (see ``Job.state_dict``): its ``epoch`` is the next one
        once the epoch was read to its end."""
        epoch, offset = self._position if self._position else (self.epoch, None)
        worker, workers = self._part
        if workers > 1:
            return {"epoch": epoch, "offset": offset, "worker": worker, "workers": workers}
        if offset is None:
            return {"epoch": epoch, "offset": None}
        state = self.job.state_dict(epoch, offset)
        state["offset"] = offset if state["epoch"] == epoch else 0
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes at a position :meth:`state_dict` (or
        :meth:`DataLoader.state_dict`, or ``Job.state_dict``) saved."""
        self.epoch = int(state["epoch"])
        self._resume = dict(state)

    def rank_offset(self, epoch: int) -> int:
        """Where in the rank's share of ``epoch`` a global state given to
        :meth:`load_state_dict` resumes (0 without one)."""
        state = self._resume
        if not state or int(state["epoch"]) != epoch or "position" not in state:
            return 0
        start, per_rank = self.job.epoch_share(epoch)
        world = int(self.job.spec["world_size"])
        ahead = int(state["position"]) - start
        if ahead < 0 or ahead % world:
            raise ValueError(
                f"job {self.job.id} (world_size {world}) cannot continue from position "
                f"{state['position']} of epoch {epoch}: submit the job with resume=state, "
                "and it begins there with any world size, batch size or workers")
        return min(ahead // world, per_rank)

    def _start(self, epoch: int, worker: int, workers: int) -> int:
        """Where this reader's part begins: a restored state's position,
        or 0."""
        state = self._resume
        if not state or int(state["epoch"]) != epoch:
            return 0
        if "position" in state:
            offset = self.rank_offset(epoch)
            if workers == 1:
                return offset
            return worker_offset(offset, int(self.job.spec["batch_size"]), worker, workers)
        if state.get("offset") is None:
            return 0
        if int(state.get("workers", 1)) != workers or int(state.get("worker", 0)) != worker:
            raise ValueError(
                f"a state saved by worker {state.get('worker', 0)} of "
                f"{state.get('workers', 1)} given to worker {worker} of {workers}: "
                "restore with as many workers, or from the global state "
                "(sluice.torch.DataLoader.state_dict)")
        return int(state["offset"])

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
        return rank, worker, workers

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        rank, worker, workers = self._share()
        epoch = self.epoch
        start = self._start(epoch, worker, workers)
        self._resume = None  # a restored position is used once
        self._position = (epoch, start)
        self._part = (worker, workers)
        reader = self.job.reader(rank, epoch, offset=start, numpy=True, worker=worker,
                                 workers=workers)
        info = get_worker_info()
        ring = self._ring if info is not None and self._ring and self._ring.usable() else None
        for batch in reader:
            self._position = (epoch, reader.offset)
            packed = ring.pack(batch, info.id, info.num_workers) if ring else None
            yield packed if packed is not None else to_torch(batch)


class DataLoader(torch.utils.data.DataLoader):
    """A ``torch.utils.data.DataLoader`` over a :class:`Dataset` that
    counts the batches the trainer took, so that :meth:`state_dict` is the
    training's global position (see ``Job.state_dict``) with any number
    of workers. ``batch_size`` is the job's (``None`` here: the dataset's
    batches are whole)."""

    def __init__(self, dataset: Dataset, **kwargs: Any):
        kwargs.setdefault("batch_size", None)
        super().__init__(dataset, **kwargs)
        self._taken: Optional[Tuple[int, int]] = None

    def __iter__(self) -> Iterator[Any]:
        ds: Dataset = self.dataset  # type: ignore[assignment]
        epoch = ds.epoch
        offset = ds.rank_offset(epoch)
        batch = int(ds.job.spec["batch_size"])
        share = ds.job.samples_per_rank(epoch)
        self._taken = (epoch, offset)
        it = super().__iter__()
        # The workers have their copies of the restored state now.
        if self.num_workers > 0:
            ds._resume = None
        for b in it:
            offset = min(offset + batch, share)
            self._taken = (epoch, offset)
            yield b

    def state_dict(self) -> Dict[str, Any]:
        """The training's global position after the batches taken (see
        ``Job.state_dict``)."""
        ds: Dataset = self.dataset  # type: ignore[assignment]
        epoch, offset = self._taken if self._taken else (ds.epoch, ds.rank_offset(ds.epoch))
        return ds.job.state_dict(epoch, offset)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes the next iteration at a global position (its epoch
        becomes the dataset's)."""
        if "position" not in state:
            raise ValueError("not a global position: give what DataLoader.state_dict or "
                             "Job.state_dict saved")
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]
        self._taken = None
