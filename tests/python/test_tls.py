"""TLS end to end: certificates from `sluice certs`, a `serve` that speaks
only TLS, the Python client and the torch Dataset reading through it,
a wrong CA refused, plain text off loopback refused without --insecure,
and storage nodes that join only with a certificate of the cluster's CA
(and serve only callers that hold one)."""

import http.client
import json
import os
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request

import pyarrow.flight as flight
import pytest

import sluice
from serve import SLUICE, generate, serve_env, start_serve

SQL = ("SELECT key, label, to_tensor(resize(decode_image(data), 16, 16)) AS image "
       "FROM pets")


def certs(d):
    """A cluster CA with a certificate for 127.0.0.1, and a second CA (an
    outsider's) with one of its own for the same address."""
    for ca in ("pki", "rogue"):
        subprocess.run([SLUICE, "certs", "ca", os.path.join(d, ca)], check=True,
                       capture_output=True)
    subprocess.run([SLUICE, "certs", "node", os.path.join(d, "pki"), "node1", "127.0.0.1",
                    "localhost"], check=True, capture_output=True)
    subprocess.run([SLUICE, "certs", "node", os.path.join(d, "pki"), "node2", "127.0.0.1"],
                   check=True, capture_output=True)
    subprocess.run([SLUICE, "certs", "node", os.path.join(d, "rogue"), "node1", "127.0.0.1"],
                   check=True, capture_output=True)
    return {
        "ca": os.path.join(d, "pki", "ca.pem"),
        "rogue_ca": os.path.join(d, "rogue", "ca.pem"),
        "node1": [os.path.join(d, "pki", "node1." + e) for e in ("pem", "key")],
        "node2": [os.path.join(d, "pki", "node2." + e) for e in ("pem", "key")],
        "rogue": [os.path.join(d, "rogue", "node1." + e) for e in ("pem", "key")],
    }


def tls_args(pki, node="node1", ca=True):
    cert, key = pki[node]
    args = ["--tls-cert", cert, "--tls-key", key]
    return args + (["--tls-ca", pki["ca"]] if ca else [])


@pytest.fixture(scope="module")
def tls_server():
    with tempfile.TemporaryDirectory() as d:
        pki = certs(d)
        env = serve_env(d)
        src = generate(d, env, "pets", 3, 10)
        proc, rest = start_serve(d, env, tls_args(pki))
        try:
            assert rest.startswith("https://127.0.0.1:"), rest
            c = sluice.Client(rest, ca=pki["ca"])
            c.ingest("pets", src)
            yield {"proc": proc, "rest": rest, "client": c, "pki": pki, "dir": d, "env": env}
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0


def test_a_trainer_reads_an_epoch_over_tls(tls_server):
    c = tls_server["client"]
    assert c.flight_address().startswith("grpc+tls://127.0.0.1:")
    job = c.submit(SQL, batch_size=8, shuffle={"seed": 2})
    job.wait()
    keys = [k for b in job.reader(0, 0, numpy=True) for k in b["key"]]
    assert len(keys) == 30 and len(set(keys)) == 30
    # The same job's epoch, read through the torch Dataset.
    import torch
    from torch.utils.data import DataLoader

    got = []
    for b in DataLoader(sluice.torch.Dataset(job), batch_size=None):
        assert isinstance(b["image"], torch.Tensor) and b["image"].shape[1:] == (16, 16, 3)
        got.extend(b["key"])
    assert got == keys


def test_a_client_with_another_ca_or_none_is_refused(tls_server):
    rest, pki = tls_server["rest"], tls_server["pki"]
    with pytest.raises(urllib.error.URLError) as e:
        sluice.Client(rest, ca=pki["rogue_ca"]).info()
    assert isinstance(e.value.reason, ssl.SSLCertVerificationError), e.value
    # Plain HTTP to the TLS port gets no HTTP answer (a TLS alert).
    with pytest.raises((urllib.error.URLError, http.client.HTTPException, OSError)):
        urllib.request.urlopen(rest.replace("https://", "http://") + "/v1/info", timeout=10)
    location = tls_server["client"].flight_address()
    with open(pki["rogue_ca"], "rb") as f:
        wrong = flight.FlightClient(location, tls_root_certs=f.read())
    with pytest.raises(flight.FlightUnavailableError):
        list(wrong.list_flights())
    plain = flight.FlightClient(location.replace("grpc+tls://", "grpc://"))
    with pytest.raises(flight.FlightUnavailableError):
        list(plain.list_flights())


