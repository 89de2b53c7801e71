"""Checkpoints on sluice, shaped like ``pydaos.torch.Checkpoint``.

::

    ckpt = sluice.Checkpoint(client, "run7")
    with ckpt.writer("epoch3.pt") as f:
        torch.save(model.state_dict(), f)
    with ckpt.reader("epoch3.pt") as f:
        model.load_state_dict(torch.load(f, weights_only=True))
    # same host: tensors over the server's mapping, no parse copy
    state = ckpt.load("epoch3.pt", weights_only=True)
    # a model's files together: one region, the small ones one request,
    # tensors over it copy-on-write
    layers = ckpt.load_all([f"layer_{i}.pt" for i in range(32)], weights_only=True)
    # and saved together: one request begins them, one transaction commits
    ckpt.save_all({f"layer_{i}.pt": layer for i, layer in enumerate(layers)})

A writer streams: bytes fill a part of ``chunk_size`` bytes, and each full
part goes to the server while the next fills, with up to ``workers`` parts
in flight — memory is ``(workers + 1) * chunk_size`` whatever the
checkpoint's size. Closing the writer commits: the server checks the parts
cover the file exactly, makes them durable, and only then makes the new
version visible. Leaving the ``with`` block by an exception aborts the
upload (nothing is listed, the space is freed); a writer process that dies
is aborted by the server after its idle timeout.

A reader fetches ranges of one version (``chunk_size``, or
``SHM_READ_RANGE`` into a kept region), ``workers`` at once, the last
first (a zip archive's directory, which ``torch.load`` reads first, is
at the end), and a read waits only for the ranges it
needs — so ``torch.load`` parses while the rest arrives. Every extent is
checked against its crc32c on the server; a mismatch is an error naming
the checkpoint and byte range.

On the server's host the bytes go through shared memory, elsewhere over
Flight (:mod:`sluice._lanes`; ``transport`` chooses): a writer's parts
are the slots of a region the server writes to the device from, and a
reader's ranges land in a region: the version's size where it is no
larger than ``read_window`` (or a mapped load wants it whole), which it
parses in place; else a window of ``read_window`` bytes that the ranges
take in turn, read ahead of the position and copied out
(:mod:`sluice._window`), so a load of any size makes only the window's
pages and fits in a small ``/dev/shm`` (its ranges are chunks, where
it holds two). ``writer.transport`` and ``reader.transport`` say which
ran. Both kinds of region are kept for the next save or load (a
reader's when nothing made of its bytes outlives it), so their pages
are allocated once: at most ``keep_read_bytes`` of read regions, the
most recently used, each for ``keep_read_seconds`` after its last read
(then its memory goes back, on both sides). Into a kept region a reader
asks for ranges of ``SHM_READ_RANGE`` (4 MiB), and a version no larger
than one is a single request.

On a cluster, a writer sends each stripe straight to the storage nodes
that hold it, with the upload passes the coordinator gave at ``begin``
(:mod:`sluice._direct`; ``transport == "direct"``), where every node gives
one, and a reader reads each stripe from a node that holds it, with the
read passes the coordinator gave at ``stat``; ``direct=False`` sends every
part and every range through the coordinator instead.

Files: this one (the checkpoints of a prefix, and their writers),
:mod:`sluice._reader` (a reader of one version), :mod:`sluice._group`
(many versions read into one region) and :mod:`sluice._mapped` (tensors
built over it).
"""

from __future__ import annotations

import io
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _direct, _lanes, _mapped
from ._errors import SluiceError
from ._group import open_group
from ._reader import SHM_READ_RANGE, CheckpointReader
from .client import Client

DEFAULT_CHUNK = 16 << 20
DEFAULT_WORKERS = 4
TRANSPORTS = ("auto", "shm", "flight")


