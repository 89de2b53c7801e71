"""The trainer's side of shared-memory delivery (see ``shm/src/segment.rs``).

A reader on the server's host proves it with a :class:`Probe`: a file in
``/dev/shm`` holding a nonce, named in its ticket, that the server reads
back. The server then writes each batch's Arrow IPC message into a slot of
a shared segment and sends only the slot's number; :class:`Segment` maps
the segment once and makes each batch over the mapping without copying it
(``pa.foreign_buffer`` + ``pa.ipc.read_record_batch``). The slot is marked
free for the server when the batch, and every array, numpy view or tensor
made from it, is garbage: the buffer's ``base`` is a :class:`_Lease` that
frees the slot when it dies.

A process keeps its last :data:`KEEP_MAX` segments mapped after their
streams (:func:`held`): its next ticket names them, with an id the process
gives itself, and the server may carry the next stream in one of them
(``"kept": true``), whose pages are then already in place on both sides.
A segment the server dropped says so in its header (``RETIRED_AT``) and is
let go at the next ticket; a forked child starts with none of its own.
"""

from __future__ import annotations

import collections
import ctypes
import mmap
import os
import secrets
import threading
from typing import Any, Dict, Optional

import numpy as np
import pyarrow as pa

SHM_DIR = "/dev/shm"
PROBE_PREFIX = "sluice-probe-"
HEADER = 4096
MAPPED_AT = 32
RETIRED_AT = 33
KEEP_MAX = 2
STATES_AT = 64
FREE = 0
MAGIC = b"SLUICE01"


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


_swept = threading.Lock()
_swept_once = False


def _sweep_probes() -> None:
    """Removes probes whose process is gone: one killed (``kill -9``)
    between making its probe and its server's answer could not. Once per
    process, before its first probe, as a server sweeps before its first
    segment."""
    global _swept_once
    with _swept:
        if _swept_once:
            return
        _swept_once = True
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    for name in names:
        if not name.startswith(PROBE_PREFIX):
            continue
        pid = name[len(PROBE_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _remove(os.path.join(SHM_DIR, name))


class Probe:
    """A file in ``/dev/shm`` holding a nonce, for one request: the server
    has read it once the stream's schema arrives, and :meth:`remove` (or
    the context manager) deletes it then, so no process leaves one behind
    (a DataLoader worker ends without running ``atexit``; one killed in
    between is swept by the next process's first probe)."""

    def __init__(self) -> None:
        _sweep_probes()
        self.name = f"{PROBE_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        self.nonce = secrets.token_hex(16)
        self.path: Optional[str] = os.path.join(SHM_DIR, self.name)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError:
            self.path = None
            return
        try:
            os.write(fd, self.nonce.encode())
        finally:
            os.close(fd)

    def ticket(self) -> Optional[Dict[str, str]]:
        """What the ticket carries, or None where ``/dev/shm`` is not
        writable."""
        return {"name": self.name, "nonce": self.nonce} if self.path else None

    def remove(self) -> None:
        if self.path:
            _remove(self.path)
            self.path = None

    def __enter__(self) -> "Probe":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


class _Lease:
    """Holds a slot while any buffer over it lives."""

    __slots__ = ("segment", "slot")

    def __init__(self, segment: "Segment", slot: int):
        self.segment = segment
        self.slot = slot

    def __del__(self) -> None:
        self.segment.state[self.slot] = FREE


class Segment:
    """A server's segment, mapped; its slots' batches as pyarrow batches."""

    def __init__(self, info: Dict[str, Any]):
        self.path = info["path"]
        self.size = int(info["size"])
        self.slots = int(info["slots"])
        self.slot_bytes = int(info["slot_bytes"])
        fd = os.open(self.path, os.O_RDWR)
        try:
            self.map = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        if self.map[:8] != MAGIC:
            raise ValueError(f"{self.path} is not a sluice segment")
        # An export of the mapping: pins it, and gives its address.
        self._anchor = ctypes.c_char.from_buffer(self.map)
        self.address = ctypes.addressof(self._anchor)
        self.state = np.frombuffer(self.map, dtype=np.uint8, count=self.slots, offset=STATES_AT)
        # Tell the server it may unlink the file: the mapping outlives it.
        self.map[MAPPED_AT] = 1

    def batch(self, slot: int, length: int, schema: pa.Schema) -> pa.RecordBatch:
        """The batch in ``slot``, over the mapping."""
        if not 0 <= slot < self.slots or not 0 < length <= self.slot_bytes:
            raise ValueError(f"slot {slot} ({length} bytes) is outside {self.path}")
        lease = _Lease(self, slot)
        buf = pa.foreign_buffer(self.address + HEADER + slot * self.slot_bytes, length,
                                base=lease)
        # The slot is memory another process writes: a slot overwritten or
        # cut short must be an exception here, never a read out of bounds
        # in pyarrow later (its offsets and lengths are checked against
        # the buffers before any value is touched).
        try:
            batch = pa.ipc.read_record_batch(pa.ipc.read_message(buf), schema)
            batch.validate(full=True)
        except (pa.ArrowException, ValueError, OSError) as e:
            raise ValueError(
                f"shared-memory slot {slot} of {self.path} does not hold a valid batch "
                f"(overwritten?): {e}") from e
        return batch

    @property
    def retired(self) -> bool:
        """Whether the server dropped it (no stream will use it again)."""
        return self.map[RETIRED_AT] != 0


_lock = threading.Lock()
_pid = -1
_trainer = ""
_kept: "collections.OrderedDict[str, Segment]" = collections.OrderedDict()


def _mine() -> None:
    """Resets the kept segments and the id in a new (forked) process."""
    global _pid, _trainer
    if _pid != os.getpid():
        _pid = os.getpid()
        _trainer = f"{_pid}-{secrets.token_hex(8)}"
        _kept.clear()


def held() -> Dict[str, Segment]:
    """The segments this process still maps for a next stream, by path
    (retired ones let go first); the caller holds on to them until its
    stream names the one it gets."""
    with _lock:
        _mine()
        for path in [p for p, seg in _kept.items() if seg.retired]:
            del _kept[path]
        return dict(_kept)


def held_ticket(segments: Dict[str, Segment]) -> Dict[str, Any]:
    """What a ticket says of ``segments`` (from :func:`held`)."""
    with _lock:
        _mine()
        return {"trainer": _trainer, "paths": list(segments)}


def remember(seg: Segment) -> None:
    """Keeps ``seg`` mapped for this process's next stream (the oldest of
    more than :data:`KEEP_MAX` let go)."""
    with _lock:
        _mine()
        _kept[seg.path] = seg
        _kept.move_to_end(seg.path)
        while len(_kept) > KEEP_MAX:
            _kept.popitem(last=False)
