"""Flight SQL against a real `serve` with a token, through ADBC's Flight
SQL driver (a standard client, not sluice's): queries and prepared
statements give the same rows as `sluice sql --format arrow`; catalogs,
schemas, tables (datasets and versions) and SQL info; no token or a wrong
one is refused; DDL, DML, SET, unknown tables and bad syntax are Flight SQL
errors with clear messages, and the server keeps serving. A plain
`pyarrow.flight` client follows ListFlights → GetFlightInfo → DoGet for a
dataset and a job."""

import subprocess

import pyarrow as pa
import pyarrow.flight as flight
import pytest

adbc = pytest.importorskip("adbc_driver_flightsql.dbapi")
from adbc_driver_flightsql import DatabaseOptions  # noqa: E402
from adbc_driver_manager import Error as AdbcError  # noqa: E402

from serve import SLUICE, generate, serve_env, start_serve  # noqa: E402

TOKEN = "fsql-s3cret"
CROPS = ("SELECT key, label, to_tensor(random_resized_crop(decode_image(data), 16, 12)) AS x "
         "FROM pets ORDER BY key")


@pytest.fixture(scope="module")
def server():
    import tempfile

    import sluice

    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d, SLUICE_TOKEN=TOKEN)
        proc, rest = start_serve(d, env)
        try:
            c = sluice.Client(rest, token=TOKEN)
            c.ingest("pets", generate(d, env, "pets", 2, 4))  # version 1: 8 samples
            c.ingest("pets", generate(d, env, "more", 2, 6))  # version 2: 12
            yield c, c.flight_address(), env
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0


def connect(address, token=TOKEN, **headers):
    kwargs = {}
    if token is not None:
        kwargs[DatabaseOptions.AUTHORIZATION_HEADER.value] = f"Bearer {token}"
    for name, value in headers.items():
        kwargs[f"{DatabaseOptions.RPC_CALL_HEADER_PREFIX.value}{name}"] = str(value)
    return adbc.connect(address, db_kwargs=kwargs)


def cli(env, address, sql, *args):
    out = subprocess.run([SLUICE, "sql", "--connect", address, "--format", "arrow", sql, *args],
                         env=dict(env, SLUICE_TOKEN=TOKEN), capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    return pa.ipc.open_stream(out.stdout).read_all()


def query(conn, sql):
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetch_arrow_table()


def test_queries_give_the_same_rows_as_the_cli(server):
    _, address, env = server
    with connect(address, **{"x-sluice-seed": 7}) as conn:
        got = query(conn, CROPS)
        plain = query(conn, "SELECT key, label, length FROM pets ORDER BY key")
    want = cli(env, address, CROPS, "--seed", "7")
    assert got.num_rows == 12
    assert isinstance(got.schema.field("x").type, pa.FixedShapeTensorType)
    assert got.equals(want, check_metadata=True)
    assert plain.equals(cli(env, address, "SELECT key, label, length FROM pets ORDER BY key"))
    # Another seed, other crops: the header reached the UDFs.
    with connect(address, **{"x-sluice-seed": 8}) as conn:
        assert not query(conn, CROPS).equals(got)
    # A version as a table.
    with connect(address) as conn:
        assert query(conn, 'SELECT count(*) AS n FROM "pets@1"').column("n").to_pylist() == [8]


def test_prepared_statements_run_what_was_prepared(server):
    _, address, env = server
    with connect(address, **{"x-sluice-seed": 7}) as conn, conn.cursor() as cur:
        # Prepared on the server; it takes no parameters.
        assert not cur.adbc_prepare(CROPS)
        cur.execute(CROPS)
        first = cur.fetch_arrow_table()
        cur.execute(CROPS)
        again = cur.fetch_arrow_table()
    assert first.equals(again)
    assert first.equals(cli(env, address, CROPS, "--seed", "7"))


def test_parameters_are_bound_as_literals(server):
    _, address, _ = server
    with connect(address) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) AS n FROM pets WHERE label = ?", parameters=("class_0",))
        n0 = cur.fetch_arrow_table().column("n").to_pylist()[0]
        cur.execute("SELECT count(*) AS n FROM pets WHERE label <> ?", parameters=("class_0",))
        n1 = cur.fetch_arrow_table().column("n").to_pylist()[0]
        cur.execute("SELECT count(*) AS n FROM pets")
        assert n0 > 0 and n0 + n1 == cur.fetch_arrow_table().column("n").to_pylist()[0]
        # A value is a value, never SQL.
        cur.execute("SELECT ? AS s, ? + 1 AS n", parameters=("'; DROP TABLE pets; --", 41))
        row = cur.fetch_arrow_table().to_pylist()[0]
        assert row == {"s": "'; DROP TABLE pets; --", "n": 42}, row
        with pytest.raises(AdbcError):
            cur.execute("SELECT ?, ?", parameters=(1,))
            cur.fetch_arrow_table()