# Versions smaller than this load by parsing the region's bytes, not by
# mapping the region's file (whose opening costs more than the copy).
MAPPED_LOAD_MIN = 8 << 20
# Versions of this size and more load by parsing through the window, not
# by mapping a region of their own: its fresh pages cost more than the
# window's copy. On the 2-core VM (docs/benchmarks.md, checkpoints run 7),
# 4 GiB mapped at 0.80-0.84 GB/s against 1.17-1.23 through the window;
# 1 GiB mapped at 1.03-1.23 against 0.84.
MAPPED_LOAD_MAX = 2 << 30
# Read regions a Checkpoint keeps for its next reads: at most this many,
# of at most DEFAULT_KEEP_READ bytes in all, each for DEFAULT_KEEP_READ_S
# after its last read (less than the server's idle timeout, 120 s: a
# trainer that loads once and trains for hours holds no idle region).
KEEP_READ_REGIONS = 8
DEFAULT_KEEP_READ = 1 << 30
DEFAULT_KEEP_READ_S = 30.0
# A version larger than this many ranges streams through a window of that
# many (sluice._window): ``workers`` being read ahead and the one being
# copied out. Its pages are made once. A window's ranges are chunks
# (``chunk_size``, where the window holds two): each request reads a
# chunk's extents at once, so the device has more reads in flight for
# fewer requests. On the 2-core VM, 1 and 4 GiB torch.load through the
# window, interleaved in one process: 16 MiB ranges in 5 slots 1.84-2.50
# GB/s, 4 MiB ranges in 6 slots 1.37-1.63, 16 MiB in 6 slots 1.41-1.67.
WINDOW_RANGES_OVER_WORKERS = 1


