"""The trainer-facing service end to end: a real `sluice serve` on free
ports, the real REST API and Flight, the Python client package.

Submit/read/cancel, ranks covering an epoch exactly once, resume, shuffle
determinism, the plan form, auth refusal, bad requests answered with 4xx
and a clear message while the server keeps serving, and the OpenAPI
document (valid, and listing exactly the routes)."""

import json
import os
import subprocess
import tempfile
import time
import urllib.request

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import sluice
from sluice.torch import worker_offset

from serve import SLUICE, serve_env, start_serve

TOKEN = "test-token"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SQL = "SELECT key, label, to_tensor(decode_resize(data, 16, 16)) AS image FROM pets"


@pytest.fixture(scope="module")
def server():
    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d, SLUICE_TOKEN=TOKEN)
        src = os.path.join(d, "pets")
        subprocess.run([SLUICE, "gen-sample", src, "--classes", "3", "--per-class", "9"],
                       env=env, check=True, capture_output=True)
        # A corrupt JPEG, for the error policy.
        jpegs = sorted(n for n in os.listdir(os.path.join(src, "class_0")) if n.endswith(".jpg"))
        with open(os.path.join(src, "class_0", jpegs[0]), "rb") as f:
            whole = f.read()
        with open(os.path.join(src, "class_0", "zz_cut.jpg"), "wb") as f:
            f.write(whole[: len(whole) * 6 // 10])
        proc, rest = start_serve(d, env)
        client = sluice.Client(rest, token=TOKEN)
        client.ingest("pets", src)
        yield {"client": client, "rest": rest, "proc": proc, "dir": d, "src": src}
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def keys_of(reader):
    out = []
    for b in reader:
        out.extend(b.column("key").to_pylist())
    return out


def test_submit_read_and_cancel(server):
    c = server["client"]
    assert [d["name"] for d in c.datasets()] == ["pets"]
    assert c.dataset("pets")["samples"] == 28
    job = c.submit(SQL, batch_size=8, on_error="skip")
    st = job.wait()
    assert st["state"] == "running" and st["samples"] == 28
    n = 0
    for b in job.reader(0, numpy=True):
        img = b["image"]
        assert img.dtype == np.uint8 and img.shape[1:] == (16, 16, 3)
        assert len(b["key"]) == len(img) <= 8
        n += len(img)
    # The corrupt JPEG is skipped and named.
    assert n == 27
    st = job.status()
    assert st["state"] == "done" and st["progress"] == 1.0
    assert st["skipped"] == 1 and "zz_cut.jpg" in st["bad_samples"][0]["key"]
    assert st["bytes"]["trainer"] + st["bytes"]["shm"] > 16 * 16 * 3 * 27 and st["samples_per_s"] > 0
    assert "cut" in job.explain()["text"].lower()
    # Cancel: the job stays listed, its streams are refused.
    job2 = c.submit(SQL, batch_size=4, on_error="skip")
    job2.wait()
    assert job2.cancel()["state"] == "cancelled"
    with pytest.raises(sluice.SluiceError, match="cancelled") as e:
        list(job2.reader(0))
    assert (e.value.code, e.value.grpc_code) == ("job_cancelled", "CANCELLED"), e.value
    assert {j["id"]: j["state"] for j in c.jobs()}[job2.id] == "cancelled"


def test_ranks_cover_each_epoch_exactly_once(server):
    c = server["client"]
    all_keys = None
    for world, drop_last in [(3, False), (4, False), (4, True)]:
        job = c.submit(SQL, batch_size=3, epochs=2, world_size=world, drop_last=drop_last,
                       shuffle={"seed": 5}, on_error="null")
        st = job.wait()
        info = job.flight_info()
        assert len(info.endpoints) == world
        per_rank = st["samples_per_rank"]
        for epoch in range(2):
            seen = []
            for rank in range(world):
                k = keys_of(job.reader(rank, epoch))
                assert len(k) == per_rank
                seen.extend(k)
            if all_keys is None:
                all_keys = set(seen)
                assert len(all_keys) == 28
            if drop_last:
                assert len(seen) == len(set(seen)) == (28 // (world * 3)) * world * 3
            else:
                assert set(seen) == all_keys and len(seen) - 28 < world
        assert job.status()["state"] == "done"


def test_resume_gives_exactly_the_rest(server):
    c = server["client"]
    job = c.submit(SQL, batch_size=5, world_size=2, shuffle={"seed": 9, "mode": "block",
                   "block_size": 4, "window": 8}, on_error="null")
    job.wait()
    full = keys_of(job.reader(1, 0))
    r = job.reader(1, 0)
    it = iter(r)
    first = next(it).column("key").to_pylist() + next(it).column("key").to_pylist()
    assert r.offset == 10
    del it
    rest = keys_of(job.reader(1, 0, offset=r.offset))
    assert first + rest == full
    for offset in (0, 3, 7, len(full)):
        assert keys_of(job.reader(1, 0, offset=offset)) == full[offset:]
    # DataLoader workers: every third batch each, taken in turn the
    # rank's share in order; a worker resumes at a batch of its part.
    parts = [keys_of(job.reader(1, 0, worker=w, workers=3)) for w in range(3)]
    assert [k for j in range(-(-len(full) // 5)) for k in parts[j % 3][j // 3 * 5:][:5]] == full
    part = keys_of(job.reader(1, 0, worker=0, workers=2))
    assert part == full[:5] + full[10:15] and len(full) > 10
    assert keys_of(job.reader(1, 0, offset=5, worker=0, workers=2)) == part[5:]
    with pytest.raises(sluice.SluiceError, match="batch's start"):
        keys_of(job.reader(1, 0, offset=3, worker=2, workers=3))


def test_shuffle_is_deterministic(server):
    c = server["client"]

    def order(seed, epoch, mode="full"):
        job = c.submit(SQL, batch_size=4, epochs=2, shuffle={"seed": seed, "mode": mode},
                       on_error="null")
        job.wait()
        return keys_of(job.reader(0, epoch))

    a = order(3, 0)
    assert order(3, 0) == a
    assert order(3, 1) != a
    assert order(4, 0) != a
    assert sorted(a) == sorted(order(3, 0, "block"))
    unshuffled = c.submit(SQL, batch_size=4, on_error="null")
    unshuffled.wait()
    plain = keys_of(unshuffled.reader(0))
    assert plain == sorted(plain)


def test_plan_form_gives_the_sql_result(server):
    c = server["client"]
    with open(os.path.join(ROOT, "examples", "pipelines", "pets.yaml")) as f:
        yaml_text = f.read()
    with open(os.path.join(ROOT, "examples", "pipelines", "pets.sql")) as f:
        sql = "\n".join(l for l in f.read().splitlines() if not l.startswith("--"))
    opts = dict(batch_size=6, shuffle={"seed": 1}, on_error="skip")
    a = c.submit(yaml_text, **opts)
    b = c.submit(sql, **opts)
    plan = c.submit({"source": "pets", "stages": [
        {"name": "small", "udf": "decode_resize", "args": ["data", 64, 64]},
        {"name": "image", "udf": "to_tensor", "args": ["small"]}],
        "outputs": ["key", "label", "image"]}, **opts)
    tables = []
    for job in (a, b, plan):
        job.wait()
        tables.append(pa.Table.from_batches(list(job.reader(0))))
    assert tables[0].equals(tables[1]) and tables[0].equals(tables[2])
    assert tables[0].num_rows == 27
    # A job's SQL is said once: the plan form's compiled SQL beside its
    # plan, a SQL job's only in its spec.
    listed = {j["id"]: j for j in c.jobs()}
    assert "SELECT" in listed[a.id]["sql"] and "sql" not in listed[a.id]["spec"]
    assert "sql" not in listed[b.id] and listed[b.id]["spec"]["sql"]


def test_auth_is_required(server):
    anon = sluice.Client(server["rest"])
    with pytest.raises(sluice.SluiceError) as e:
        anon.datasets()
    assert e.value.status == 401 and e.value.code == "unauthorized"
    with urllib.request.urlopen(server["rest"] + "/healthz") as r:
        assert r.read() == b"ok\n"
    wrong = sluice.Client(server["rest"], token="nope")
    with pytest.raises(sluice.SluiceError) as e:
        wrong.submit(SQL)
    assert e.value.status == 401
    # Flight refuses a ticket without the token.
    job = server["client"].submit(SQL, on_error="null")
    job.wait()
    f = server["client"].flight()
    ticket = flight.Ticket(json.dumps({"type": "job", "job": job.id}).encode())
    with pytest.raises(flight.FlightUnauthenticatedError):
        f.do_get(ticket).read_all()
    with pytest.raises(flight.FlightUnauthenticatedError):
        f.do_get(ticket, flight.FlightCallOptions(headers=[(b"authorization", b"Bearer nope")])).read_all()
    # The scheme is case-insensitive (RFC 7235).
    req = urllib.request.Request(server["rest"] + "/v1/datasets",
                                 headers={"authorization": "bearer " + TOKEN})
    with urllib.request.urlopen(req) as r:
        assert r.status == 200


def test_an_unknown_job_id_is_not_echoed_whole(server):
    c = server["client"]
    long_id = "x" * 3_000_000
    ticket = flight.Ticket(json.dumps({"type": "job", "job": long_id}).encode())
    # pyarrow raises NOT_FOUND as a KeyError.
    with pytest.raises(KeyError) as e:
        c.flight().do_get(ticket, c.call_options()).read_all()
    assert "job_not_found" in str(e.value) and "(3000000 bytes)" in str(e.value), str(e.value)[:300]
    with pytest.raises(sluice.SluiceError) as e:
        c._request("GET", "/v1/jobs/" + "y" * 10_000)
    assert e.value.status == 404 and len(e.value.message) < 300, e.value.message[:300]
    assert c._request("GET", "/healthz") == "ok\n"


def test_flight_sql_with_no_rows_is_an_empty_table(server):
    c = server["client"]
    for sql in ["SELECT key, label FROM pets WHERE label = 'nosuch'",
                "SELECT key, label FROM pets WHERE width > 100000"]:
        ticket = flight.Ticket(json.dumps({"type": "query", "sql": sql}).encode())
        t = c.flight().do_get(ticket, c.call_options()).read_all()
        assert t.num_rows == 0 and t.column_names == ["key", "label"], t


def test_oversized_bodies_get_413(server):
    """Every time: the server reads an oversized body to its end before it
    answers, so the client sees the 413, not a connection reset while it
    was still sending (one in a few hundred 3 MiB bodies did under load)."""
    c = server["client"]
    for _ in range(20):
        with pytest.raises(sluice.SluiceError) as e:
            c._request("POST", "/v1/jobs", {"sql": "SELECT key FROM pets", "pad": "x" * (3 << 20)})
        assert (e.value.status, e.value.code) == (413, "payload_too_large"), e.value.message
        assert "over the 2 MiB limit" in e.value.message
    assert c._request("GET", "/healthz") == "ok\n"


@pytest.mark.parametrize("token", ["", " ", ","])
def test_an_empty_token_refuses_to_start(token):
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, SLUICE_DATA_DIR=os.path.join(d, "data"), SLUICE_DEVICE_SIZE="64MiB")
        env.pop("SLUICE_TOKEN", None)
        r = subprocess.run([SLUICE, "serve", "--rest", "127.0.0.1:0", "--flight", "127.0.0.1:0",
                            "--token", token], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, r
        assert "empty bearer token" in r.stderr, r.stderr


@pytest.mark.parametrize("body,status,code,needle", [
    ({"sql": "SELEC key FROM pets"}, 400, "invalid_sql", "SELEC"),
    ({"sql": "SELECT key FROM nosuch"}, 404, "dataset_not_found", "nosuch"),
    ({"sql": "SELECT label, count(*) FROM pets GROUP BY label"}, 400, "not_a_pipeline", "aggregate"),
    ({"sql": "SELECT key FROM pets", "batch_size": 0}, 400, "invalid_options", "batch_size"),
    ({"sql": "SELECT key FROM pets", "batchsize": 4}, 400, "invalid_json", "batchsize"),
    ({"sql": "SELECT key FROM pets", "world_size": "two"}, 400, "invalid_json", "world_size"),
    ({"sql": "SELECT key FROM pets", "offload": "sideways"}, 400, "invalid_options", "sideways"),
    ({"sql": "SELECT key FROM pets", "offload": 7}, 400, "invalid_options", "cut"),
    ({"plan": "source: pets\noutputs: []"}, 400, "invalid_plan", "outputs"),
    ({"plan": {"source": "pets", "stages": [{"name": "x", "udf": "nosuchudf", "args": ["data"]}],
               "outputs": ["x"]}}, 400, "invalid_sql", "nosuchudf"),
    ({}, 400, "invalid_options", "sql"),
    # Requests that once took the server down, or lost data quietly.
    ({"sql": "SELECT center_crop(decode_image(data), 100000, 100000) AS x, key FROM pets"},
     400, "invalid_sql", "max_pixels"),
    ({"sql": "SELECT resize(decode_image(data), 65536, 65537) AS x, key FROM pets"},
     400, "invalid_sql", "max_pixels"),
    ({"sql": "SELECT key, " + "+".join(["1"] * 300) + " AS x FROM pets"}, 201, None, None),
    ({"sql": "SELECT key, to_tensor(decode_resize(data, 8, 8), 'complex128') AS x FROM pets"},
     400, "invalid_sql", "uint8"),
    ({"sql": "SELECT key, normalize(decode_resize(data, 8, 8), [CAST('NaN' AS DOUBLE)], [0.2]) AS x FROM pets"},
     400, "invalid_sql", "finite"),
    ({"sql": "SELECT key FROM pets WHERE length(data) > 10"}, 400, "not_a_pipeline", "metadata"),
])
def test_bad_jobs_get_4xx_and_the_server_keeps_serving(server, body, status, code, needle):
    c = server["client"]
    if status < 300:
        assert c._request("POST", "/v1/jobs", body)["state"] in ("pending", "running")
    else:
        with pytest.raises(sluice.SluiceError) as e:
            c._request("POST", "/v1/jobs", body)
        assert (e.value.status, e.value.code) == (status, code), e.value.message
        assert needle.lower() in e.value.message.lower(), e.value.message
    assert c._request("GET", "/healthz") == "ok\n"
    assert c.dataset("pets")["samples"] == 28


def test_bad_lookups_and_ingests(server):
    c = server["client"]
    for call, status, code in [
        (lambda: c.job("job-999-0"), 404, "job_not_found"),
        (lambda: c.dataset("nosuch"), 404, "dataset_not_found"),
        (lambda: c.ingest("etc", "/etc"), 403, "forbidden_path"),
        (lambda: c.ingest("bad name!", server["src"]), 400, "ingest_failed"),
        (lambda: c.ingest("Capitals", server["src"]), 400, "ingest_failed"),
        # Outside the roots: the same answer whether the host path exists or not.
        (lambda: c.ingest("x", "/no/such/dir"), 403, "forbidden_path"),
        (lambda: c.ingest("x", server["dir"] + "/../../etc"), 403, "forbidden_path"),
        (lambda: c.ingest("gone", os.path.join(server["dir"], "missing")), 400, "ingest_failed"),
        (lambda: c._request("GET", "/v1/nothing"), 404, "not_found"),
        # One data dir holds one copy; a scrub's rate is a positive number.
        (lambda: c.ingest("twice", server["src"], replicas=2), 400, "bad_replicas"),
        (lambda: c._request("POST", "/v1/scrub", {"rate_mb_s": -1}), 400, "bad_request"),
        (lambda: c._request("POST", "/v1/nodes/storage/nope:1/drain"), 404, "node_not_found"),
    ]:
        with pytest.raises(sluice.SluiceError) as e:
            call()
        assert (e.value.status, e.value.code) == (status, code), e.value.message
    job = c.submit(SQL, world_size=2, on_error="null")
    job.wait()
    with pytest.raises(sluice.SluiceError, match="rank 2") as e:
        list(job.reader(2))
    assert (e.value.status, e.value.code) == (400, "out_of_range"), e.value
    with pytest.raises(sluice.SluiceError, match="offset"):
        list(job.reader(0, offset=10_000))
    assert c.datasets()[0]["name"] == "pets"
    # The embedded default scrubs its own objects: all good, nothing to repair.
    [node] = c._request("POST", "/v1/scrub", {"dataset": "pets"})
    assert node["report"]["objects"] > 0 and node["report"]["bad"] == [], node
    assert node["repairs"] == [], node
    # Nothing here was laid out by a cluster's ingest: nothing to move.
    assert c._request("POST", "/v1/rebalance") == []


def test_symlinks_in_an_ingest_root_are_not_followed(server):
    c = server["client"]
    d = os.path.join(server["dir"], "linked")
    os.makedirs(d, exist_ok=True)
    good = sorted(n for n in os.listdir(os.path.join(server["src"], "class_1")))[0]
    with open(os.path.join(server["src"], "class_1", good), "rb") as f, \
            open(os.path.join(d, "good" + os.path.splitext(good)[1]), "wb") as g:
        g.write(f.read())
    os.symlink("/etc/passwd", os.path.join(d, "passwd.png"))
    report = c.ingest("linked", d)
    assert report["samples"] == 1, report
    [skipped] = report["skipped"]
    assert skipped["key"] == "passwd.png" and "symbolic link" in skipped["reason"], skipped
    assert "root" not in skipped["reason"]


def test_openapi_is_valid_and_matches_the_routes(server):
    from openapi_spec_validator import validate

    doc = server["client"]._request("GET", "/openapi.json")
    validate(doc)
    assert doc["openapi"].startswith("3.")
    routes = {p: sorted(ops) for p, ops in doc["paths"].items()}
    assert routes == {
        "/v1/jobs": ["get", "post"],
        "/v1/jobs/{id}": ["delete", "get"],
        "/v1/jobs/{id}/explain": ["get"],
        "/v1/jobs/{id}/record": ["get"],
        "/v1/jobs/{id}/progress": ["post"],
        "/v1/nodes/compute": ["post"],
        "/v1/nodes/storage": ["post"],
        "/v1/nodes/{kind}/{id}": ["delete"],
        "/v1/scrub": ["post"],
        "/v1/nodes/storage/{id}/drain": ["post"],
        "/v1/rebalance": ["post"],
        "/v1/datasets": ["get", "post"],
        "/v1/datasets/{name}": ["get"],
        "/v1/checkpoints": ["delete", "get"],
        "/v1/info": ["get"],
        "/v1/nodes": ["get"],
        "/healthz": ["get"],
        "/metrics": ["get"],
    }
    # Every documented route answers (not the fallback 404).
    c = server["client"]
    job = c.submit(SQL, on_error="null")
    for path, ops in routes.items():
        if "get" not in ops:
            continue
        p = path.replace("{id}", job.id).replace("{name}", "pets")
        c._request("GET", p)

    assert 'sluice_device_free_bytes ' in c._request("GET", "/metrics")
    metrics = c._request("GET", "/metrics")
    assert f'sluice_job_delivered_samples_total{{job="{job.id}"}}' in metrics
    assert 'sluice_jobs{state="running"}' in metrics or 'sluice_jobs{state="pending"}' in metrics


def test_a_registered_compute_node_is_given_ranks():
    """A compute node's registration (a server of its own: ranks then go
    to that node for its time to live)."""
    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d)
        proc, rest = start_serve(d, env)
        try:
            c = sluice.Client(rest)
            c._request("POST", "/v1/nodes/compute", {"location": "grpc://10.0.0.9:50052"})
            assert [n["location"] for n in c._request("GET", "/v1/nodes")["compute"]] == \
                ["grpc://10.0.0.9:50052"]
            with pytest.raises(sluice.SluiceError) as e:
                c._request("POST", "/v1/nodes/compute", {"location": "ftp://x"})
            assert (e.value.status, e.value.code) == (400, "invalid_location")
            assert "ftp://x" in e.value.message
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0


def test_worker_offsets_add_up_to_the_rank_offset():
    for read in range(0, 40, 4):
        for workers in range(1, 6):
            parts = [worker_offset(read, 4, w, workers) for w in range(workers)]
            assert sum(parts) == read and all(p % 4 == 0 for p in parts)
            # The next batch is the least-read worker's, the lowest first.
            assert read // 4 % workers == min(range(workers), key=lambda w: (parts[w], w))


def test_queries_have_memory_and_time_limits():
    """A query whose join outgrows --query-memory, and one that runs past
    --query-timeout, each end with an error saying so; the server goes on
    answering."""
    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d)
        src = os.path.join(d, "pets")
        subprocess.run([SLUICE, "gen-sample", src, "--classes", "3", "--per-class", "20"],
                       env=env, check=True, capture_output=True)
        proc, rest = start_serve(d, env, ["--query-memory", "16MiB", "--query-timeout", "1"])
        try:
            c = sluice.Client(rest)
            c.ingest("pets", src)

            def run(sql):
                ticket = flight.Ticket(json.dumps({"type": "query", "sql": sql}).encode())
                return c.flight().do_get(ticket, c.call_options()).read_all()

            with pytest.raises(pa.ArrowException) as e:
                run("SELECT a.key, b.key AS k2, c.key AS k3, d.key AS k4 "
                    "FROM pets a, pets b, pets c, pets d, pets e")
            assert "Resources exhausted" in str(e.value), e.value
            # A short literal that asks for gigabytes is refused before it
            # allocates (it grew the server to 8 GB before).
            with pytest.raises(pa.ArrowException) as e:
                run("SELECT length(repeat('x', 2000000000)) AS n")
            assert "repeat" in str(e.value) and "max_decoded_bytes" in str(e.value), e.value
            # In a job, the stream fails naming it.
            job = c.submit("SELECT key, repeat(key, 200000000) AS x FROM pets")
            job.wait()
            with pytest.raises(sluice.SluiceError) as e:
                for _ in job.reader(0).batches():
                    pass
            assert "repeat" in str(e.value) and "max_decoded_bytes" in str(e.value), e.value
            t0 = time.monotonic()
            with pytest.raises(pa.ArrowException) as e:
                run("SELECT sum(resize(decode_image(b.data), 512, 512)['width']) "
                    "AS n FROM (SELECT key FROM pets) a, pets b")
            assert "time limit of 1 s" in str(e.value), e.value
            # The UDF batch being evaluated when the limit passes stops at
            # its next row (docs/architecture.md).
            elapsed = time.monotonic() - t0
            assert elapsed < 60, elapsed
            assert run("SELECT count(*) AS n FROM pets").column("n")[0].as_py() == 60
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0
