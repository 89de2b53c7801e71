"""Weighted mixtures of datasets: a job reads several parts interleaved by
weight, deterministically in (seed, epoch), each row naming its part in a
`source` column; an epoch ends by a named rule; a mixture resumes exactly
(elastically too) from a trainer's saved position, also after `serve` is
killed; parts may run different pipelines whose columns agree, and a
mismatch is refused at submit, naming both."""

import collections
import random

import pytest

import sluice
from serve import generate, sample_server, serve_env, serving

SQL = "SELECT key, label FROM pets"
SHUFFLE = {"seed": 5}


@pytest.fixture(scope="module")
def server():
    with sample_server(3, 20) as (_, c, d, env):  # pets: 60 samples
        c.ingest("more", generate(d, env, "more", 2, 10))  # more: 20
        yield c


def mixture(c, rule=None, world=1, batch=8, resume=None, sql=SQL, **parts):
    mix = [{"dataset": "pets", "weight": 0.7}, {"dataset": "more", "weight": 0.3}]
    opts = {"mix_epoch": rule} if rule else {}
    if resume:
        opts["resume"] = resume
    return c.submit(sql, batch_size=batch, world_size=world, shuffle=SHUFFLE,
                    mix=parts.get("mix", mix), **opts)


def read(job, epoch=None, world=1):
    """Every rank's rows of `epoch`, merged in global order:
    [(source, key)]."""
    epoch = job.first_epoch() if epoch is None else epoch
    ranks = [[(s, k) for b in job.reader(r, epoch, numpy=True)
              for s, k in zip(b["source"], b["key"])] for r in range(world)]
    longest = max(map(len, ranks))
    return [ranks[r][i] for i in range(longest) for r in range(world) if i < len(ranks[r])]


def test_a_mixture_holds_its_weights_and_ends_by_its_rule(server):
    whole = read(mixture(server))
    # first_exhausted: `more` (20 at 0.3) runs out first, after ~66.
    count = collections.Counter(s for s, _ in whole)
    assert count["more"] == 20 and 44 <= count["pets"] <= 48, count
    assert len(set(whole)) == len(whole), "a sample read twice"
    for k in range(1, len(whole) + 1):  # every prefix within two of 0.3
        assert abs(sum(s == "more" for s, _ in whole[:k]) - 0.3 * k) <= 2, k
    assert read(mixture(server)) == whole, "not deterministic"
    resample = read(mixture(server, "resample"))
    assert len(resample) == 80
    assert collections.Counter(s for s, _ in resample)["more"] == 24
    fixed = mixture(server, {"samples": 50})
    assert len(read(fixed)) == 50
    st = fixed.status()
    assert st["mix"]["rule"] == {"samples": 50} and st["mix"]["epoch_samples"] == 50
    shares = {p["name"]: p["share"] for p in st["mix"]["parts"]}
    assert abs(shares["more"] - 0.3) < 0.05, st["mix"]
    assert 'mixture: {"samples":50}, 50 positions an epoch' in fixed.explain()["text"]


def test_epochs_differ_and_the_mixture_pattern_is_the_seeds(server):
    e0 = read(mixture(server, "resample"), 0)
    job2 = server.submit(SQL, batch_size=8, epochs=2, shuffle=SHUFFLE, mix_epoch="resample",
                         mix=[{"dataset": "pets", "weight": 0.7},
                              {"dataset": "more", "weight": 0.3}])
    assert read(job2, 0) == e0
    e1 = read(job2, 1)
    assert [s for s, _ in e1] == [s for s, _ in e0]  # the same interleave…
    assert e1 != e0  # …of other samples


def test_a_mixture_resumed_at_100_random_positions_equals_the_uninterrupted_run(server):
    whole = read(mixture(server))
    rng = random.Random(7)
    for _ in range(100):
        world = rng.randint(1, 3)
        position = rng.randint(0, len(whole))
        state = {"sluice": 1, "epoch": 0, "position": position, "samples": len(whole),
                 "shuffle": SHUFFLE}
        job = mixture(server, world=world, batch=rng.randint(1, 9), resume=state)
        assert read(job, 0, world)[:len(whole) - position] == whole[position:], (world, position)


def test_parts_may_run_their_own_pipelines_when_the_columns_agree(server):
    mix = [{"dataset": "pets", "weight": 1},
           {"name": "more_class_0", "weight": 1,
            "sql": "SELECT key, label FROM more WHERE label = 'class_0'"}]
    rows = read(mixture(server, mix=mix))
    assert {s for s, _ in rows} == {"pets", "more_class_0"}
    assert sum(s == "more_class_0" for s, _ in rows) == 10
    with pytest.raises(sluice.SluiceError, match=r"part 2 \(more\) gives columns \[key: Utf8\]"):
        mixture(server, mix=[{"dataset": "pets", "weight": 1},
                             {"name": "more", "weight": 1, "sql": "SELECT key FROM more"}])
    with pytest.raises(sluice.SluiceError, match="another part is named"):
        mixture(server, mix=[{"dataset": "pets", "weight": 1}, {"dataset": "pets", "weight": 2}])
    with pytest.raises(sluice.SluiceError, match="weight must be above 0"):
        mixture(server, mix=[{"dataset": "pets", "weight": 0}])
    with pytest.raises(sluice.SluiceError, match="unknown dataset"):
        mixture(server, mix=[{"dataset": "pets", "weight": 1}, {"dataset": "nope", "weight": 1}])


def test_a_mixture_resumes_elastically_after_serve_is_killed(tmp_path):
    d = str(tmp_path)
    env = serve_env(d)
    pets, more = generate(d, env, "pets", 2, 15), generate(d, env, "more", 1, 12)
    with serving(d, env, kill=True) as c:
        c.ingest("pets", pets)
        c.ingest("more", more)
        job = mixture(c, "resample", world=2, batch=4)
        whole = read(mixture(c, "resample"))
        it = iter(job.reader(0, 0))
        next(it), next(it)
        state = job.state_dict(0, 8)  # both ranks took 2 batches of 4
        assert state["position"] == 16 and state["samples"] == 42
    with serving(d, env) as c:
        assert c.job(job.id).wait()["mix"]["epoch_samples"] == 42  # restored
        again = mixture(c, "resample", world=3, batch=5, resume=state)
        assert read(again, 0, 3)[:42 - 16] == whole[16:]


def test_a_plan_names_its_mixture(server):
    """The plan form carries `mix` and `mix_epoch` itself (YAML, as
    `sluice job submit plan.yaml` sends it): the same rows as the REST
    form."""
    plan = """
source: pets
outputs: [key, label]
mix_epoch: resample
mix:
  - {dataset: pets, weight: 0.7}
  - {dataset: more, weight: 0.3}
"""
    job = server.submit(plan, batch_size=8, shuffle=SHUFFLE)
    assert read(job) == read(mixture(server, "resample"))
    assert job.status()["spec"]["mix"][1]["dataset"] == "more"


def test_sql_reads_a_mixture_through_mix(server):
    """`FROM mix(dataset => weight, …, mix_epoch => rule)`: the same rows
    as the `mix` option; a malformed call is refused naming it."""
    job = server.submit("SELECT key, label FROM mix(pets => 0.7, more => 0.3, "
                        "mix_epoch => 'resample')", batch_size=8, shuffle=SHUFFLE)
    assert read(job) == read(mixture(server, "resample"))
    assert [p["dataset"] for p in job.status()["spec"]["mix"]] == ["pets", "more"]
    with pytest.raises(sluice.SluiceError, match="dataset => weight"):
        server.submit("SELECT key FROM mix(pets, more)")