class Checkpoint:
    """The checkpoints under ``prefix`` of a sluice service (``client``)."""

    def __init__(self, client: Client, prefix: str = "", chunk_size: int = DEFAULT_CHUNK,
                 workers: int = DEFAULT_WORKERS, transport: str = "auto",
                 keep_read_bytes: int = DEFAULT_KEEP_READ,
                 keep_read_seconds: float = DEFAULT_KEEP_READ_S,
                 read_window: Optional[int] = None, direct: bool = True):
        if chunk_size < 1 or workers < 1:
            raise ValueError("chunk_size and workers must be positive")
        if keep_read_bytes < 0 or keep_read_seconds < 0:
            raise ValueError("keep_read_bytes and keep_read_seconds must not be negative")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport {transport!r}: expected one of {TRANSPORTS}")
        self.client = client
        self.prefix = prefix.strip("/")
        self.chunk_size = chunk_size
        self.workers = workers
        self.transport = transport
        # On a cluster: write and read the stripes at the storage nodes
        # (where the coordinator hands out passes), or send every part and
        # range through it.
        self.direct = direct
        self._lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None
        # The threads a direct writer's stripes go out on (each part's
        # stretches to each of their holders at once).
        self._fan_pool: Optional[ThreadPoolExecutor] = None
        self._parse_pool: Optional[ThreadPoolExecutor] = None
        # The put region every writer of this object shares, and the
        # lock its making and checking run under.
        self._put_slots: Optional[_lanes.PutSlots] = None
        self._puts_lock = threading.Lock()
        # Regions handed back by mappings that went (`_give_back`).
        self._returned: Deque[Tuple[_lanes.Region, bool]] = deque()
        # Read regions kept for the next reads, least recently used first
        # (each with its `idle_since`).
        self._idle_gets: List[_lanes.Region] = []
        self._expiry: Optional[threading.Timer] = None
        self.keep_read_bytes = keep_read_bytes
        self.keep_read_seconds = keep_read_seconds
        # The region a larger version streams through (0: one the
        # version's size, always).
        # The ranges a reader asks for into a kept region (and the size an
        # opening reads whole before it answers).
        span = self.small_range = min(chunk_size, SHM_READ_RANGE)
        if read_window is None:
            read_window = (workers + WINDOW_RANGES_OVER_WORKERS) * chunk_size
        if read_window and read_window < 2 * span:
            raise ValueError(f"read_window {read_window}: 0, or at least two ranges ({2 * span})")
        self.read_window = read_window
        # The ranges a window takes: chunks where it holds two of them.
        self.window_range = chunk_size if read_window >= 2 * chunk_size else span
        self._shm_refused = False

    def _executor(self) -> ThreadPoolExecutor:
        """The threads every writer and reader of this object shares
        (started once, not per checkpoint)."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="sluice-ckpt")
            return self._pool

    def _fan(self) -> ThreadPoolExecutor:
        """The threads that send a direct writer's stripes to the storage
        nodes: ``2 * workers``, so each of ``workers`` parts in flight has
        its copies sent at once."""
        with self._lock:
            if self._fan_pool is None:
                self._fan_pool = ThreadPoolExecutor(2 * self.workers,
                                                    thread_name_prefix="sluice-stripe")
            return self._fan_pool

    def _puts(self, subject: str) -> Any:
        """A writer's lanes: the slots of the region this Checkpoint's
        writers share (kept from the last save, or new), or Flight (see
        :mod:`sluice._lanes`)."""
        pool = self._executor()
        with self._puts_lock:
            slots = self._put_slots
            # The server lets a region go after its idle timeout: one no
            # other writer is using now is asked after first.
            if slots is not None and not slots.in_use():
                try:
                    _lanes.action(self.client, "checkpoint.shm.touch",
                                  {"region": slots.region.id}, subject)
                except SluiceError as e:
                    if e.code != "region_not_found":
                        raise
                    slots.region.close()
                    slots = self._put_slots = None
            if slots is None and not (self._shm_refused and self.transport == "auto"):
                slots = self._put_slots = self._new_slots(subject)
            if slots is not None:
                # Joined under the lock: `_let_puts_go` never takes a
                # region a writer is about to use.
                return _lanes.ShmPuts(self.client, pool, self.chunk_size, self.workers, slots,
                                      lambda: self._new_slots(subject))
        return _lanes.FlightPuts(self.client, pool, self.chunk_size, self.workers)

    def _let_puts_go(self) -> None:
        """Lets an idle put region go (a load does: a process that loads
        holds its read region, not the writers' too; the next save makes a
        new one)."""
        with self._puts_lock:
            slots = self._put_slots
            if slots is None or not slots.idle():
                return
            self._put_slots = None
        _lanes.close_region(self.client, slots.region, "checkpoint writer region")

    def _new_slots(self, subject: str) -> Optional["_lanes.PutSlots"]:
        """A new put region of ``workers + 1`` slots; ``None`` where the
        server is not on this host (then writers use Flight)."""
        lent = _lanes.open_region(
            self.client, "checkpoint.shm.put_open",
            {"size": (self.workers + 1) * self.chunk_size}, subject, self.transport, writable=True)
        if lent is None or lent[0] is None:
            with self._lock:
                self._shm_refused = True
            return None
        return _lanes.PutSlots(lent[0], self.chunk_size)

    def _open_read(self, kind: str, body: Dict[str, Any], subject: str) -> Any:
        """``open_region`` of a read region (``get_open``, ``get_group``),
        offering the kept ones: those the server did not choose, and did
        not name as gone, are kept again (see :func:`_lanes.open_region`
        for what it answers)."""
        kept = self._take_gets()
        try:
            lent = _lanes.open_region(self.client, kind, dict(body, kept=list(kept)), subject,
                                      self.transport, writable=False, kept=kept)
        except BaseException:
            self._keep_gets(list(kept.values()))
            raise
        chosen = lent[0] if lent is not None else None
        self._keep_gets([r for r in kept.values() if r is not chosen],
                        gone=lent[1].get("gone", []) if lent is not None else [])
        return lent

    def _give_back(self, region: "_lanes.Region", keep: bool) -> None:
        """A region handed back by whatever held it (a mapping's finalizer:
        any thread, so nothing is called here); the next read keeps or
        lets go of it."""
        self._returned.append((region, keep))

    def _take_returned(self) -> None:
        """Keeps the regions handed back (or lets go of those not to keep)."""
        back = []
        while self._returned:
            back.append(self._returned.popleft())
        if back:
            self._keep_gets([r for r, keep in back if keep])
            self._let_go([r for r, keep in back if not keep], ())

    def _take_gets(self) -> Dict[str, "_lanes.Region"]:
        """Kept read regions for one reader's ``get_open``, taken: the one
        kept last and the largest (the rest stay for readers on other
        threads); it gives back those the server did not choose."""
        self._take_returned()
        with self._lock:
            idle = self._idle_gets
            picks = {id(r): r for r in idle[-1:] + sorted(idle, key=lambda r: r.size)[-1:]}
            self._idle_gets = [r for r in idle if id(r) not in picks]
        return {r.id: r for r in picks.values()}

    def _keep_gets(self, regions: List["_lanes.Region"], gone: List[str] = ()) -> None:
        """Keeps ``regions`` for the next reads, within the bounds; lets
        go of those past them and of ``gone`` (let go by the server)."""
        drop = [r for r in regions if r.id in gone]
        now = time.monotonic()
        with self._lock:
            for r in regions:
                if r.id not in gone:
                    r.idle_since = now
                    self._idle_gets.append(r)
            while self._idle_gets and (
                    len(self._idle_gets) > KEEP_READ_REGIONS
                    or sum(r.size for r in self._idle_gets) > self.keep_read_bytes):
                drop.append(self._idle_gets.pop(0))
        self._arm_expiry()
        self._let_go(drop, gone)

    def _arm_expiry(self) -> None:
        """Starts the timer for the oldest kept read region, if any is kept
        and none runs."""
        with self._lock:
            if not self._idle_gets or self._expiry is not None:
                return
            due = min(r.idle_since for r in self._idle_gets) + self.keep_read_seconds
            timer = self._expiry = threading.Timer(
                max(0.01, due - time.monotonic()), self._expire_gets)
            timer.daemon = True
        timer.start()

    def _expire_gets(self) -> None:
        """Lets go of the kept read regions unused for ``keep_read_seconds``."""
        now = time.monotonic()
        with self._lock:
            self._expiry = None
            old = [r for r in self._idle_gets if now - r.idle_since >= self.keep_read_seconds]
            self._idle_gets = [r for r in self._idle_gets if r not in old]
        self._let_go(old, ())
        self._arm_expiry()

    def _let_go(self, regions: List["_lanes.Region"], gone: Any) -> None:
        for r in regions:
            if r.id in gone:
                r.close()
            else:
                _lanes.close_region(self.client, r, "checkpoint region")

    def close(self) -> None:
        """Lets the kept regions and threads go (they also go with the
        process, and the server lets an unused region go after its idle
        timeout)."""
        with self._lock:
            slots, self._put_slots = self._put_slots, None
            gets, self._idle_gets = self._idle_gets, []
            while self._returned:
                gets.append(self._returned.popleft()[0])
            expiry, self._expiry = self._expiry, None
            pool, self._pool = self._pool, None
            parsers, self._parse_pool = self._parse_pool, None
            fan, self._fan_pool = self._fan_pool, None
        if parsers is not None:
            parsers.shutdown(wait=True)
        if expiry is not None:
            expiry.cancel()
        for region in ([slots.region] if slots is not None else []) + gets:
            _lanes.close_region(self.client, region, "checkpoint region")
        if pool is not None:
            pool.shutdown(wait=True)
        if fan is not None:
            fan.shutdown(wait=True)

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _name(self, name: str) -> str:
        name = name.strip("/")
        return f"{self.prefix}/{name}" if self.prefix else name

    def _action(self, kind: str, body: Dict[str, Any], name: str) -> Any:
        return _lanes.action(self.client, kind, body, f"checkpoint '{name}'")

    def writer(self, name: str) -> "CheckpointWriter":
        """A writable binary stream: a new version of ``name`` on close."""
        return CheckpointWriter(self, self._name(name))

    def commit_group(self, uploads: List[Dict[str, Any]]) -> Any:
        """Makes several uploads visible in one transaction, each a
        :meth:`CheckpointWriter.uncommitted`: all of them are listed, or
        (an error) none is. One device flush for all."""
        return self._action("checkpoint.commit_group", {"uploads": uploads},
                            f"{len(uploads)} uploads under '{self.prefix}'")

    def abort_upload(self, upload: Dict[str, Any]) -> None:
        """Abandons an :meth:`CheckpointWriter.uncommitted` upload: nothing
        is committed, its space is freed (one that expired already is
        gone anyway)."""
        try:
            self._action("checkpoint.abort", {"upload": upload["upload"]},
                         f"upload {upload['upload']}")
        except SluiceError:
            pass

    def reader(self, name: str, version: Optional[int] = None) -> "CheckpointReader":
        """A readable, seekable binary stream of ``name`` (its newest
        version, or ``version``), fetched whole in parallel ranges."""
        return CheckpointReader(self, self._name(name), version)

    def load(self, name: str, version: Optional[int] = None, **torch_load: Any) -> Any:
        """``torch.load`` of ``name``. On the server's host the tensors'
        storage is the shared region the server read the version into
        (``torch.load(path, mmap=True)``: no parse copy; the pages are
        this process's once the region is let go); elsewhere, for a
        version under ``MAPPED_LOAD_MIN`` bytes, and for one of
        ``MAPPED_LOAD_MAX`` and more (through the window), it parses from
        a :meth:`reader` (whose region is then kept for the next read)."""
        import torch

        self._let_puts_go()
        # A version torch will map gets a region of its own (`own_from`),
        # so that the kept ones stay for the reads that copy out of them;
        # a larger one (`own_below`) streams through the window.
        with CheckpointReader(self, self._name(name), version, own_from=MAPPED_LOAD_MIN,
                              own_below=MAPPED_LOAD_MAX) as r:
            path = r.mapped_path()
            if path is None or r.size < MAPPED_LOAD_MIN or r.region_size != r.size:
                # A small version parses faster from the region's bytes
                # than torch opens and maps a file of it; a kept region
                # larger than the version is no file torch can open.
                return torch.load(r, **torch_load)
            r.wait()
            # The tensors map the region's pages: it is never read into again.
            r.hand_over()
            return torch.load(path, mmap=True, **torch_load)

    def load_all(self, names: List[str], versions: Optional[List[Optional[int]]] = None,
                 **torch_load: Any) -> List[Any]:
        """``torch.load`` of each of ``names`` (their newest versions, or
        ``versions``), in order, parsed on ``workers`` threads at once. On
        the server's host they are read into one region side by side
        (:mod:`sluice._group`: the small ones in one request). With
        ``weights_only`` given (and no ``map_location``) the tensors are
        built over the region, copy-on-write (:mod:`sluice._mapped`: no
        parse copy, no memory of their own), and the region is kept for
        the next load once the last of them is gone; otherwise they are
        copied out of it, as ``torch.load`` copies them out of a file's
        pages, and it is kept at once. Elsewhere, and for a version that
        does not fit ``keep_read_bytes``, each is a :meth:`load` of its
        own."""
        import torch

        self._let_puts_go()

        if versions is None:
            versions = [None] * len(names)
        if len(versions) != len(names):
            raise ValueError(f"{len(names)} names but {len(versions)} versions")
        full = [self._name(n) for n in names]
        readers = open_group(self, full, versions) if full else {}

        mapped = _mapped.usable(torch_load) and bool(readers)

        def one(i: int) -> Any:
            r = readers.get(i)
            if r is None:
                return self.load(names[i], versions[i], **torch_load)
            with r:
                try:
                    if mapped and r.size > 0:
                        lanes = r._lanes
                        view = lanes.group.copy_on_write()[lanes.base:lanes.base + r.size]
                        state = _mapped.load(r, view, bool(torch_load["weights_only"]))
                        if state is not _mapped.NOT_MAPPED:
                            # The tensors are over the bytes: all must be in.
                            r.wait()
                            return state
                    return torch.load(r, **torch_load)
                except Exception as e:
                    # torch's own errors do not say which file (notes: 3.11 on).
                    if hasattr(e, "add_note"):
                        e.add_note(f"loading checkpoint '{r.name}' version {r.info['version']}")
                    raise

        # The largest first: their parses copy each range as it arrives,
        # while the other threads get through the small files (a few
        # milliseconds of unpickling each) beside them. In order, the large
        # ones waited for every small one's parse with their bytes in.
        order = sorted(range(len(names)),
                       key=lambda i: -readers[i].size if i in readers else 0)
        submitted = {i: self._threads().submit(one, i) for i in order}
        parses = [submitted[i] for i in range(len(names))]
        try:
            return [f.result() for f in parses]
        finally:
            # On an error, the parses still running finish before their
            # readers (and the region) are let go.
            for f in parses:
                f.cancel()
            wait(parses)
            for r in readers.values():
                r.close()
            if readers:
                # The tensors hold the mapping now (none, on an error).
                next(iter(readers.values()))._lanes.group.release_view()

    def _threads(self) -> ThreadPoolExecutor:
        """The threads :meth:`load_all` parses on and :meth:`save_all`
        serializes on (apart from those that move the bytes, which these
        wait for)."""
        with self._lock:
            if self._parse_pool is None:
                self._parse_pool = ThreadPoolExecutor(self.workers,
                                                      thread_name_prefix="sluice-files")
            return self._parse_pool

    def save_all(self, states: Union[Mapping[str, Any], Sequence[Tuple[str, Any]]],
                 **torch_save: Any) -> List[Dict[str, Any]]:
        """``torch.save`` of each ``(name, state)`` (a mapping, or pairs in
        order), on ``workers`` threads at once, made visible together in
        one transaction: :meth:`commit_group`, one device flush for all,
        and a save that fails or dies half-way lists none of them. Their
        uploads begin in one request (``checkpoint.begin_group``), not one
        a file; on the server's host their parts share the writers' put
        region. Returns each one's committed version, in order."""
        import torch

        items = list(states.items()) if isinstance(states, Mapping) else list(states)
        if not items:
            return []
        full = [self._name(name) for name, _ in items]
        subject = f"{len(full)} checkpoints under '{self.prefix}'"
        begun = self._action("checkpoint.begin_group", {"names": full, "direct": self.direct},
                             subject)
        ids = begun["uploads"]
        direct = begun.get("direct") or [None] * len(ids)

        def one(i: int) -> Dict[str, Any]:
            # A writer that fails aborts its own upload.
            w = CheckpointWriter(self, full[i], upload=ids[i], direct=direct[i])
            try:
                torch.save(items[i][1], w, **torch_save)
            except BaseException as e:
                w.abort()
                w.raise_own(e)
                raise
            return w.uncommitted()

        saves = [self._threads().submit(one, i) for i in range(len(items))]
        wait(saves)
        failed = [f.exception() for f in saves if f.exception() is not None]
        uploads = [f.result() for f in saves if f.exception() is None]
        try:
            if failed:
                raise failed[0]
            return self.commit_group(uploads)
        except BaseException:
            for upload in uploads:
                self.abort_upload(upload)
            raise

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
    """See the module docs; ``info`` holds the committed version after
    close, ``transport`` is ``"shm"``, ``"flight"`` or ``"direct"`` (a
    cluster's stripes written to its storage nodes)."""

    def __init__(self, ckpt: Checkpoint, name: str, upload: Optional[str] = None,
                 direct: Optional[Dict[str, Any]] = None):
        super().__init__()
        self._ckpt = ckpt
        self.name = name
        self.info: Optional[Dict[str, Any]] = None
        self._subject = f"checkpoint '{name}'"
        # An upload begun already (``Checkpoint.save_all`` begins a group's
        # in one request), or one of its own.
        # On a cluster whose storage nodes this process may write to, the
        # begin's answer carries the stripes' layout and the nodes' passes
        # (``direct``): the parts go to the nodes, not the coordinator.
        if upload is None:
            begun = ckpt._action("checkpoint.begin", {"name": name, "direct": ckpt.direct}, name)
            upload, direct = begun["upload"], begun.get("direct")
        self._upload = upload
        try:
            if direct:
                self._lanes = _direct.DirectPuts(ckpt.client, ckpt._executor(), ckpt.chunk_size,
                                                 ckpt.workers, direct, ckpt._fan())
            else:
                self._lanes = ckpt._puts(self._subject)
        except BaseException:
            self._abort_upload()
            raise
        self.transport = ("direct" if direct else
                          "shm" if isinstance(self._lanes, _lanes.ShmPuts) else "flight")
        self._slot, self._part = self._lanes.acquire()
        self._fill = 0
        self._offset = 0  # of the part being filled
        # What failed a write (the server's answer: a full device, a
        # refused name). torch.save calls ``write`` from its zip writer,
        # which swallows the error and fails on its own with a message of
        # its own ("unexpected pos ..."): the writer's is the one to show.
        self._failed: Optional[BaseException] = None

    def raise_own(self, error: BaseException) -> None:
        """Raises what failed this writer's own ``write`` in place of
        ``error`` (what ``torch.save`` made of it), if that is not it."""
        if self._failed is not None and error is not self._failed:
            raise self._failed from error

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
        try:
            while pos < n:
                take = min(n - pos, len(self._part) - self._fill)
                self._part[self._fill:self._fill + take] = view[pos:pos + take]
                self._fill += take
                pos += take
                if self._fill == len(self._part):
                    self._send()
        except BaseException as e:
            self._failed = e
            raise
        return n

    def _send(self) -> None:
        self._lanes.send(self._slot, self._fill, self._upload, self._offset, self._subject)
        self._offset += self._fill
        self._fill = 0
        self._slot, self._part = self._lanes.acquire()

    def _abort_upload(self) -> None:
        self._ckpt.abort_upload({"upload": self._upload})

    def abort(self) -> None:
        """Abandons the upload: nothing is committed, the space is freed."""
        if self.closed:
            return
        self._lanes.cancel()
        self._abort_upload()
        self._lanes.release()
        super().close()

    def close(self) -> None:
        """Sends the last part, waits for every part and commits."""
        if self.closed:
            return
        try:
            if self._fill:
                self._send()
            self._lanes.drain()
            self.info = self._ckpt._action(
                "checkpoint.commit", {"upload": self._upload, "size": self.tell()}, self.name)
        except BaseException:
            self.abort()
            raise
        self._lanes.release()
        super().close()

    def uncommitted(self) -> Dict[str, Any]:
        """Sends the last part and waits for every part, but leaves the
        commit to the caller: ``{"upload", "size"}`` for a
        ``checkpoint.commit_group`` that makes several uploads visible in
        one transaction (:mod:`sluice.dcp`)."""
        try:
            if self._fill:
                self._send()
            self._lanes.drain()
        except BaseException:
            self.abort()
            raise
        self._lanes.release()
        super().close()
        return {"upload": self._upload, "size": self.tell()}

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
            self.raise_own(exc)
        else:
            self.close()


__all__ = ["Checkpoint", "CheckpointReader", "CheckpointWriter", "SHM_READ_RANGE"]
