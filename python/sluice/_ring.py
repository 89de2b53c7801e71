"""A shared-memory ring that carries DataLoader workers' batches to the
main process without torch's per-batch shared-memory segments.

torch hands a worker's tensor to the main process by copying it into a new
shared-memory segment, which both processes then map and fault in page by
page — for a 5 MB batch that costs several milliseconds of CPU on each
side, as much as the whole Flight read. A :class:`Ring` is one anonymous
shared mapping made in the main process (when the dataset is made), so
forked workers inherit it. Each worker owns some of its fixed-size slots:
it copies a batch's tensor columns into a free slot and sends only the
slot's number and the arrays' shapes; the main process makes tensors that
are views of the slot, and marks the slot free again when the last of
them (and of any view of them) is garbage. A batch too big for a slot, a
worker without a free slot (the trainer holds on to batches), or a worker
not forked from the ring's maker ('spawn') falls back to torch's own way.
"""

from __future__ import annotations

import ctypes
import itertools
import mmap
import os
import weakref
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

# Slot states, one byte each at the start of the mapping.
FREE, USED = 0, 1
HEADER = 4096

_rings: Dict[int, "Ring"] = {}
_ids = itertools.count(1)


class Ring:
    """``slots`` slots of ``slot_bytes`` in one shared anonymous mapping
    (pages are only allocated when touched)."""

    def __init__(self, slots: int, slot_bytes: int):
        if not 0 < slots <= HEADER:
            raise ValueError(f"{slots} slots")
        self.id = next(_ids)
        self.pid = os.getpid()
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.map = mmap.mmap(-1, HEADER + slots * slot_bytes)
        self.state = np.frombuffer(self.map, dtype=np.uint8, count=slots)
        _rings[self.id] = self

    def __getstate__(self) -> Dict[str, Any]:
        # Pickled (a 'spawn' worker): the copy has no mapping and is unused.
        return {"id": -1, "pid": -1, "slots": 0, "slot_bytes": 0}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.map = None
        self.state = None

    def usable(self) -> bool:
        """Whether this process shares the mapping with its maker."""
        return self.map is not None and _rings.get(self.id) is self

    def take(self, worker: int, workers: int) -> Optional[int]:
        """A free slot of ``worker``'s share, now marked used."""
        for slot in range(worker, self.slots, workers):
            if self.state[slot] == FREE:
                self.state[slot] = USED
                return slot
        return None

    def view(self, slot: int, offset: int, dtype: np.dtype, shape: Tuple[int, ...]) -> np.ndarray:
        start = HEADER + slot * self.slot_bytes + offset
        count = int(np.prod(shape)) if shape else 1
        return np.frombuffer(self.map, dtype=dtype, count=count, offset=start).reshape(shape)

    def pack(self, batch: Dict[str, Any], worker: int, workers: int) -> Optional["Packed"]:
        """``batch``'s numeric arrays copied into a slot, or None (no slot,
        or they do not fit)."""
        arrays = {k: v for k, v in batch.items()
                  if isinstance(v, np.ndarray) and v.dtype != object}
        sizes = {k: -(-v.nbytes // 64) * 64 for k, v in arrays.items()}
        if not arrays or sum(sizes.values()) > self.slot_bytes:
            return None
        slot = self.take(worker, workers)
        if slot is None:
            return None
        layout: List[Tuple[str, int, str, Tuple[int, ...]]] = []
        offset = 0
        for k, v in arrays.items():
            np.copyto(self.view(slot, offset, v.dtype, v.shape), v)
            layout.append((k, offset, v.dtype.str, v.shape))
            offset += sizes[k]
        rest = {k: v for k, v in batch.items() if k not in arrays}
        return Packed(self.id, slot, layout, rest)


def _release(ring: Ring, slot: int) -> None:
    ring.state[slot] = FREE


def _unpack(ring_id: int, slot: int, layout: List[Tuple[str, int, str, Tuple[int, ...]]],
            rest: Dict[str, Any]) -> Dict[str, Any]:
    """In the main process: the batch as tensors viewing the slot, which is
    freed once they (and every view of them) are gone."""
    ring = _rings[ring_id]
    out: Dict[str, Any] = {}
    # The slot's bytes as a ctypes object: every array made from it (and
    # every tensor and view of those) keeps it alive through its buffer
    # export — numpy does not collapse a chain of bases past a non-array —
    # so the slot is freed only when the last of them is gone.
    holder = (ctypes.c_char * ring.slot_bytes).from_buffer(
        ring.map, HEADER + slot * ring.slot_bytes)
    weakref.finalize(holder, _release, ring, slot)
    for k, offset, dtype, shape in layout:
        dt = np.dtype(dtype)
        count = int(np.prod(shape)) if shape else 1
        arr = np.frombuffer(holder, dtype=dt, count=count, offset=offset).reshape(shape)
        out[k] = torch.from_numpy(arr)
    out.update(rest)
    return out


class Packed:
    """A batch in a ring slot, as a worker sends it; unpickles as the
    batch's dict (tensors viewing the slot)."""

    def __init__(self, ring_id: int, slot: int,
                 layout: List[Tuple[str, int, str, Tuple[int, ...]]], rest: Dict[str, Any]):
        self.args = (ring_id, slot, layout, rest)

    def __reduce__(self) -> Any:
        return (_unpack, self.args)
