"""Trust at the cluster surfaces, tried as a holder of an ordinary token
would: scoped tokens over REST and Flight, node registration, progress
reports, and the process's memory budget. Each reproduction of the probe
that found these holes is a test here."""

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import sluice
from serve import SLUICE, generate, reset_hwm, serve_env, start_serve, vm_hwm_mib

U64_MAX = 2**64 - 1


def add_token(path, name, scopes, datasets=(), checkpoints=()):
    """`sluice tokens add`: the secret it prints once."""
    args = [SLUICE, "tokens", "add", path, name, "--scope", ",".join(scopes)]
    for d in datasets:
        args += ["--dataset", d]
    for c in checkpoints:
        args += ["--checkpoint", c]
    p = subprocess.run(args, check=True, capture_output=True, text=True)
    secret = p.stdout.strip()
    assert secret.startswith("slc_") and secret not in open(path).read()
    return secret


def call(rest, method, path, token=None, body=None):
    """(HTTP status, JSON body) of one REST call."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(rest + path, data=data, method=method)
    req.add_header("content-type", "application/json")
    if token:
        req.add_header("authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read()
            return r.status, json.loads(text) if text.strip().startswith((b"{", b"[")) else text
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text


@pytest.fixture(scope="module")
def cluster():
    """A `serve` with a tokens file and an audit log, holding `pets` (20
    images) and `cats` (4); tokens: admin, a reader of pets*, an ingester
    of pets*, two nodes, and a command-line token (every scope)."""
    with tempfile.TemporaryDirectory() as d:
        tokens = os.path.join(d, "tokens.yaml")
        audit = os.path.join(d, "audit.jsonl")
        t = {
            "admin": add_token(tokens, "ops", ["admin"]),
            "reader": add_token(tokens, "alice", ["read"], ["pets*"], ["alice/"]),
            "ingester": add_token(tokens, "bob", ["ingest"], ["pets*"]),
            "node1": add_token(tokens, "compute-1", ["node"]),
            "node2": add_token(tokens, "compute-2", ["node"]),
        }
        env = serve_env(d)
        pets = generate(d, env, "pets", 2, 10)
        cats = generate(d, env, "cats", 2, 2)
        t["root"] = "a-command-line-token"
        proc, rest = start_serve(d, env, ["--tokens", tokens, "--audit-log", audit,
                                          "--token", t["root"]])
        try:
            admin = sluice.Client(rest, token=t["admin"])
            admin.ingest("pets", pets)
            admin.ingest("cats", cats)
            yield {"rest": rest, "tokens": t, "dir": d, "env": env, "proc": proc,
                   "file": tokens, "audit": audit}
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0


def flight_query(rest, token, sql):
    c = sluice.Client(rest, token=token)
    ticket = flight.Ticket(json.dumps({"type": "query", "sql": sql}).encode())
    return c.flight().do_get(ticket, c.call_options()).read_all()


def test_each_route_answers_each_scope_as_its_table_says(cluster):
    rest, t = cluster["rest"], cluster["tokens"]
    missing = os.path.join(cluster["dir"], "no-such-dir")
    # (method, path, body): the statuses for no token, reader, ingester,
    # admin, node; "in" is let in (neither 401 nor 403: the handler's own
    # answer to a bad body).
    routes = [
        ("GET", "/v1/datasets", None, [401, 200, 200, 200, 403]),
        ("GET", "/v1/datasets/cats", None, [401, 403, 403, 200, 403]),
        ("GET", "/v1/jobs", None, [401, 200, 200, 200, 403]),
        ("GET", "/v1/nodes", None, [401, 200, 200, 200, 403]),
        ("GET", "/v1/info", None, [401, 200, 200, 200, 200]),
        ("GET", "/metrics", None, [401, 200, 200, 200, 200]),
        ("POST", "/v1/jobs", {"sql": "SELECT key FROM cats"}, [401, 403, 403, 201, 403]),
        ("POST", "/v1/datasets", {"name": "cats", "path": missing},
         [401, 403, 403, "in", 403]),
        ("POST", "/v1/datasets", {"name": "pets2", "path": missing},
         [401, 403, "in", "in", 403]),
        ("DELETE", "/v1/nodes/storage/10.9.9.9:1", None, [401, 403, 403, 404, 403]),
        ("POST", "/v1/nodes/compute", {"location": "grpc://x:99999999"},
         [401, 403, 403, 403, 400]),
        ("POST", "/v1/jobs/job-0-0/progress", {}, [401, 403, 403, 403, "in"]),
        ("GET", "/v1/jobs/job-0-0/record", None, [401, 403, 403, 403, 404]),
        ("GET", "/healthz", None, [200, 200, 200, 200, 200]),
    ]
    who = [None, t["reader"], t["ingester"], t["admin"], t["node1"]]
    for method, path, body, want in routes:
        got = [call(rest, method, path, tok, body)[0] for tok in who]
        got = ["in" if w == "in" and g not in (401, 403) else g for g, w in zip(got, want)]
        assert got == want, f"{method} {path}: {got}"
    # A reader lists only its datasets.
    names = [d["name"] for d in call(rest, "GET", "/v1/datasets", t["reader"])[1]]
    assert names == ["pets"], names


def test_flight_calls_see_only_the_datasets_of_their_token(cluster):
    rest, t = cluster["rest"], cluster["tokens"]
    assert flight_query(rest, t["reader"], "SELECT count(*) AS n FROM pets").column("n")[0].as_py() == 20
    for sql in ["SELECT count(*) FROM cats",
                "SELECT * FROM pets WHERE key IN (SELECT key FROM cats)",
                "SELECT * FROM information_schema.tables"]:
        with pytest.raises(flight.FlightUnauthorizedError) as e:
            flight_query(rest, t["reader"], sql)
        assert "may not" in str(e.value), sql
    # A job over cats, submitted by the admin, is not the reader's to read.
    job = sluice.Client(rest, token=t["admin"]).submit("SELECT key FROM cats")
    job.wait()
    reader = sluice.Client(rest, token=t["reader"])
    ticket = flight.Ticket(json.dumps({"type": "job", "job": job.id}).encode())
    with pytest.raises(flight.FlightUnauthorizedError):
        reader.flight().do_get(ticket, reader.call_options()).read_all()
    assert job.id not in [j["id"] for j in reader.jobs()]
    # Flight SQL's listing shows a reader only its datasets.
    listed = [i.descriptor.path[0].decode() for i in reader.flight().list_flights(
        options=reader.call_options()) if i.descriptor.path]
    assert "cats" not in listed and "pets" in listed
    # Every refusal is in the audit log, with who and what.
    lines = [json.loads(l) for l in open(cluster["audit"])]
    assert any(l["who"] == "alice" and "cats" in l["why"] for l in lines), lines[-5:]
    assert any(l["who"] == "no token" for l in lines)
    assert all(t["reader"] not in json.dumps(l) for l in lines), "no secret is written"


def test_a_flight_sql_login_carries_its_token_s_scope(cluster):
    """ADBC's username/password login (Flight's Basic handshake) with a
    scoped token: its datasets and nothing else."""
    adbc = pytest.importorskip("adbc_driver_flightsql.dbapi")
    from adbc_driver_manager import Error as AdbcError

    address = sluice.Client(cluster["rest"], token=cluster["tokens"]["admin"]).flight_address()
    login = {"username": "alice", "password": cluster["tokens"]["reader"]}
    with adbc.connect(address, db_kwargs=login) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) AS n FROM pets")
        assert cur.fetch_arrow_table().column("n").to_pylist() == [20]
        with pytest.raises(AdbcError) as e:
            cur.execute("SELECT count(*) FROM cats")
            cur.fetch_arrow_table()
        assert "may not read" in str(e.value)


def test_a_progress_report_out_of_range_is_refused_and_changes_nothing(cluster):
    rest, t = cluster["rest"], cluster["tokens"]
    reader = sluice.Client(rest, token=t["reader"])
    job = reader.submit("SELECT key, label FROM pets", world_size=2, batch_size=4)
    job.wait()
    node = "grpc://127.0.0.1:7"
    assert call(rest, "POST", "/v1/nodes/compute", t["node1"], {"location": node})[0] == 200
    # node2 may not take node1's location.
    assert call(rest, "POST", "/v1/nodes/compute", t["node2"], {"location": node})[0] == 403
    # The reader is told its ranks are served there: the node may report them.
    status = job.status()
    assert [e["location"] for e in status["endpoints"]] == [node, node]

    def report(ranges, delivered=0, token=t["node1"], skipped=0, by=node):
        return call(rest, "POST", f"/v1/jobs/{job.id}/progress", token, {
            "node": by, "ranges": ranges, "delivered": delivered,
            "bytes": {"link": delivered, "trainer": 0, "shm": 0},
            "skipped": skipped, "bad_samples": []})

    before = job.status()
    for ranges, delivered in [
        ([[[7, 9], [[0, 1_000_000]]]], 1_000_000),            # the probe's report
        ([[[0, 0], [[0, 1_000_000]]]], 10),                    # past the rank's positions
        ([[[0, 0], [[U64_MAX - 1, U64_MAX]]]], U64_MAX),        # near u64::MAX
        ([[[0, 0], [[5, 2]]]], 1),                             # a range backwards
    ]:
        status, body = report(ranges, delivered)
        assert status in (400, 422), (ranges, status, body)
    lines = [json.loads(l) for l in open(cluster["audit"])]
    assert any(l["who"] == "compute-1" and "rank 7" in l["why"] for l in lines), lines[-3:]
    after = job.status()
    for k in ("state", "progress", "delivered", "ranks"):
        assert after.get(k) == before.get(k), k
    assert after["state"] == "running" and after["progress"] == 0.0
    # Counters near u64::MAX saturate rather than wrap or panic.
    assert report([], U64_MAX)[0] == 200 and report([], U64_MAX)[0] == 200
    # Another node's token, or a location it did not register: refused.
    assert report([[[0, 0], [[0, 10]]]], token=t["node2"])[0] == 403
    assert report([[[0, 0], [[0, 10]]]], by="grpc://127.0.0.1:8")[0] == 403
    # A true report counts.
    assert report([[[0, 0], [[0, 10]]]], 10)[0] == 200
    st = job.status()
    assert st["progress"] == 0.5 and st["state"] == "running", st
    assert st["delivered"] == U64_MAX


def test_a_storage_node_holding_what_the_cluster_did_not_write_is_quarantined(cluster):
    rest, t, d = cluster["rest"], cluster["tokens"], cluster["dir"]
    admin = sluice.Client(rest, token=t["admin"])
    # The probe: 100 other images ingested as `pets` in a data dir of one's own.
    own = os.path.join(d, "rogue")
    env = dict(cluster["env"], SLUICE_DATA_DIR=os.path.join(own, "data"))
    src = generate(own, env, "pets", 2, 50)
    subprocess.run([SLUICE, "ingest", "pets", src], env=env, check=True, capture_output=True)
    node = subprocess.Popen([SLUICE, "storage-node", "--listen", "127.0.0.1:0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        addr = node.stdout.readline().split(" listening on ")[1].split()[0]
        location = f"http://{addr}"
        # A user's token cannot register a node at all.
        assert call(rest, "POST", "/v1/nodes/storage", t["reader"], {"location": location})[0] == 403
        status, body = call(rest, "POST", "/v1/nodes/storage", t["node1"], {"location": location})
        assert (status, body["code"]) == (400, "quarantined"), body
        assert "pets@1" in body["message"]
        assert flight_query(rest, t["admin"], "SELECT count(*) AS n FROM pets").column("n")[0].as_py() == 20
        assert admin.dataset("pets")["samples"] == 20
        held = call(rest, "GET", "/v1/nodes", t["admin"])[1]["quarantined"]
        assert [q["location"] for q in held] == [location]
        assert held[0]["by"] == "compute-1" and held[0]["unknown"][0]["dataset"] == "pets"
        assert location not in [n["name"] for n in call(rest, "GET", "/v1/nodes", t["admin"])[1]["nodes"]]
        # The admin takes it out of the list.
        status, body = call(rest, "DELETE", f"/v1/nodes/storage/{addr}", t["admin"])
        assert status == 200 and body["removed"] == [location], body
        assert call(rest, "GET", "/v1/nodes", t["admin"])[1]["quarantined"] == []
    finally:
        node.kill()
        node.wait()
    # A node that does not answer is not kept, and queries that touch no
    # dataset never see it.
    status, body = call(rest, "POST", "/v1/nodes/storage", t["node1"],
                        {"location": "http://127.0.0.1:9"})
    assert (status, body["code"]) == (400, "node_unreachable"), body
    n = flight_query(rest, t["admin"], "SELECT count(*) AS n FROM generate_series(1, 10)")
    assert n.column("n")[0].as_py() == 10


def test_locations_are_checked_and_a_flood_of_registrations_is_refused(cluster):
    rest, t = cluster["rest"], cluster["tokens"]
    for bad in ["http://user:pw@169.254.169.254/latest", "grpc://x:99999999",
                "grpc://169.254.169.254:80", "grpc://0.0.0.0:1", "file:///etc/passwd"]:
        status, body = call(rest, "POST", "/v1/nodes/compute", t["node2"], {"location": bad})
        assert (status, body["code"]) == (400, "invalid_location"), (bad, body)
    # The probe's flood, from a shared identity (a --token, every scope).
    # New locations are let in at a bounded rate.
    codes = [call(rest, "POST", "/v1/nodes/compute", t["root"],
                  {"location": f"grpc://10.77.{i // 250}.{i % 250 + 1}:1"})[0]
             for i in range(300)]
    assert codes.count(429) > 200, codes.count(200)
    live = call(rest, "GET", "/v1/nodes", t["admin"])[1]["compute"]
    assert len(live) < 100


def test_a_new_token_works_after_sighup_and_a_removed_one_stops(cluster):
    rest, f = cluster["rest"], cluster["file"]
    carol = add_token(f, "carol", ["read"])
    assert call(rest, "GET", "/v1/jobs", carol)[0] == 401
    cluster["proc"].send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while call(rest, "GET", "/v1/jobs", carol)[0] != 200:
        assert time.monotonic() < deadline, "the tokens file was not read again"
        time.sleep(0.2)
    subprocess.run([SLUICE, "tokens", "remove", f, "carol"], check=True, capture_output=True)
    cluster["proc"].send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while call(rest, "GET", "/v1/jobs", carol)[0] != 401:
        assert time.monotonic() < deadline, "a removed token still works"
        time.sleep(0.2)


def test_a_poisoned_job_record_is_set_aside_and_the_server_starts():
    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d)
        src = generate(d, env, "pets", 2, 5)
        proc, rest = start_serve(d, env)
        try:
            c = sluice.Client(rest)
            c.ingest("pets", src)
            good = c.submit("SELECT key FROM pets", world_size=2)
            bad = c.submit("SELECT key FROM pets", world_size=2)
            good.wait()
            bad.wait()
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0
        # What the unchecked report of the probe left in a record.
        path = os.path.join(d, "data", "jobs", bad.id + ".json")
        record = json.load(open(path))
        record["progress"]["ranges"] = [[[7, 9], [[U64_MAX, 1]]]]
        json.dump(record, open(path, "w"))
        for _ in range(2):
            proc, rest = start_serve(d, env)
            try:
                c = sluice.Client(rest)
                assert c.job(good.id).wait()["state"] == "running"
                with pytest.raises(sluice.SluiceError) as e:
                    c.job(bad.id).status()
                assert e.value.status == 404
            finally:
                proc.terminate()
                assert proc.wait(timeout=30) == 0
        why = open(os.path.join(d, "data", "jobs", "rejected", bad.id + ".error")).read()
        assert "runs backwards" in why


def test_queries_past_the_memory_budget_fail_and_the_process_stays_under_it():
    budget_mib = 512
    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d)
        proc, rest = start_serve(d, env, ["--memory-limit", f"{budget_mib}MiB"])
        try:
            c = sluice.Client(rest)
            for sql in [
                "SELECT length(repeat('x', 400000000))",
                "SELECT count(*) FROM unnest(range(1, 100000000))",
                "SELECT cardinality(array_agg(value)) FROM generate_series(1, 100000000)",
                "SELECT length(string_agg(CAST(value AS VARCHAR), ',')) "
                "FROM generate_series(1, 100000000)",
            ]:
                ticket = flight.Ticket(json.dumps({"type": "query", "sql": sql}).encode())
                reset_hwm(proc.pid)
                with pytest.raises(pa.ArrowException) as e:
                    c.flight().do_get(ticket, c.call_options()).read_all()
                msg = str(e.value)
                assert "memory budget" in msg or "--memory-limit" in msg, (sql, msg)
                assert proc.poll() is None
                # Never far past the budget, whichever query it is.
                hwm = vm_hwm_mib(proc.pid)
                assert hwm < budget_mib + 128, f"peak RSS {hwm:.0f} MiB in {sql}: {msg}"
            # Still serving.
            t = flight.Ticket(json.dumps({"type": "query", "sql": "SELECT 1 AS one"}).encode())
            assert c.flight().do_get(t, c.call_options()).read_all().num_rows == 1
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0


def test_a_storage_node_takes_calls_only_from_nodes_of_the_cluster():
    with tempfile.TemporaryDirectory() as d:
        tokens = os.path.join(d, "tokens.yaml")
        coord = add_token(tokens, "coordinator", ["node"])
        admin = add_token(tokens, "ops", ["admin"])
        env = serve_env(d)
        env["SLUICE_DATA_DIR"] = os.path.join(d, "storage")
        src = generate(d, env, "pets", 2, 3)
        subprocess.run([SLUICE, "ingest", "pets", src], env=env, check=True, capture_output=True)
        node = subprocess.Popen([SLUICE, "storage-node", "--listen", "127.0.0.1:0", "--tokens", tokens],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            addr = node.stdout.readline().split(" listening on ")[1].split()[0]
            # A user's token, even an admin's, is not a node's.
            raw = flight.FlightClient(f"grpc://{addr}")
            for token, error in [(admin, flight.FlightUnauthorizedError),
                                 (None, flight.FlightUnauthenticatedError)]:
                headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
                with pytest.raises(error):
                    list(raw.list_flights(options=flight.FlightCallOptions(headers=headers)))
            # A coordinator that presents the cluster's node token reads it.
            for node_token, want in [(coord, 6), (None, None)]:
                cenv = serve_env(os.path.join(d, f"c{want}"))
                os.makedirs(os.path.join(d, f"c{want}"), exist_ok=True)
                args = ["--storage", f"http://{addr}", "--tokens", tokens]
                if node_token:
                    args += ["--node-token", node_token]
                proc, rest = start_serve(os.path.join(d, f"c{want}"), cenv, args)
                try:
                    if want is not None:
                        got = flight_query(rest, admin, "SELECT count(*) AS n FROM pets")
                        assert got.column("n")[0].as_py() == want
                    else:
                        with pytest.raises(pa.ArrowException):
                            flight_query(rest, admin, "SELECT count(*) AS n FROM pets")
                finally:
                    proc.terminate()
                    assert proc.wait(timeout=30) == 0
        finally:
            node.kill()
            node.wait()
