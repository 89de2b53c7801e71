"""`sluice job` against a real `serve`: submit a pipeline file, list,
watch it to done while a trainer reads it, explain, cancel; an unknown
id and an unreachable server are one-line errors with a non-zero exit."""

import os
import subprocess
import threading

import pytest

from serve import SLUICE, sample_server


@pytest.fixture(scope="module")
def server():
    with sample_server(2, 12) as (_, c, d, env):
        sql = os.path.join(d, "pipeline.sql")
        with open(sql, "w") as f:
            f.write("SELECT key, label, to_tensor(resize(decode_image(data), 16, 16)) AS image "
                    "FROM pets")
        yield c, dict(env, SLUICE_URL=c.url), sql


def job(env, *args, check=True):
    r = subprocess.run([SLUICE, "job", *args], env=env, capture_output=True, text=True,
                       timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def test_submit_watch_explain_and_cancel(server):
    c, env, sql = server
    jid = job(env, "submit", sql, "--batch-size", "8", "--seed", "3").stdout.strip()
    assert jid.startswith("job-")
    assert jid in job(env, "list").stdout
    # A trainer reads the epoch while the CLI watches.
    t = threading.Thread(target=lambda: list(c.job(jid).reader(0, 0).batches()))
    t.start()
    watched = job(env, "status", jid, "--watch").stdout.strip().splitlines()
    t.join(timeout=60)
    assert watched, "no status line"
    last = watched[-1]
    assert f"{jid}  done  100.0%  24 samples" in last, watched
    assert "offload" in job(env, "explain", jid).stdout
    other = job(env, "submit", sql).stdout.strip()
    assert " cancelled " in job(env, "cancel", other).stdout


def test_unknown_ids_and_unreachable_servers_are_one_line_errors(server):
    _, env, _ = server
    r = job(env, "status", "job-999-0", check=False)
    assert r.returncode != 0
    assert len(r.stderr.strip().splitlines()) == 1 and "job_not_found" in r.stderr, r.stderr
    r = job(env, "--url", "http://127.0.0.1:1", "list", check=False)
    assert r.returncode != 0
    assert "cannot reach the sluice server" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_submit_resumes_from_a_saved_position(server):
    """`job submit --resume state.json`: the job begins where the trainer's
    saved state says, with another world size; a file that is not a state
    is a one-line error naming it."""
    import json

    c, env, sql = server
    first = c.submit(open(sql).read(), batch_size=4, world_size=2, shuffle={"seed": 3})
    state = os.path.join(os.path.dirname(sql), "state.json")
    with open(state, "w") as f:
        json.dump(first.state_dict(0, 4), f)
    jid = job(env, "submit", sql, "--batch-size", "5", "--world-size", "4", "--seed", "3",
              "--resume", state).stdout.strip()
    st = c.job(jid).wait()
    assert st["resumed"] == {"epoch": 0, "start": 8, "samples_per_rank": 4}, st
    with open(state, "w") as f:
        f.write("epoch 0, position 8")
    r = job(env, "submit", sql, "--resume", state, check=False)
    assert r.returncode != 0 and "state.json: not a saved position" in r.stderr, r.stderr
