"""Checkpoints on a cluster, over loopback: a coordinator (`serve
--storage`) in front of three real storage nodes. A version is striped
over every node and each stripe kept on two; it reads back byte-identical
with a node killed -9; a node killed before the commit leaves the
previous version and nothing partial; too few nodes is a named error;
pieces no version names are swept; DCP saves and loads through the
coordinator; scoped tokens apply. (`test_rig.py` runs the same over
namespaces and a shaped link.)"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.flight as flight
import pytest
import torch

import sluice
import sluice._direct
from sluice import _lanes
from serve import SLUICE, flip_in_device, node_pieces, serve_env, start_serve

STRIPE = 4 << 20  # compute-exec/src/checkpoints/mod.rs: STRIPE


def pattern(n, seed):
    """`n` bytes that differ at every position and between seeds."""
    block = bytes((seed * 31 + i * 7) % 251 for i in range(251))
    return (block * (n // 251 + 1))[:n]


def storage_node(d, env, name):
    """A `sluice storage-node` over a data dir of its own: (process, URL)."""
    env = dict(env, SLUICE_DATA_DIR=os.path.join(d, name))
    log = open(os.path.join(d, f"{name}.log"), "a")
    proc = subprocess.Popen([SLUICE, "storage-node", "--listen", "127.0.0.1:0"], env=env,
                            stdout=subprocess.PIPE, stderr=log, text=True)
    log.close()
    line = proc.stdout.readline()
    assert " listening on " in line, line
    return proc, "http://" + line.split(" listening on ")[1].split()[0]


@contextlib.contextmanager
def cluster(nodes=3, token=None, args=(), node_tokens=False):
    """A coordinator over `nodes` storage nodes (which take only a node
    token of a tokens file, with `node_tokens`: the coordinator presents
    it, and the environment yielded holds it as SLUICE_NODE_TOKEN):
    yields (client, node processes, node URLs, temp dir, environment)."""
    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d, SLUICE_DEVICE_SIZE="512MiB")
        node_env = env
        if node_tokens:
            tokens = os.path.join(d, "node-tokens.yaml")
            add = subprocess.run([SLUICE, "tokens", "add", tokens, "nodes", "--scope", "node"],
                                 check=True, capture_output=True, text=True)
            env["SLUICE_NODE_TOKEN"] = add.stdout.strip()
            node_env = dict(env, SLUICE_TOKENS=tokens)
        procs, urls = [], []
        coord = None
        try:
            for i in range(nodes):
                p, u = storage_node(d, node_env, f"node{i}")
                procs.append(p)
                urls.append(u)
            coord_env = dict(env, **({"SLUICE_TOKEN": token} if token else {}))
            coord, rest = start_serve(d, coord_env, ["--storage", ",".join(urls),
                                                     "--checkpoint-idle-timeout", "2",
                                                     *args])
            yield sluice.Client(rest, token=token), procs, urls, d, env
        finally:
            for p in procs + ([coord] if coord else []):
                if p.poll() is None:
                    p.kill()
                p.wait(timeout=30)


pieces = node_pieces


def write(ck, name, data):
    with ck.writer(name) as w:
        w.write(data)
    return w.info


def read(ck, name, version=None):
    with ck.reader(name, version) as r:
        return r.read()


def test_a_version_is_striped_and_replicated_and_survives_a_lost_node():
    with cluster() as (c, procs, urls, _, _):
        ck = sluice.Checkpoint(c, "run1", workers=3)
        data = pattern(10 * STRIPE + 12345, 1)  # 11 stripes
        info = write(ck, "model.pt", data)
        assert info["size"] == len(data) and info["version"] == 1, info
        w = ck.writer("x")
        # No same-host path to a striped version: the trainer writes the
        # stripes to the nodes with the passes the coordinator gave.
        assert w.transport == "direct"
        w.close()
        # Every node holds a piece; the pieces hold each byte twice.
        held = [pieces(u) for u in urls]
        assert all(len(h) == 1 for h in held), held
        sizes = [next(iter(h.values())) for h in held]
        assert sum(sizes) == 2 * len(data), sizes
        assert max(sizes) - min(sizes) <= 2 * STRIPE, sizes
        assert read(ck, "model.pt") == data
        # A model's files begun in one request, committed in one transaction.
        states = {"opt.pt": torch.arange(100_000), "layer.pt": torch.ones(7)}
        assert [i["version"] for i in ck.save_all(states)] == [1, 1]
        for name, want in states.items():
            assert torch.equal(ck.load(name, weights_only=True), want), name
        with pytest.raises(sluice.SluiceError) as e:
            ck.save_all([("a.pt", torch.ones(1)), ("a.pt", torch.ones(1))])
        assert "two uploads of" in e.value.message, e.value
        # A piece's name holds the checkpoint's: a name too long to fit is
        # refused before any node is asked.
        with pytest.raises(sluice.SluiceError) as e:
            write(ck, "x" * 500, b"long")
        assert "at most" in e.value.message, e.value
        # A node killed -9: each stripe has another holder.
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(timeout=30)
        t0 = time.monotonic()
        assert read(ck, "model.pt") == data
        assert time.monotonic() - t0 < 30
        # Two nodes still answer: a new version is striped over them.
        small = pattern(3 * STRIPE + 7, 2)
        assert write(ck, "model.pt", small)["version"] == 2
        assert read(ck, "model.pt") == small
        assert read(ck, "model.pt", version=1) == data
        # One node left: too few for two copies, said with the nodes.
        procs[2].send_signal(signal.SIGKILL)
        procs[2].wait(timeout=30)
        with pytest.raises(sluice.SluiceError) as e:
            write(ck, "model.pt", small)
        assert "2 replica(s)" in e.value.message and urls[1] in e.value.message, e.value
        # Version 1 has stripes held only by the two dead nodes.
        with pytest.raises(sluice.SluiceError) as e:
            read(ck, "model.pt", version=1)
        assert "every holder failed" in e.value.message, e.value
        assert urls[1] in e.value.message and urls[2] in e.value.message, e.value
        assert c._request("GET", "/healthz") == "ok\n"


def node_put(url, cmd, data, headers=()):
    """A DoPut of `data` to the storage node at `url` (a part of the
    upload `cmd` names), presenting `headers` and no token; its reply."""
    schema = pa.schema([pa.field("data", pa.large_binary(), nullable=False)])
    client = flight.FlightClient(url.replace("http://", "grpc://"))
    writer, reader = client.do_put(flight.FlightDescriptor.for_command(json.dumps(cmd).encode()),
                                   schema, flight.FlightCallOptions(headers=list(headers)))
    writer.write_batch(pa.record_batch([pa.array([data], pa.large_binary())], schema=schema))
    writer.done_writing()
    reply = reader.read()
    writer.close()
    return json.loads(reply.to_pybytes())


def test_a_trainer_writes_its_stripes_to_the_nodes_with_passes_that_write_nothing_else():
    with cluster(node_tokens=True) as (c, _, urls, _, env):
        data = pattern(9 * STRIPE + 4321, 3)
        direct = sluice.Checkpoint(c, "d", workers=3)
        relayed = sluice.Checkpoint(c, "r", workers=3, direct=False)
        with direct.writer("m.pt") as w:
            w.write(data)
        assert w.transport == "direct"
        with relayed.writer("m.pt") as w:
            w.write(data)
        assert w.transport == "flight"
        # Either way: the same bytes, and the same stripes on each node.
        assert read(direct, "m.pt") == read(relayed, "m.pt") == data
        for u in urls:
            held = pieces(u, token=env["SLUICE_NODE_TOKEN"])
            sizes = {n.split("/", 2)[2]: b for n, b in held.items()}
            assert sizes["d/m.pt"] == sizes["r/m.pt"], held

        # What a pass is: the begin's answer names each node's upload and
        # pass; a put with it writes that upload, nothing else does.
        pass_header = b"x-sluice-upload-pass"
        a = _lanes.action(c, "checkpoint.begin", {"name": "p/a.pt", "direct": True}, "a")
        b = _lanes.action(c, "checkpoint.begin", {"name": "p/b.pt", "direct": True}, "b")
        node_a, node_b = a["direct"]["nodes"][0], b["direct"]["nodes"][0]
        assert node_a["url"] == node_b["url"]
        url, mine = node_a["url"], (pass_header, node_a["pass"].encode())
        with pytest.raises(flight.FlightUnauthenticatedError):
            node_put(url, {"checkpoint_upload": node_a["upload"], "offset": 0}, b"x")
        for cmd, header in [
            # Another upload's piece with this pass, a wrong pass.
            ({"checkpoint_upload": node_b["upload"], "offset": 0}, mine),
            ({"checkpoint_upload": node_a["upload"], "offset": 0}, (pass_header, b"0" * 64)),
            # A put that is not a checkpoint part.
            ({"dataset": "pets", "version": 1}, mine),
        ]:
            with pytest.raises(flight.FlightUnauthorizedError) as e:
                node_put(url, cmd, b"x", [header])
            assert "pass" in str(e.value), e.value
        # Every other call with only a pass is a call without a token.
        client = flight.FlightClient(url.replace("http://", "grpc://"))
        opts = flight.FlightCallOptions(headers=[mine])
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(client.do_action(flight.Action("checkpoint.list", b'{"prefix": ""}'), opts))
        with pytest.raises(flight.FlightUnauthenticatedError):
            client.do_get(flight.Ticket(json.dumps({"checkpoint": "d/m.pt", "version": 1,
                                                    "length": 1}).encode()), opts).read_all()
        # The coordinator sees none of a direct upload's parts: idle past
        # its own timeout (2 s), the upload lives while the nodes hold it.
        time.sleep(3.5)
        lay = sluice._direct.Striping(a["direct"]["unit"], len(a["direct"]["nodes"]),
                                      a["direct"]["replicas"])
        for k in lay.holders(0):
            n = a["direct"]["nodes"][k]
            got = node_put(n["url"], {"checkpoint_upload": n["upload"],
                                      "offset": lay.local_offset(k, 0)},
                           b"mine", [(pass_header, n["pass"].encode())])
            assert got == {"bytes": 4}, got
        info = _lanes.action(c, "checkpoint.commit", {"upload": a["upload"], "size": 4}, "a")
        assert info["size"] == 4
        assert read(sluice.Checkpoint(c, "p"), "a.pt") == b"mine"
        # A pass dies with its upload.
        with pytest.raises(flight.FlightUnauthorizedError):
            node_put(url, {"checkpoint_upload": node_a["upload"], "offset": 0}, b"x", [mine])


WRITER = """
import sys, time, sluice
ck = sluice.Checkpoint(sluice.Client(sys.argv[1]), "k", workers=2)
w = ck.writer("m.pt")
assert w.transport == "direct", w.transport
w.write(b"y" * (5 * (4 << 20)))
print("written", flush=True)
time.sleep(600)
"""


def test_a_direct_writer_killed_mid_stream_leaves_the_previous_version_and_nothing_partial():
    with cluster() as (c, _, urls, _, _):
        ck = sluice.Checkpoint(c, "k")
        old = pattern(2 * STRIPE + 5, 4)
        write(ck, "m.pt", old)
        before = [pieces(u) for u in urls]
        p = subprocess.Popen([sys.executable, "-c", WRITER, c.url], stdout=subprocess.PIPE,
                             text=True)
        try:
            assert p.stdout.readline().strip() == "written"
        finally:
            p.kill()
            p.wait(timeout=30)
        assert read(ck, "m.pt") == old
        assert [(v["name"], v["version"]) for v in ck.list(versions=True)] == [("k/m.pt", 1)]
        # The stripes it sent are uploads on the nodes, never versions.
        assert [pieces(u) for u in urls] == before


def node_get(url, name, version, offset, length, headers=()):
    """A DoGet of a range of a version on the storage node at `url`,
    presenting `headers` and no token: its bytes."""
    client = flight.FlightClient(url.replace("http://", "grpc://"))
    ticket = json.dumps({"type": "checkpoint", "checkpoint": name, "version": version,
                         "offset": offset, "length": length}).encode()
    table = client.do_get(flight.Ticket(ticket),
                          flight.FlightCallOptions(headers=list(headers))).read_all()
    return b"".join(v.as_py() for v in table.column(0))


def test_a_trainer_reads_its_stripes_from_the_nodes_with_read_passes_that_read_nothing_else():
    with cluster(node_tokens=True) as (c, procs, urls, _, _):
        data = pattern(9 * STRIPE + 4321, 5)
        direct = sluice.Checkpoint(c, "d", workers=3)
        relayed = sluice.Checkpoint(c, "d", workers=3, direct=False)
        write(direct, "m.pt", data)
        write(direct, "m.pt", data[::-1])
        for ck, transport in [(direct, "direct"), (relayed, "flight")]:
            with ck.reader("m.pt", 1) as r:
                assert r.transport == transport
                assert "direct" not in r.info, r.info
                assert r.read() == data
        assert read(direct, "m.pt") == data[::-1]

        # What a read pass is: the stat's answer names each piece, the
        # stripes it holds and a pass that reads that piece's version.
        header = b"x-sluice-read-pass"
        one = _lanes.action(c, "checkpoint.stat", {"name": "d/m.pt", "version": 1,
                                                    "direct": True}, "m")
        two = _lanes.action(c, "checkpoint.stat", {"name": "d/m.pt", "direct": True}, "m")
        assert "direct" not in _lanes.action(c, "checkpoint.stat", {"name": "d/m.pt"}, "m")
        lay = one["direct"]
        assert len(lay["pieces"]) == 3
        assert sorted(s for p in lay["pieces"] for s in p["stripes"]) == sorted(2 * list(range(10)))
        p1, p2 = lay["pieces"][0], two["direct"]["pieces"][0]
        assert p1["url"] == p2["url"] and p1["piece"] != p2["piece"]
        mine = (header, p1["pass"].encode())
        s = p1["stripes"][1]
        got = node_get(p1["url"], p1["piece"], p1["version"], STRIPE, 100, [mine])
        assert got == data[s * STRIPE:s * STRIPE + 100]
        with pytest.raises(flight.FlightUnauthenticatedError):
            node_get(p1["url"], p1["piece"], p1["version"], 0, 1)
        for name, version, pass_ in [
            # Another version's piece with this pass; a pass of another
            # piece; a wrong pass; a pass whose expiry was moved on.
            (p2["piece"], p2["version"], p1["pass"]),
            (p1["piece"], p1["version"], p2["pass"]),
            (p1["piece"], p1["version"], "1" + p1["pass"]),
            (p1["piece"], p1["version"], "9999999999." + p1["pass"].split(".")[1]),
        ]:
            with pytest.raises(flight.FlightUnauthorizedError) as e:
                node_get(p1["url"], name, version, 0, 1, [(header, pass_.encode())])
            assert "read pass" in str(e.value), e.value
        # Every other call with only a read pass is a call without a token.
        client = flight.FlightClient(p1["url"].replace("http://", "grpc://"))
        opts = flight.FlightCallOptions(headers=[mine])
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(client.do_action(flight.Action("checkpoint.list", b'{"prefix": ""}'), opts))
        begun = _lanes.action(c, "checkpoint.begin", {"name": "x.pt", "direct": True}, "x")
        node = begun["direct"]["nodes"][0]
        with pytest.raises(flight.FlightUnauthenticatedError):
            node_put(node["url"], {"checkpoint_upload": node["upload"], "offset": 0}, b"x",
                     [(header, p1["pass"].encode())])

        # A node killed -9 after the reader was told where the stripes
        # are: each of its stripes from the other holder, byte-identical.
        k = urls.index(p1["url"])
        procs[k].send_signal(signal.SIGKILL)
        procs[k].wait(timeout=30)
        gets = sluice._direct.DirectGets(c, STRIPE, 3, "d/m.pt", 1, lay, direct._fan())
        gets.fetch(0, len(data))
        assert b"".join(bytes(v) for _, v in gets.parts[0]) == data
        assert gets.down == {0}
        # Asked now, the coordinator leaves the dead node out, and the two
        # others hold every stripe.
        with direct.reader("m.pt", 1) as r:
            assert r.transport == "direct"
            assert r.read() == data


def test_a_node_lost_before_the_commit_leaves_the_previous_version_and_nothing_partial():
    with cluster() as (c, procs, urls, _, _):
        ck = sluice.Checkpoint(c, "run2", workers=2)
        old = pattern(5 * STRIPE, 3)
        write(ck, "opt.pt", old)
        before = [pieces(u) for u in urls]
        w = ck.writer("opt.pt")
        w.write(pattern(6 * STRIPE + 1, 4))
        w.flush()
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(timeout=30)
        with pytest.raises(sluice.SluiceError) as e:
            w.close()
        assert urls[0] in e.value.message, e.value
        assert [v["version"] for v in ck.list(versions=True)] == [1]
        assert read(ck, "opt.pt") == old
        # The live nodes hold what they held: the new pieces are gone.
        assert [pieces(u) for u in urls[1:]] == before[1:]
        # A group commit (DCP's) fails alike, whole.
        assert [v["name"] for v in c._request("GET", "/v1/checkpoints?prefix=run2/")] == \
            ["run2/opt.pt"]


def test_a_coordinator_killed_mid_save_keeps_the_previous_version_after_a_restart():
    with cluster() as (c, _, urls, d, env):
        ck = sluice.Checkpoint(c, "run4", workers=2)
        old = pattern(3 * STRIPE + 5, 8)
        write(ck, "m.pt", old)
        w = ck.writer("m.pt")
        w.write(pattern(4 * STRIPE, 9))
        w.flush()
        coord = [p for p in psutil_children() if "serve" in p[1]]
        assert len(coord) == 1, coord
        os.kill(coord[0][0], signal.SIGKILL)
        with pytest.raises(Exception):
            w.close()
        proc, rest = start_serve(d, env, ["--storage", ",".join(urls)])
        try:
            again = sluice.Checkpoint(sluice.Client(rest), "run4")
            assert [v["version"] for v in again.list(versions=True)] == [1]
            assert read(again, "m.pt") == old
            assert write(again, "m.pt", b"next")["version"] == 2
        finally:
            proc.kill()
            proc.wait(timeout=30)


def psutil_children():
    """(pid, command line) of this process's children."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid():
            out.append((int(pid), cmd))
    return out


