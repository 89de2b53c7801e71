"""The multi-host rig: namespaces, veth, a shaped link and pinned CPUs
come up and go away cleanly, and sluice spread over its hosts returns what
one data dir returns."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import sluice
from rig import compute_nodes, ours, parse_env, rig_cmd, up
from serve import SLUICE, flip_in_device, node_pieces

# For a test whose later job would otherwise be served by the first's rows.
NO_OUTPUT_CACHE = {"SLUICE_OUTPUT_CACHE_MEMORY": "0"}

SQL = ("SELECT key, label, to_tensor(resize(decode_image(data), 32, 32)) AS img "
       "FROM pets ORDER BY key")
GROUP_BY = ("SELECT label, count(*) AS n, count(DISTINCT key) AS keys, min(key) AS first "
            "FROM pets GROUP BY label ORDER BY label")


def gen(d, name, classes, per_class):
    src = os.path.join(d, "src", name)
    subprocess.run([SLUICE, "gen-sample", src, "--classes", str(classes), "--per-class",
                    str(per_class)], check=True, capture_output=True)
    return os.path.dirname(src)


def sql_arrow(data_dir, query, *args):
    p = subprocess.run([SLUICE, "--data-dir", data_dir, "sql", query, "--format", "arrow", *args],
                       capture_output=True, check=True)
    return pa.ipc.open_stream(p.stdout).read_all()


def one_data_dir(d, root):
    """What the embedded default returns for SQL over `pets` in one data dir."""
    embedded = os.path.join(d, "embedded")
    subprocess.run([SLUICE, "--data-dir", embedded, "ingest", "pets",
                    os.path.join(root, "pets")], check=True, capture_output=True)
    return sql_arrow(embedded, SQL)


@contextlib.contextmanager
def two_by_two(extra_env=None, classes=3, per_class=7):
    """A rig of 2 storage and 2 compute nodes (both registered) holding
    `pets` (`classes` x `per_class` images), its processes seeing
    `extra_env`: yields (rig dir, its environment, a client); taken down
    after."""
    with tempfile.TemporaryDirectory() as d:
        rig_dir = os.path.join(d, "rig")
        root = gen(d, "pets", classes, per_class)
        env = up(rig_dir, "--storage", "2", "--compute", "2", "--ingest-root", root,
                 extra_env=extra_env)
        try:
            c = sluice.Client(env["REST"])
            compute_nodes(c, 2)
            yield rig_dir, env, c
        finally:
            rig_cmd("down", rig_dir=rig_dir)


def node_pid(rig_dir, node):
    """The pid of the rig's node `node` (e.g. `compute0`, `storage1`)."""
    with open(os.path.join(rig_dir, "pids")) as f:
        return next(int(line.split()[0]) for line in f if f"{node}/" in line)


