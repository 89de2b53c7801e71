"""sluice's trainer client: submit pipelines over REST, read batches over
Arrow Flight, keep checkpoints on the same service.

- :class:`Client` — the REST API (datasets, jobs) of a ``sluice serve``;
- :class:`Job` — one submitted job: status, explain, cancel, readers;
- :class:`Reader` — one rank's share of an epoch, from an offset, as
  pyarrow batches or dicts of numpy arrays (tensor columns without a copy);
- :class:`Checkpoint` — named, versioned checkpoints, shaped like
  ``pydaos.torch.Checkpoint`` (``writer``/``reader`` streams for
  ``torch.save``/``torch.load``; shared memory on the server's host,
  Flight elsewhere: :mod:`sluice._lanes`);
- :mod:`sluice.dcp` — ``torch.distributed.checkpoint``'s storage writer
  and reader over checkpoints (import it by name: it imports torch);
- :mod:`sluice.torch` — a torch ``IterableDataset`` over a job (torch
  itself is imported only when the module is first used).
"""

from .checkpoint import Checkpoint, CheckpointReader, CheckpointWriter
from .client import Client, Job, Reader, SluiceError, to_numpy

__all__ = ["Checkpoint", "CheckpointReader", "CheckpointWriter", "Client", "Job", "Reader",
           "SluiceError", "to_numpy", "torch"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # ``sluice.torch`` without ``import sluice.torch``, and without paying
    # for importing torch when only the reader is used.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'sluice' has no attribute {name!r}")
