"""The dashboard in a real browser (headless Chromium over the DevTools
protocol) against a real `serve` with a token: a missing and a wrong token
show a clear message, never a blank page; signed in, a running job appears
with its progress moving, its placement drawn with the bottleneck marked;
cancel works from the page. Screenshots go to artifacts/dashboard/."""

import os
import threading
import time

import pytest

from browser import Browser, chromium
from serve import generate, serve_env, start_serve

TOKEN = "dash-s3cret"
ARTIFACTS = os.environ.get(
    "SLUICE_ARTIFACTS",
    os.path.join(os.path.dirname(__file__), "..", "..", "artifacts"))
SQL = ("SELECT key, label, to_tensor(resize(decode_image(data), 256, 256, 'lanczos3')) AS image "
       "FROM pets")


def sign_in(browser, url):
    """Opens the dashboard afresh and signs in with the token."""
    browser.open(url + "/")
    browser.eval("sessionStorage.clear(); true")
    browser.open(url + "/")
    browser.wait("!document.getElementById('login').hidden", what="the token form")
    browser.eval(f"document.getElementById('token').value = '{TOKEN}';"
                 "document.getElementById('login').requestSubmit(); true")
    browser.wait("!document.getElementById('main').hidden", what="the dashboard")


def shot(browser, name):
    path = browser.screenshot(os.path.join(ARTIFACTS, "dashboard", f"{name}.png"))
    assert os.path.getsize(path) > 1000
    return path


@pytest.fixture(scope="module")
def browser():
    binary = chromium()
    if not binary:
        pytest.skip("Chromium is not installed (scripts/deps.sh installs Debian's chromium)")
    with Browser(binary) as b:
        yield b


@pytest.fixture(scope="module")
def server():
    import sluice
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        env = serve_env(d, SLUICE_TOKEN=TOKEN)
        src = generate(d, env, "pets", 3, 40)
        proc, rest = start_serve(d, env)
        try:
            c = sluice.Client(rest, token=TOKEN)
            c.ingest("pets", src)
            yield c
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0


def test_a_missing_or_wrong_token_is_a_clear_message(server, browser):
    browser.open(server.url + "/")
    browser.eval("sessionStorage.clear(); true")
    browser.open(server.url + "/")
    text = browser.wait("!document.getElementById('login').hidden && "
                        "document.getElementById('message').textContent", what="the token form")
    assert "requires a bearer token" in text, text
    assert browser.eval("document.getElementById('main').hidden")
    shot(browser, "1-token-required")
    browser.eval("document.getElementById('token').value = 'wrong';"
                 "document.getElementById('login').requestSubmit(); true")
    text = browser.wait("document.getElementById('message').textContent.includes('refused') && "
                        "document.getElementById('message').textContent", what="the refusal")
    assert "the server refused this token" in text, text
    shot(browser, "2-token-refused")


