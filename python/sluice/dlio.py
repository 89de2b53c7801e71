"""DLIO (``dlio-benchmark`` 2.0) plugins: a data loader that reads a sluice
job and a checkpoint mechanism that writes through :class:`sluice.Checkpoint`.

DLIO loads them by name from its workload config::

    reader:
      data_loader: pytorch
      data_loader_classname: sluice.dlio.SluiceDataLoader
      data_loader_sampler: iterative
    checkpoint:
      checkpoint_mechanism_classname: sluice.dlio.SluiceCheckpointing

and finds the service through the environment:

- ``SLUICE_URL`` (required): the REST URL of ``sluice serve``;
- ``SLUICE_TOKEN``: its bearer token, if it has one;
- ``SLUICE_TLS_CA``: the cluster's CA file, for an ``https://`` URL;
- ``SLUICE_DLIO_DATASET``: the dataset to read (default ``dlio``; the
  validation set is ``<name>_valid``). If it does not exist, rank 0
  ingests DLIO's ``<data_folder>/train`` (``valid``) into it, which must
  lie under one of the server's ``--ingest-root``s;
- ``SLUICE_DLIO_READ``: ``decode`` (default) has the service decode each
  sample as DLIO's own reader for the format does: an ``.npz``'s ``x``
  array (``np.load``), a JPEG or PNG to its pixels in the file's own mode
  (PIL's ``np.asarray(Image.open(f))``; DLIO generates greyscale);
  ``bytes`` reads each sample's bytes as they are stored, as MLPerf
  Storage's closed division does;
- ``SLUICE_DLIO_SQL``: the job's SQL over ``{dataset}``, in place of the
  two above;
- ``SLUICE_DLIO_PREFIX``: where checkpoints go (default ``dlio/<model>``).

:class:`PosixBytesReader` is the baseline for ``bytes``: DLIO's own
reader of local files, reading each file's bytes without decoding them
(MLPerf Storage's fork of DLIO does that; upstream DLIO 2.0 decodes
JPEGs with PIL).

Rank 0 submits one job for the run (batch size, world size = MPI ranks,
epochs, the seed's shuffle, drop-last as DLIO counts steps) and
broadcasts its id; each rank then reads its share of each epoch. See
``docs/dlio.md`` for the command that runs a workload against sluice.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from dlio_benchmark.checkpointing.base_checkpointing import BaseCheckpointing
from dlio_benchmark.common.enumerations import DataLoaderType, DatasetType, Shuffle
from dlio_benchmark.data_loader.base_data_loader import BaseDataLoader
from dlio_benchmark.reader.reader_handler import FormatReader
from dlio_benchmark.utils.utility import DLIOMPI

from .checkpoint import Checkpoint
from .client import Client, Job, SluiceError
from .torch import to_torch

# The job that decodes a sample as DLIO's own reader of the format does.
DECODE_SQL = {
    "npz": "SELECT key, npz(data, 'x') AS x FROM {dataset}",
    "jpeg": "SELECT key, decode_image(data, 'L') AS x FROM {dataset}",
    "png": "SELECT key, decode_image(data, 'L') AS x FROM {dataset}",
}
# Files of a checkpoint written (or loaded, load_states) at once.
LANES = 4

# Each sample's stored bytes (MLPerf Storage's closed division).
BYTES_SQL = "SELECT key, data AS x FROM {dataset}"


def job_sql(fmt: str) -> str:
    """The SQL of the run's job for DLIO's dataset format ``fmt``
    (``SLUICE_DLIO_SQL`` and ``SLUICE_DLIO_READ`` choose; see above)."""
    sql = os.environ.get("SLUICE_DLIO_SQL")
    if sql:
        return sql
    read = os.environ.get("SLUICE_DLIO_READ", "decode")
    if read == "bytes":
        return BYTES_SQL
    if read != "decode":
        raise ValueError(f"SLUICE_DLIO_READ={read!r}: expected decode or bytes")
    if fmt not in DECODE_SQL:
        raise ValueError(f"sluice.dlio: no decode for DLIO format {fmt!r}; "
                         "set SLUICE_DLIO_READ=bytes or SLUICE_DLIO_SQL")
    return DECODE_SQL[fmt]


def client() -> Client:
    """The client of the service ``SLUICE_URL`` names."""
    url = os.environ.get("SLUICE_URL")
    if not url:
        raise RuntimeError("sluice.dlio: set SLUICE_URL to the REST URL of `sluice serve`")
    return Client(url, token=os.environ.get("SLUICE_TOKEN") or None)


def _ensure_dataset(c: Client, name: str, folder: str) -> None:
    try:
        c.dataset(name)
    except SluiceError as e:
        if e.status != 404:
            raise
        c.ingest(name, os.path.abspath(folder), on_error="fail")


class SluiceDataLoader(BaseDataLoader):
    """Reads this rank's batches of a sluice job, one epoch per ``next()``."""

    _jobs: Dict[str, Job] = {}

    def __init__(self, format_type: Any, dataset_type: Any, epoch: int):
        super().__init__(format_type, dataset_type, epoch, DataLoaderType.CUSTOM)
        self._client = client()
        base = os.environ.get("SLUICE_DLIO_DATASET", "dlio")
        self._valid = dataset_type is DatasetType.VALID
        self._dataset = f"{base}_valid" if self._valid else base
        self._job: Optional[Job] = None
        # (epoch, its first batch, the rest) read ahead by read().
        self._primed: Optional[Tuple[int, Any, Iterator[Any]]] = None

    def read(self) -> None:
        """Submits the run's job (rank 0) and shares its id with every rank."""
        if int(self._args.num_samples_per_file) != 1:
            # A sluice dataset's sample is one file; DLIO would count
            # steps over samples the job does not have, and report 0.
            raise ValueError(
                "sluice.dlio: dataset.num_samples_per_file is "
                f"{self._args.num_samples_per_file}; the loader reads one sample per file")
        key = self._dataset
        mpi = DLIOMPI.get_instance()
        if key not in self._jobs:
            job_id = None
            if mpi.rank() == 0:
                folder = os.path.join(self._args.data_folder, "valid" if self._valid else "train")
                _ensure_dataset(self._client, self._dataset, folder)
                fmt = getattr(self._args.format, "value", str(self._args.format))
                sql = job_sql(fmt).format(dataset=self._dataset)
                opts: Dict[str, Any] = {
                    "batch_size": self.batch_size,
                    "world_size": mpi.size(),
                    "epochs": max(1, int(self._args.epochs)),
                    "drop_last": True,
                }
                if self._args.sample_shuffle is not Shuffle.OFF:
                    opts["shuffle"] = {"seed": int(self._args.seed)}
                job_id = self._client.submit(sql, **opts).id
            job_id = mpi.comm().bcast(job_id, root=0)
            self._jobs[key] = self._client.job(job_id)
        self._job = self._jobs[key]
        self._job.wait()
        # DLIO calls read() before its first epoch, outside the time it
        # measures, as its own loader builds its DataLoader there: the
        # first epoch's stream starts now, and its first batch is waiting
        # when training begins (the service begins each later epoch ahead
        # of its reader).
        if self._primed is None:
            epoch = self._epoch()
            batches = self._batches(epoch)
            self._primed = (epoch, next(batches, None), batches)

    def _epoch(self) -> int:
        return (self.epoch_number - 1) % max(1, int(self._args.epochs))

    def _batches(self, epoch: int) -> Iterator[Dict[str, Any]]:
        assert self._job is not None
        return iter(self._job.reader(DLIOMPI.get_instance().rank(), epoch, numpy=True))

    def next(self) -> Iterator[Dict[str, Any]]:
        """This rank's batches of the current epoch (DLIO counts from 1)."""
        if self._job is None:
            self.read()
        epoch = self._epoch()
        # DLIO stops at its step count without draining the generator, so
        # the epoch is counted now: the next call reads the next epoch
        # (which the service has begun ahead), never this one again.
        self.epoch_number += 1
        primed, self._primed = self._primed, None
        first = None
        if primed is not None and primed[0] == epoch:
            _, first, batches = primed
        else:
            if primed is not None:
                primed[2].close()
            batches = self._batches(epoch)
        try:
            if first is not None:
                yield to_torch(first)
            for batch in batches:
                yield to_torch(batch)
        finally:
            # Closing the generator ends the stream and its read-ahead.
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def finalize(self) -> None:
        pass


