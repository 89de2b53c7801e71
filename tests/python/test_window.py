"""`sluice._window.Window` alone, its reads done by a function that
copies from a byte string into a bytearray region (the server's part is
tested through the real server in test_checkpoints.py): every access
pattern a parser makes gives the version's own bytes, at most `workers`
reads run at once, a slot is never read into while its bytes are being
copied out, and a failed read is raised where its range is wanted."""

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sluice._window import Window

SPAN = 1000


class Fake:
    """A version of `size` bytes read into `region` by `fetch`, counting
    the reads in flight (each sleeps a little, so that they overlap)."""

    def __init__(self, size, slots, fail_at=None):
        self.data = bytes(random.Random(size).randrange(256) for _ in range(size))
        self.region = bytearray(slots * SPAN)
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.reads = []
        self.fail_at = fail_at
        # Slot offsets being copied out by the test now.
        self.copying = set()

    def fetch(self, lo, length, at):
        with self.lock:
            assert at not in self.copying, f"slot at {at} read into while copied out"
            self.running += 1
            self.most = max(self.most, self.running)
            self.reads.append(lo)
        try:
            time.sleep(0.002)
            if lo == self.fail_at:
                raise OSError(f"range {lo} failed")
            self.region[at:at + length] = self.data[lo:lo + length]
        finally:
            with self.lock:
                self.running -= 1


def read(win, fake, pos, n):
    """Bytes [pos, pos + n) through the window, as CheckpointReader reads."""
    out = bytearray()
    while n > 0 and pos < win.size:
        lo = pos // SPAN * SPAN
        base = win.place(lo) + (pos - lo)
        take = min(n, lo + SPAN - pos, win.size - pos)
        with fake.lock:
            fake.copying.add(base - (pos - lo))
        out += fake.region[base:base + take]
        with fake.lock:
            fake.copying.discard(base - (pos - lo))
        pos += take
        n -= take
    return bytes(out)


@pytest.mark.parametrize("slots,workers", [(2, 1), (3, 2), (6, 4)])
def test_every_access_pattern_gives_the_versions_bytes(slots, workers):
    size = 23 * SPAN + 17
    fake = Fake(size, slots)
    with ThreadPoolExecutor(workers) as pool:
        win = Window(fake.fetch, pool, size, SPAN, slots, workers)
        starts = list(range(0, size, SPAN))
        win.start(starts[-1:] + starts[:-1])
        # A zip reader: the directory at the end, then in order.
        assert read(win, fake, size - 40, 40) == fake.data[-40:]
        assert read(win, fake, 0, size) == fake.data
        # Then anywhere, at random.
        rng = random.Random(slots)
        for _ in range(200):
            pos = rng.randrange(size)
            n = rng.randrange(1, 3 * SPAN)
            assert read(win, fake, pos, n) == fake.data[pos:pos + n], (pos, n)
        assert win.close()
    assert fake.most <= workers
    # Sequential reading reads each range about once (ahead, not again).
    assert len(fake.reads) < 24 + 200 * 4


def test_a_failed_read_is_raised_where_its_range_is_wanted():
    size = 10 * SPAN
    fake = Fake(size, 3, fail_at=4 * SPAN)
    with ThreadPoolExecutor(2) as pool:
        win = Window(fake.fetch, pool, size, SPAN, 3, 2)
        win.start([0, SPAN])
        assert read(win, fake, 0, 4 * SPAN) == fake.data[:4 * SPAN]
        with pytest.raises(OSError, match="range 4000 failed"):
            read(win, fake, 4 * SPAN, 10)
        assert not win.close()


def test_a_window_needs_two_slots():
    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(ValueError, match="at least 2"):
            Window(lambda *a: None, pool, 10 * SPAN, SPAN, 1, 1)