def test_pieces_no_version_names_are_swept_and_deletes_reach_every_node():
    with cluster(args=["--checkpoint-sweep-every", "1"]) as (c, _, urls, _, _):
        ck = sluice.Checkpoint(c, "run3")
        write(ck, "a.pt", pattern(2 * STRIPE, 5))
        kept = [pieces(u) for u in urls]
        # A piece the ledger does not name, as a coordinator killed
        # between the nodes' commits and its own leaves one.
        stray = flight.FlightClient(urls[2].replace("http://", "grpc://"))
        act = lambda kind, body: json.loads(list(stray.do_action(
            flight.Action(kind, json.dumps(body).encode())))[0].body.to_pybytes())
        up = act("checkpoint.begin", {"name": ".stripes/0123abcd/run3/a.pt"})["upload"]
        act("checkpoint.commit", {"upload": up, "size": 0})
        assert ".stripes/0123abcd/run3/a.pt" in pieces(urls[2])
        deadline = time.monotonic() + 30
        while ".stripes/0123abcd/run3/a.pt" in pieces(urls[2]):
            assert time.monotonic() < deadline, "the stray piece was not swept"
            time.sleep(0.5)
        assert [pieces(u) for u in urls] == kept
        # Keep 2: a third version drops the first's pieces everywhere.
        write(ck, "a.pt", pattern(STRIPE, 6))
        write(ck, "a.pt", pattern(STRIPE, 7))
        assert [v["version"] for v in ck.list(versions=True)] == [2, 3]
        assert sum(len(pieces(u)) for u in urls) == 2 * 2  # 1 stripe x 2 copies, 2 versions
        ck.delete("a.pt")
        assert all(pieces(u) == {} for u in urls)
        assert ck.list() == []