class PosixBytesReader(FormatReader):
    """DLIO's reader of local files, reading each file's bytes and not
    decoding them: the baseline of ``SLUICE_DLIO_READ=bytes``, named in
    ``reader.reader_classname``. Like every DLIO 2.0 reader it hands the
    loader DLIO's fixed sample, not the data it read."""

    def __init__(self, dataset_type: Any, thread_index: int, epoch: int):
        super().__init__(dataset_type, thread_index)

    def open(self, filename: str) -> bytes:
        super().open(filename)
        with open(filename, "rb") as f:
            return f.read()

    def close(self, filename: str) -> None:
        super().close(filename)

    def get_sample(self, filename: str, sample_index: int) -> None:
        super().get_sample(filename, sample_index)

    def next(self) -> Iterator[Any]:
        yield from super().next()

    def read_index(self, image_idx: int, step: int) -> Any:
        return super().read_index(image_idx, step)

    def finalize(self) -> None:
        return super().finalize()

    def is_index_based(self) -> bool:
        return True

    def is_iterator_based(self) -> bool:
        return True


class CheckpointFiles:
    """What both checkpoint mechanisms of the MLPerf workload share (a
    mixin before DLIO's checkpointing class): ``checkpoint()`` gathers the
    files DLIO's ``BaseCheckpointing`` saves for the step, hands them to
    :meth:`write_files` together, and keeps them in :attr:`written`;
    :meth:`load_states` loads several on ``LANES`` threads."""

    _gathering: Optional[List[Tuple[str, Any]]] = None
    # The (suffix, state) of every file of the last checkpoint written.
    written: List[Tuple[str, Any]] = []

    def write_files(self, files: List[Tuple[str, Any]]) -> None:
        raise NotImplementedError

    def load_state(self, suffix: str) -> Any:
        raise NotImplementedError

    def save_state(self, suffix: str, state: Any) -> None:
        if self._gathering is None:
            self.write_files([(suffix, state)])
        else:
            self._gathering.append((suffix, state))

    def checkpoint(self, epoch: int, step_number: int) -> None:
        self._gathering = []
        try:
            super().checkpoint(epoch, step_number)  # type: ignore[misc]
            files = self._gathering
        finally:
            self._gathering = None
        if files:  # a rank that checkpoints nothing (DLIO's rank_zero)
            self.write_files(files)
        self.written = files

    def load_states(self, suffixes: List[str]) -> List[Any]:
        """The states of several files (a checkpoint's), on ``LANES``
        threads at once: each file's fixed costs overlap the others'."""
        with ThreadPoolExecutor(LANES, thread_name_prefix="dlio-load") as pool:
            return list(pool.map(self.load_state, suffixes))


