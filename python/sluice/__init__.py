"""sluice's trainer client: submit pipelines over REST, read batches over
Arrow Flight.

- :class:`Client` — the REST API (datasets, jobs) of a ``sluice serve``;
- :class:`Job` — one submitted job: status, explain, cancel, readers;
- :class:`Reader` — one rank's share of an epoch, from an offset, as
  pyarrow batches or dicts of numpy arrays (tensor columns without a copy);
- :mod:`sluice.torch` — a torch ``IterableDataset`` over a job.
"""

from . import torch  # noqa: F401 (imports torch itself only when used)
from .client import Client, Job, Reader, SluiceError, to_numpy

__all__ = ["Client", "Job", "Reader", "SluiceError", "to_numpy"]
__version__ = "0.1.0"
