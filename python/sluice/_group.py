"""Several versions in one shared region: a model's files loaded together
(:meth:`sluice.Checkpoint.load_all`).

A load of a checkpoint made of many files (a layer a file and the
optimizer's groups: MLPerf's llama3 layout is 34 files a rank) would
otherwise open each alone: a proof of host, a region lent and mapped, a
request, for every file. ``checkpoint.shm.get_group`` lends one region for
all of them, the versions side by side, and reads the small ones (at most
``small_range`` bytes each, 4 MiB) before it answers, all at once at the
device's depth: 32 files of 430 KB are one request. The larger ones are
fetched by item in ranges, on the :class:`~sluice.Checkpoint`'s threads,
one range of each in turn (so that every parse goes forward as its bytes
arrive, none waiting behind another's), while the caller parses those
that are in. The region holds at most ``keep_read_bytes`` (a version
that would not fit is read alone), and once every item's reader is
closed with nothing of its bytes outliving it (tensors built over it,
:mod:`sluice._mapped`, hold it until the last of them is gone), it is
kept for the next load of the same shape, whose pages are then in place
on both sides.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from . import _lanes, _mapped
from ._reader import CheckpointReader, Opened

if TYPE_CHECKING:
    from .checkpoint import Checkpoint

#: The largest range of a group's larger versions one request reads.
GROUP_RANGE = 8 << 20


class _Group:
    """The region the items share; kept (or let go) once all are closed
    and, where tensors were built over it (:mod:`sluice._mapped`), once
    the last of them is gone."""

    def __init__(self, ckpt: "Checkpoint", region: _lanes.Region, items: int):
        self.ckpt, self.region = ckpt, region
        self._open = items
        self._keep = True
        self._mapped = False
        self._lock = threading.Lock()
        self._cow: Optional[Any] = None

    def copy_on_write(self) -> memoryview:
        """The region mapped copy-on-write (once): tensors over it hold the
        region until they are gone."""
        with self._lock:
            if self._cow is None:
                cow = _mapped.copy_on_write(self.region.fd, self.region.size)
                self._mapped = True
                weakref.finalize(cow, self._unmapped)
                self._cow = memoryview(cow)
            return self._cow

    def release_view(self) -> None:
        """Drops this side's reference to the mapping (the tensors keep theirs)."""
        with self._lock:
            self._cow = None

    def closed(self, keep: bool) -> None:
        with self._lock:
            self._open -= 1
            self._keep = self._keep and keep
            last, keep, mapped = self._open == 0, self._keep, self._mapped
        if not last or mapped:
            return
        if keep:
            self.ckpt._keep_gets([self.region])
        else:
            _lanes.close_region(self.ckpt.client, self.region, "checkpoint group region")

    def _unmapped(self) -> None:
        """The mapping's finalizer (any thread, at any point: it only hands
        the region back, for the Checkpoint's next read to take up)."""
        with self._lock:
            self._mapped = False
            done, keep = self._open == 0, self._keep
        if done:
            self.ckpt._give_back(self.region, keep)


class ItemGets(_lanes.ShmGets):
    """One version's ranges in a group's region (fetched by item, viewed
    at its place); closing it tells the group."""

    def __init__(self, group: _Group, item: int, at: int, chunk: int, name: str):
        ckpt = group.ckpt
        super().__init__(ckpt.client, chunk, ckpt.workers, name, group.region, group.closed,
                         item=item, base=at)
        self.group = group

    def close(self, keep: bool = False) -> None:
        self.group.closed(keep)


def open_group(ckpt: "Checkpoint", names: List[str],
               versions: List[Optional[int]]) -> Dict[int, CheckpointReader]:
    """Readers of the versions one group region holds, by their place in
    ``names`` (full names); those it left out, and all of them where the
    server is not on this host, are not in the answer."""
    if ckpt.transport == "flight" or ckpt._shm_refused or not ckpt.keep_read_bytes:
        return {}
    items = [{"name": n} if v is None else {"name": n, "version": v}
             for n, v in zip(names, versions)]
    body: Dict[str, Any] = {"items": items, "fill": ckpt.small_range,
                            "max_bytes": ckpt.keep_read_bytes}
    lent = ckpt._open_read("checkpoint.shm.get_group", body,
                           f"{len(names)} checkpoints under '{ckpt.prefix}'")
    if lent is None or lent[0] is None:
        return {}
    region, answer = lent
    placed = answer["items"]
    group = _Group(ckpt, region, len(placed))
    # Ranges of at most GROUP_RANGE, each request's extents read at once
    # (the tensors map the bytes, so no parse waits on a small first
    # range). The ranks of a host load together from one server and one
    # device, and a request answers only once all its extents are in: with
    # 16 MiB ranges (the chunk), one rank's four in flight kept the
    # others' waiting behind 64 MiB of reads (docs/benchmarks.md, "The
    # loads at 2 and 4 ranks").
    chunk = min(ckpt.chunk_size, GROUP_RANGE)
    readers: Dict[int, CheckpointReader] = {}
    for item, p in enumerate(placed):
        index = int(p["index"])
        info = p["checkpoint"]
        lanes = ItemGets(group, item, int(p["at"]), chunk, names[index])
        opened = Opened(info, lanes, int(p["filled"]), chunk, int(info["size"]), defer=True)
        readers[index] = CheckpointReader(ckpt, names[index], versions[index], opened=opened)
    # The larger versions' ranges in turn, one of each at a time: their
    # parses all go forward as the bytes arrive, none waits for the others.
    due = list(readers.values())
    while due:
        due = [r for r in due if r.submit_next()]
    return readers
