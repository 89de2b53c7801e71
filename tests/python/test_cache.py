"""The node-wide object cache under a real job: the second epoch's objects
come from memory (its hits show in /metrics), the bytes are the same as a
server without a cache delivers, and `--cache-memory 0` turns it off."""

import pyarrow as pa

from serve import metric, sample_server

SQL = "SELECT key, label, data FROM pets"


def epochs(cache_memory):
    """Both epochs of a job on a fresh server, and its cache's counters."""
    with sample_server(2, 40, ["--cache-memory", cache_memory]) as (_, c, _, _):
        job = c.submit(SQL, batch_size=16, epochs=2, shuffle={"seed": 9})
        job.wait()
        first = pa.Table.from_batches(list(job.reader(0, 0).batches()))
        # Epoch 1 is begun ahead while epoch 0 ends: its first reads may
        # already be hits, so what is counted is misses (device reads).
        misses_first = metric(c.url, "sluice_cache_misses_total")
        second = pa.Table.from_batches(list(job.reader(0, 1).batches()))
        counters = {
            "misses_first": misses_first,
            "misses": metric(c.url, "sluice_cache_misses_total"),
            "hits": metric(c.url, "sluice_cache_hits_total"),
            "bytes": metric(c.url, "sluice_cache_bytes"),
            "budget": metric(c.url, "sluice_cache_budget_bytes"),
        }
        return first, second, counters


def test_the_second_epoch_comes_from_memory_with_the_same_bytes():
    first, second, cached = epochs("64MiB")
    assert cached["budget"] == 64 << 20
    # Every object read once from the device, in the first epoch; none after.
    assert cached["misses_first"] == 80 and cached["misses"] == 80, cached
    assert cached["hits"] >= 80, cached
    assert 0 < cached["bytes"] <= cached["budget"]
    f0, f1, off = epochs("0")
    assert off["budget"] == 0 and off["hits"] == 0 and off["bytes"] == 0
    assert off["misses"] == 0, off
    # Same seed, same data: the cache changes where bytes come from only.
    assert first.equals(f0) and second.equals(f1)
    assert sorted(first.column("key").to_pylist()) == sorted(second.column("key").to_pylist())
