"""A plain `pyarrow.flight` client, without the sluice package's help,
follows what `ListFlights` lists: GetFlightInfo on a dataset's descriptor
(latest or a version) gives endpoints whose tickets DoGet streams, the
same rows as the SQL that names them; GetSchema agrees; jobs still answer
by id; a descriptor naming nothing is NOT_FOUND naming it."""

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from serve import generate, sample_server


@pytest.fixture(scope="module")
def server():
    with sample_server(2, 6) as (_, c, d, env):  # version 1: 12 samples
        c.ingest("pets", generate(d, env, "more", 2, 9))  # version 2: 18
        yield c, flight.FlightClient(c.flight_address())


def read(client, info):
    return pa.concat_tables(client.do_get(e.ticket).read_all() for e in info.endpoints)


def test_listed_descriptors_lead_to_rows(server):
    c, fc = server
    listed = list(fc.list_flights())
    assert [i.descriptor.path for i in listed] == [[b"pets"]]
    info = fc.get_flight_info(listed[0].descriptor)
    assert info.total_records == 18
    assert "data" not in info.schema.names and "key" in info.schema.names
    rows = read(fc, info)
    assert rows.num_rows == 18
    assert rows.schema.equals(info.schema)
    assert fc.get_schema(listed[0].descriptor).schema.equals(info.schema)
    # The same rows as the SQL that names them.
    cols = ", ".join(f'"{n}"' for n in info.schema.names)
    sql = pa.Table.from_batches(list(c.submit(f"SELECT {cols} FROM pets", batch_size=64)
                                     .reader(0, 0).batches()))
    assert rows.sort_by("key").equals(sql.sort_by("key"))


def test_a_version_descriptor_reads_that_version(server):
    _, fc = server
    info = fc.get_flight_info(flight.FlightDescriptor.for_path("pets", "1"))
    assert read(fc, info).num_rows == 12
    with pytest.raises(pa.ArrowException, match="not a number"):
        fc.get_flight_info(flight.FlightDescriptor.for_path("pets", "latest"))


def test_unknown_descriptors_are_not_found_by_name(server):
    c, fc = server
    with pytest.raises(pa.ArrowException, match='names no dataset and no job') as e:
        fc.get_flight_info(flight.FlightDescriptor.for_path("nope"))
    assert "nope" in str(e.value)
    with pytest.raises(pa.ArrowException, match="names no dataset and no job"):
        fc.get_schema(flight.FlightDescriptor.for_path("nope"))
    # Jobs answer by id as before.
    job = c.submit("SELECT key FROM pets", batch_size=4)
    job.wait()
    info = fc.get_flight_info(flight.FlightDescriptor.for_command(job.id))
    assert info.total_records == 18
    assert c._request("GET", "/healthz") == "ok\n"
