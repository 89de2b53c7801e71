"""The REST client (:class:`Client`, :class:`Job`) and the Flight reader
(:class:`Reader`). Only the standard library, pyarrow and numpy."""

from __future__ import annotations

import gc
import json
import os
import queue
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from typing import Any, Dict, Iterator, Optional, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from . import _shm
from ._errors import SluiceError, from_flight


# Whether this process made a gRPC channel, and whether it was forked from
# one that had: gRPC's threads do not survive a fork, and a channel made in
# such a child waits forever, so readers there go through `sluice._relay`.
_grpc_used = False
_forked_after_grpc = False


# Every Client of this process, and in a forked child the Flight clients
# it inherited. Closing a Flight client needs gRPC's threads, which a fork
# does not copy: a child that frees an inherited one (the last reference
# dropped, or the garbage collector finding a cycle the parent had not yet
# collected) hangs in its destructor. So the child keeps them all alive,
# and the parent's garbage is frozen across the fork (`gc.freeze`: the
# child never collects it; the parent unfreezes and collects it itself).
_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()
_inherited: list = []


def _after_fork_in_child() -> None:
    global _forked_after_grpc
    _forked_after_grpc = _forked_after_grpc or _grpc_used
    _inherited.extend(c._flight for c in list(_clients))


os.register_at_fork(before=gc.freeze, after_in_parent=gc.unfreeze,
                    after_in_child=_after_fork_in_child)


def _is_sql(text: str) -> bool:
    head = text.lstrip().split(None, 1)[0].lower() if text.strip() else ""
    return head in ("select", "with", "explain")


