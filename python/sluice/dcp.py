"""``torch.distributed.checkpoint`` (DCP) on sluice: a ``StorageWriter``
and a ``StorageReader``.

::

    import torch.distributed.checkpoint as dcp
    from sluice.dcp import SluiceReader, SluiceWriter

    ckpt = sluice.Checkpoint(client, "run7")
    dcp.save(state, storage_writer=SluiceWriter(ckpt), checkpoint_id="step-100")
    dcp.async_save(state, storage_writer=SluiceWriter(ckpt), checkpoint_id="step-200")
    dcp.load(state, storage_reader=SluiceReader(ckpt), checkpoint_id="step-100")

Why a ``StorageWriter``/``StorageReader`` and not a ``FileSystemBase``
(as s3torchconnector plugs in): a file system commits one file at a time
and publishes the metadata by a rename, so a save killed between files
leaves some of them listed. Here every rank writes its file as an upload
that is not visible yet, its ``WriteResult`` carries the upload to the
coordinator, and the coordinator's ``finish`` writes the metadata and
commits every rank's file with it in **one catalog transaction**
(``checkpoint.commit_group``): a save is listed whole or not at all, and
a save killed half-way leaves the previous step loadable and nothing of
its own (its uploads are aborted when they go idle).

Layout under ``<prefix>/<checkpoint_id>/``:

- ``__<i>.distcp``: the items of global plan ``i`` (one per rank that has
  any), tensors as their raw bytes (row-major, each at a 64-byte aligned
  offset) and ``BYTE_IO`` items as they are;
- ``.metadata``: DCP's ``Metadata`` (pickled), whose ``storage_data``
  says where each item is (:class:`Stored`).

Every file of one save has the same commit time; a reader reads the
versions of that commit (a save to the same id later cannot mix with the
one whose metadata it read). Each rank writes its own file in parallel
through the :class:`~sluice.Checkpoint`'s lanes (shared memory on the
server's host, Flight elsewhere). A load reads each file it needs once,
in parallel ranges, and copies each item into the tensors DCP's planner
hands it as soon as its ranges are in (in file order; a file larger than
the :class:`~sluice.Checkpoint`'s ``read_window`` streams through a
window, a whole tensor straight into its target), so
a save from 2 ranks loads on 1 or 4 (resharding is DCP's planner's).
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import uuid
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from .checkpoint import Checkpoint
from .client import Client

METADATA = ".metadata"
_ALIGN = 64


@dataclasses.dataclass(frozen=True)
class Stored:
    """Where one item is: its file (relative to the checkpoint id), byte
    range, and for a tensor its dtype and shape."""

    file: str
    offset: int
    length: int
    dtype: Optional[str] = None
    shape: Optional[Tuple[int, ...]] = None


@dataclasses.dataclass(frozen=True)
class _Written:
    """A ``WriteResult``'s storage data on its way to the coordinator: the
    item's place, and the upload that holds it (not kept in the metadata)."""

    stored: Stored
    upload: Dict[str, Any]


def _checkpoint(target: Union[Checkpoint, Client]) -> Checkpoint:
    return target if isinstance(target, Checkpoint) else Checkpoint(target)


def _id(checkpoint_id: Union[str, os.PathLike, None]) -> str:
    cid = os.fspath(checkpoint_id) if checkpoint_id is not None else ""
    cid = str(cid).strip("/")
    if not cid:
        raise ValueError("a sluice DCP checkpoint needs a checkpoint_id (a name under the prefix)")
    return cid


class _Target:
    """What the writer and the reader share: the checkpoint store, the
    checkpoint id, and the names of its files."""

    def __init__(self, checkpoint: Union[Checkpoint, Client],
                 checkpoint_id: Union[str, os.PathLike, None]):
        self.ckpt = _checkpoint(checkpoint)
        self.path = _id(checkpoint_id) if checkpoint_id is not None else None

    def _reset_id(self, checkpoint_id: Union[str, os.PathLike, None]) -> None:
        if checkpoint_id is not None:
            self.path = _id(checkpoint_id)

    def _name(self, file: str) -> str:
        return f"{_id(self.path)}/{file}"

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, os.PathLike]) -> bool:
        try:
            cid = str(os.fspath(checkpoint_id))
        except TypeError:
            return False
        return bool(cid.strip("/")) and "://" not in cid