def test_plain_text_off_loopback_needs_insecure():
    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d)
        r = subprocess.run([SLUICE, "serve", "--rest", "0.0.0.0:0", "--flight", "127.0.0.1:0"],
                           env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode != 0
        assert "refusing to serve the REST API in plain text" in r.stderr, r.stderr
        assert "--insecure" in r.stderr and "--tls-cert" in r.stderr
        r = subprocess.run([SLUICE, "storage-node", "--listen", "0.0.0.0:0"], env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "refusing to serve Flight" in r.stderr, r.stderr
        proc = subprocess.Popen([SLUICE, "--insecure", "serve", "--rest", "0.0.0.0:0",
                                 "--flight", "127.0.0.1:0"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        try:
            lines = [proc.stdout.readline() for _ in range(2)]
            assert lines[1].startswith("REST API on http://0.0.0.0:"), lines
            port = lines[1].split()[3].rsplit(":", 1)[1]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
                assert r.status == 200
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0


def register(rest, ca, location):
    """(HTTP status, JSON body) of `POST /v1/nodes/storage` for `location`."""
    req = urllib.request.Request(rest + "/v1/nodes/storage", method="POST",
                                 data=json.dumps({"location": location}).encode(),
                                 headers={"content-type": "application/json"})
    ctx = ssl.create_default_context(cafile=ca)
    try:
        with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def storage_node(d, env, name, tls):
    """A `sluice storage-node` over a data dir of its own: (process, address)."""
    env = dict(env, SLUICE_DATA_DIR=os.path.join(d, name))
    proc = subprocess.Popen([SLUICE, *tls, "storage-node", "--listen", "127.0.0.1:0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    assert " listening on " in line, line
    return proc, line.split(" listening on ")[1].split()[0]


def test_only_storage_nodes_holding_the_clusters_certificate_join(tls_server):
    rest, pki, d, env = (tls_server[k] for k in ("rest", "pki", "dir", "env"))
    rogue, rogue_addr = storage_node(d, env, "rogue-node", tls_args(pki, "rogue", ca=False))
    member, member_addr = storage_node(d, env, "member-node", tls_args(pki, "node2"))
    try:
        # A certificate from another CA, for the right address: refused.
        status, body = register(rest, pki["ca"], f"grpc+tls://{rogue_addr}")
        assert (status, body["code"]) == (400, "node_identity"), body
        # A plain location on a cluster with a CA: refused.
        status, body = register(rest, pki["ca"], f"grpc://{member_addr}")
        assert (status, body["code"]) == (400, "tls_required"), body
        # The cluster's certificate: joins.
        status, body = register(rest, pki["ca"], f"grpc+tls://{member_addr}")
        assert status == 200 and body["location"] == f"https://{member_addr}", body
        c = tls_server["client"]
        names = [n["name"] for n in c._request("GET", "/v1/nodes")["nodes"]]
        assert f"https://{member_addr}" in names
        assert f"https://{rogue_addr}" not in names
        # The member serves only callers holding a certificate of the CA.
        with open(pki["ca"], "rb") as f:
            ca = f.read()
        anonymous = flight.FlightClient(f"grpc+tls://{member_addr}", tls_root_certs=ca)
        with pytest.raises(flight.FlightUnavailableError):
            list(anonymous.list_flights())
        cert, key = pki["node1"]
        with open(cert, "rb") as fc, open(key, "rb") as fk:
            node = flight.FlightClient(f"grpc+tls://{member_addr}", tls_root_certs=ca,
                                       cert_chain=fc.read(), private_key=fk.read())
        assert list(node.list_flights()) == []
    finally:
        for p in (rogue, member):
            p.kill()
            p.wait()