def test_dcp_saves_and_loads_through_the_coordinator():
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    from sluice.dcp import SluiceReader, SluiceWriter
    with cluster() as (c, _, _, _, _):
        state = {"w": torch.arange(3 * 1024 * 1024, dtype=torch.float32).reshape(1024, -1),
                 "b": torch.ones(17), "step": 5}
        ck = sluice.Checkpoint(c, "dcp")
        dcp.save(state, storage_writer=SluiceWriter(ck), checkpoint_id="step5", no_dist=True)
        got = {"w": torch.zeros(1024, 3 * 1024), "b": torch.zeros(17), "step": 0}
        dcp.load(got, storage_reader=SluiceReader(ck), checkpoint_id="step5", no_dist=True)
        assert torch.equal(got["w"], state["w"]) and torch.equal(got["b"], state["b"])
        assert got["step"] == 5


def test_scoped_tokens_keep_to_their_prefixes_on_the_cluster():
    with tempfile.TemporaryDirectory() as t:
        tokens = os.path.join(t, "tokens.yaml")
        add = subprocess.run([SLUICE, "tokens", "add", tokens, "alice", "--scope", "read",
                              "--checkpoint", "alice/"], check=True, capture_output=True,
                             text=True)
        secret = add.stdout.strip()
        with cluster(args=["--tokens", tokens]) as (c, _, _, _, _):
            alice = sluice.Client(c.url, token=secret)
            write(sluice.Checkpoint(alice, "alice"), "m.pt", b"mine")
            with pytest.raises(sluice.SluiceError) as e:
                write(sluice.Checkpoint(alice, "bob"), "m.pt", b"not mine")
            assert e.value.status == 403 or e.value.code == "forbidden", e.value
            assert read(sluice.Checkpoint(alice, "alice"), "m.pt") == b"mine"
            assert [v["name"] for v in alice._request("GET", "/v1/checkpoints")] == \
                ["alice/m.pt"]