class Client:
    """A client of a ``sluice serve`` REST API at ``url``; ``token`` is
    sent as a bearer token on REST and Flight.

    Over TLS (an ``https://`` URL, ``grpc+tls://`` Flight locations) the
    server's certificate is checked against ``ca``, the cluster's CA file
    (PEM; default: ``SLUICE_TLS_CA``, else the system's CAs)."""

    def __init__(self, url: str = "http://127.0.0.1:8080", token: Optional[str] = None,
                 timeout: float = 60.0, ca: Optional[str] = None):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.ca = ca or os.environ.get("SLUICE_TLS_CA") or None
        self._ca_pem: Optional[bytes] = None
        self._ssl: Optional[ssl.SSLContext] = None
        self._flight: Dict[int, flight.FlightClient] = {}
        self._flight_pid = 0
        self._flight_address: Optional[str] = None
        _clients.add(self)

    # -- REST ---------------------------------------------------------------
    def _request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("content-type", "application/json")
        if self.token:
            req.add_header("authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._context()) as r:
                text = r.read().decode()
                ctype = r.headers.get("content-type", "")
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            try:
                err = json.loads(text)
                raise SluiceError(e.code, err.get("code", "error"), err.get("message", text)) from None
            except ValueError:
                raise SluiceError(e.code, "error", text) from None
        return json.loads(text) if "json" in ctype else text

    def _context(self) -> Optional[ssl.SSLContext]:
        """The TLS context of an ``https://`` URL: the server checked
        against ``ca``."""
        if not self.url.startswith("https://"):
            return None
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=self.ca)
        return self._ssl

    def _tls_roots(self) -> Optional[bytes]:
        """The CA certificates a ``grpc+tls://`` Flight client checks the
        server against (``None``: gRPC's own roots)."""
        if self.ca and self._ca_pem is None:
            with open(self.ca, "rb") as f:
                self._ca_pem = f.read()
        return self._ca_pem

    def info(self) -> Dict[str, Any]:
        """The service's version and Flight address."""
        return self._request("GET", "/v1/info")

    def datasets(self) -> list:
        """The datasets: name, samples, bytes, columns."""
        return self._request("GET", "/v1/datasets")

    def dataset(self, name: str) -> Dict[str, Any]:
        """One dataset."""
        return self._request("GET", f"/v1/datasets/{urllib.parse.quote(name)}")

    def ingest(self, name: str, path: str, manifest: Optional[str] = None,
               on_error: str = "skip", replicas: Optional[int] = None) -> Dict[str, Any]:
        """Ingests a directory on the server (under one of its ingest roots);
        over storage nodes, ``replicas`` nodes hold each part (the server's
        default: 2 with at least 2 nodes)."""
        body: Dict[str, Any] = {"name": name, "path": path, "on_error": on_error}
        if manifest:
            body["manifest"] = manifest
        if replicas is not None:
            body["replicas"] = replicas
        return self._request("POST", "/v1/datasets", body)

    def submit(self, pipeline: Union[str, Dict[str, Any]], **options: Any) -> "Job":
        """Submits a pipeline — SQL text, a plan dict, or a plan's YAML text —
        with the job options (``batch_size``, ``epochs``, ``shuffle``,
        ``world_size``, ``drop_last``, ``on_error``, ``offload``, and
        ``resume``: a state a trainer saved, see :meth:`Job.state_dict`)."""
        body: Dict[str, Any] = dict(options)
        if isinstance(pipeline, str) and _is_sql(pipeline):
            body["sql"] = pipeline
        else:
            body["plan"] = pipeline
        status = self._request("POST", "/v1/jobs", body)
        return Job(self, status["id"], status)

    def job(self, job_id: str) -> "Job":
        """An existing job."""
        return Job(self, job_id, self._request("GET", f"/v1/jobs/{job_id}"))

    def jobs(self) -> list:
        """Every job's status."""
        return self._request("GET", "/v1/jobs")

    # -- Flight -------------------------------------------------------------
    def flight(self, lane: int = 0, location: Optional[str] = None) -> flight.FlightClient:
        """A Flight client of the service (or of the compute node at
        ``location`` that serves a job's rank), made once per process, lane
        and location.

        Each lane is its own connection: streams that share one HTTP/2
        connection are served one frame at a time, so parallel transfers
        (a checkpoint's parts) use several lanes. A gRPC channel must not
        cross a fork, so a forked child (a DataLoader worker) makes its own."""
        global _grpc_used
        if self._flight_pid != os.getpid():
            if _forked_after_grpc:
                raise SluiceError(
                    500, "forked_after_grpc",
                    "this process was forked from one that used gRPC, which cannot work "
                    "here; job readers relay through a new process, other calls need a "
                    "'spawn' or 'forkserver' multiprocessing context")
            self._flight_pid = os.getpid()
            self._flight = {}
        address = location or self.flight_address()
        key = lane if address == self.flight_address() else (address, lane)
        client = self._flight.get(key)
        if client is None:
            options = [("grpc.max_receive_message_length", -1)]
            if lane:
                # Its own subchannel, hence its own TCP connection.
                options.append(("grpc.use_local_subchannel_pool", 1))
            tls = {}
            if address.startswith("grpc+tls://") and self._tls_roots() is not None:
                tls["tls_root_certs"] = self._tls_roots()
            client = flight.FlightClient(address, generic_options=options, **tls)
            self._flight[key] = client
            _grpc_used = True
        return client

    def flight_address(self) -> str:
        """The ``grpc://host:port`` (``grpc+tls://``) of the service's
        Flight endpoint."""
        if self._flight_address is None:
            self._flight_address = self._reachable(self.info()["flight"])
        return self._flight_address

    def _reachable(self, location: str) -> str:
        """``location`` as this client reaches it (a server listening on
        all addresses is reached at the REST host)."""
        parsed = urllib.parse.urlparse(location)
        host = parsed.hostname
        if host in ("0.0.0.0", "::", None):
            host = urllib.parse.urlparse(self.url).hostname
        scheme = "grpc+tls" if parsed.scheme == "grpc+tls" else "grpc"
        return f"{scheme}://{host}:{parsed.port}"

    def __getstate__(self) -> Dict[str, Any]:
        # A Flight client cannot be pickled (to 'spawn' DataLoader workers).
        state = dict(self.__dict__)
        state["_flight"] = {}
        state["_flight_pid"] = 0
        state["_ssl"] = None
        return state

    def call_options(self) -> flight.FlightCallOptions:
        headers = [(b"authorization", f"Bearer {self.token}".encode())] if self.token else []
        return flight.FlightCallOptions(headers=headers)