class SluiceWriter(_Target, StorageWriter):
    """DCP's ``StorageWriter`` over a :class:`~sluice.Checkpoint` (see the
    module docs)."""

    def __init__(self, checkpoint: Union[Checkpoint, Client],
                 checkpoint_id: Union[str, os.PathLike, None] = None):
        _Target.__init__(self, checkpoint, checkpoint_id)
        self.is_coordinator = False
        self.save_id = uuid.uuid4().hex

    def reset(self, checkpoint_id: Union[str, os.PathLike, None] = None) -> None:
        self._reset_id(checkpoint_id)
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        return [dataclasses.replace(p, storage_data=f"__{i}.distcp") for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        results: List[WriteResult] = []
        if plan.items:
            file = plan.storage_data
            w = self.ckpt.writer(self._name(file))
            placed: List[Tuple[Any, Stored]] = []
            try:
                pos = 0
                for item in plan.items:
                    data = planner.resolve_data(item)
                    if item.type == WriteItemType.BYTE_IO:
                        view = data.getbuffer()
                        w.write(view)
                        placed.append((item, Stored(file, pos, len(view))))
                        pos += len(view)
                        continue
                    t = data.detach().cpu().contiguous()
                    pad = -pos % _ALIGN
                    if pad:
                        w.write(bytes(pad))
                        pos += pad
                    raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
                    w.write(raw)
                    n = t.numel() * t.element_size()
                    placed.append((item, Stored(file, pos, n, str(t.dtype), tuple(t.shape))))
                    pos += n
                upload = w.uncommitted()
            except BaseException:
                w.abort()
                raise
            results = [WriteResult(index=item.index, size_in_bytes=st.length,
                                   storage_data=_Written(st, upload)) for item, st in placed]
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        """On the coordinator: the metadata, then every rank's file and the
        metadata committed in one transaction."""
        uploads: Dict[str, Dict[str, Any]] = {}
        storage: Dict[MetadataIndex, Stored] = {}
        for rank_results in results:
            for wr in rank_results:
                storage[wr.index] = wr.storage_data.stored
                uploads[wr.storage_data.upload["upload"]] = wr.storage_data.upload
        metadata.storage_data = storage
        name = self._name(METADATA)
        w = self.ckpt.writer(name)
        try:
            w.write(pickle.dumps(metadata))
            uploads["metadata"] = w.uncommitted()
        except BaseException:
            w.abort()
            raise
        self.ckpt.commit_group(list(uploads.values()))


class SluiceReader(_Target, StorageReader):
    """DCP's ``StorageReader`` over a :class:`~sluice.Checkpoint` (see the
    module docs)."""

    def __init__(self, checkpoint: Union[Checkpoint, Client],
                 checkpoint_id: Union[str, os.PathLike, None] = None):
        _Target.__init__(self, checkpoint, checkpoint_id)
        self.reset(checkpoint_id)

    def reset(self, checkpoint_id: Union[str, os.PathLike, None] = None) -> None:
        self._reset_id(checkpoint_id)
        self.storage_data: Dict[MetadataIndex, Stored] = {}
        self.versions: Dict[str, int] = {}
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        with self.ckpt.reader(self._name(METADATA)) as r:
            metadata = pickle.loads(r.view())
            committed = r.info["created_unix_ms"]
        # The files of the same commit as this metadata.
        prefix = self._name("")
        full = self.ckpt._name(prefix)
        for v in self.ckpt._action("checkpoint.list", {"prefix": full}, full):
            if v["created_unix_ms"] == committed:
                self.versions[v["name"]] = int(v["version"])
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool,
                              *args: Any, **kwargs: Any) -> None:
        if metadata.storage_data is None:
            raise ValueError(f"checkpoint '{self.path}': its metadata says where no item is")
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        per_file: Dict[str, list] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].file, []).append(req)
        for file, reqs in per_file.items():
            name = self._name(file)
            version = self.versions.get(self.ckpt._name(name))
            # In file order: each item is copied out as soon as its
            # ranges are in, while the later ones are still being read.
            reqs.sort(key=lambda req: self.storage_data[req.storage_index].offset)
            with self.ckpt.reader(name, version) as r:
                for req in reqs:
                    self._load_item(r, file, req, planner)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _load_item(self, r: Any, file: str, req: Any, planner: LoadPlanner) -> None:
        """Copies one item out of reader ``r`` into what ``planner`` asks
        (nothing made of the reader's bytes outlives this call, so its
        region is kept for the next read)."""
        st = self.storage_data[req.storage_index]
        if req.type == LoadItemType.BYTE_IO:
            planner.load_bytes(req, io.BytesIO(bytes(r.slice(st.offset, st.length))))
            return
        target = planner.resolve_tensor(req).detach()
        if r.windowed and _reads_into(target, st, req):
            # The whole stored tensor into a target of its own shape and
            # type: one copy, from the window into the target.
            r.readinto_at(st.offset, _bytes_of(target))
            planner.commit_tensor(req, target)
            return
        tensor = _tensor(r.slice(st.offset, st.length), st)
        tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
        if target.size() != tensor.size():
            raise ValueError(
                f"checkpoint '{self.path}': {req.storage_index.fqn} is "
                f"{tuple(tensor.size())} in {file} but {tuple(target.size())} is asked")
        target.copy_(tensor)
        planner.commit_tensor(req, target)


def _reads_into(target: torch.Tensor, st: Stored, req: Any) -> bool:
    """Whether item ``req`` is the whole stored tensor and ``target`` its
    own contiguous memory of the same shape and type, so the stored
    bytes can be copied straight into it."""
    shape = tuple(st.shape or ())
    return (target.is_contiguous() and target.device.type == "cpu"
            and _dtype_name(target.dtype) == _dtype_name(st.dtype)
            and tuple(target.size()) == shape
            and tuple(req.lengths) == shape and not any(req.storage_offsets)
            and target.numel() * target.element_size() == st.length and st.length > 0)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _bytes_of(target: torch.Tensor) -> memoryview:
    """``target``'s memory as writable bytes (it is contiguous)."""
    return memoryview(target.reshape(-1).view(torch.uint8).numpy()).cast("B")


def _tensor(view: memoryview, st: Stored) -> torch.Tensor:
    """The stored tensor over ``view`` (its bytes; no copy: the caller
    copies what it needs before the view goes)."""
    dtype = getattr(torch, _dtype_name(st.dtype))
    shape = tuple(st.shape or ())
    numel = 1
    for d in shape:
        numel *= d
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    with warnings.catch_warnings():
        # A read-only mapping: only copied from.
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(view, dtype=dtype, count=numel)
    return flat.reshape(shape)
