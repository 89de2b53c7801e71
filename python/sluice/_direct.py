"""A cluster checkpoint's stripes written to and read from the storage
nodes directly.

A coordinator over storage nodes keeps each checkpoint striped over them
(stripe *s* of ``unit`` bytes on nodes *s … s+R−1* mod *n*, each node's
stripes back to back in a piece of its own). A writer that begins with
``direct`` is given that layout and, for each node, its piece's upload
and an upload pass (``sluice_access::pass`` on the server: a pass writes
that upload's parts on that node, and nothing else). :class:`DirectPuts`
then cuts each part at stripe boundaries and sends every stretch to each
of its holders at once, so the bytes cross one link, not two, and the
coordinator only begins and commits (DAOS's client-side striping). The
placement is the server's (``compute-exec/src/checkpoints/stripes.rs``),
which the coordinator checks at commit: every node's piece must be
covered exactly once.

A reader whose ``checkpoint.stat`` asks ``direct`` is told each piece of
the version (its node, name and version there, the stripes it holds) and
a read pass for it, signed by its node (``sluice_access::read_pass``: a
presigned GET of that one version). :class:`DirectGets` then reads each
stripe of a range from one of its holders, the stripe's own first choice
in turn as the coordinator would choose, the next on any error; a stripe
no holder gives is read through the coordinator, which tries the holders
it reaches and names what failed.
"""

from __future__ import annotations

import urllib.parse
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Dict, List, Set, Tuple

import pyarrow.flight as flight

from ._errors import SluiceError
from ._lanes import FlightGets, FlightPuts, get_range, put_part

# The headers the passes travel in.
PASS_HEADER = b"x-sluice-upload-pass"
READ_PASS_HEADER = b"x-sluice-read-pass"