class SluiceCheckpointing(CheckpointFiles, BaseCheckpointing):
    """DLIO's checkpoints (model, optimizer, layer states) written with
    ``torch.save`` through :class:`sluice.Checkpoint`: a step's files on
    ``LANES`` threads at once (``Checkpoint.save_all``), begun in one
    request and made visible together in one commit (one device flush for
    all; a checkpoint killed half-way lists none)."""

    __instance: Optional["SluiceCheckpointing"] = None

    @staticmethod
    def get_instance() -> "SluiceCheckpointing":
        if SluiceCheckpointing.__instance is None:
            SluiceCheckpointing.__instance = SluiceCheckpointing()
        return SluiceCheckpointing.__instance

    def __init__(self) -> None:
        super().__init__("pt")
        prefix = os.environ.get("SLUICE_DLIO_PREFIX") or f"dlio/{self.args.model}"
        self.store = Checkpoint(client(), prefix)

    def get_tensor(self, size: int) -> torch.Tensor:
        return torch.randint(high=1, size=(size,), dtype=torch.int8)

    def write_files(self, files: List[Tuple[str, Any]]) -> None:
        """A checkpoint's files through ``Checkpoint.save_all``: begun in
        one request, written on ``LANES`` threads, committed together."""
        self.store.save_all([(f"{suffix}.{self.ext}", state) for suffix, state in files])

    def load_state(self, suffix: str) -> Any:
        """The state ``save_state`` wrote under ``suffix`` (DLIO 2.0 has
        no load phase; ``python/dlio/checkpointing.py`` calls this for
        MLPerf Storage's). On the server's host a large one's tensors are
        the region the server read the version into (no parse copy)."""
        return self.store.load(f"{suffix}.{self.ext}", weights_only=True)

    def load_states(self, suffixes: List[str]) -> List[Any]:
        """A checkpoint's files loaded together (``Checkpoint.load_all``):
        on the server's host one region holds them all, its small files
        read in one request, parsed on ``LANES`` threads as they arrive."""
        return self.store.load_all([f"{s}.{self.ext}" for s in suffixes], weights_only=True)

    def stored_bytes(self, suffix: str) -> int:
        """The size of the newest version of ``suffix``'s file."""
        return int(self.store.stat(f"{suffix}.{self.ext}")["size"])

    def finalize(self) -> None:
        super().finalize()
