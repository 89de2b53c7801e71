"""One error vocabulary end to end: a byte flipped on the device reaches
the trainer as DATA_LOSS, kind `checksum_mismatch`, naming the sample;
the job it failed answers later readers and REST with the same kind; the
kinds of bad requests are the same over Flight and REST."""

import os
import tempfile

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import sluice
from sluice._errors import from_flight
from serve import generate, sample_server, serve_env, start_serve

SQL = "SELECT key, label, data FROM pets"


def flip_one_sample(device, src):
    """Flips a byte in the middle of one source file's bytes on the
    device; returns that file's key (`class/name`)."""
    with open(device, "r+b") as f:
        data = f.read()
        for cls in sorted(os.listdir(src)):
            for name in sorted(os.listdir(os.path.join(src, cls))):
                raw = open(os.path.join(src, cls, name), "rb").read()
                mid = len(raw) // 2
                at = data.find(raw[mid:mid + 64])
                if at > 0:
                    f.seek(at)
                    f.write(bytes([data[at] ^ 0x40]))
                    return f"{cls}/{os.path.splitext(name)[0]}"
    raise AssertionError("no source file found on the device")


def test_a_flipped_byte_is_data_loss_from_the_device_to_the_trainer():
    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d)
        src = generate(d, env, "pets", 2, 6)
        proc, rest = start_serve(d, env)
        try:
            sluice.Client(rest).ingest("pets", src)
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0
        key = flip_one_sample(os.path.join(d, "data", "device.img"), src)
        proc, rest = start_serve(d, env)
        try:
            c = sluice.Client(rest)
            job = c.submit(SQL, batch_size=4)
            job.wait()
            with pytest.raises(sluice.SluiceError) as e:
                for _ in job.reader(0).batches():
                    pass
            err = e.value
            assert (err.grpc_code, err.code) == ("DATA_LOSS", "checksum_mismatch"), err
            assert key.split("/")[-1] in err.message and "pets" in err.message, err.message
            # The job it failed keeps the kind, for REST and later readers.
            status = job.status()
            assert status["state"] == "failed" and status["error_kind"] == "checksum_mismatch"
            with pytest.raises(sluice.SluiceError) as later:
                list(job.reader(0))
            assert (later.value.grpc_code, later.value.code) == ("DATA_LOSS", "job_failed")
            assert c._request("GET", "/healthz") == "ok\n"
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0


def test_flight_and_rest_name_an_error_the_same():
    with sample_server(2, 3) as (_, c, _, _):
        # REST: an unknown dataset at submit.
        with pytest.raises(sluice.SluiceError) as by_rest:
            c.submit("SELECT key FROM nope")
        assert (by_rest.value.status, by_rest.value.code) == (404, "dataset_not_found")
        # Flight: a rank past the job's, and an unknown job.
        job = c.submit(SQL, world_size=1)
        job.wait()
        with pytest.raises(sluice.SluiceError) as by_flight:
            list(job.reader(3))
        assert (by_flight.value.status, by_flight.value.code) == (400, "out_of_range")
        assert by_flight.value.grpc_code == "INVALID_ARGUMENT"
        with pytest.raises(sluice.SluiceError) as missing:
            list(sluice.Job(c, "no-such-job").reader(0))
        assert (missing.value.status, missing.value.code) == (404, "job_not_found")
        with pytest.raises(sluice.SluiceError) as by_rest:
            c.job("no-such-job")
        assert (by_rest.value.status, by_rest.value.code) == (404, "job_not_found")
        # A ticket says what it is by its tag; one without is refused
        # naming the tags, not guessed at.
        for raw in [b'{"job": "%s"}' % job.id.encode(), b'{"sql": "SELECT 1"}']:
            with pytest.raises(pa.ArrowInvalid) as e:
                c.flight().do_get(flight.Ticket(raw), c.call_options()).read_all()
            err = from_flight(e.value)
            assert (err.code, err.grpc_code) == ("bad_ticket", "INVALID_ARGUMENT"), err
            assert '"type"' in err.message and '"checkpoint"' in err.message, err.message
