"""The node's caches under a real job, as /metrics shows them:

- the object cache: the second epoch's objects come from memory, the bytes
  are the same as a server without a cache delivers, and `--cache-memory 0`
  turns it off;
- the output cache: a deterministic job's later epochs, and a second job
  of the same SQL, are served its output rows without a read, with the
  same bytes; a job with random stages does not use it;
- the stage cache: a random job's decode is done once per sample, its
  later epochs and a second job served the decoded images, with the same
  bytes as a server without it."""

import pyarrow as pa

from serve import metric, sample_server

SQL = "SELECT key, label, data FROM pets"
DECODED = "SELECT key, label, to_tensor(resize(decode_image(data), 24, 24)) AS x FROM pets"
RANDOM = "SELECT key, to_tensor(random_resized_crop(decode_image(data), 24, 24)) AS x FROM pets"
# The decode (and resize, fused with it) is the same every epoch; the flip is not.
FLIPPED = "SELECT key, to_tensor(random_horizontal_flip(resize(decode_image(data), 24, 24))) AS x FROM pets"


def epochs(cache_memory, sql=SQL, output_cache="0", n=2, stage_cache="0"):
    """The epochs of a job on a fresh server, and its caches' counters."""
    args = ["--cache-memory", cache_memory, "--output-cache-memory", output_cache,
            "--stage-cache-memory", stage_cache]
    with sample_server(2, 40, args) as (_, c, _, _):
        job = c.submit(sql, batch_size=16, epochs=n, shuffle={"seed": 9})
        job.wait()
        first = pa.Table.from_batches(list(job.reader(0, 0).batches()))
        # Epoch 1 is begun ahead while epoch 0 ends: its first reads may
        # already be hits, so what is counted is misses (device reads).
        misses_first = metric(c.url, "sluice_cache_misses_total")
        later = [pa.Table.from_batches(list(job.reader(0, e).batches())) for e in range(1, n)]
        counters = {
            "misses_first": misses_first,
            "misses": metric(c.url, "sluice_cache_misses_total"),
            "hits": metric(c.url, "sluice_cache_hits_total"),
            "bytes": metric(c.url, "sluice_cache_bytes"),
            "budget": metric(c.url, "sluice_cache_budget_bytes"),
        }
        for name in ("hits_total", "misses_total", "rows", "budget_bytes"):
            counters["out_" + name] = metric(c.url, "sluice_output_cache_" + name)
        for name in ("hits_total", "misses_total", "values", "budget_bytes"):
            counters["stage_" + name] = metric(c.url, "sluice_stage_cache_" + name)
        # The same SQL again: every row from the output cache, if it is on.
        again = c.submit(sql, batch_size=16, epochs=1, shuffle={"seed": 9})
        again.wait()
        hits_before = counters["out_hits_total"]
        second_job = pa.Table.from_batches(list(again.reader(0, 0).batches()))
        counters["again_out_hits"] = metric(c.url, "sluice_output_cache_hits_total") - hits_before
        counters["again_misses"] = metric(c.url, "sluice_cache_misses_total") - counters["misses"]
        counters["again_hits"] = metric(c.url, "sluice_cache_hits_total") - counters["hits"]
        counters["again_stage_hits"] = (metric(c.url, "sluice_stage_cache_hits_total")
                                        - counters["stage_hits_total"])
        return [first, *later], second_job, counters


def test_the_second_epoch_comes_from_memory_with_the_same_bytes():
    (first, second), _, cached = epochs("64MiB")
    assert cached["budget"] == 64 << 20
    # Every object read once from the device, in the first epoch; none after.
    assert cached["misses_first"] == 80 and cached["misses"] == 80, cached
    assert cached["hits"] >= 80, cached
    assert 0 < cached["bytes"] <= cached["budget"]
    assert cached["out_budget_bytes"] == 0 and cached["out_hits_total"] == 0, cached
    (f0, f1), _, off = epochs("0")
    assert off["budget"] == 0 and off["hits"] == 0 and off["bytes"] == 0
    assert off["misses"] == 0, off
    # Same seed, same data: the cache changes where bytes come from only.
    assert first.equals(f0) and second.equals(f1)
    assert sorted(first.column("key").to_pylist()) == sorted(second.column("key").to_pylist())


def test_a_deterministic_job_s_rows_come_from_the_output_cache_with_the_same_bytes():
    cached, again, on = epochs("64MiB", DECODED, "64MiB", n=3)
    plain, again_plain, off = epochs("64MiB", DECODED, "0", n=3)
    for e, (a, b) in enumerate(zip(cached, plain)):
        assert a.equals(b), f"epoch {e}"
    assert again.equals(again_plain)
    assert on["out_budget_bytes"] == 64 << 20 and on["out_rows"] == 80, on
    # Each epoch looks every sample up once; epoch 2 began after epoch 0
    # was done: all hits.
    assert on["out_hits_total"] + on["out_misses_total"] == 3 * 80, on
    assert on["out_hits_total"] >= 80, on
    # The second job of the same SQL: every row from memory, no object
    # read at all (not even from the object cache), where without the
    # output cache each of its samples is read again.
    assert on["again_out_hits"] == 80 and on["again_misses"] == 0 and on["again_hits"] == 0, on
    assert off["out_hits_total"] == 0 and off["again_hits"] == 80, off
    # Later epochs read fewer objects than without it.
    assert on["hits"] < off["hits"], (on, off)


def test_a_job_with_random_stages_does_not_use_the_output_cache():
    _, _, on = epochs("0", RANDOM, "64MiB", n=2)
    assert on["out_hits_total"] == 0 and on["out_misses_total"] == 0 and on["out_rows"] == 0, on


def test_a_random_job_s_decode_comes_from_the_stage_cache_with_the_same_bytes():
    cached, again, on = epochs("64MiB", FLIPPED, "64MiB", n=3, stage_cache="64MiB")
    plain, again_plain, off = epochs("64MiB", FLIPPED, "64MiB", n=3, stage_cache="0")
    # Same seed, same data: the flips differ by epoch, the bytes do not
    # differ by cache.
    for e, (a, b) in enumerate(zip(cached, plain)):
        assert a.equals(b), f"epoch {e}"
    assert not cached[0].equals(cached[1])
    assert again.equals(again_plain)
    assert on["stage_budget_bytes"] == 64 << 20 and on["stage_values"] == 80, on
    # Every sample looked up once an epoch; decoded once, in epoch 0 (a few
    # again where epoch 1, begun ahead, reached a sample before epoch 0's
    # window had cached it); the second job decodes none.
    assert on["stage_hits_total"] + on["stage_misses_total"] == 3 * 80, on
    assert 80 <= on["stage_misses_total"] < 120, on
    assert on["again_stage_hits"] == 80, on
    # A random job: the output cache holds none of its rows.
    assert on["out_rows"] == 0 and on["out_hits_total"] == 0, on
    assert off["stage_budget_bytes"] == 0 and off["stage_hits_total"] == 0, off
    assert off["stage_misses_total"] == 0, off