def test_a_running_job_moves_and_is_cancelled_from_the_page(server, browser):
    c = server
    job = c.submit(SQL, batch_size=8, offload="1")
    idle = c.submit(SQL, batch_size=8)
    # A trainer that reads a batch every 0.3 s: the job runs for seconds.
    stop = threading.Event()

    def read():
        for _ in job.reader(0, 0).batches():
            if stop.wait(0.3):
                return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    try:
        sign_in(browser, c.url)
        row = f"document.querySelector('#jobs tr[data-job=\"{job.id}\"]')"
        browser.wait(f"!!{row}", what="the job's row")
        # Show the reading job, and watch its progress move.
        browser.eval(f"{row}.click(); true")
        progress = f"{row}.children[2].textContent"
        first = browser.wait(f"{row}.dataset.state === 'running' && {progress}",
                             what="the job running")
        moved = browser.wait(f"{progress} !== {first!r} && {progress}", timeout=30,
                             what="the progress moving")
        assert float(moved.strip().rstrip("%")) > float(first.strip().rstrip("%"))
        browser.wait("document.getElementById('job-id').textContent === " + repr(job.id))
        browser.wait("document.querySelectorAll('#ranks .bar').length > 0", what="rank progress")
        browser.wait("document.querySelector('#chart polyline') && "
                     "document.querySelector('#chart polyline').getAttribute('points').length > 0",
                     what="the rate chart")
        # The placement: decode on storage (cut 1), the resize on compute.
        lanes = browser.wait("[...document.querySelectorAll('#placement .lane')]"
                             ".map(l => l.dataset.lane).join(',')", what="the placement")
        assert lanes == "storage,link,compute,trainer", lanes
        lane = "document.querySelector('#placement .lane[data-lane=%s]').textContent"
        assert "decode_image" in browser.eval(lane % "storage")
        assert "resize" in browser.eval(lane % "compute")
        # The page marks the bottleneck the API names (the slow resize, or
        # the slow trainer, whichever the last seconds measured).
        marked = ("(() => { const l = document.querySelector('#placement .lane.hot');"
                  " return (l ? l.dataset.lane : '') + '|' +"
                  " document.getElementById('bottleneck').textContent; })()")
        where = {"resize": "compute", "to_tensor": "compute", "decode_image": "storage"}
        for _ in range(60):
            b = job.status().get("stages", {}).get("bottleneck")
            page_lane, sentence = browser.eval(marked).split("|", 1)
            if b:
                want = where.get(b.get("stage")) if b["tier"] == "cpu" else b["tier"]
                if page_lane == want and sentence.startswith(f"Bottleneck: {b['tier']}"):
                    break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the page marks {page_lane!r} ({sentence!r}); the API says {b}")
        datasets = browser.wait("document.querySelector('#datasets tbody').textContent",
                                what="the datasets")
        assert "pets" in datasets and "image" in datasets, datasets
        device = browser.wait("document.getElementById('device').textContent.includes('chunks')"
                              " && document.getElementById('device').textContent")
        assert "free" in device, device
        assert "up" in browser.eval("document.querySelector('#nodes tbody').textContent")
        shot(browser, "3-job-running")

        # Cancel the other job from its row.
        other = f"document.querySelector('#jobs tr[data-job=\"{idle.id}\"]')"
        browser.wait(f"!!({other} && {other}.querySelector('button.cancel'))",
                     what="the other job's cancel button")
        browser.eval(f"{other}.querySelector('button.cancel').click(); true")
        for _ in range(50):
            if idle.status()["state"] == "cancelled":
                break
            time.sleep(0.2)
        assert idle.status()["state"] == "cancelled"
        browser.wait(f"{other}.dataset.state === 'cancelled'", what="the row cancelled")
        shot(browser, "4-job-cancelled")
        # The page kept working: the reading job is still running.
        assert job.status()["state"] in ("running", "done")
    finally:
        stop.set()
        t.join(timeout=30)


def test_a_mixture_shows_its_parts_and_shares(server, browser):
    """A mixture read to its end: the page lists its parts with the planned
    weights and the shares the trainer received, as the API gives them."""
    c = server
    job = c.submit(SQL, batch_size=8, shuffle={"seed": 2}, mix_epoch={"samples": 60},
                   mix=[{"dataset": "pets", "weight": 3, "name": "all"},
                        {"name": "zero", "weight": 1,
                         "sql": SQL + " WHERE label = 'class_0'"}])
    assert sum(b.num_rows for b in job.reader(0, 0).batches()) == 60
    sign_in(browser, c.url)
    row = f"document.querySelector('#jobs tr[data-job=\"{job.id}\"]')"
    browser.wait(f"!!{row}", what="the mixture's row")
    browser.eval(f"{row}.click(); true")
    browser.wait("!document.getElementById('mix-box').hidden", what="the mixture")
    cells = browser.wait("[...document.querySelectorAll('#mix tbody tr')].map(r =>"
                         " [...r.children].map(c => c.textContent).join('|')).join(';')",
                         what="the parts")
    shares = {p["name"]: p for p in job.status()["mix"]["parts"]}
    assert cells == ";".join(
        f"{n}|{w:.3f}|{shares[n]['samples']}|{shares[n]['delivered']}|{shares[n]['share']:.3f}"
        for n, w in [("all", 0.75), ("zero", 0.25)]), cells
    assert shares["zero"]["delivered"] == 15
    shot(browser, "mixture")
