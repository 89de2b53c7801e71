"""The reading half of :mod:`sluice.checkpoint`: a
:class:`CheckpointReader` streams one version from the server, through a
shared region on its host (:mod:`sluice._lanes`, :mod:`sluice._window`)
or over Flight (on a cluster, from the storage nodes: :mod:`sluice._direct`),
in parallel ranges that a read waits for only where it
needs them; :func:`_open` chooses the region (``get_open``), and a group
of readers shares one (:mod:`sluice._group`).
"""

from __future__ import annotations

import io
import weakref
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Optional

import numpy as np

from . import _lanes
from ._direct import DirectGets
from ._window import Window

if TYPE_CHECKING:
    from .checkpoint import Checkpoint

# The ranges a reader asks for over shared memory into a kept region (at
# most chunk_size): four in flight keep the disk busy, and the first is in
# while the rest are read, so torch.load parses beside the reads (64 MiB
# into a kept region: 1.50 GB/s, against 0.85 with 16 MiB ranges, which
# all arrived together while the parse waited). Into a fresh region,
# chunk_size ranges (1 GiB: 1.34-1.37 GB/s, against 0.92-1.17).
SHM_READ_RANGE = 4 << 20
# Copies out of a region of at least this many bytes run without the GIL.
_NUMPY_COPY_MIN = 256 << 10


class CheckpointReader(io.RawIOBase):
    """See the module docs; ``info`` is the version read, ``transport``
    ``"shm"``, ``"flight"`` or ``"direct"`` (a cluster's stripes from its
    storage nodes). Reads copy straight from where the bytes
    landed (the shared region, or Flight's Arrow buffers) into the
    caller's memory; :meth:`view` gives them without a copy."""

    def __init__(self, ckpt: "Checkpoint", name: str, version: Optional[int] = None,
                 own_from: int = 0, own_below: int = 0, opened: Optional["Opened"] = None):
        super().__init__()
        self.name = name
        self._ckpt = ckpt
        # Views handed out (slice, view): while one lives, the region is
        # not read into again.
        self._exported: List[weakref.ref] = []
        self._handed_over = False
        self._begin(opened if opened is not None
                    else _open(ckpt, name, version, own_from, own_below))

    def _begin(self, opened: "Opened") -> None:
        """Starts the ranges of ``opened`` (those it holds already done)."""
        ckpt = self._ckpt
        self.info, self._lanes = opened.info, opened.lanes
        self.transport = self._lanes.transport
        self.size = int(self.info["size"])
        # The region's size (a kept one may be larger than the version; a
        # window smaller).
        self.region_size = opened.region_size
        self._pos = 0
        self._range = opened.shm_range if self.transport == "shm" else ckpt.chunk_size
        starts = list(range(0, self.size, self._range))
        # The last first: a zip archive's directory, which torch.load reads first.
        first = starts[-1:] + starts[:-1]
        pool = ckpt._executor()
        self._futures: Dict[int, Future] = {}
        self._window: Optional[Window] = None
        # Ranges not submitted yet (`opened.defer`: the caller submits them
        # in turn with other readers', `submit_next`).
        self._due: List[int] = []
        if self.region_size is not None and self.region_size < self.size:
            self._window = Window(self._lanes.fetch, pool, self.size, self._range,
                                  self.region_size // self._range, ckpt.workers)
            self._window.start(first)
            return
        for lo in first:
            if opened.filled == self.size:
                # The region's opening read it whole already.
                self._futures[lo] = done = Future()
                done.set_result(None)
            elif opened.defer:
                self._due.append(lo)
            else:
                self._submit(lo)

    def _submit(self, lo: int) -> None:
        self._futures[lo] = self._ckpt._executor().submit(
            self._lanes.fetch, lo, min(self.size - lo, self._range))

    def submit_next(self) -> bool:
        """Submits the next range left for the caller (see ``defer``);
        whether there was one."""
        if not self._due:
            return False
        self._submit(self._due.pop(0))
        return True

    def _ready(self, lo: int) -> None:
        """Waits for the range at ``lo`` (raises its error, if it failed)."""
        self._futures[lo].result()

    def wait(self) -> "CheckpointReader":
        """Waits until every range has arrived (through a window: those
        being read now)."""
        for lo in self._futures:
            self._ready(lo)
        return self

    @property
    def windowed(self) -> bool:
        """Whether the version streams through a region smaller than
        itself (:mod:`sluice._window`): its bytes are copied out as they
        are read, never viewed in place."""
        return self._window is not None

    def view(self) -> memoryview:
        """The whole version, once arrived (see :meth:`slice`)."""
        return self.slice(0, self.size)

    def slice(self, offset: int, length: int) -> memoryview:
        """Bytes ``[offset, offset + length)`` as soon as the ranges that
        hold them have arrived (the rest may still be on their way): a
        view of the shared region, or (over Flight, or through a window)
        a copy. The stream's position does not move."""
        end = min(self.size, offset + length)
        if self.transport != "shm" or self._window is not None:
            out = bytearray(max(0, end - offset))
            self._copy_at(offset, memoryview(out))
            return memoryview(out)
        for lo in range(offset // self._range * self._range, end, self._range):
            self._ready(lo)
        view = self._lanes.view(0, offset, end - offset)
        self._exported.append(weakref.ref(view))
        return view

    def mapped_path(self) -> Optional[str]:
        """A name of the region's file while the reader is open (shared
        memory only): what ``torch.load(path, mmap=True)`` maps."""
        region = getattr(self._lanes, "region", None)
        return region.proc_path if region is not None and self._window is None else None

    def hand_over(self) -> None:
        """Says the region's pages are mapped elsewhere now (by
        :meth:`mapped_path`): it is let go on close, never kept."""
        self._handed_over = True

    def _keepable(self) -> bool:
        """Whether nothing made of the region's bytes outlives the reader."""
        return not self._handed_over and all(ref() is None for ref in self._exported)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, b: Any) -> int:
        done = self._copy_at(self._pos, memoryview(b).cast("B"))
        self._pos += done
        return done

    def readinto_at(self, offset: int, b: Any) -> int:
        """Copies the bytes from ``offset`` into ``b`` (as many as fit)
        without moving the stream's position; returns how many."""
        return self._copy_at(offset, memoryview(b).cast("B"))

    def _copy_at(self, pos: int, out: memoryview) -> int:
        """Copies the bytes from ``pos`` into ``out`` (as many as fit),
        each range once it has arrived; returns how many."""
        want = max(0, min(len(out), self.size - pos))
        done = 0
        while done < want:
            at = pos + done
            lo = at // self._range * self._range
            n = min(want - done, lo + self._range - at)
            if self._window is not None:
                base = self._window.place(lo) + (at - lo)
                piece = self._lanes.region.view[base:base + n]
            else:
                self._ready(lo)
                piece = self._lanes.view(lo, at, n)
            _copy(out[done:done + len(piece)], piece)
            done += len(piece)
        return done

    def read(self, size: int = -1) -> bytes:
        end = self.size if size is None or size < 0 else min(self.size, self._pos + size)
        buf = bytearray(max(0, end - self._pos))
        self.readinto(buf)
        return bytes(buf) if len(buf) < 1 << 16 else buf  # type: ignore[return-value]

    def close(self) -> None:
        if self.closed:
            return
        for f in self._futures.values():
            f.cancel()
        for f in self._futures.values():
            if not f.cancelled():
                try:
                    f.result()
                except Exception:  # noqa: BLE001 - closing: the reader's errors were raised on read
                    pass
        ok = all(f.done() and not f.cancelled() and f.exception() is None
                 for f in self._futures.values())
        if self._window is not None:
            # A window's reads that never ran left nothing half-written.
            ok = self._window.close()
        if self.transport == "shm" and self._handed_over:
            # Its pages are mapped by what the caller holds now: letting it
            # go (the server unmaps it) need not hold up the load.
            # `Checkpoint.close` waits for it, with the other threads.
            self._ckpt._executor().submit(self._lanes.close)
        elif self.transport == "shm":
            self._lanes.close(keep=ok and self._keepable())
        else:
            self._lanes.close()
        super().close()


def _copy(dst: memoryview, src: memoryview) -> None:
    """``dst[:] = src``; a large one through numpy, which lets the GIL go
    while it copies (and the kernel makes ``dst``'s fresh pages), so the
    parses of several versions copy at once."""
    if len(src) >= _NUMPY_COPY_MIN:
        np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))
    else:
        dst[:] = src