class Job:
    """A submitted job."""

    def __init__(self, client: Client, job_id: str, status: Optional[Dict[str, Any]] = None):
        self.client = client
        self.id = job_id
        self._status = status or {}

    def __repr__(self) -> str:
        return f"Job({self.id!r}, state={self._status.get('state')!r})"

    def status(self) -> Dict[str, Any]:
        """State, progress, samples/s, bytes per tier, skipped samples."""
        self._status = self.client._request("GET", f"/v1/jobs/{self.id}")
        return self._status

    def wait(self, timeout: float = 120.0) -> Dict[str, Any]:
        """Waits until the job is no longer pending."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            if st["state"] != "pending":
                return st
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} still pending after {timeout} s")
            time.sleep(0.05)

    @property
    def spec(self) -> Dict[str, Any]:
        if "spec" not in self._status:
            self.status()
        return self._status["spec"]

    def explain(self) -> Dict[str, Any]:
        """Where its stages run and why: ``text`` and ``placement``."""
        return self.client._request("GET", f"/v1/jobs/{self.id}/explain")

    def cancel(self) -> Dict[str, Any]:
        """Cancels it."""
        self._status = self.client._request("DELETE", f"/v1/jobs/{self.id}")
        return self._status

    def location(self, rank: int) -> str:
        """The Flight location that serves ``rank`` now: a compute node
        registered with the coordinator, or the coordinator itself (asked
        each time: ranks move when compute nodes come and go)."""
        c = self.client
        for e in self.status().get("endpoints", []):
            if e["rank"] == rank:
                return c._reachable(e["location"])
        return c.flight_address()

    def flight_info(self) -> flight.FlightInfo:
        """Its Flight info: schema and one endpoint per rank."""
        c = self.client
        return c.flight().get_flight_info(
            flight.FlightDescriptor.for_command(self.id), c.call_options())

    def reader(self, rank: int = 0, epoch: int = 0, offset: int = 0,
               limit: Optional[int] = None, numpy: bool = False,
               prefetch: int = 2, transport: Optional[str] = None,
               worker: int = 0, workers: int = 1) -> "Reader":
        """Rank ``rank``'s share of ``epoch`` from ``offset`` (at most
        ``limit`` positions), ``prefetch`` batches read ahead; ``transport``
        as :class:`Reader` takes it. With ``workers`` > 1, DataLoader worker
        ``worker``'s part of it: the rank's batches ``worker``,
        ``worker + workers``, … (``offset`` and ``limit`` in that part)."""
        return Reader(self, rank, epoch, offset, limit, numpy, prefetch, transport,
                      worker, workers)

    def first_epoch(self) -> int:
        """The first epoch it reads: 0, or the epoch a resumed job
        continues."""
        resumed = self.wait().get("resumed")
        return int(resumed["epoch"]) if resumed else 0

    def epoch_share(self, epoch: int) -> Tuple[int, int]:
        """``(start, samples_per_rank)`` of ``epoch``: the global position
        it begins at (0, or where a resumed job continues its first) and
        the positions of each rank's share."""
        st = self.wait()
        resumed = st.get("resumed")
        if resumed and resumed["epoch"] == epoch:
            return int(resumed["start"]), int(resumed["samples_per_rank"])
        return 0, int(st["samples_per_rank"])

    def samples_per_rank(self, epoch: int) -> int:
        """Positions of each rank's share of ``epoch`` (a resumed job's
        first epoch holds only what was left of it)."""
        return self.epoch_share(epoch)[1]

    def state_dict(self, epoch: int, offset: int) -> Dict[str, Any]:
        """The training's position when **every** rank has read ``offset``
        positions of its share of ``epoch`` (ranks step together in
        data-parallel training), in the form a trainer saves with its
        checkpoint: ``{"sluice": 1, "epoch", "position", "samples",
        "shuffle"}``. ``position`` is global: every sample before it in the
        epoch's order was read, none after. A job submitted with
        ``resume=`` this state continues exactly there, with any world
        size, batch size or number of workers."""
        st = self.wait()
        if st["state"] == "failed":
            raise SluiceError(500, "job_failed", f"job {self.id}: {st.get('error')}")
        spec = st["spec"]
        start, per_rank = self.epoch_share(epoch)
        samples = int(st["samples"])
        if not 0 <= offset <= per_rank:
            raise ValueError(f"offset {offset} of a share of {per_rank} positions")
        if offset == per_rank:
            epoch, position = epoch + 1, 0
        else:
            position = min(start + offset * int(spec["world_size"]), samples)
        return {"sluice": 1, "epoch": epoch, "position": position, "samples": samples,
                "shuffle": spec.get("shuffle")}


