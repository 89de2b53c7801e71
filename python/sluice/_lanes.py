"""How a checkpoint's bytes travel: the lanes of :mod:`sluice.checkpoint`.

Two transports, one shape each way.

Writing (``PutLanes``): the writer asks for a part buffer
(:meth:`acquire`), fills it, and hands it over (:meth:`send`) while it
fills the next; at most ``workers`` parts are in flight.

- :class:`ShmPuts`: on the server's host. The part buffers are the slots
  of a shared-memory region the server lent (``checkpoint.shm.put_open``),
  so the writer's one copy of a byte is into the mapping, and the server
  writes the slot from there to the device (``checkpoint.shm.put``). The
  region (:class:`PutSlots`) is the Checkpoint's, shared by the writers
  it runs at once (a save on several threads holds one, not one a
  thread), and outlives a save: the next one finds its pages in place.
- :class:`FlightPuts`: anywhere. Each part is a ``DoPut`` stream of
  8 MiB messages on a lane (its own connection).
- :class:`~sluice._direct.DirectPuts`: a cluster's checkpoint, whose
  coordinator gave upload passes: each stripe of a part goes straight to
  the storage nodes that hold it (:mod:`sluice._direct`).

Reading (``GetLanes``): a reader asks for ranges, several at once
(:meth:`fetch`), and reads them once they are in (:meth:`view`).

- :class:`ShmGets`: the server reads each range O_DIRECT and checks its
  crc32c, then puts it in a region mapped here (``checkpoint.shm.get``):
  one of the version's size, where the reader parses it in place, or a
  window smaller than the version that its ranges take in turn
  (:mod:`sluice._window`).
- :class:`FlightGets`: each range is a ``DoGet`` stream on a lane; its
  Arrow buffers are kept as they arrive.
- :class:`~sluice._direct.DirectGets`: a cluster's checkpoint, whose
  coordinator gave read passes: each stripe of a range comes straight
  from a storage node that holds it (:mod:`sluice._direct`).

Shared memory is tried first unless ``transport="flight"``: the server
accepts it only when this process's :class:`~sluice._shm.Probe` shows it
shares the server's ``/dev/shm`` (and can open the server's 0600 files),
and otherwise answers ``shm_unavailable``, after which Flight carries the
bytes (``transport="shm"`` raises instead). Region files are unlinked as
soon as they are mapped, so a process killed at any point leaves nothing
in ``/dev/shm``.

A reader that copied what it needed out of its region (``torch.load``
from :class:`~sluice.checkpoint.CheckpointReader`, ``sluice.dcp``'s
load) leaves the region to its :class:`~sluice.Checkpoint`, which names
it in its next ``get_open``: the server reads the next version into it,
whose pages are in place on both sides already (allocating and faulting
in a fresh region's pages was the largest fixed cost of a load).
"""

from __future__ import annotations

import bisect
import json
import mmap
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from . import _shm
from ._errors import SluiceError, from_flight

# Bytes per Flight message of a part (the server takes up to 64 MiB).
_PIECE = 8 << 20


def action(client: Any, kind: str, body: Dict[str, Any], subject: str, lane: int = 0) -> Any:
    """One checkpoint action's JSON answer, its errors as :class:`SluiceError`
    naming ``subject``."""
    try:
        results = list(client.flight(lane).do_action(
            flight.Action(kind, json.dumps(body).encode()), client.call_options()))
    except (flight.FlightError, pa.ArrowException) as e:
        raise from_flight(e, subject) from None
    return json.loads(results[0].body.to_pybytes()) if results else None


