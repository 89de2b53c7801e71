"""Per-stage statistics against a real `serve`: a job whose resize is made
slow (Lanczos to 384x384 of small images) names that stage as its
bottleneck, on whichever side the placement runs it, in the job's status,
in /metrics, in `sluice job status` and in EXPLAIN ANALYZE."""

import re
import subprocess
import urllib.request

import pytest

from serve import SLUICE, sample_server

SLOW = ("SELECT key, to_tensor(resize(decode_image(data), 384, 384, 'lanczos3')) AS image "
        "FROM pets")


@pytest.fixture(scope="module")
def server():
    # Its tests run the same SQL more than once and time the stages: the
    # output cache would serve the later jobs without running them.
    with sample_server(2, 40, ["--output-cache-memory", "0"]) as (_, c, d, env):
        yield c, dict(env, SLUICE_URL=c.url)


@pytest.mark.parametrize("offload,side", [("1", "compute"), ("storage", "storage")])
def test_a_slow_stage_is_named_the_bottleneck_on_its_side(server, offload, side):
    c, env = server
    job = c.submit(SLOW, batch_size=8, offload=offload)
    batches = list(job.reader(0, 0).batches())
    assert sum(b.num_rows for b in batches) == 80
    st = job.status()
    stages = st["stages"]
    assert stages["samples_per_s"] > 0
    b = stages["bottleneck"]
    # Co-located sides (serve with its embedded storage) are one pool.
    assert b["tier"] == "cpu", stages
    assert b["stage"] == "resize", stages
    flagged = [s for s in stages["stages"] if s["bottleneck"]]
    assert len(flagged) == 1 and flagged[0]["udf"] == "resize", stages
    assert flagged[0]["tier"] == side, stages
    decode = [s for s in stages["stages"] if s["udf"] == "decode_image"][0]
    assert flagged[0]["mean_ms"] > decode["mean_ms"], stages
    assert flagged[0]["p90_ms"] > 0 and flagged[0]["samples_per_s"] > 0
    assert {q["queue"] for q in stages["queues"]} == {"windows", "reader"}

    with urllib.request.urlopen(c.url + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert re.search(
        rf'^sluice_job_bottleneck{{job="{job.id}",tier="cpu",stage="resize"}} 1$', metrics, re.M)
    assert re.search(
        rf'^sluice_job_stage_samples_per_second{{job="{job.id}",tier="{side}",[^}}]*'
        r'udf="resize"} \S+$', metrics, re.M), metrics

    line = subprocess.run([SLUICE, "job", "status", job.id], env=env, capture_output=True,
                          text=True, timeout=60, check=True).stdout
    assert "bottleneck cpu (resize)" in line, line
    text = subprocess.run([SLUICE, "job", "explain", job.id], env=env, capture_output=True,
                          text=True, timeout=60, check=True).stdout
    assert re.search(rf"resize \({side}[^)]*\).*<- bottleneck", text), text
    assert "bottleneck: cpu (resize)" in text, text


def test_no_statistics_before_the_first_window(server):
    c, _ = server
    job = c.submit(SLOW, batch_size=8)
    assert "stages" not in job.status()
    job.cancel()