def test_stripes_leave_a_lost_node_and_a_drained_one_and_read_whole():
    with cluster(nodes=4, args=["--lost-after", "2"]) as (c, procs, urls, _, _):
        ck = sluice.Checkpoint(c, "run5")
        data = pattern(9 * STRIPE + 99, 10)
        write(ck, "m.pt", data)
        # Lost: the stripes node 3 held get a second copy on the others.
        procs[3].send_signal(signal.SIGKILL)
        procs[3].wait(timeout=30)
        deadline = time.monotonic() + 60
        while sum(sum(pieces(u).values()) for u in urls[:3]) != 2 * len(data):
            assert time.monotonic() < deadline, [pieces(u) for u in urls[:3]]
            time.sleep(0.5)
        assert read(ck, "m.pt") == data
        # Drained: node 0's stripes go to nodes 1 and 2 (no copy twice).
        drained = c._request("POST", "/v1/nodes/storage/" + urls[0].split("://")[1] + "/drain")
        moved = drained["checkpoints"]
        assert moved["versions"] == 1 and moved["short"] == [], drained
        assert pieces(urls[0]) == {}
        assert sum(sum(pieces(u).values()) for u in urls[1:3]) == 2 * len(data)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(timeout=30)
        assert read(ck, "m.pt") == data
        # Two nodes, two copies each: nowhere to move node 1's stripes.
        drained = c._request("POST", "/v1/nodes/storage/" + urls[1].split("://")[1] + "/drain")
        assert drained["checkpoints"]["versions"] == 0, drained
        assert "no node without a copy" in drained["checkpoints"]["short"][0], drained
        assert read(ck, "m.pt") == data


