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
- ``SLUICE_DLIO_SQL``: the job's SQL over ``{dataset}`` (default: each
  ``.npz``'s ``x`` array decoded by the service, what DLIO's own NPZ
  reader does with ``np.load``);
- ``SLUICE_DLIO_PREFIX``: where checkpoints go (default ``dlio/<model>``).

Rank 0 submits one job for the run (batch size, world size = MPI ranks,
epochs, the seed's shuffle, drop-last as DLIO counts steps) and
broadcasts its id; each rank then reads its share of each epoch. See
``docs/dlio.md`` for the command that runs a workload against sluice.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, Optional

import torch
from dlio_benchmark.checkpointing.base_checkpointing import BaseCheckpointing
from dlio_benchmark.common.enumerations import DataLoaderType, DatasetType, Shuffle
from dlio_benchmark.data_loader.base_data_loader import BaseDataLoader
from dlio_benchmark.utils.utility import DLIOMPI

from .checkpoint import Checkpoint
from .client import Client, Job, SluiceError
from .torch import to_torch

DEFAULT_SQL = "SELECT key, npz(data, 'x') AS x FROM {dataset}"


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

    def read(self) -> None:
        """Submits the run's job (rank 0) and shares its id with every rank."""
        key = self._dataset
        mpi = DLIOMPI.get_instance()
        if key not in self._jobs:
            job_id = None
            if mpi.rank() == 0:
                folder = os.path.join(self._args.data_folder, "valid" if self._valid else "train")
                _ensure_dataset(self._client, self._dataset, folder)
                sql = os.environ.get("SLUICE_DLIO_SQL", DEFAULT_SQL).format(dataset=self._dataset)
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

    def next(self) -> Iterator[Dict[str, Any]]:
        """This rank's batches of the current epoch (DLIO counts from 1)."""
        if self._job is None:
            self.read()
        assert self._job is not None
        epoch = (self.epoch_number - 1) % max(1, int(self._args.epochs))
        reader = self._job.reader(DLIOMPI.get_instance().rank(), epoch, numpy=True)
        for batch in reader:
            yield to_torch(batch)
        self.epoch_number += 1

    def finalize(self) -> None:
        pass


class SluiceCheckpointing(BaseCheckpointing):
    """DLIO's checkpoints (model, optimizer, layer states) written with
    ``torch.save`` through :class:`sluice.Checkpoint`."""

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

    def save_state(self, suffix: str, state: Any) -> None:
        with self.store.writer(f"{suffix}.{self.ext}") as f:
            torch.save(state, f)

    def checkpoint(self, epoch: int, step_number: int) -> None:
        super().checkpoint(epoch, step_number)

    def finalize(self) -> None:
        super().finalize()
