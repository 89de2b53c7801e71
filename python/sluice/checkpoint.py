"""Checkpoints on sluice, shaped like ``pydaos.torch.Checkpoint``.

::

    ckpt = sluice.Checkpoint(client, "run7")
    with ckpt.writer("epoch3.pt") as f:
        torch.save(model.state_dict(), f)
    with ckpt.reader("epoch3.pt") as f:
        model.load_state_dict(torch.load(f, weights_only=True))

A writer streams: bytes fill a part of ``chunk_size`` bytes, and each full
part goes out on its own Flight ``DoPut`` while the next fills, with up to
``workers`` parts in flight — memory is ``(workers + 1) * chunk_size``
whatever the checkpoint's size. Closing the writer commits: the server
checks the parts cover the file exactly, makes them durable, and only then
makes the new version visible. Leaving the ``with`` block by an exception
aborts the upload (nothing is listed, the space is freed); a writer process
that dies is aborted by the server after its idle timeout.

A reader fetches ``chunk_size`` ranges of one version on ``workers``
parallel ``DoGet`` streams straight into one buffer, then serves reads and
seeks from it without a copy. Every extent is checked against its crc32c on
the server; a mismatch is an error naming the checkpoint and byte range.
"""

from __future__ import annotations

import bisect
import io
import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from ._errors import SluiceError, from_flight
from .client import Client

DEFAULT_CHUNK = 16 << 20
DEFAULT_WORKERS = 4
# Bytes per Flight message of a part (the server takes up to 64 MiB).
_PIECE = 8 << 20


def _error(e: Exception, name: str) -> SluiceError:
    """A Flight error as a :class:`SluiceError` (by its status code and the
    server's kind: ``checkpoint_not_found``, ``checkpoint_corrupt``,
    ``device_full``, ``unauthorized``, …), naming the checkpoint."""
    return from_flight(e, f"checkpoint '{name}'")


class Checkpoint:
    """The checkpoints under ``prefix`` of a sluice service (``client``)."""

    def __init__(self, client: Client, prefix: str = "", chunk_size: int = DEFAULT_CHUNK,
                 workers: int = DEFAULT_WORKERS):
        if chunk_size < 1 or workers < 1:
            raise ValueError("chunk_size and workers must be positive")
        self.client = client
        self.prefix = prefix.strip("/")
        self.chunk_size = chunk_size
        self.workers = workers

    def _name(self, name: str) -> str:
        name = name.strip("/")
        return f"{self.prefix}/{name}" if self.prefix else name

    def _action(self, kind: str, body: Dict[str, Any], name: str) -> Any:
        c = self.client
        try:
            results = list(c.flight().do_action(
                flight.Action(kind, json.dumps(body).encode()), c.call_options()))
        except (flight.FlightError, pa.ArrowException) as e:
            raise _error(e, name) from None
        return json.loads(results[0].body.to_pybytes()) if results else None

    def writer(self, name: str) -> "CheckpointWriter":
        """A writable binary stream: a new version of ``name`` on close."""
        return CheckpointWriter(self, self._name(name))

    def reader(self, name: str, version: Optional[int] = None) -> "CheckpointReader":
        """A readable, seekable binary stream of ``name`` (its newest
        version, or ``version``), fetched whole in parallel ranges."""
        return CheckpointReader(self, self._name(name), version)

    def stat(self, name: str, version: Optional[int] = None) -> Dict[str, Any]:
        """``name``'s newest version (or ``version``): size, version, time."""
        full = self._name(name)
        body: Dict[str, Any] = {"name": full}
        if version is not None:
            body["version"] = version
        return self._action("checkpoint.stat", body, full)

    def list(self, versions: bool = False) -> List[Any]:
        """The names under the prefix (relative to it), or with
        ``versions=True`` every version as a dict."""
        prefix = f"{self.prefix}/" if self.prefix else ""
        all_versions = self._action("checkpoint.list", {"prefix": prefix}, prefix or "/")
        if versions:
            return all_versions
        names = sorted({v["name"][len(prefix):] for v in all_versions})
        return names

    def delete(self, name: str, version: Optional[int] = None) -> List[Dict[str, Any]]:
        """Deletes ``name`` (every version, or ``version``)."""
        full = self._name(name)
        body: Dict[str, Any] = {"name": full}
        if version is not None:
            body["version"] = version
        return self._action("checkpoint.delete", body, full)