def allowed_cpus(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return line.split()[1]
    return None


def test_the_rig_comes_up_and_goes_down_cleanly():
    with tempfile.TemporaryDirectory() as d:
        rig_dir = os.path.join(d, "rig")
        root = gen(d, "pets", 2, 4)
        env = up(rig_dir, "--storage", "2", "--compute", "1", "--link", "100Mbit",
                 "--ingest-root", root)
        try:
            assert env["REST"].startswith("http://") and env["FLIGHT"].startswith("http://")
            assert len(env["STORAGE"].split(",")) == 2 and len(env["COMPUTE"].split(",")) == 1
            with urllib.request.urlopen(env["REST"] + "/healthz", timeout=10) as r:
                assert r.status == 200
            # Four hosts, each process pinned to its side's CPUs.
            assert sorted(ours()) == ["slrig-c0", "slrig-coord", "slrig-s0", "slrig-s1"]
            with open(os.path.join(rig_dir, "pids")) as f:
                pins = [allowed_cpus(line.split()[0]) for line in f]
            assert pins[:2] == [env["STORAGE_CPUS"]] * 2, pins
            assert set(pins[2:]) == {env["COMPUTE_CPUS"]}, pins
            # The storage hosts' egress is shaped, and `link` reshapes it live.
            shaped = subprocess.run(["ip", "netns", "exec", "slrig-s0", "tc", "qdisc", "show",
                                     "dev", "eth0"], capture_output=True, text=True).stdout
            assert "tbf" in shaped and "100Mbit" in shaped, shaped
            rig_cmd("link", "1Gbit", rig_dir=rig_dir)
            shaped = subprocess.run(["ip", "netns", "exec", "slrig-s1", "tc", "qdisc", "show",
                                     "dev", "eth0"], capture_output=True, text=True).stdout
            assert "1Gbit" in shaped, shaped
            # A second rig while one is up is refused, and names the first.
            again = rig_cmd("up", "--storage", "1", rig_dir=rig_dir, check=False)
            assert again.returncode != 0 and "already up" in again.stderr
        finally:
            rig_cmd("down", rig_dir=rig_dir)
        assert ours() == []
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert "slrig0" not in links and "slr-" not in links
        assert not os.path.exists(rig_dir)
        # Down, then up again: nothing of the first rig is in the way.
        up(rig_dir, "--storage", "1", "--compute", "0")
        rig_cmd("down", rig_dir=rig_dir)
        assert ours() == []


def test_the_rig_returns_what_one_data_dir_returns():
    with tempfile.TemporaryDirectory() as d:
        rig_dir = os.path.join(d, "rig")
        root = gen(d, "pets", 3, 7)
        want = one_data_dir(d, root)
        assert want.num_rows == 21
        env = up(rig_dir, "--storage", "2", "--compute", "1", "--link", "1Gbit",
                 "--ingest-root", root)
        try:
            client = os.path.join(d, "client")
            for how, args in [
                ("a compute node", ["--connect", env["COMPUTE"]]),
                ("the coordinator's Flight", ["--connect", env["FLIGHT"]]),
                ("all on storage", ["--connect", env["COMPUTE"], "--offload", "storage"]),
                ("all on compute", ["--connect", env["COMPUTE"], "--offload", "compute"]),
            ]:
                got = sql_arrow(client, SQL, *args)
                assert got.equals(want), f"the rig via {how} differs from one data dir"
            # An aggregate over both nodes runs on the distributed engine,
            # its partial step on each node, and answers what one data dir
            # answers.
            want_groups = sql_arrow(os.path.join(d, "embedded"), GROUP_BY)
            for via in [env["COMPUTE"], env["FLIGHT"]]:
                got = sql_arrow(client, GROUP_BY, "--connect", via)
                assert got.equals(want_groups), f"GROUP BY via {via}"
            plan = subprocess.run([SLUICE, "--data-dir", client, "sql", "EXPLAIN " + GROUP_BY,
                                   "--connect", env["COMPUTE"]],
                                  capture_output=True, text=True, check=True).stdout
            assert "NetworkCoalesceExec" in plan, plan
            for node in env["STORAGE"].split(","):
                assert f"node={node}, reads=" in plan, (node, plan)
            assert "fragment=AggregateExec: mode=Partial" in plan, plan
            # A job over REST, through the coordinator, over both nodes.
            c = sluice.Client(env["REST"])
            job = c.submit("SELECT key, label, to_tensor(resize(decode_image(data), 32, 32)) AS img "
                           "FROM pets", batch_size=5)
            assert job.wait()["samples"] == 21
            rows = pa.Table.from_batches(list(job.reader(0, 0).batches())).sort_by("key")
            assert rows.column("img").equals(want.column("img"))
            assert rows.column("label").equals(want.column("label"))
        finally:
            rig_cmd("down", rig_dir=rig_dir)


def test_ranks_are_served_by_the_compute_nodes_with_the_coordinators_bytes():
    """2 storage x 2 compute nodes: each compute node registers, a 4-rank
    job's endpoints spread over both, each rank read from its node holds
    exactly the bytes the coordinator itself delivers for that rank, and
    the four ranks hold every sample once."""
    with tempfile.TemporaryDirectory() as d:
        rig_dir = os.path.join(d, "rig")
        root = gen(d, "pets", 3, 7)
        env = up(rig_dir, "--storage", "2", "--compute", "2", "--link", "1Gbit",
                 "--ingest-root", root)
        try:
            c = sluice.Client(env["REST"])
            nodes = {"grpc://" + u.split("://")[1] for u in env["COMPUTE"].split(",")}
            assert compute_nodes(c, 2) == nodes
            job = c.submit("SELECT key, label, to_tensor(resize(decode_image(data), 32, 32)) "
                           "AS img FROM pets", batch_size=2, world_size=4, shuffle={"seed": 5})
            assert job.wait()["samples"] == 21
            served = {e["rank"]: e["location"] for e in job.status()["endpoints"]}
            assert set(served.values()) == nodes and served[0] == served[2] != served[1], served
            # The same in Flight's terms: one endpoint per rank, at its node.
            info = c.flight().get_flight_info(flight.FlightDescriptor.for_path(job.id),
                                              c.call_options())
            assert [e.locations[0].uri.decode() for e in info.endpoints] == \
                [served[r] for r in range(4)]
            # Every rank read from its node: the nodes report what they
            # delivered, and the coordinator's status counts it all.
            from_nodes = [pa.Table.from_batches(list(job.reader(rank).batches()))
                          for rank in range(4)]
            deadline = time.monotonic() + 20
            while True:
                st = job.status()
                sent = st["bytes"]["trainer"] + st["bytes"]["shm"]
                if st["state"] == "done" and st["progress"] == 1.0 and sent:
                    break
                assert time.monotonic() < deadline, f"no progress reached the coordinator: {st}"
                time.sleep(0.5)
            assert st["delivered"] == 24 and st["bytes"]["link"] > 0, st["bytes"]
            assert sorted(r["delivered"] for r in st["ranks"]) == [6, 6, 6, 6], st["ranks"]
            coordinator = flight.FlightClient(c.flight_address())
            keys = []
            for rank in range(4):
                got = from_nodes[rank]
                ticket = json.dumps({"type": "job", "job": job.id, "rank": rank}).encode()
                want = coordinator.do_get(flight.Ticket(ticket)).read_all()
                assert got.equals(want.select(got.column_names)), f"rank {rank} differs"
                keys += got.column("key").to_pylist()
            # 21 samples over 4 ranks: 6 each, the last 3 wrapped around
            # (drop_last false), so every sample at least once.
            assert len(keys) == 24 and len(set(keys)) == 21
            assert set(keys) == set(want_keys(c))
            # A trainer on compute node 1's host reads every rank there
            # (REST and Flight both see where it connects from).
            script = ("import json, sys, sluice; c = sluice.Client(sys.argv[1]); "
                      "j = c.job(sys.argv[2]); print(json.dumps({"
                      "'rest': [j.location(r) for r in range(4)], "
                      "'flight': [e.locations[0].uri.decode() "
                      "for e in j.flight_info().endpoints]}))")
            beside = subprocess.run(["ip", "netns", "exec", "slrig-c1", sys.executable, "-c",
                                     script, env["REST"], job.id],
                                    capture_output=True, text=True, timeout=60)
            assert beside.returncode == 0, beside.stderr
            beside = json.loads(beside.stdout)
            host1 = "grpc://" + env["COMPUTE"].split(",")[1].split("://")[1]
            assert beside == {"rest": [host1] * 4, "flight": [host1] * 4}, beside
            # Each compute node planned the job from the coordinator's record.
            for j in range(2):
                with open(os.path.join(rig_dir, f"compute{j}", "node.log")) as f:
                    log = f.read()
                assert "serving the jobs of the coordinator" in log, log
            # Cancelled on the coordinator, the job is refused on its nodes.
            job.cancel()
            for rank in range(2):
                with pytest.raises(sluice.SluiceError) as e:
                    list(job.reader(rank))
                assert e.value.code == "job_cancelled", e.value
        finally:
            rig_cmd("down", rig_dir=rig_dir)


def test_a_rank_resumes_exactly_on_another_compute_node_after_kill_9():
    """Rank 1's compute node is killed mid-epoch: the rank moves to the
    other node once the dead one stops registering, and the trainer,
    resuming at its offset there, gets exactly the rest."""
    with two_by_two() as (rig_dir, env, c):
        job = c.submit("SELECT key, to_tensor(resize(decode_image(data), 16, 16)) AS img "
                       "FROM pets", batch_size=2, world_size=2, shuffle={"seed": 11})
        job.wait()
        ticket = json.dumps({"type": "job", "job": job.id, "rank": 1}).encode()
        want = flight.FlightClient(c.flight_address()).do_get(flight.Ticket(ticket)).read_all()
        first = job.location(1)
        reader = job.reader(1, prefetch=0)
        got = []
        for batch in reader.batches():
            got.append(batch)
            if len(got) == 2:
                break
        resume_at = reader.offset
        hosts = [u.split("://")[1] for u in env["COMPUTE"].split(",")]
        node = hosts.index(first.split("://")[1])
        os.kill(node_pid(rig_dir, f"compute{node}"), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while job.location(1) == first:
            assert time.monotonic() < deadline, "rank 1 never moved off the dead node"
            time.sleep(0.5)
        rest = list(job.reader(1, offset=resume_at).batches())
        delivered = pa.Table.from_batches(got + rest)
        assert delivered.equals(want.select(delivered.column_names)), \
            "the resumed rank differs from an uninterrupted read"


def lockstep(job, world, steps=None):
    """Every rank of `job` (each read from the compute node serving it)
    taking `steps` batches in lockstep (None: all): the keys taken in
    global order (step by step, position i of every rank before i + 1),
    and the offset each rank reached."""
    readers = [job.reader(r, job.first_epoch(), prefetch=0) for r in range(world)]
    iters = [r.batches() for r in readers]
    taken, step = [], 0
    while steps is None or step < steps:
        batches = [next(it, None) for it in iters]
        if all(b is None for b in batches):
            break
        keys = [b.column("key").to_pylist() if b is not None else [] for b in batches]
        taken += [k[i] for i in range(max(map(len, keys))) for k in keys if i < len(k)]
        step += 1
    return taken, [r.offset for r in readers]


def test_an_elastic_resume_continues_on_other_compute_nodes():
    """2 ranks read part of an epoch on 2 compute nodes; one node is
    killed, and the training resumes with 3 ranks, all on the node left,
    from the trainers' saved state: the epoch's order exactly, once."""
    with two_by_two() as (rig_dir, env, c):
        sql, shuffle = "SELECT key, label FROM pets", {"seed": 4}
        whole, _ = lockstep(c.submit(sql, batch_size=5, shuffle=shuffle), 1)
        assert len(whole) == 21
        job = c.submit(sql, batch_size=3, world_size=2, shuffle=shuffle)
        job.wait()
        assert len({job.location(r) for r in range(2)}) == 2
        taken, offsets = lockstep(job, 2, steps=2)
        assert offsets == [6, 6]
        state = job.state_dict(0, offsets[0])
        assert state["position"] == 12
        os.kill(node_pid(rig_dir, "compute0"), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while len(c._request("GET", "/v1/nodes")["compute"]) > 1:
            assert time.monotonic() < deadline, "the killed compute node stays registered"
            time.sleep(0.5)
        again = c.submit(sql, batch_size=2, world_size=3, shuffle=shuffle, resume=state)
        assert again.wait()["resumed"] == {"epoch": 0, "start": 12, "samples_per_rank": 3}
        assert len({again.location(r) for r in range(3)}) == 1
        rest, _ = lockstep(again, 3)
        assert taken + rest == whole


def read_timed(batches):
    """Every batch left in `batches`, and the longest wait for one (s)."""
    got, gap, t = [], 0.0, time.monotonic()
    for b in batches:
        now = time.monotonic()
        got.append(b)
        gap, t = max(gap, now - t), now
    return got, gap


def test_a_storage_node_killed_mid_epoch_fails_over_to_its_replicas():
    """Two storage nodes, each part on both (the default). A storage node
    killed -9 while a rank reads costs the trainer nothing: the epoch
    completes, every sample once, byte-identical to an undisturbed run,
    and the job's status names the node and the windows run again. With
    the second node killed too, no holder is left: an error naming the
    nodes within seconds, never a hang or a short epoch."""
    with tempfile.TemporaryDirectory() as d:
        rig_dir = os.path.join(d, "rig")
        root = gen(d, "pets", 4, 25)
        # The reference job's rows would serve the job under test from the
        # output cache: it must read through the loss.
        env = up(rig_dir, "--storage", "2", "--compute", "0", "--ingest-root", root,
                 extra_env=NO_OUTPUT_CACHE)
        try:
            c = sluice.Client(env["REST"])
            nodes = env["STORAGE"].split(",")
            sql = "SELECT key, to_tensor(resize(decode_image(data), 16, 16)) AS img FROM pets"
            want = pa.Table.from_batches(list(c.submit(sql, batch_size=2).reader(0).batches()))
            assert want.num_rows == 100
            job = c.submit(sql, batch_size=2)
            job.wait()
            batches = job.reader(0, prefetch=0).batches()
            got = [next(batches)]
            os.kill(node_pid(rig_dir, "storage1"), signal.SIGKILL)
            rest, gap = read_timed(batches)
            got += rest
            assert pa.Table.from_batches(got).equals(want), "the failed-over epoch differs"
            assert gap < 10, f"the trainer waited {gap:.1f} s for a batch"
            status = job.status()
            assert status["state"] == "done" and status["delivered"] == 100, status
            failovers = status["failovers"]
            assert [f["node"] for f in failovers] == [nodes[1]], failovers
            assert failovers[0]["what"] == "lost" and failovers[0]["windows"] >= 1, failovers

            # A job submitted while the node is still down starts: its
            # samples are listed from their other holders.
            job = c.submit(sql, batch_size=2)
            job.wait()
            again = pa.Table.from_batches(list(job.reader(0).batches()))
            assert again.equals(want), "a job started without a holder differs"

            # Both holders gone: a named error, never a short epoch.
            rig_cmd("restart-storage", "1", rig_dir=rig_dir)
            job = c.submit(sql, batch_size=2)
            job.wait()
            batches = job.reader(0, prefetch=0).batches()
            rows = next(batches).num_rows
            for node in ("storage1", "storage0"):
                os.kill(node_pid(rig_dir, node), signal.SIGKILL)
            t0 = time.monotonic()
            try:
                for b in batches:
                    rows += b.num_rows
                raise AssertionError(f"the epoch ended without its nodes: {rows} of 100 rows")
            except sluice.SluiceError as e:
                took = time.monotonic() - t0
                assert nodes[0] in e.message and nodes[1] in e.message, e
                assert "every holder is lost" in e.message, e
                assert e.code in ("unavailable", "node_unavailable"), e
                assert took < 60, f"the error took {took:.0f} s"
            assert rows < 100
            assert c._request("GET", "/healthz") == "ok\n"
        finally:
            rig_cmd("down", rig_dir=rig_dir)


def test_compute_nodes_fail_over_a_lost_storage_node_and_the_coordinator_shows_it():
    """2 storage x 2 compute nodes, each part on both storage nodes. A
    storage node killed while the ranks read on the compute nodes: every
    rank's epoch completes with the bytes of an undisturbed run, the
    coordinator's status shows the failover and the compute node that met
    it, and the dataset shows its parts under-replicated (REST and
    `sluice datasets --url`)."""
    with two_by_two(extra_env=NO_OUTPUT_CACHE, classes=4, per_class=25) as (rig_dir, env, c):
        sql = "SELECT key, to_tensor(resize(decode_image(data), 16, 16)) AS img FROM pets"
        before = c.submit(sql, batch_size=2, world_size=2)
        want = [pa.Table.from_batches(list(before.reader(r).batches())) for r in range(2)]
        assert sum(t.num_rows for t in want) == 100
        pets = c._request("GET", "/v1/datasets/pets")
        assert pets["samples"] == 100, pets
        assert pets["replication"] == {"replicas": 2, "parts": 2, "full": 2, "under": 0,
                                       "lost": 0}, pets
        job = c.submit(sql, batch_size=2, world_size=2)
        job.wait()
        first = [job.reader(r, prefetch=0).batches() for r in range(2)]
        got = [[next(first[r])] for r in range(2)]
        os.kill(node_pid(rig_dir, "storage1"), signal.SIGKILL)
        got0 = got[0] + list(first[0])
        got1 = got[1] + list(first[1])
        assert pa.Table.from_batches(got0).equals(want[0]), "rank 0 differs"
        assert pa.Table.from_batches(got1).equals(want[1]), "rank 1 differs"
        lost = env["STORAGE"].split(",")[1]
        deadline = time.monotonic() + 15
        while True:
            failovers = job.status().get("failovers", [])
            if any(f["node"] == lost and f.get("via") for f in failovers):
                break
            assert time.monotonic() < deadline, f"no failover reported: {failovers}"
            time.sleep(0.5)
        assert {f["via"] for f in failovers} <= compute_nodes(c, 2), failovers
        pets = c._request("GET", "/v1/datasets/pets")["replication"]
        assert (pets["full"], pets["under"], pets["lost"]) == (0, 2, 0), pets
        assert all(p["live"] == [env["STORAGE"].split(",")[0]] for p in pets["degraded"]), pets
        listed = subprocess.run([SLUICE, "datasets", "--url", env["REST"]],
                                capture_output=True, text=True, check=True).stdout
        assert "2 copies: 0 of 2 parts full, 2 under-replicated" in listed, listed


def wait_for(what, check, within=60):
    """Polls `check()` every half second until it returns something true;
    that, or an error naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {within} s"
        time.sleep(0.5)


def test_parts_move_when_a_node_is_lost_joins_or_is_drained_and_nothing_is_lost():
    """3 storage nodes, each part on 2 (the default), a coordinator that
    counts a node lost after 4 s. A node killed -9: its parts are copied
    from their other holders to the node left without a copy, and the
    dataset is fully replicated again without it; back later, it is told
    to retire its stale copy. A node that joins takes
    an even share with `sluice rebalance`. A node drained while a job
    reads: the job's bytes are those of an undisturbed run, every part
    ends on the other two nodes, and the drained node then holds nothing.
    Every job in between reads what the first did."""
    with tempfile.TemporaryDirectory() as d:
        rig_dir = os.path.join(d, "rig")
        root = gen(d, "pets", 4, 10)
        env = up(rig_dir, "--storage", "3", "--compute", "0", "--ingest-root", root,
                 "--", "--lost-after", "4", extra_env=NO_OUTPUT_CACHE)
        try:
            c = sluice.Client(env["REST"])
            nodes = env["STORAGE"].split(",")
            sql = "SELECT key, to_tensor(resize(decode_image(data), 16, 16)) AS img FROM pets"

            def read_all():
                job = c.submit(sql, batch_size=4)
                job.wait()
                return pa.Table.from_batches(list(job.reader(0).batches()))

            def replication():
                return c._request("GET", "/v1/datasets/pets")["replication"]

            def holding():
                pets = c._request("GET", "/v1/datasets/pets")
                return sorted(v["node"] for v in pets["versions"])

            want = read_all()
            assert want.num_rows == 40
            assert replication()["full"] == 3
            # A checkpoint striped over the three, two copies of each stripe.
            ck = sluice.Checkpoint(c, "moves")
            blob = os.urandom(7 * (4 << 20) + 11)
            with ck.writer("m.pt") as w:
                w.write(blob)

            def ckpt_bytes(urls):
                return sum(sum(node_pieces(u).values()) for u in urls)

            # Lost: storage2's two parts get their second copy back on the
            # two nodes left.
            os.kill(node_pid(rig_dir, "storage2"), signal.SIGKILL)
            # Before its parts are copied, a query reads around it.
            counted = subprocess.run(
                [SLUICE, "sql", "--connect", env["FLIGHT"], "--format", "csv",
                 "SELECT count(*) AS n, count(DISTINCT key) AS k FROM pets"],
                capture_output=True, text=True, check=True).stdout
            assert counted.split() == ["n,k", "40,40"], counted
            wait_for("re-replication", lambda: replication()["full"] == 3
                     and holding() == sorted(nodes[:2]))
            r = replication()
            assert (r["under"], r["lost"]) == (0, 0), r
            assert read_all().equals(want), "after re-replication the rows differ"
            # The checkpoint's stripes have two copies again, on the two left.
            wait_for("checkpoint re-replication",
                     lambda: ckpt_bytes(nodes[:2]) == 2 * len(blob))
            with ck.reader("m.pt") as r:
                assert r.read() == blob
            # Back after its parts moved away: its stale copy is retired,
            # never read.
            rig_cmd("restart-storage", "2", rig_dir=rig_dir)
            wait_for("the returned node's retirement", lambda: storage_datasets(nodes[2]) == [])
            wait_for("the returned node's stale checkpoint pieces",
                     lambda: node_pieces(nodes[2]) == {})
            assert holding() == sorted(nodes[:2]) and replication()["full"] == 3

            # Joined: a fourth node, then a rebalance gives it a share.
            added = parse_env(rig_cmd("add-storage", rig_dir=rig_dir).stdout)["STORAGE_URL"]
            wait_for("the new node's registration",
                     lambda: added in {n["name"] for n in c._request("GET", "/v1/nodes")["nodes"]})
            out = subprocess.run([SLUICE, "rebalance", "--url", env["REST"]],
                                 capture_output=True, text=True, check=True).stdout
            assert "rebalance" in out and f"-> {added}" in out, out
            assert added in holding(), holding()
            assert replication()["full"] == 3, replication()
            assert read_all().equals(want), "after the rebalance the rows differ"

            # Drained while a job reads: its epoch is undisturbed, then the
            # node holds nothing.
            job = c.submit(sql, batch_size=2)
            job.wait()
            batches = job.reader(0, prefetch=0).batches()
            got = [next(batches)]
            drained = c._request("POST", "/v1/nodes/storage/" + nodes[1].split("://")[1]
                                 + "/drain")
            assert drained["datasets"][0]["why"] == f"drain of {nodes[1]}", drained
            assert drained["datasets"][0]["retiring"][0]["waiting_for"] == [job.id], drained
            assert drained["checkpoints"]["versions"] == 1, drained
            got += list(batches)
            assert pa.Table.from_batches(got).equals(want), "the job read during a drain differs"
            # Its parts went to the nodes without a copy (storage2, back and
            # empty, among them).
            assert nodes[1] not in holding() and len(holding()) >= 2, holding()
            assert replication()["full"] == 3, replication()
            # Its copy goes once the job is done: the node lists nothing.
            wait_for("the drained node's retirement", lambda: storage_datasets(nodes[1]) == [])
            assert read_all().equals(want), "after the drain the rows differ"
            # The checkpoint left the drained node too, and reads whole.
            assert node_pieces(nodes[1]) == {}
            live = [n for n in nodes + [added] if n != nodes[1]]
            assert ckpt_bytes(live) == 2 * len(blob)
            with ck.reader("m.pt") as r:
                assert r.read() == blob
        finally:
            rig_cmd("down", rig_dir=rig_dir)


def storage_datasets(url):
    """The datasets the storage node at `url` lists, by name."""
    client = flight.FlightClient(url.replace("http://", "grpc://"))
    return sorted(f.descriptor.path[0].decode() for f in client.list_flights())


def test_a_corrupt_replica_is_read_around_then_repaired_by_a_scrub():
    """A flipped byte in one storage node's copy of an image: `sluice
    scrub` finds the object and rewrites it from the good replica, and a
    second scrub finds nothing. Flipped again, a job still gets the right
    bytes (read from the other replica, the failover shown as corrupt),
    and the bad copy is repaired."""
    with tempfile.TemporaryDirectory() as d:
        rig_dir = os.path.join(d, "rig")
        root = gen(d, "pets", 3, 7)
        # No object cache: every read goes to the device.
        env = up(rig_dir, "--storage", "2", "--compute", "0", "--ingest-root", root,
                 extra_env=dict(NO_OUTPUT_CACHE, SLUICE_CACHE_MEMORY="0"))
        try:
            c = sluice.Client(env["REST"])
            nodes = env["STORAGE"].split(",")
            sql = "SELECT key, to_tensor(resize(decode_image(data), 16, 16)) AS img FROM pets"
            want = pa.Table.from_batches(list(c.submit(sql, batch_size=4).reader(0).batches()))
            cls = sorted(os.listdir(os.path.join(root, "pets")))[1]
            name = sorted(os.listdir(os.path.join(root, "pets", cls)))[2]
            with open(os.path.join(root, "pets", cls, name), "rb") as f:
                image = f.read()
            device = os.path.join(rig_dir, "storage1", "data", "device.img")

            def scrub():
                p = subprocess.run([SLUICE, "scrub", "--url", env["REST"], "--format", "json"],
                                   capture_output=True, text=True, check=True)
                return {n["node"]: n for n in json.loads(p.stdout)}

            # Found by a scrub, rewritten from the other node.
            flip_in_device(device, image)
            first = scrub()
            assert first[nodes[0]]["report"]["bad"] == [], first
            bad = first[nodes[1]]["report"]["bad"]
            assert [b["key"] for b in bad] == [f"{cls}/{name}"], bad
            assert [(r["outcome"], r["from"]) for r in first[nodes[1]]["repairs"]] == \
                [("repaired", nodes[0])], first[nodes[1]]
            assert all(n["report"]["bad"] == [] for n in scrub().values())

            # Flipped again, then read: the trainer gets the right bytes.
            flip_in_device(device, image)
            job = c.submit(sql, batch_size=4)
            got = pa.Table.from_batches(list(job.reader(0).batches()))
            assert got.equals(want), "a corrupt replica reached the trainer"
            status = job.status()
            assert status["skipped"] == 0, status
            corrupt = [f for f in status.get("failovers", []) if f["what"] == "corrupt"]
            # The reads spread over both holders: when this object was
            # drawn from node 1 the window met it, read it from node 0, and
            # node 1's copy was scrubbed and rewritten in the background.
            assert all(f["node"] == nodes[1] for f in corrupt), status["failovers"]
            if corrupt:
                log = os.path.join(rig_dir, "coordinator", "serve.log")
                deadline = time.monotonic() + 30
                while True:
                    with open(log) as f:
                        if f"repair of pets key {cls}/{name} on {nodes[1]}" in f.read():
                            break
                    assert time.monotonic() < deadline, "the read's repair never came"
                    time.sleep(0.2)
            else:
                assert scrub()[nodes[1]]["repairs"][0]["outcome"] == "repaired"
            assert all(n["report"]["bad"] == [] for n in scrub().values())
        finally:
            rig_cmd("down", rig_dir=rig_dir)


def test_a_job_told_to_wait_for_storage_reads_on_when_the_node_comes_back():
    """With storage_wait_s, a storage node killed mid-epoch and started
    again over its data costs a pause, not the epoch: the windows that
    met the outage run again, and the trainer gets exactly the bytes of
    an uninterrupted read."""
    with tempfile.TemporaryDirectory() as d:
        rig_dir = os.path.join(d, "rig")
        root = gen(d, "pets", 4, 25)
        # The reference job's rows would serve the job under test from the
        # output cache: it must read through the outage.
        # One copy of each part: the node's samples have no other holder.
        env = up(rig_dir, "--storage", "2", "--compute", "0", "--ingest-root", root,
                 "--replicas", "1", extra_env=NO_OUTPUT_CACHE)
        try:
            c = sluice.Client(env["REST"])
            sql = "SELECT key, to_tensor(resize(decode_image(data), 16, 16)) AS img FROM pets"
            want = pa.Table.from_batches(list(c.submit(sql, batch_size=2).reader(0).batches()))
            assert want.num_rows == 100
            job = c.submit(sql, batch_size=2, storage_wait_s=60)
            assert job.status()["spec"]["storage_wait_s"] == 60
            reader = job.reader(0, prefetch=0)
            batches = reader.batches()
            got = [next(batches)]
            rig_cmd("restart-storage", "1", rig_dir=rig_dir)
            got += list(batches)
            assert pa.Table.from_batches(got).equals(want), "the waited-for epoch differs"
            with open(os.path.join(rig_dir, "coordinator", "serve.log")) as f:
                log = f.read()
            assert "retrying the window" in log, log[-2000:]
            # The job reports the windows it ran again once the node was back.
            status = job.status()
            assert status["state"] == "done" and status["delivered"] == 100, status
            waited = [f for f in status["failovers"] if f["what"] == "waited"]
            assert [f["node"] for f in waited] == [env["STORAGE"].split(",")[1]], status
            assert waited[0]["windows"] >= 1, waited
        finally:
            rig_cmd("down", rig_dir=rig_dir)


def want_keys(c):
    t = pa.Table.from_batches(list(
        c.submit("SELECT key FROM pets", batch_size=32).reader(0).batches()))
    return t.column("key").to_pylist()


def photos(d, n, w=1024, h=768):
    """Photo-like JPEGs (smooth colour fields and fine noise), ~200 KB each."""
    import numpy as np
    from PIL import Image
    os.makedirs(d, exist_ok=True)
    for i in range(n):
        rng = np.random.default_rng(i)
        small = rng.integers(0, 256, size=(h // 64, w // 64, 3), dtype=np.uint8)
        base = np.asarray(Image.fromarray(small).resize((w, h), Image.BICUBIC), dtype=np.int16)
        noise = rng.integers(-12, 13, size=(h, w, 3), dtype=np.int16)
        img = Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))
        img.save(os.path.join(d, f"img{i:04d}.jpg"), quality=90)


def test_a_job_moves_its_cut_when_the_link_is_throttled_mid_run():
    """Compute has both CPUs, storage one: an auto job ships the raw
    photos to compute. Throttled to 100 Mbit/s mid-run, the job is
    link-bound, and moves the decoding to storage at a window boundary;
    every delivered byte is what an unthrottled run delivers."""
    sql = "SELECT key, to_tensor(resize(decode_image(data), 32, 32)) AS img FROM photos"
    with tempfile.TemporaryDirectory() as d:
        rig_dir = os.path.join(d, "rig")
        root = os.path.join(d, "src")
        photos(os.path.join(root, "photos"), 240)
        # The steady job's rows would serve the moved one from the output
        # cache: it must run its plan over the link to be re-planned.
        # 2 Gbit/s: the raw photos cross faster than one storage core
        # decodes them, with room to spare however fast that core is (at
        # 1 Gbit/s the two were within 3% on a fast machine).
        env = up(rig_dir, "--storage", "1", "--compute", "0", "--link", "2Gbit",
                 "--storage-cpus", "0", "--compute-cpus", "0-1", "--ingest-root", root,
                 extra_env=NO_OUTPUT_CACHE)
        try:
            c = sluice.Client(env["REST"])
            steady = c.submit(sql, batch_size=8)
            first = steady.explain()
            assert first["placement"]["pipelines"][0]["choice"] == {"kind": "cut", "cut": 0}, \
                first["text"]
            assert first["placement"]["pipelines"][0]["calibration"]["kind"] == "measured", \
                first["text"]
            want = pa.Table.from_batches(list(steady.reader(0, 0).batches()))
            assert not steady.status().get("replans"), steady.status()["replans"]

            job = c.submit(sql, batch_size=8)
            got, throttled = [], False
            for b in job.reader(0, 0).batches():
                got.append(b)
                if not throttled and sum(x.num_rows for x in got) >= 24:
                    rig_cmd("link", "100Mbit", rig_dir=rig_dir)
                    throttled = True
            rig_cmd("link", "2Gbit", rig_dir=rig_dir)
            assert pa.Table.from_batches(got).equals(want), "the moved job delivered other bytes"
            st = job.status()
            moves = st.get("replans", [])
            assert moves, f"no re-plan: {st.get('observed')}"
            m = moves[0]
            assert m["from"] == "cut 0" and m["to"] in ("cut 1", "cut 2"), m
            assert m["measured"]["bottleneck"] == "link", m
            assert m["link_bytes_per_s"] < 0.7 * 1.25e8, m
            explained = job.explain()
            assert explained["replans"] == moves
            assert "re-planned" in explained["text"] and "link bound" in explained["text"]
            assert explained["placement"]["pipelines"][0]["choice"]["cut"] == int(m["to"][-1])
            # Per-stage statistics over separate machines: each tier on its
            # own, and the decodes (fused with the resize or not) the storage
            # node ran after the move
            # reported back under the node's name.
            analyze = explained["analyze"]
            assert {t["tier"] for t in analyze["tiers"]} == {"storage", "link", "compute",
                                                             "trainer"}, analyze
            on_storage = [s for s in analyze["stages"] if s["tier"] == "storage"]
            assert any(s["udf"].startswith("decode") for s in on_storage), (moves, analyze)
            assert all(s["node"] and s["samples_per_s"] > 0 for s in on_storage), analyze
        finally:
            rig_cmd("down", rig_dir=rig_dir)


def dataset(c, name):
    """The coordinator's view of dataset `name`, or None."""
    return next((d for d in c.datasets() if d["name"] == name), None)


def test_an_ingest_over_rest_is_sharded_committed_on_all_or_none_and_reaches_new_nodes():
    """The rig ingests `pets` over REST on the coordinator: the version is
    spread over both storage nodes and a job over it returns what one data
    dir returns. A part one node refuses leaves no version on either. A
    storage node that registers while no job runs takes its share of the
    next ingest."""
    with tempfile.TemporaryDirectory() as d:
        rig_dir = os.path.join(d, "rig")
        root = gen(d, "pets", 3, 7)
        want = one_data_dir(d, root)
        env = up(rig_dir, "--storage", "2", "--compute", "0", "--ingest-root", root)
        try:
            c = sluice.Client(env["REST"])
            nodes = env["STORAGE"].split(",")
            pets = dataset(c, "pets")
            assert pets["samples"] == 21
            assert sorted(v["node"] for v in pets["versions"]) == sorted(nodes), pets
            job = c.submit(SQL.replace(" ORDER BY key", ""), batch_size=4)
            assert job.wait()["samples"] == 21
            rows = pa.Table.from_batches(list(job.reader(0).batches())).sort_by("key")
            assert rows.column("img").equals(want.column("img"))
            assert rows.column("key").equals(want.column("key"))

            # Again, through the Python client with one copy: version 2 on
            # both, 11 + 10.
            report = c.ingest("pets", os.path.join(root, "pets"), replicas=1)
            parts = {p["node"]: p for p in report["parts"]}
            assert set(parts) == set(nodes), report
            assert sorted(p["samples"] for p in parts.values()) == [10, 11], report
            assert {p["version"] for p in parts.values()} == {2}, report
            assert report["samples"] == 21 and report["replicas"] == 1
            # Version 1, two copies of each part, still reads each key once.
            counted = subprocess.run(
                [SLUICE, "sql", "--connect", env["FLIGHT"], "--format", "csv",
                 'SELECT count(*) AS n, count(DISTINCT key) AS k FROM "pets@1"'],
                capture_output=True, text=True, check=True).stdout
            assert counted.split() == ["n,k", "21,21"], counted
            # More copies than nodes: refused, nothing written.
            with pytest.raises(sluice.SluiceError) as e:
                c.ingest("pets", os.path.join(root, "pets"), replicas=3)
            assert e.value.status == 400 and "replicas 3" in e.value.message, e.value

            # A source whose second object (node 1's first) is a symlink,
            # which confinement refuses: with on_error=fail node 1 fails,
            # node 0's prepared part is dropped, no version anywhere.
            broken = os.path.join(root, "broken", "a")
            os.makedirs(broken)
            src = os.path.join(root, "pets")
            first = sorted(os.listdir(os.path.join(src, os.listdir(src)[0])))
            images = [os.path.join(src, os.listdir(src)[0], f) for f in first]
            for i, name in enumerate(["0.jpg", "1.jpg", "2.jpg", "3.jpg"]):
                if i == 1:
                    os.symlink(images[0], os.path.join(broken, name))
                else:
                    with open(images[i], "rb") as f, open(os.path.join(broken, name), "wb") as g:
                        g.write(f.read())
            with pytest.raises(sluice.SluiceError) as e:
                c.ingest("broken", os.path.dirname(broken), on_error="fail", replicas=1)
            assert e.value.status == 400, e.value
            assert nodes[1] in e.value.message and "abandoned on every node" in e.value.message, \
                e.value.message
            assert dataset(c, "broken") is None
            # The nodes' ingest locks are free again: the same source with
            # skip commits on both (the symlink left out, named).
            report = c.ingest("broken", os.path.dirname(broken), replicas=1)
            assert report["samples"] == 3 and [s["key"] for s in report["skipped"]] == ["a/1.jpg"]
            assert {p["version"] for p in report["parts"]} == {1}, report

            # A third storage node, given to no one, registers by itself
            # and takes its share of the next ingest: 3 parts of 7, each
            # on 2 of the 3 nodes (part i on nodes i and i+1).
            added = parse_env(rig_cmd("add-storage", rig_dir=rig_dir).stdout)["STORAGE_URL"]
            deadline = time.monotonic() + 30
            while added not in {n["name"] for n in c._request("GET", "/v1/nodes")["nodes"]}:
                assert time.monotonic() < deadline, "the new storage node never registered"
                time.sleep(0.5)
            report = c.ingest("more", os.path.join(root, "pets"))
            assert sorted(p["node"] for p in report["parts"]) == sorted(nodes + [added]), report
            assert sorted(p["samples"] for p in report["parts"]) == [14, 14, 14], report
            assert report["replicas"] == 2 and report["samples"] == 21, report
            order = [p["node"] for p in report["parts"]]
            assert report["holders"] == [[order[i], order[(i + 1) % 3]] for i in range(3)], report
            job = c.submit("SELECT key, to_tensor(resize(decode_image(data), 32, 32)) AS img "
                           "FROM more", batch_size=4)
            assert job.wait()["samples"] == 21
            rows = pa.Table.from_batches(list(job.reader(0).batches())).sort_by("key")
            assert rows.column("img").equals(want.column("img"))
        finally:
            rig_cmd("down", rig_dir=rig_dir)


def test_a_storage_node_killed_mid_ingest_leaves_no_version_anywhere():
    """Storage node 1 is stopped before an ingest and killed while node 0
    holds its prepared part: the ingest fails naming node 1, node 0 drops
    its part, and no version of the dataset appears anywhere."""
    with tempfile.TemporaryDirectory() as d:
        rig_dir = os.path.join(d, "rig")
        root = gen(d, "pets", 3, 7)
        env = up(rig_dir, "--storage", "2", "--compute", "0", "--ingest-root", root)
        try:
            c = sluice.Client(env["REST"])
            nodes = env["STORAGE"].split(",")
            pid = node_pid(rig_dir, "storage1")
            os.kill(pid, signal.SIGSTOP)
            import threading
            outcome = {}

            def ingest():
                try:
                    outcome["report"] = c.ingest("late", os.path.join(root, "pets"))
                except sluice.SluiceError as e:
                    outcome["error"] = e

            t = threading.Thread(target=ingest)
            t.start()
            time.sleep(3)  # node 0 prepares its part meanwhile
            assert t.is_alive(), outcome
            os.kill(pid, signal.SIGKILL)
            t.join(60)
            assert not t.is_alive(), "the ingest hung after the node died"
            e = outcome.get("error")
            assert e is not None, outcome
            assert e.status == 503 and e.code == "node_unavailable", e
            assert nodes[1] in e.message, e.message
            assert dataset(c, "late") is None
            # Node 0 dropped its part: it lists no such dataset.
            with open(os.path.join(rig_dir, "storage0", "node.log")) as f:
                log = f.read()
            node0 = flight.FlightClient(nodes[0].replace("http://", "grpc://"))
            listed = [i.descriptor.path[0].decode() for i in node0.list_flights()]
            assert "late" not in listed, (listed, log)
            assert "prepared late version 1" in log and "dropped on its coordinator's word" in log, \
                log
        finally:
            rig_cmd("down", rig_dir=rig_dir)


def test_a_checkpoint_through_the_coordinator_is_striped_replicated_and_outlives_a_node():
    """Three storage nodes: a checkpoint written through the coordinator
    is striped over all of them with two copies of each stripe, and reads
    back byte-identical with one node killed -9."""
    with tempfile.TemporaryDirectory() as d:
        rig_dir = os.path.join(d, "rig")
        env = up(rig_dir, "--storage", "3", "--compute", "0")
        try:
            c = sluice.Client(env["REST"])
            nodes = env["STORAGE"].split(",")
            ck = sluice.Checkpoint(c, "rig")
            data = os.urandom(9 * (4 << 20) + 1000)
            with ck.writer("model.pt") as w:
                w.write(data)
            sizes = [sum(node_pieces(u).values()) for u in nodes]
            assert all(sizes) and sum(sizes) == 2 * len(data), sizes
            os.kill(node_pid(rig_dir, "storage1"), signal.SIGKILL)
            with ck.reader("model.pt") as r:
                assert r.read() == data
            assert [v["version"] for v in ck.list(versions=True)] == [1]
        finally:
            rig_cmd("down", rig_dir=rig_dir)


def test_a_rig_with_identities_serves_ranks_and_refuses_strangers():
    """`rig.sh up --tokens --tls`: every node joins with a node token of its
    own and a certificate of the rig's CA, every link is TLS, and storage
    nodes take only node tokens from holders of the CA's certificates; a
    trainer with the admin token and the CA reads each rank from its
    compute node, the coordinator's job is done from the nodes' reports,
    and a caller without a node token or a certificate can neither
    register nor reach a storage node."""
    with tempfile.TemporaryDirectory() as d:
        rig_dir = os.path.join(d, "rig")
        root = gen(d, "pets", 2, 5)
        env = up(rig_dir, "--tokens", "--tls", "--storage", "2", "--compute", "1",
                 "--ingest-root", root)
        try:
            assert env["TOKEN"].startswith("slc_")
            assert env["TOKEN"] not in open(os.path.join(rig_dir, "tokens.yaml")).read()
            assert env["REST"].startswith("https://"), env
            with pytest.raises(sluice.SluiceError) as e:
                sluice.Client(env["REST"], ca=env["CA"]).datasets()
            assert e.value.status == 401
            c = sluice.Client(env["REST"], token=env["TOKEN"], ca=env["CA"])
            node = "grpc+tls://" + env["COMPUTE"].split("://")[1]
            assert compute_nodes(c, 1) == {node}
            job = c.submit("SELECT key, label FROM pets", batch_size=2, world_size=2)
            assert job.wait()["samples"] == 10
            assert {e["location"] for e in job.status()["endpoints"]} == {node}
            keys = [k for rank in range(2) for b in job.reader(rank).batches()
                    for k in b.column("key").to_pylist()]
            assert sorted(keys) == sorted(want_keys(c))
            # A checkpoint through the coordinator: its stripes reach the
            # storage nodes over TLS with the coordinator's node token.
            ck = sluice.Checkpoint(c, "alice")
            blob = os.urandom(5 * (4 << 20) + 3)
            with ck.writer("m.pt") as w:
                w.write(blob)
            with ck.reader("m.pt") as r:
                assert r.read() == blob
            # A query on the compute node reaches the storage nodes' engine
            # workers over TLS, with its node token and certificate.
            groups = subprocess.run(
                [SLUICE, "--data-dir", os.path.join(d, "client"), "--tls-ca", env["CA"], "sql",
                 GROUP_BY, "--connect", node, "--format", "csv"],
                capture_output=True, text=True, check=True,
                env={**os.environ, "SLUICE_TOKEN": env["TOKEN"]}).stdout
            assert [line.split(",")[:3] for line in groups.split()[1:]] == \
                [["class_0", "5", "5"], ["class_1", "5", "5"]], groups
            deadline = time.monotonic() + 20
            while job.status()["state"] != "done":
                assert time.monotonic() < deadline, f"no report reached the coordinator: {job.status()}"
                time.sleep(0.5)
            # The admin token is not a node's: it registers nothing.
            with pytest.raises(sluice.SluiceError) as e:
                c._request("POST", "/v1/nodes/compute", {"location": "grpc+tls://10.213.0.250:1"})
            assert e.value.status == 403
            # A storage node answers only holders of a certificate of the
            # CA, and of those only node tokens.
            storage = "grpc+tls://" + env["STORAGE"].split(",")[0].split("://")[1]
            headers = [(b"authorization", f"Bearer {env['TOKEN']}".encode())]
            options = flight.FlightCallOptions(headers=headers)
            with open(env["CA"], "rb") as f:
                ca = f.read()
            with pytest.raises(flight.FlightUnavailableError):
                list(flight.FlightClient(storage, tls_root_certs=ca).list_flights(options=options))
            pki = os.path.join(rig_dir, "pki")
            with open(os.path.join(pki, "compute0.pem"), "rb") as fc, \
                    open(os.path.join(pki, "compute0.key"), "rb") as fk:
                member = flight.FlightClient(storage, tls_root_certs=ca, cert_chain=fc.read(),
                                             private_key=fk.read())
            with pytest.raises(flight.FlightUnauthorizedError):
                list(member.list_flights(options=options))
        finally:
            rig_cmd("down", rig_dir=rig_dir)