def test_catalogs_schemas_tables_and_info(server):
    c, address, _ = server
    with connect(address) as conn:
        objects = conn.adbc_get_objects().read_all().to_pylist()
        assert [o["catalog_name"] for o in objects] == ["datafusion"]
        schemas = objects[0]["catalog_db_schemas"]
        assert [s["db_schema_name"] for s in schemas] == ["public"]
        tables = {t["table_name"]: t for t in schemas[0]["db_schema_tables"]}
        assert set(tables) == {"pets", "pets@2"}, set(tables)
        assert tables["pets"]["table_type"] == "TABLE"
        columns = [col["column_name"] for col in tables["pets"]["table_columns"]]
        assert columns[:2] == ["key", "label"] and "data" in columns
        schema = conn.adbc_get_table_schema("pets")
        assert schema.field("data").type == pa.binary()
        info = conn.adbc_get_info()
        assert info["vendor_name"] == "sluice"
        assert conn.adbc_get_table_types() == ["TABLE"]


def test_no_token_or_a_wrong_one_is_refused(server):
    _, address, _ = server
    for token in (None, "wrong"):
        with connect(address, token=token) as conn:
            with pytest.raises(AdbcError, match="(?i)unauthenticated|token"):
                query(conn, "SELECT 1 AS one")


@pytest.mark.parametrize("sql,says", [
    ("CREATE TABLE t (a INT)", "CREATE refused: sluice's SQL is read-only"),
    ("INSERT INTO pets (key) VALUES ('x')", "INSERT refused: sluice's SQL is read-only"),
    ("SET datafusion.execution.batch_size = 1", "SET refused"),
    ("COPY pets TO '/tmp/x.parquet'", "COPY refused"),
    ("SELECT * FROM nope", 'dataset "nope" not found'),
    ("SELEC 1", "Expected: an SQL statement, found: SELEC"),
    ("SELECT decode_image(key) FROM pets", "decode_image"),
])
def test_bad_statements_are_clear_errors_and_the_server_keeps_serving(server, sql, says):
    _, address, _ = server
    with connect(address) as conn:
        with pytest.raises(AdbcError) as e:
            query(conn, sql)
        assert says in str(e.value), str(e.value)
        assert query(conn, "SELECT 1 AS one").column("one").to_pylist() == [1]


def test_a_plain_flight_client_follows_listed_datasets_and_jobs(server):
    c, address, _ = server
    job = c.submit("SELECT key, label FROM pets", batch_size=4, world_size=2)
    job.wait()
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    fc = flight.FlightClient(address)
    listed = list(fc.list_flights(options=options))
    by_kind = {("path", tuple(i.descriptor.path)) if i.descriptor.path else
               ("cmd", i.descriptor.command): i for i in listed}
    assert ("path", (b"pets",)) in by_kind
    assert ("cmd", job.id.encode()) in by_kind, list(by_kind)
    for descriptor in (by_kind[("path", (b"pets",))].descriptor,
                       by_kind[("cmd", job.id.encode())].descriptor):
        info = fc.get_flight_info(descriptor, options=options)
        rows = pa.concat_tables(fc.do_get(e.ticket, options=options).read_all()
                                for e in info.endpoints)
        assert rows.num_rows == 12, descriptor
        assert sorted(rows.column("key").to_pylist()) == sorted(
            query_keys(address))
        assert fc.get_schema(descriptor, options=options).schema.equals(info.schema)


def query_keys(address):
    with connect(address) as conn:
        return query(conn, "SELECT key FROM pets").column("key").to_pylist()


def _field(number, payload):
    """A length-delimited protobuf field."""
    n, out = len(payload), bytearray([number << 3 | 2])
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out) + payload


def test_get_schema_of_a_statement_is_its_result_schema(server):
    _, address, _ = server
    sql = "SELECT key, label, length FROM pets"
    command = _field(1, b"type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery") \
        + _field(2, _field(1, sql.encode()))
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    fc = flight.FlightClient(address)
    schema = fc.get_schema(flight.FlightDescriptor.for_command(command), options=options).schema
    with connect(address) as conn:
        assert schema.equals(query(conn, sql).schema)


def test_a_username_and_password_login_is_exchanged_for_the_token(server):
    """Flight's handshake: a client given a login (the password is the
    token) gets `authorization: Bearer TOKEN` back and uses it."""
    _, address, _ = server
    with adbc.connect(address, db_kwargs={"username": "trainer", "password": TOKEN}) as conn:
        assert query(conn, "SELECT 1 AS one").column("one").to_pylist() == [1]
    with pytest.raises(AdbcError, match="(?i)unauthenticated|token"):
        with adbc.connect(address, db_kwargs={"username": "trainer", "password": "wrong"}) as c:
            query(c, "SELECT 1 AS one")
