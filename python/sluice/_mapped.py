"""Tensors over a shared region, no parse copy: what
:meth:`sluice.Checkpoint.load_all` returns on the server's host.

``torch.load(path, mmap=True)`` builds every tensor over one storage that
maps the whole file. A group region holds many versions side by side, so
there is no file per version to map; instead the region is mapped once
more, copy-on-write (``MAP_PRIVATE``), and each version's tensors are
built over its bytes in that mapping through the same step of
``torch.serialization`` that ``mmap=True`` uses (``_load`` with an
``overall_storage``). Reading a tensor reads the region's pages in place;
writing one copies the page it writes into this process only, so a
trainer may update what it loaded and the region is never written by
this side. Nothing is copied or allocated for the tensors: a load costs
the device's reads and the unpickling, and the loaded state takes no
memory beyond the region's.

The region cannot be read into again while a tensor over it lives: the
mapping's finalizer hands the region back (:meth:`sluice.Checkpoint.
_give_back`) once the last one is gone, and the next load takes it up
again with its pages in place. Where ``torch.serialization`` lacks that
step (it is private API; every torch from 2.1 has it) or the load asks
for what it cannot do (a ``map_location``, another ``pickle_module``),
the caller copies out instead (``torch.load`` from the reader).
"""

from __future__ import annotations

import inspect
import mmap
import pickle
from typing import Any, Dict, Optional

# What load() answers where it cannot map: the caller copies out.
NOT_MAPPED = object()
_usable: Optional[bool] = None


def usable(torch_load: Dict[str, Any]) -> bool:
    """Whether a load with these ``torch.load`` arguments can be mapped."""
    global _usable
    if _usable is None:
        import torch.serialization as ts

        _usable = (hasattr(ts, "_open_zipfile_reader") and hasattr(ts, "_load")
                   and "overall_storage" in inspect.signature(ts._load).parameters)
    return (_usable and set(torch_load) <= {"weights_only", "map_location"}
            and "weights_only" in torch_load and torch_load.get("map_location") is None)


def copy_on_write(fd: int, size: int) -> mmap.mmap:
    """A private (copy-on-write) mapping of a region's file."""
    return mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def load(reader: Any, view: memoryview, weights_only: bool) -> Any:
    """The state in ``reader`` (its zip directory and pickle read through
    it), every tensor over ``view`` (the version's bytes in a
    copy-on-write mapping, which the tensors keep alive); ``NOT_MAPPED``
    where it is no zip archive (torch.save's legacy format)."""
    import torch
    import torch.serialization as ts

    if not ts._is_zipfile(reader):
        # torch.save's legacy format (or no torch file at all): torch.load
        # reads it, or says what it is.
        reader.seek(0)
        return NOT_MAPPED
    reader.seek(0)
    storage = torch.frombuffer(view, dtype=torch.uint8).untyped_storage()
    with ts._open_zipfile_reader(reader) as archive:
        if weights_only:
            from torch import _weights_only_unpickler

            try:
                return ts._load(archive, None, _weights_only_unpickler,
                                overall_storage=storage, weights_only=True)
            except pickle.UnpicklingError as e:
                raise pickle.UnpicklingError(
                    f"weights_only load of {reader.name} failed: {e}") from None
        return ts._load(archive, None, pickle, overall_storage=storage)
