"""The multi-host rig: namespaces, veth, a shaped link and pinned CPUs
come up and go away cleanly, and sluice spread over its hosts returns what
one data dir returns."""

import os
import subprocess
import tempfile
import urllib.request

import pyarrow as pa

import sluice
from rig import ours, rig_cmd, up
from serve import SLUICE

SQL = ("SELECT key, label, to_tensor(resize(decode_image(data), 32, 32)) AS img "
       "FROM pets ORDER BY key")


def gen(d, name, classes, per_class):
    src = os.path.join(d, "src", name)
    subprocess.run([SLUICE, "gen-sample", src, "--classes", str(classes), "--per-class",
                    str(per_class)], check=True, capture_output=True)
    return os.path.dirname(src)


def sql_arrow(data_dir, query, *args):
    p = subprocess.run([SLUICE, "--data-dir", data_dir, "sql", query, "--format", "arrow", *args],
                       capture_output=True, check=True)
    return pa.ipc.open_stream(p.stdout).read_all()


def allowed_cpus(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return line.split()[1]
    return None


def test_the_rig_comes_up_and_goes_down_cleanly():
    with tempfile.TemporaryDirectory() as d:
        rig_dir = os.path.join(d, "rig")
        root = gen(d, "pets", 2, 4)
        env = up(rig_dir, "--storage", "2", "--compute", "1", "--link", "100Mbit",
                 "--ingest-root", root)
        try:
            assert env["REST"].startswith("http://") and env["FLIGHT"].startswith("http://")
            assert len(env["STORAGE"].split(",")) == 2 and len(env["COMPUTE"].split(",")) == 1
            with urllib.request.urlopen(env["REST"] + "/healthz", timeout=10) as r:
                assert r.status == 200
            # Four hosts, each process pinned to its side's CPUs.
            assert sorted(ours()) == ["slrig-c0", "slrig-coord", "slrig-s0", "slrig-s1"]
            with open(os.path.join(rig_dir, "pids")) as f:
                pins = [allowed_cpus(line.split()[0]) for line in f]
            assert pins[:2] == [env["STORAGE_CPUS"]] * 2, pins
            assert set(pins[2:]) == {env["COMPUTE_CPUS"]}, pins
            # The storage hosts' egress is shaped, and `link` reshapes it live.
            shaped = subprocess.run(["ip", "netns", "exec", "slrig-s0", "tc", "qdisc", "show",
                                     "dev", "eth0"], capture_output=True, text=True).stdout
            assert "tbf" in shaped and "100Mbit" in shaped, shaped
            rig_cmd("link", "1Gbit", rig_dir=rig_dir)
            shaped = subprocess.run(["ip", "netns", "exec", "slrig-s1", "tc", "qdisc", "show",
                                     "dev", "eth0"], capture_output=True, text=True).stdout
            assert "1Gbit" in shaped, shaped
            # A second rig while one is up is refused, and names the first.
            again = rig_cmd("up", "--storage", "1", rig_dir=rig_dir, check=False)
            assert again.returncode != 0 and "already up" in again.stderr
        finally:
            rig_cmd("down", rig_dir=rig_dir)
        assert ours() == []
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert "slrig0" not in links and "slr-" not in links
        assert not os.path.exists(rig_dir)
        # Down, then up again: nothing of the first rig is in the way.
        up(rig_dir, "--storage", "1", "--compute", "0")
        rig_cmd("down", rig_dir=rig_dir)
        assert ours() == []


def test_the_rig_returns_what_one_data_dir_returns():
    with tempfile.TemporaryDirectory() as d:
        rig_dir = os.path.join(d, "rig")
        root = gen(d, "pets", 3, 7)
        embedded = os.path.join(d, "embedded")
        subprocess.run([SLUICE, "--data-dir", embedded, "ingest", "pets",
                        os.path.join(root, "pets")], check=True, capture_output=True)
        want = sql_arrow(embedded, SQL)
        assert want.num_rows == 21
        env = up(rig_dir, "--storage", "2", "--compute", "1", "--link", "1Gbit",
                 "--ingest-root", root)
        try:
            client = os.path.join(d, "client")
            for how, args in [
                ("a compute node", ["--connect", env["COMPUTE"]]),
                ("the coordinator's Flight", ["--connect", env["FLIGHT"]]),
                ("all on storage", ["--connect", env["COMPUTE"], "--offload", "storage"]),
                ("all on compute", ["--connect", env["COMPUTE"], "--offload", "compute"]),
            ]:
                got = sql_arrow(client, SQL, *args)
                assert got.equals(want), f"the rig via {how} differs from one data dir"
            # A job over REST, through the coordinator, over both nodes.
            c = sluice.Client(env["REST"])
            job = c.submit("SELECT key, label, to_tensor(resize(decode_image(data), 32, 32)) AS img "
                           "FROM pets", batch_size=5)
            assert job.wait()["samples"] == 21
            rows = pa.Table.from_batches(list(job.reader(0, 0).batches())).sort_by("key")
            assert rows.column("img").equals(want.column("img"))
            assert rows.column("label").equals(want.column("label"))
        finally:
            rig_cmd("down", rig_dir=rig_dir)


def photos(d, n, w=1024, h=768):
    """Photo-like JPEGs (smooth colour fields and fine noise), ~200 KB each."""
    import numpy as np
    from PIL import Image
    os.makedirs(d, exist_ok=True)
    for i in range(n):
        rng = np.random.default_rng(i)
        small = rng.integers(0, 256, size=(h // 64, w // 64, 3), dtype=np.uint8)
        base = np.asarray(Image.fromarray(small).resize((w, h), Image.BICUBIC), dtype=np.int16)
        noise = rng.integers(-12, 13, size=(h, w, 3), dtype=np.int16)
        img = Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))
        img.save(os.path.join(d, f"img{i:04d}.jpg"), quality=90)


def test_a_job_moves_its_cut_when_the_link_is_throttled_mid_run():
    """Compute has both CPUs, storage one: an auto job ships the raw
    photos to compute. Throttled to 100 Mbit/s mid-run, the job is
    link-bound, and moves the decoding to storage at a window boundary;
    every delivered byte is what an unthrottled run delivers."""
    sql = "SELECT key, to_tensor(resize(decode_image(data), 32, 32)) AS img FROM photos"
    with tempfile.TemporaryDirectory() as d:
        rig_dir = os.path.join(d, "rig")
        root = os.path.join(d, "src")
        photos(os.path.join(root, "photos"), 240)
        env = up(rig_dir, "--storage", "1", "--compute", "0", "--link", "1Gbit",
                 "--storage-cpus", "0", "--compute-cpus", "0-1", "--ingest-root", root)
        try:
            c = sluice.Client(env["REST"])
            steady = c.submit(sql, batch_size=8)
            first = steady.explain()
            assert first["placement"]["pipelines"][0]["choice"] == {"kind": "cut", "cut": 0}, \
                first["text"]
            assert first["placement"]["pipelines"][0]["calibration"]["kind"] == "measured", \
                first["text"]
            want = pa.Table.from_batches(list(steady.reader(0, 0).batches()))
            assert not steady.status().get("replans"), steady.status()["replans"]

            job = c.submit(sql, batch_size=8)
            got, throttled = [], False
            for b in job.reader(0, 0).batches():
                got.append(b)
                if not throttled and sum(x.num_rows for x in got) >= 24:
                    rig_cmd("link", "100Mbit", rig_dir=rig_dir)
                    throttled = True
            rig_cmd("link", "1Gbit", rig_dir=rig_dir)
            assert pa.Table.from_batches(got).equals(want), "the moved job delivered other bytes"
            st = job.status()
            moves = st.get("replans", [])
            assert moves, f"no re-plan: {st.get('observed')}"
            m = moves[0]
            assert m["from"] == "cut 0" and m["to"] in ("cut 1", "cut 2"), m
            assert m["measured"]["bottleneck"] == "link", m
            assert m["link_bytes_per_s"] < 0.7 * 1.25e8, m
            explained = job.explain()
            assert explained["replans"] == moves
            assert "re-planned" in explained["text"] and "link bound" in explained["text"]
            assert explained["placement"]["pipelines"][0]["choice"]["cut"] == int(m["to"][-1])
            # Per-stage statistics over separate machines: each tier on its
            # own, and the decodes (fused with the resize or not) the storage
            # node ran after the move
            # reported back under the node's name.
            analyze = explained["analyze"]
            assert {t["tier"] for t in analyze["tiers"]} == {"storage", "link", "compute",
                                                             "trainer"}, analyze
            on_storage = [s for s in analyze["stages"] if s["tier"] == "storage"]
            assert any(s["udf"].startswith("decode") for s in on_storage), analyze
            assert all(s["node"] and s["samples_per_s"] > 0 for s in on_storage), analyze
        finally:
            rig_cmd("down", rig_dir=rig_dir)