class CheckpointWriter(io.RawIOBase):
    """See the module docs; ``info`` holds the committed version after close."""

    def __init__(self, ckpt: Checkpoint, name: str):
        super().__init__()
        self._ckpt = ckpt
        self.name = name
        self.info: Optional[Dict[str, Any]] = None
        self._upload = ckpt._action("checkpoint.begin", {"name": name}, name)["upload"]
        self._part = bytearray(ckpt.chunk_size)
        self._fill = 0
        self._offset = 0  # of the part being filled
        self._pool = ThreadPoolExecutor(ckpt.workers, thread_name_prefix="sluice-ckpt-put")
        self._inflight: List[Future] = []
        self._failed = False

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._offset + self._fill

    def write(self, b: Any) -> int:
        if self.closed:
            raise ValueError(f"checkpoint '{self.name}': write after close")
        view = memoryview(b).cast("B")
        n = len(view)
        pos = 0
        while pos < n:
            take = min(n - pos, len(self._part) - self._fill)
            self._part[self._fill:self._fill + take] = view[pos:pos + take]
            self._fill += take
            pos += take
            if self._fill == len(self._part):
                self._send()
        return n

    def _send(self) -> None:
        part, size, offset = self._part, self._fill, self._offset
        # Bounded memory: wait for the oldest part when all workers are busy.
        while len(self._inflight) >= self._ckpt.workers:
            self._inflight.pop(0).result()
        self._inflight.append(self._pool.submit(self._put, offset, memoryview(part)[:size]))
        self._offset += size
        self._fill = 0
        self._part = bytearray(self._ckpt.chunk_size)

    def _put(self, offset: int, data: memoryview) -> None:
        c = self._ckpt.client
        cmd = json.dumps({"checkpoint_upload": self._upload, "offset": offset}).encode()
        schema = pa.schema([pa.field("data", pa.large_binary(), nullable=False)])
        try:
            lane = offset // self._ckpt.chunk_size % self._ckpt.workers
            writer, reader = c.flight(lane).do_put(
                flight.FlightDescriptor.for_command(cmd), schema, c.call_options())
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
            raise _error(e, self.name) from None

    def _wait(self) -> None:
        try:
            for f in self._inflight:
                f.result()
        finally:
            self._inflight = []

    def abort(self) -> None:
        """Abandons the upload: nothing is committed, the space is freed."""
        if self.closed:
            return
        self._failed = True
        for f in self._inflight:
            f.cancel()
        self._pool.shutdown(wait=True)
        try:
            self._ckpt._action("checkpoint.abort", {"upload": self._upload}, self.name)
        except SluiceError:
            pass  # expired already: the server freed it
        super().close()

    def close(self) -> None:
        """Sends the last part, waits for every part and commits."""
        if self.closed:
            return
        try:
            if self._fill:
                self._send()
            self._wait()
            self.info = self._ckpt._action(
                "checkpoint.commit", {"upload": self._upload, "size": self.tell()}, self.name)
        except BaseException:
            self.abort()
            raise
        self._pool.shutdown(wait=True)
        super().close()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()


class CheckpointReader(io.RawIOBase):
    """See the module docs; ``info`` is the version read.

    The ranges are fetched in the background from the moment it is made
    (the last one first: a zip archive's directory, which ``torch.load``
    reads first, is at the end), and a read waits only for the ranges it
    needs — so ``torch.load`` parses while the rest arrives. They arrive as
    Arrow buffers and are kept as they are; reads copy straight from them
    into the caller's memory."""

    def __init__(self, ckpt: Checkpoint, name: str, version: Optional[int] = None):
        super().__init__()
        body: Dict[str, Any] = {"name": name}
        if version is not None:
            body["version"] = version
        self.info = ckpt._action("checkpoint.stat", body, name)
        self.name = name
        self.size = int(self.info["size"])
        self._ckpt = ckpt
        self._pos = 0
        self._range = ckpt.chunk_size
        ranges = [(lo, min(self.size - lo, self._range))
                  for lo in range(0, self.size, self._range)]
        self._parts: List[List[Tuple[int, memoryview]]] = [[] for _ in ranges]
        self._starts: List[List[int]] = [[] for _ in ranges]
        self._futures: List[Future] = [None] * len(ranges)  # type: ignore[list-item]
        self._pool = ThreadPoolExecutor(max(1, min(ckpt.workers, len(ranges))),
                                        thread_name_prefix="sluice-ckpt-get")
        order = list(range(len(ranges)))
        if order:
            order = order[-1:] + order[:-1]
        for i in order:
            lo, n = ranges[i]
            self._futures[i] = self._pool.submit(self._get, lo, n, self._parts[i])
        self._pool.shutdown(wait=False)

    def _ready(self, i: int) -> List[Tuple[int, memoryview]]:
        """Range ``i``'s pieces, once fetched (its error, if it failed)."""
        self._futures[i].result()
        if not self._starts[i] and self._parts[i]:
            self._starts[i] = [start for start, _ in self._parts[i]]
        return self._parts[i]

    def wait(self) -> "CheckpointReader":
        """Waits until every range has arrived."""
        for i in range(len(self._futures)):
            self._ready(i)
        return self

    def _get(self, offset: int, length: int, out: List[Tuple[int, memoryview]]) -> None:
        c = self._ckpt.client
        ticket = json.dumps({"type": "checkpoint", "checkpoint": self.name,
                             "version": self.info["version"], "offset": offset,
                             "length": length}).encode()
        pos = offset
        try:
            lane = offset // self._ckpt.chunk_size % self._ckpt.workers
            stream = c.flight(lane).do_get(flight.Ticket(ticket), c.call_options())
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
            raise _error(e, self.name) from None
        if pos != offset + length:
            raise SluiceError(500, "checkpoint_failed",
                              f"checkpoint '{self.name}': bytes {pos}..{offset + length} missing")

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
        out = memoryview(b).cast("B")
        want = max(0, min(len(out), self.size - self._pos))
        done = 0
        while done < want:
            pos = self._pos + done
            r = pos // self._range
            pieces = self._ready(r)
            j = bisect.bisect_right(self._starts[r], pos) - 1
            start, view = pieces[j]
            lo = pos - start
            n = min(len(view) - lo, want - done)
            out[done:done + n] = view[lo:lo + n]
            done += n
        self._pos += done
        return done

    def read(self, size: int = -1) -> bytes:
        end = self.size if size is None or size < 0 else min(self.size, self._pos + size)
        buf = bytearray(max(0, end - self._pos))
        self.readinto(buf)
        return bytes(buf) if len(buf) < 1 << 16 else buf  # type: ignore[return-value]

    def close(self) -> None:
        for f in self._futures:
            f.cancel()
        self._parts = []
        self._starts = []
        super().close()