class Opened(NamedTuple):
    """A version's lanes once its region (or Flight) is chosen: what a
    :class:`CheckpointReader` starts its ranges from."""

    info: Dict[str, Any]
    lanes: Any
    # Bytes of it in the region already.
    filled: int
    # The ranges it asks for over shared memory.
    shm_range: int
    # The region's size (None over Flight).
    region_size: Optional[int]
    # Leave the ranges to the caller (`CheckpointReader.submit_next`).
    defer: bool = False


def _open(ckpt: "Checkpoint", name: str, version: Optional[int], own_from: int,
          own_below: int) -> Opened:
    """A region for one version (``checkpoint.shm.get_open``), or Flight."""
    body: Dict[str, Any] = {"name": name}
    if version is not None:
        body["version"] = version
    subject = f"checkpoint '{name}'"
    # A version no larger than one small range is read by get_open.
    shm_range = ckpt.small_range
    if ckpt._shm_refused and ckpt.transport == "auto":
        lent = None
    else:
        lent = ckpt._open_read(
            "checkpoint.shm.get_open",
            dict(body, fill=shm_range, own_from=own_from, own_below=own_below,
                 window=ckpt.read_window), subject)
    if lent is None:
        # On a cluster, where its nodes sign read passes, the stripes come
        # from the storage nodes directly (`sluice._direct`).
        info = ckpt._action("checkpoint.stat", dict(body, direct=ckpt.direct), name)
        layout = info.pop("direct", None)
        if layout is not None:
            lanes: Any = DirectGets(ckpt.client, ckpt.chunk_size, ckpt.workers, name,
                                    int(info["version"]), layout, ckpt._fan())
        else:
            lanes = _lanes.FlightGets(ckpt.client, ckpt.chunk_size, ckpt.workers, name,
                                      int(info["version"]))
        return Opened(info, lanes, 0, shm_range, None)
    region, answer = lent
    info = answer["checkpoint"]
    if region.size < int(info["size"]):
        shm_range = ckpt.window_range
    elif not answer.get("kept"):
        # A fresh region's pages are made as its extents are read:
        # larger ranges keep more of that work beside the reads.
        shm_range = ckpt.chunk_size
    lanes = _lanes.ShmGets(ckpt.client, shm_range, ckpt.workers, name, region,
                           lambda r: ckpt._keep_gets([r]))
    return Opened(info, lanes, int(answer.get("filled", 0)), shm_range, region.size)
