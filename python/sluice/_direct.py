"""A cluster checkpoint's stripes written straight to the storage nodes.

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
"""

from __future__ import annotations

import urllib.parse
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Dict, List, Tuple

import pyarrow.flight as flight

from ._lanes import FlightPuts, put_part

# The header a pass travels in.
PASS_HEADER = b"x-sluice-upload-pass"


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


__all__ = ["DirectPuts", "Striping", "flight_location"]