def _read_ahead(source: Iterator[Any], depth: int) -> Iterator[Any]:
    """The items of ``source``, read up to ``depth`` ahead on a thread;
    its errors are raised here, and leaving early stops it."""
    q: "queue.Queue[Tuple[str, Any]]" = queue.Queue(depth)
    stop = threading.Event()

    def put(item: Tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in source:
                if not put(("item", item)):
                    return
            put(("end", None))
        except BaseException as e:  # noqa: BLE001 (handed to the consumer)
            put(("error", e))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=run, name="sluice-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            kind, item = q.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()


# The struct columns of the array and image UDFs (sluice_udfs::tensor):
# their bytes become numpy arrays over the Arrow buffer, not Python bytes.
_ARRAY_FIELDS = ("dtype", "shape", "data")
_IMAGE_FIELDS = ("height", "width", "channels", "pixels")


def _field_names(t: pa.DataType) -> Tuple[str, ...]:
    return tuple(t.field(i).name for i in range(t.num_fields)) if pa.types.is_struct(t) else ()


def _row_views(col: pa.StructArray) -> np.ndarray:
    """An array or image column as an object array of per-row numpy
    arrays viewing the column's data buffer (``None`` for a null row)."""
    image = _field_names(col.type) == _IMAGE_FIELDS
    data = col.field("pixels" if image else "data")
    if pa.types.is_large_binary(data.type):
        offsets = np.frombuffer(data.buffers()[1], dtype=np.int64)
    else:
        offsets = np.frombuffer(data.buffers()[1], dtype=np.int32)
    offsets = offsets[data.offset:data.offset + len(data) + 1]
    values = data.buffers()[2]
    if image:
        dims = zip(col.field("height").to_pylist(), col.field("width").to_pylist(),
                   col.field("channels").to_pylist())
        kinds = [("uint8", (h, w, c)) for h, w, c in dims]
    else:
        kinds = list(zip(col.field("dtype").to_pylist(), col.field("shape").to_pylist()))
    out = np.empty(len(col), dtype=object)
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    for i, (dtype, shape) in enumerate(kinds):
        if valid[i]:
            lo, hi = int(offsets[i]), int(offsets[i + 1])
            dt = np.dtype(dtype)
            out[i] = np.frombuffer(values, dtype=dt, count=(hi - lo) // dt.itemsize,
                                   offset=lo).reshape(shape)
    return out


def to_numpy(batch: pa.RecordBatch) -> Dict[str, Any]:
    """A batch as a dict of numpy arrays: fixed-shape tensor columns as
    ``[rows, *shape]`` views of the Arrow buffers (no copy), primitive
    columns as views, array and image columns (``npz``, ``decode_image``
    …) as object arrays of per-row views (no copy), others (strings,
    other structs) converted."""
    out: Dict[str, Any] = {}
    for name, col in zip(batch.schema.names, batch.columns):
        if isinstance(col.type, pa.FixedShapeTensorType):
            out[name] = col.to_numpy_ndarray()
        elif pa.types.is_primitive(col.type) and col.null_count == 0:
            out[name] = col.to_numpy(zero_copy_only=True)
        elif _field_names(col.type) in (_ARRAY_FIELDS, _IMAGE_FIELDS):
            out[name] = _row_views(col)
        else:
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


class Reader:
    """Iterates over one rank's batches; :attr:`offset` is the offset to
    resume at after the batches seen so far.

    Up to ``prefetch`` batches are read ahead on a background thread, so
    the stream keeps flowing while the trainer computes (gRPC's flow
    control would otherwise stop it once its window fills); 0 reads on the
    caller's thread.

    ``transport``: ``"auto"`` (the default, or ``$SLUICE_TRANSPORT``)
    takes the batches through shared memory when the server is on this
    host and over Flight otherwise; ``"shm"`` insists on shared memory (an
    error says why it cannot be); ``"flight"`` never uses it. The bytes are
    the same either way. :attr:`transport_used` says which it got."""

    def __init__(self, job: Job, rank: int, epoch: int, offset: int,
                 limit: Optional[int], numpy: bool, prefetch: int = 2,
                 transport: Optional[str] = None, worker: int = 0, workers: int = 1):
        transport = transport or os.environ.get("SLUICE_TRANSPORT") or "auto"
        if transport not in ("auto", "shm", "flight"):
            raise ValueError(f"transport {transport!r}: expected auto, shm or flight")
        self.transport = transport
        self.transport_used: Optional[str] = None
        self.job = job
        self.rank = rank
        self.epoch = epoch
        self.offset = offset
        self.limit = limit
        self.worker = worker
        self.workers = workers
        self.numpy = numpy
        self.prefetch = prefetch
        self.schema: Optional[pa.Schema] = None
        self.last_from = offset

    def _ticket(self, probe: Optional["_shm.Probe"] = None,
                held: Optional[Dict[str, "_shm.Segment"]] = None) -> flight.Ticket:
        t: Dict[str, Any] = {"type": "job", "job": self.job.id, "rank": self.rank,
                             "epoch": self.epoch, "offset": self.offset}
        if self.limit is not None:
            t["limit"] = self.limit
        if self.workers != 1:
            t["worker"], t["workers"] = self.worker, self.workers
        if self.transport != "auto":
            t["transport"] = self.transport
        if probe is not None and probe.ticket() is not None:
            t["probe"] = probe.ticket()
            if held is not None:
                t["held"] = _shm.held_ticket(held)
        return flight.Ticket(json.dumps(t).encode())

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The batches as pyarrow record batches. The server's errors are
        raised as :class:`SluiceError` (``code`` is their kind, e.g.
        ``checksum_mismatch``; ``grpc_code`` their status code)."""
        source = self._relayed() if _forked_after_grpc else self._flight()
        if self.prefetch > 0:
            source = _read_ahead(source, self.prefetch)
        start = self.offset
        try:
            for batch, first, next_offset in source:
                self.last_from = first
                self.offset = next_offset
                if self.limit is not None:
                    self.limit -= self.offset - start
                    start = self.offset
                yield batch
        except (flight.FlightError, pa.ArrowException) as e:
            raise from_flight(e, f"job {self.job.id}") from e

    def _flight(self, transport: Optional[str] = None) -> Iterator[Tuple[pa.RecordBatch, int, int]]:
        """(batch, first position, next offset) over Flight (and shared
        memory, when it can be had)."""
        c = self.job.client
        transport = transport or self.transport
        probe = _shm.Probe() if transport != "flight" else None
        # Segments this process still maps: the server may carry this
        # stream in one of them (held here until the stream names it).
        held = _shm.held() if probe is not None else None
        location = self.job.location(self.rank)
        try:
            stream = c.flight(location=location).do_get(self._ticket(probe, held),
                                                        c.call_options())
            self.schema = stream.schema
        except pa.ArrowException as e:
            if transport == "shm":
                raise SluiceError(412, "shm_unavailable", f"job {self.job.id}: {e}") from None
            raise
        finally:
            # Read by the server before it answered.
            if probe is not None:
                probe.remove()
        self.transport_used = "flight"
        segment: Optional[_shm.Segment] = None
        lost = "never announced"
        pieces = []
        while True:
            try:
                chunk = stream.read_chunk()
            except StopIteration:
                break
            if chunk.data is not None:
                pieces.append(chunk.data)
            if chunk.app_metadata is None:
                continue
            meta = json.loads(chunk.app_metadata.to_pybytes())
            if "segment" in meta:
                try:
                    info = meta["segment"]
                    kept = (held or {}).get(info["path"]) if meta.get("kept") else None
                    segment = kept or _shm.Segment(info)
                    _shm.remember(segment)
                    held = None
                    self.transport_used = "shm"
                except PermissionError:
                    if transport == "shm":
                        raise
                    # The server runs as another user: its segments are
                    # not ours to map. Nothing was delivered yet; read the
                    # same range over Flight instead.
                    stream.cancel()
                    yield from self._flight("flight")
                    return
                except OSError as e:
                    # The server's stream ended (an error, a cancel) and took
                    # the segment with it: the error follows, unless a slot
                    # does.
                    lost = f"{meta['segment'].get('path')}: {e}"
                continue
            if "slot" in meta:
                if segment is None:
                    raise SluiceError(500, "shm_lost",
                                      f"job {self.job.id}: shared-memory segment {lost}")
                batch = segment.batch(int(meta["slot"]), int(meta["len"]), self.schema)
                yield batch, int(meta["from"]), int(meta["next_offset"])
                continue
            if len(pieces) == 1:
                batch = pieces[0]
            else:
                batch = pa.Table.from_batches(pieces, schema=self.schema).combine_chunks().to_batches()
                batch = batch[0] if batch else pa.RecordBatch.from_pylist([], schema=self.schema)
            pieces = []
            yield batch, int(meta["from"]), int(meta["next_offset"])

    def _relayed(self) -> Iterator[Tuple[pa.RecordBatch, int, int]]:
        """The same through ``python -m sluice._relay`` (see there)."""
        c = self.job.client
        req = {"url": c.url, "token": c.token, "ca": c.ca, "flight": self.job.location(self.rank),
               "job": self.job.id,
               "rank": self.rank, "epoch": self.epoch, "offset": self.offset,
               "limit": self.limit, "transport": self.transport,
               "worker": self.worker, "workers": self.workers}
        proc = subprocess.Popen([sys.executable, "-m", "sluice._relay"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write((json.dumps(req) + "\n").encode())
            proc.stdin.close()
            try:
                stream = pa.ipc.open_stream(proc.stdout)
            except pa.ArrowInvalid:
                stream = None
            if stream is not None:
                self.schema = stream.schema
                while True:
                    try:
                        batch, meta = stream.read_next_batch_with_custom_metadata()
                    except StopIteration:
                        break
                    yield batch, int(meta[b"from"]), int(meta[b"next_offset"])
            err = proc.stderr.read().decode() if proc.stderr else ""
            if proc.wait() != 0:
                last = err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}"
                raise SluiceError(500, "relay_failed", f"job {self.job.id}: {last}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def __iter__(self) -> Iterator[Any]:
        for b in self.batches():
            yield to_numpy(b) if self.numpy else b

    def state_dict(self) -> Dict[str, Any]:
        """The training's position after the batches read so far, when
        every rank has read as far (see :meth:`Job.state_dict`)."""
        if self.workers != 1:
            raise ValueError("a worker's part alone does not say what its rank read: "
                             "take the state where the batches are consumed "
                             "(sluice.torch.DataLoader)")
        return self.job.state_dict(self.epoch, self.offset)
