"""A checkpoint version read through a window: a shared region smaller
than the version, whose slots its ranges take in turn.

A region the version's size costs the kernel a fresh page for every byte
of it (zeroed, then pinned for the O_DIRECT read: about 0.3 s of CPU per
GiB on two cores, which the reader's own copies need too), and it must
fit in ``/dev/shm`` whole. A reader that copies the bytes out as it goes
(``torch.load`` over a stream, ``sluice.dcp``'s load) needs only the
ranges around where it reads: the :class:`Window` gives each range a
slot of ``span`` bytes, asks the server to read it there
(``checkpoint.shm.get`` with ``at``), reads ahead of the position in
order, and reuses the slot of the range used least recently once its
bytes are copied out. Its pages are made once and kept with the region
for the next read.

One thread reads through a window at a time: a slot is reused only
between two calls of :meth:`Window.place`, after the caller copied what
it needed out of the last one.
"""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Callable, Dict, List


class Window:
    """Ranges ``[lo, lo + span)`` of a ``size``-byte version in the
    ``slots`` slots of a region; ``fetch(lo, length, at)`` reads one
    into the region at ``at`` (on ``pool``, at most ``workers`` at once)."""

    def __init__(self, fetch: Callable[[int, int, int], None], pool: ThreadPoolExecutor,
                 size: int, span: int, slots: int, workers: int):
        if slots < 2:
            raise ValueError(f"a window of {slots} slots: at least 2")
        self.size, self.span, self.slots, self.workers = size, span, slots, workers
        self._fetch, self._pool = fetch, pool
        self._lock = threading.Lock()
        self._free: List[int] = list(range(slots - 1, -1, -1))
        # Range → its slot, and its read (done once the bytes are there).
        self._slot: Dict[int, int] = {}
        self._reads: Dict[int, Future] = {}
        # Range → when it was last read from (absent: read ahead, unused).
        self._used: Dict[int, int] = {}
        self._tick = 0

    def start(self, first: List[int]) -> None:
        """Reads the ranges at ``first`` ahead, as many as there are slots."""
        with self._lock:
            for lo in first[:self.slots]:
                if lo not in self._slot:
                    self._schedule(lo, self._free.pop())

    def place(self, lo: int) -> int:
        """Where in the region the range at ``lo`` is once it has arrived
        (raises its read's error); reads the next ones ahead."""
        with self._lock:
            if lo not in self._slot:
                self._schedule(lo, self._slot_for(lo))
            read = self._reads[lo]
        read.result()
        with self._lock:
            self._tick += 1
            self._used[lo] = self._tick
            self._ahead(lo)
            return self._slot[lo] * self.span

    def close(self) -> bool:
        """Drops the reads not started and waits out the others (no read
        lands in the region after this); whether every read ended well."""
        with self._lock:
            reads = list(self._reads.values())
        for f in reads:
            f.cancel()
        ok = True
        for f in reads:
            if f.cancelled():
                continue
            try:
                f.result()
            except Exception:  # noqa: BLE001 - closing: the reader's errors were raised on read
                ok = False
        return ok

    def _schedule(self, lo: int, slot: int) -> None:
        self._slot[lo] = slot
        self._reads[lo] = self._pool.submit(
            self._fetch, lo, min(self.size - lo, self.span), slot * self.span)

    def _evict(self, lo: int) -> int:
        self._reads.pop(lo)
        self._used.pop(lo, None)
        return self._slot.pop(lo)

    def _slot_for(self, lo: int) -> int:
        """A slot for range ``lo``: a free one, else that of the range
        used least recently, else of the one read farthest ahead; waits
        for a read to end where every slot is being read into."""
        while True:
            if self._free:
                return self._free.pop()
            done = [r for r, f in self._reads.items() if f.done()]
            used = [r for r in done if r in self._used]
            if used:
                return self._evict(min(used, key=self._used.__getitem__))
            if done:
                return self._evict(max(done))
            running = list(self._reads.values())
            self._lock.release()
            try:
                wait(running, return_when=FIRST_COMPLETED)
            finally:
                self._lock.acquire()

    def _ahead(self, lo: int) -> None:
        """Reads the ranges after ``lo`` ahead into free slots or those of
        ranges already used (never ``lo``'s, never one read ahead and not
        used yet), ``workers`` at most in flight."""
        running = sum(not f.done() for f in self._reads.values())
        for k in range(1, self.slots):
            nxt = lo + k * self.span
            if nxt >= self.size:
                return
            if nxt in self._slot:
                continue
            if running >= self.workers:
                return
            if self._free:
                slot = self._free.pop()
            else:
                used = [r for r, f in self._reads.items()
                        if r != lo and r in self._used and f.done()]
                if not used:
                    return
                slot = self._evict(min(used, key=self._used.__getitem__))
            self._schedule(nxt, slot)
            running += 1