class Region:
    """A region the server lent, mapped here. Its file is unlinked at
    once; the descriptor stays open, so :attr:`proc_path` names the file
    while the region lives (``torch.load(path, mmap=True)`` maps it)."""

    def __init__(self, info: Dict[str, Any], writable: bool):
        self.id = info["region"]
        self.size = int(info["size"])
        # When a Checkpoint last kept it for the next read.
        self.idle_since = 0.0
        path = info["path"]
        self.fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            self.map = mmap.mmap(self.fd, max(self.size, 1), access=access) if self.size else None
        except BaseException:
            os.close(self.fd)
            raise
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass
        self.view = memoryview(self.map) if self.map is not None else memoryview(b"")

    @property
    def proc_path(self) -> str:
        """A name of the region's file for as long as it is open here."""
        return f"/proc/self/fd/{self.fd}"

    def close(self) -> None:
        """Lets this side's descriptor and mapping go (views made of it
        keep the mapping until they go too)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.view = memoryview(b"")
        self.map = None

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            os.close(self.fd)


def _shm_refused(e: SluiceError) -> bool:
    """Whether ``e`` says the server will not lend a region (not this
    host, no room, or a server without the same-host path), so Flight
    carries the bytes instead."""
    older = e.code == "invalid_request" and "unknown checkpoint action" in e.message
    return older or e.code in ("shm_unavailable", "not_served") or e.grpc_code == "UNIMPLEMENTED"


def open_region(client: Any, kind: str, body: Dict[str, Any], subject: str, transport: str,
                writable: bool, kept: Optional[Dict[str, Region]] = None
                ) -> Optional[Tuple[Optional[Region], Any]]:
    """A region lent by ``kind`` (``put_open``/``get_open``/``get_group``)
    with this process's probe, and the server's answer; ``None`` where the
    server is not on this host (or ``transport`` is ``"flight"``), and
    ``(None, answer)`` where ``get_group`` lent none (no version fits). Where the
    server answers with one of the ``kept`` regions (``get_open``), that
    one is used as it is mapped already."""
    if transport == "flight":
        return None
    with _shm.Probe() as probe:
        ticket = probe.ticket()
        if ticket is None:
            if transport == "shm":
                raise SluiceError(412, "shm_unavailable", f"{subject}: /dev/shm is not writable here")
            return None
        try:
            answer = action(client, kind, dict(body, probe=ticket), subject)
        except SluiceError as e:
            if transport == "shm" or not _shm_refused(e):
                raise
            return None
    # get_open answers {"region": {…}, "checkpoint": {…}, "kept", …}, put_open the region;
    # get_group {"region": null, …} where it placed no version: no region is lent.
    if "region" in answer and answer["region"] is None:
        return None, answer
    info = answer["region"] if isinstance(answer.get("region"), dict) else answer
    if answer.get("kept") and kept and info["region"] in kept:
        return kept[info["region"]], answer
    try:
        region = Region(info, writable)
    except OSError as e:
        # Not ours to open (another user's server): Flight it is.
        try:
            action(client, "checkpoint.shm.close", {"region": info["region"]}, subject)
        except SluiceError:
            pass
        if transport == "shm":
            raise SluiceError(412, "shm_unavailable", f"{subject}: {info['path']}: {e}") from None
        return None
    return region, answer


def put_part(client: flight.FlightClient, options: flight.FlightCallOptions, upload: str,
             offset: int, data: memoryview, subject: str) -> None:
    """One part (``data``, at ``offset`` of ``upload``) as a ``DoPut``
    stream of ``_PIECE`` messages on ``client``."""
    cmd = json.dumps({"checkpoint_upload": upload, "offset": offset}).encode()
    schema = pa.schema([pa.field("data", pa.large_binary(), nullable=False)])
    try:
        writer, reader = client.do_put(flight.FlightDescriptor.for_command(cmd), schema, options)
        for lo in range(0, len(data), _PIECE):
            piece = data[lo:lo + _PIECE]
            offsets = pa.array([0, len(piece)], pa.int64()).buffers()[1]
            arr = pa.LargeBinaryArray.from_buffers(
                pa.large_binary(), 1, [None, offsets, pa.py_buffer(piece)])
            writer.write_batch(pa.record_batch([arr], schema=schema))
        writer.done_writing()
        reader.read()
        writer.close()
    except (flight.FlightError, pa.ArrowException) as e:
        raise from_flight(e, subject) from None


class FlightPuts:
    """Parts over Flight ``DoPut`` streams (see the module docs)."""

    def __init__(self, client: Any, pool: ThreadPoolExecutor, chunk: int, workers: int):
        self.client, self.pool, self.chunk, self.workers = client, pool, chunk, workers
        # The parts in flight, oldest first: (their buffer, their send).
        self.pending: List[Tuple[Any, Future]] = []

    def acquire(self) -> Tuple[Any, memoryview]:
        buf = bytearray(self.chunk)
        return buf, memoryview(buf)

    def send(self, slot: Any, size: int, upload: str, offset: int, subject: str) -> None:
        while len(self.pending) >= self.workers:
            self.pending.pop(0)[1].result()
        data = memoryview(slot)[:size]
        self.pending.append((slot, self.pool.submit(self._put, data, upload, offset, subject)))

    def _put(self, data: memoryview, upload: str, offset: int, subject: str) -> None:
        c = self.client
        lane = offset // self.chunk % self.workers
        put_part(c.flight(lane), c.call_options(), upload, offset, data, subject)

    def drain(self) -> None:
        """Waits for every part in flight (raises the first that failed)."""
        try:
            for _, f in self.pending:
                f.result()
        finally:
            self.pending = []

    def cancel(self) -> None:
        """Drops the parts not started and waits out the others."""
        for _, f in self.pending:
            f.cancel()
        for _, f in self.pending:
            if not f.cancelled():
                try:
                    f.result()
                except Exception:  # noqa: BLE001 - the upload is being aborted
                    pass
        self.pending = []

    def release(self) -> None:
        """Nothing is kept between saves."""


class PutSlots:
    """A put region's slots (``chunk`` bytes each), shared by every writer
    of a :class:`~sluice.Checkpoint` at once: a slot is free again as soon
    as the part in it is written, whichever writer sent it."""

    def __init__(self, region: Region, chunk: int):
        self.region, self.chunk = region, chunk
        self._free = list(range(region.size // chunk))
        self._in_flight = 0
        # Writers using it now.
        self._users = 0
        self._cond = threading.Condition()

    def join(self) -> None:
        with self._cond:
            self._users += 1

    def leave(self) -> None:
        with self._cond:
            self._users -= 1

    def in_use(self) -> bool:
        """Whether a writer uses it now (its parts keep it alive on the
        server)."""
        with self._cond:
            return self._users > 0

    def idle(self) -> bool:
        """Whether no writer uses it and no part is in flight."""
        with self._cond:
            return self._users == 0 and self._in_flight == 0

    def take(self) -> Optional[int]:
        """A free slot, waiting while a part in flight will free one;
        ``None`` where none is free and none is in flight (every slot is
        being filled, by writers that may not send before this one does)."""
        with self._cond:
            while not self._free:
                if self._in_flight == 0:
                    return None
                self._cond.wait()
            return self._free.pop()

    def sending(self) -> None:
        with self._cond:
            self._in_flight += 1

    def sent(self, slot: int) -> None:
        """The part in ``slot`` is written (or failed, or was cancelled)."""
        with self._cond:
            self._in_flight -= 1
            self._free.append(slot)
            self._cond.notify()

    def put_back(self, slot: int) -> None:
        """A slot taken and never sent."""
        with self._cond:
            self._free.append(slot)
            self._cond.notify()


class ShmPuts(FlightPuts):
    """One writer's parts through the slots of a shared-memory region (see
    the module docs), which the other writers of its Checkpoint share:
    ``workers + 1`` slots for all of them, not each. A writer that finds
    every slot being filled by others, none in flight, gets a region of
    its own from ``more`` (let go when it is done)."""

    def __init__(self, client: Any, pool: ThreadPoolExecutor, chunk: int, workers: int,
                 slots: PutSlots, more: Callable[[], Optional[PutSlots]]):
        super().__init__(client, pool, chunk, workers)
        self.slots, self.more = slots, more
        self.shared: Optional[PutSlots] = slots
        slots.join()
        self.own: Optional[PutSlots] = None
        # The slot being filled, and whose it is.
        self.held: Optional[Tuple[PutSlots, int]] = None

    def acquire(self) -> Tuple[Any, memoryview]:
        # A part that failed fails the writer at its next part, not only
        # at close.
        while self.pending and self.pending[0][1].done():
            self.pending.pop(0)[1].result()
        slot = self.slots.take()
        if slot is None:
            own = self.more()
            slot = own.take() if own is not None else None
            if own is None or slot is None:
                raise SluiceError(507, "shm_unavailable",
                                  "every slot of the writers' shared region is being filled, "
                                  "and the server lent no other region")
            self.own = self.slots = own
        self.held = (self.slots, slot)
        return slot, self.slots.region.view[slot * self.chunk:(slot + 1) * self.chunk]

    def send(self, slot: Any, size: int, upload: str, offset: int, subject: str) -> None:
        assert self.held is not None and self.held[1] == slot, "send the slot acquired"
        slots, self.held = self.held[0], None
        body = {"region": slots.region.id, "upload": upload, "at": slot * self.chunk,
                "length": size, "offset": offset}
        lane = offset // self.chunk % self.workers
        slots.sending()
        f = self.pool.submit(action, self.client, "checkpoint.shm.put", body, subject, lane)
        f.add_done_callback(lambda _: slots.sent(slot))
        self.pending.append((slot, f))

    def release(self) -> None:
        """Gives back the slot being filled (the writer drained or
        cancelled its parts); a region of its own is let go."""
        if self.held is not None:
            self.held[0].put_back(self.held[1])
            self.held = None
        self.pending = []
        if self.shared is not None:
            self.shared.leave()
            self.shared = None
        if self.own is not None:
            close_region(self.client, self.own.region, "checkpoint writer region")
            self.own = None


def get_range(client: flight.FlightClient, options: flight.FlightCallOptions, name: str,
              version: int, offset: int, length: int, subject: str,
              place: Optional[int] = None) -> List[Tuple[int, memoryview]]:
    """The bytes ``[offset, offset + length)`` of version ``version`` of
    ``name`` from ``client``'s server, one ``DoGet``: its Arrow buffers
    as they arrived, each with its place in what the reader reads (from
    ``place`` on, ``offset`` by default), no copy."""
    ticket = json.dumps({"type": "checkpoint", "checkpoint": name, "version": version,
                         "offset": offset, "length": length}).encode()
    out: List[Tuple[int, memoryview]] = []
    start = offset if place is None else place
    pos = start
    try:
        stream = client.do_get(flight.Ticket(ticket), options)
        while True:
            try:
                chunk = stream.read_chunk()
            except StopIteration:
                break
            if chunk.data is None or chunk.data.num_rows == 0:
                continue
            col = chunk.data.column(0)
            offs = np.frombuffer(col.buffers()[1], dtype=np.int64)
            offs = offs[col.offset:col.offset + len(col) + 1]
            values = memoryview(col.buffers()[2]).cast("B")[int(offs[0]):int(offs[-1])]
            if len(values):
                out.append((pos, values))
                pos += len(values)
    except (flight.FlightError, pa.ArrowException) as e:
        raise from_flight(e, subject) from None
    if pos != start + length:
        got = pos - start
        raise SluiceError(500, "checkpoint_failed",
                          f"{subject}: bytes {offset + got}..{offset + length} missing")
    return out


class FlightGets:
    """Ranges over Flight ``DoGet`` streams (see the module docs)."""

    transport = "flight"

    def __init__(self, client: Any, chunk: int, workers: int, name: str, version: int):
        self.client, self.chunk, self.workers = client, chunk, workers
        self.name, self.version = name, version
        self.parts: Dict[int, List[Tuple[int, memoryview]]] = {}
        self.starts: Dict[int, List[int]] = {}

    def fetch(self, offset: int, length: int) -> None:
        c = self.client
        lane = offset // self.chunk % self.workers
        got = get_range(c.flight(lane), c.call_options(), self.name, self.version, offset,
                        length, f"checkpoint '{self.name}'")
        self._keep(offset, got)

    def _keep(self, offset: int, got: List[Tuple[int, memoryview]]) -> None:
        """The range at ``offset`` arrived as ``got`` (its buffers, each
        with its place in the version, in order)."""
        self.parts[offset] = got
        self.starts[offset] = [start for start, _ in got]

    def view(self, offset: int, pos: int, want: int) -> memoryview:
        """Up to ``want`` bytes from ``pos`` of the range at ``offset``
        (fetched), without a copy."""
        j = bisect.bisect_right(self.starts[offset], pos) - 1
        start, view = self.parts[offset][j]
        lo = pos - start
        return view[lo:lo + want]

    def close(self) -> None:
        self.parts = {}
        self.starts = {}


class ShmGets:
    """Ranges read by the server into a shared-memory region (see the
    module docs). Closed with ``keep``, the region goes back to
    ``on_release`` (the :class:`~sluice.Checkpoint`'s kept regions) for
    the next read, not to the server."""

    transport = "shm"

    def __init__(self, client: Any, chunk: int, workers: int, name: str, region: Region,
                 on_release: Callable[[Region], None], item: Optional[int] = None,
                 base: int = 0):
        self.client, self.chunk, self.workers = client, chunk, workers
        self.name, self.region = name, region
        self.on_release = on_release
        # Which of a group region's versions this is, and where it starts
        # in the region (``checkpoint.shm.get_group``); None and 0 alone.
        self.item, self.base = item, base

    def fetch(self, offset: int, length: int, at: Optional[int] = None) -> None:
        """Reads the range into the region at ``at`` (where the version's
        place puts it when ``None``)."""
        body: Dict[str, Any] = {"region": self.region.id, "offset": offset, "length": length}
        if self.item is not None:
            body["item"] = self.item
        if at is not None:
            body["at"] = at
        lane = offset // self.chunk % self.workers
        answer = action(self.client, "checkpoint.shm.get", body, f"checkpoint '{self.name}'",
                        lane)
        got = int(answer["bytes"])
        if got != length:
            raise SluiceError(500, "checkpoint_failed",
                              f"checkpoint '{self.name}': bytes {offset + got}.."
                              f"{offset + length} missing")

    def view(self, offset: int, pos: int, want: int) -> memoryview:
        return self.region.view[self.base + pos:self.base + pos + want]

    def close(self, keep: bool = False) -> None:
        if keep:
            self.on_release(self.region)
            return
        close_region(self.client, self.region, f"checkpoint '{self.name}'")


def close_region(client: Any, region: Region, subject: str) -> None:
    """Lets ``region`` go on both sides."""
    try:
        action(client, "checkpoint.shm.close", {"region": region.id}, subject)
    except SluiceError:
        pass  # expired already: the server let it go
    finally:
        region.close()