def test_a_flipped_byte_in_a_piece_is_read_around_then_repaired_by_a_scrub():
    with cluster() as (c, _, urls, d, _):
        ck = sluice.Checkpoint(c, "run6")
        data = os.urandom(5 * STRIPE + 17)
        write(ck, "m.pt", data)
        # A byte of stripe 1 flipped on one of its holders' devices.
        holder = next(i for i, u in enumerate(urls) if pieces(u))
        flip_in_device(os.path.join(d, f"node{holder}", "device.img"),
                       data[STRIPE:STRIPE + 4096] if holder in (1, 2) else data[:4096])
        assert read(ck, "m.pt") == data  # the bad copy is read around
        scrubbed = {n["node"]: n for n in c._request("POST", "/v1/scrub", {})}
        repairs = scrubbed[urls[holder]]["checkpoints"]["repairs"]
        assert [r["outcome"] for r in repairs] == ["repaired"], scrubbed
        assert repairs[0]["checkpoint"] == "run6/m.pt" and repairs[0]["version"] == 1
        again = {n["node"]: n for n in c._request("POST", "/v1/scrub", {})}
        assert all(n["checkpoints"]["report"]["bad"] == [] for n in again.values()), again
        assert sum(n["checkpoints"]["report"]["extents"] for n in again.values()) > 0
        assert read(ck, "m.pt") == data