class Striping:
    """Where each stripe goes (the server's ``Striping``)."""

    def __init__(self, unit: int, nodes: int, replicas: int):
        if unit < 1 or nodes < 1 or not 1 <= replicas <= nodes:
            raise ValueError(f"a striping of {unit} B over {nodes} node(s), {replicas} copies")
        self.unit, self.nodes, self.replicas = unit, nodes, replicas
        # The residues (stripe mod nodes) each node holds, ascending.
        self._residues = [sorted({(k - j) % nodes for j in range(replicas)})
                          for k in range(nodes)]

    def holders(self, s: int) -> List[int]:
        """The nodes holding stripe ``s``, the first one first."""
        return [(s + j) % self.nodes for j in range(self.replicas)]

    def local_offset(self, k: int, s: int) -> int:
        """Where stripe ``s`` starts in node ``k``'s piece."""
        residues = self._residues[k]
        return ((s // self.nodes) * len(residues) + residues.index(s % self.nodes)) * self.unit

    def stretches(self, offset: int, size: int) -> List[Tuple[int, int, int]]:
        """The part ``[offset, offset + size)`` cut at stripe boundaries:
        (stripe, start within the part, length) for each stretch."""
        out = []
        at, end = offset, offset + size
        while at < end:
            s = at // self.unit
            n = min(end, (s + 1) * self.unit) - at
            out.append((s, at - offset, n))
            at += n
        return out


def flight_location(url: str) -> str:
    """A node's URL as the coordinator dials it (``http://``, ``https://``
    or a gRPC scheme) as a Flight location."""
    p = urllib.parse.urlparse(url)
    scheme = {"http": "grpc", "https": "grpc+tls", "grpc+tcp": "grpc"}.get(p.scheme, p.scheme)
    return f"{scheme}://{p.netloc}"


class DirectPuts(FlightPuts):
    """A writer's parts, each stripe sent to its holders directly (see the
    module docs). At most ``workers`` parts are in flight, as over the
    coordinator; the stretches of a part go out on ``fan`` at once."""

    def __init__(self, client: Any, pool: ThreadPoolExecutor, chunk: int, workers: int,
                 layout: Dict[str, Any], fan: ThreadPoolExecutor):
        super().__init__(client, pool, chunk, workers)
        self.nodes = layout["nodes"]
        self.striping = Striping(int(layout["unit"]), len(self.nodes), int(layout["replicas"]))
        self.locations = [flight_location(n["url"]) for n in self.nodes]
        self.fan = fan
        # Each node's call options: its pass (and no token: a storage
        # node takes only nodes' tokens).
        self.options = [flight.FlightCallOptions(headers=[(PASS_HEADER, n["pass"].encode())])
                        for n in self.nodes]

    def _put(self, data: memoryview, upload: str, offset: int, subject: str) -> None:
        sends = []
        for s, lo, n in self.striping.stretches(offset, len(data)):
            within = offset + lo - s * self.striping.unit
            for k in self.striping.holders(s):
                node = self.nodes[k]
                at = self.striping.local_offset(k, s) + within
                sends.append(self.fan.submit(self._put_on, k, s, node["upload"], at,
                                             data[lo:lo + n], subject))
        wait(sends)
        for f in sends:
            f.result()

    def _put_on(self, k: int, s: int, upload: str, at: int, data: memoryview,
                subject: str) -> None:
        lane = s // self.striping.nodes % self.workers
        client = self.client.flight(lane, location=self.locations[k])
        put_part(client, self.options[k], upload, at, data,
                 f"{subject} (storage node {self.nodes[k]['url']})")


class DirectGets(FlightGets):
    """A reader's ranges, each stripe from a storage node that holds it
    (see the module docs); the stripes of a range are read at once on
    ``fan``."""

    transport = "direct"

    def __init__(self, client: Any, chunk: int, workers: int, name: str, version: int,
                 layout: Dict[str, Any], fan: ThreadPoolExecutor):
        super().__init__(client, chunk, workers, name, version)
        self.unit = int(layout["unit"])
        self.pieces = layout["pieces"]
        self.locations = [flight_location(p["url"]) for p in self.pieces]
        self.options = [flight.FlightCallOptions(
            headers=[(READ_PASS_HEADER, p["pass"].encode())]) for p in self.pieces]
        # Each stripe's holders: (piece, where the stripe starts in it).
        self.holders: Dict[int, List[Tuple[int, int]]] = {}
        for i, p in enumerate(self.pieces):
            for j, s in enumerate(p["stripes"]):
                self.holders.setdefault(int(s), []).append((i, j * self.unit))
        # Pieces whose node failed a read: tried last.
        self.down: Set[int] = set()
        self.fan = fan

    def fetch(self, offset: int, length: int) -> None:
        cut = Striping(self.unit, 1, 1).stretches(offset, length)
        stripes = [self.fan.submit(self._stripe, s, offset + lo, n) for s, lo, n in cut]
        wait(stripes)
        got: List[Tuple[int, memoryview]] = []
        for f in stripes:
            got.extend(f.result())
        self._keep(offset, got)

    def _stripe(self, s: int, lo: int, n: int) -> List[Tuple[int, memoryview]]:
        """Bytes ``[lo, lo + n)`` of the version, all in stripe ``s``."""
        holders = list(self.holders.get(s, ()))
        if holders:
            turn = s % len(holders)
            holders = holders[turn:] + holders[:turn]
        holders.sort(key=lambda h: h[0] in self.down)
        for i, base in holders:
            piece = self.pieces[i]
            subject = f"checkpoint '{self.name}' (storage node {piece['url']})"
            lane = s % self.workers
            try:
                client = self.client.flight(lane, location=self.locations[i])
                return get_range(client, self.options[i], piece["piece"], int(piece["version"]),
                                 base + lo - s * self.unit, n, subject, place=lo)
            except SluiceError:
                self.down.add(i)
        # No holder gave it: the coordinator reads it from those it
        # reaches (and names what failed where none does).
        c = self.client
        return get_range(c.flight(s % self.workers), c.call_options(), self.name, self.version,
                         lo, n, f"checkpoint '{self.name}'")


__all__ = ["DirectGets", "DirectPuts", "Striping", "flight_location"]
