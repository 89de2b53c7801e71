#!/usr/bin/env python3
"""One trainer's images/s with torchvision's standard training transform:
a sluice job vs the loaders people use, on the same files and cores, in
one run.

The transform is RandomResizedCrop(224) + RandomHorizontalFlip +
ToTensor + Normalize (float32, ImageNet's mean and std), on ImageNet-like
JPEGs the bench generates (ImageNet's spread of sides around 500x375 with
some large photos; mean size printed). Each loader runs in a process of
its own for a warm-up epoch and `--runs` timed epochs, and hands a
trainer loop float32 batches of `--batch` with their labels:

* sluice: `sluice serve` on this machine, the job
  `normalize(random_horizontal_flip(random_resized_crop(
  decode_image(data), 224, 224)), mean, std)` (float32 CHW), read by the
  Python client (`sluice`), and the same job through `sluice.torch.Dataset`
  in a DataLoader of `--workers` persistent workers (`sluice-torch`: each
  worker reads every Nth batch of the share, batches reach the trainer
  through a shared-memory ring);
* PyTorch DataLoader + torchvision transforms on PIL, `--workers` workers
  (persistent, as fast as DataLoader gets), and the same on Pillow-SIMD;
* tf.data with AUTOTUNE: `sample_distorted_bounding_box` +
  `decode_and_crop_jpeg` (decodes only the crop), resize, flip, normalize;
* DALI's CPU pipeline with `--workers` threads: `image_random_crop`,
  `resize`, `crop_mirror_normalize`.

It also prints the decode-bound limit: sluice's kernel rate on one core
(`sluice bench udf`, the same SQL over the same files in memory, taken
right before and right after sluice's run and averaged) times the cores,
and, for each of sluice's epochs, the two factors of its share of that
limit: the kernels' CPU per image over the server's (the server's work
besides the kernels), and the share of the cores left idle. Beside it, the
same kernels run on every core at once (one process per core, rates
summed, also before and after sluice's run): the cores then share caches
and memory bandwidth, as the server's threads do.
The peers are installed by this bench into venvs of its own (never by
the test command): `python/requirements-bench.txt` in
`<cache>/bench-venv`, and Pillow-SIMD in `<cache>/bench-venv-simd`, which
sees the first venv's packages through a .pth file and shadows its PIL.
Use the optimized build of sluice (`cargo build --release`): a debug
binary is refused. Any Python 3 runs it (the driver needs only the
standard library; the loaders run in the venvs):

    python3 scripts/bench_loaders.py --sluice $CARGO_TARGET_DIR/release/sluice
"""

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
SQL = (
    "SELECT label, normalize(random_horizontal_flip(random_resized_crop("
    f"decode_image(data), 224, 224)), {MEAN}, {STD}) AS image FROM imagenet"
)
LOADERS = ("sluice", "sluice-torch", "torch-pil", "torch-pillow-simd", "tf.data", "dali")


# ---- venvs -----------------------------------------------------------------

def venv_python(path):
    return os.path.join(path, "bin", "python")


def has(python, *modules):
    code = "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))"
    return os.path.exists(python) and subprocess.run([python, "-c", code, *modules]).returncode == 0


def ensure_venvs(cache):
    """The peers' venvs, made when missing."""
    peers = os.path.join(cache, "bench-venv")
    simd = os.path.join(cache, "bench-venv-simd")
    py = venv_python(peers)
    if not has(py, "torchvision", "tensorflow", "nvidia.dali", "pyarrow", "sluice"):
        print(f"== peers into {peers} (torch, torchvision, tensorflow-cpu, DALI: several GB)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", peers], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "-r",
                        os.path.join(ROOT, "python", "requirements-bench.txt")], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "-e", os.path.join(ROOT, "python")], check=True)
    spy = venv_python(simd)
    check = "import PIL, sys; sys.exit('post' not in PIL.__version__)"
    if not os.path.exists(spy) or subprocess.run([spy, "-c", check]).returncode != 0:
        print(f"== Pillow-SIMD into {simd} (built with AVX2)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", simd], check=True)
        site = subprocess.run([spy, "-c", "import site; print(site.getsitepackages()[0])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        peer_site = subprocess.run([py, "-c", "import site; print(site.getsitepackages()[0])"],
                                   check=True, capture_output=True, text=True).stdout.strip()
        with open(os.path.join(site, "sluice-bench-peers.pth"), "w") as f:
            f.write(peer_site + "\n")
        env = dict(os.environ, CC="cc -mavx2")
        subprocess.run([spy, "-m", "pip", "install", "-q", "--no-deps", "--no-binary", "pillow-simd",
                        "pillow-simd"], check=True, env=env)
    return py, spy


# ---- data ------------------------------------------------------------------

def imagenet_sides(rng):
    """A (width, height) drawn like ImageNet's train set: most photos 500 on
    the long side (500x375, 500x333, 375x500, ...), some smaller, a few
    large."""
    u = rng.random()
    if u < 0.70:
        long, short = 500, int(rng.choice([375, 333, 281, 500, 400, 350]))
    elif u < 0.93:
        long = int(rng.integers(200, 500))
        short = int(long * rng.uniform(0.6, 1.0))
    else:
        long = int(rng.integers(600, 2000))
        short = int(long * rng.uniform(0.6, 0.8))
    return (long, short) if rng.random() < 0.75 else (short, long)


def photo(w, h, rng):
    """Photo-like content: smooth colour fields, edges and grain, so that
    JPEG sizes come out near ImageNet's (~110 KB at 500x375, quality 90)."""
    import numpy as np
    from PIL import Image

    small = rng.integers(0, 256, size=(max(h // 24, 2), max(w // 24, 2), 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(small).resize((w, h), Image.BICUBIC), dtype=np.int16)
    grain = rng.normal(0, 12, size=(h, w, 1)) + rng.normal(0, 5, size=(h, w, 3))
    return Image.fromarray(np.clip(base + grain, 0, 255).astype(np.uint8))


def make_dataset(d, n, classes, seed):
    import numpy as np

    stamp = os.path.join(d, f".done-{n}-{classes}-{seed}")
    if os.path.exists(stamp):
        return
    shutil.rmtree(d, ignore_errors=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        c = os.path.join(d, f"class{i % classes:03d}")
        os.makedirs(c, exist_ok=True)
        w, h = imagenet_sides(rng)
        photo(w, h, rng).save(os.path.join(c, f"img{i:06d}.jpg"), quality=90)
    open(stamp, "w").close()


def listing(d):
    paths, labels = [], []
    for c in sorted(os.listdir(d)):
        if c.startswith("."):
            continue
        for f in sorted(os.listdir(os.path.join(d, c))):
            paths.append(os.path.join(d, c, f))
            labels.append(int(c[5:]))
    return paths, labels


# ---- loaders (each in a process of its own) --------------------------------

def timed_epochs(epoch, runs, server=None):
    """Runs epoch(e) once to warm up and `runs` times timed; images/s each.

    With `server` (a sluice server), each timed epoch also records the
    server's CPU milliseconds per image and the share of the machine's
    cores that sat idle: the two factors of sluice's distance to the
    decode-bound limit (see `where_the_gap_is`)."""
    epoch(0)
    rates, ms, idle, threads = [], [], [], []
    for r in range(runs):
        c, i, t = server.cpu_seconds() if server else 0, idle_seconds(), time.perf_counter()
        by = server.cpu_by_thread() if server else {}
        n = epoch(r + 1)
        wall = time.perf_counter() - t
        rates.append(n / wall)
        if server:
            ms.append((server.cpu_seconds() - c) * 1e3 / n)
            idle.append((idle_seconds() - i) / (wall * os.cpu_count()))
            after = server.cpu_by_thread()
            threads.append({k: (v - by.get(k, 0.0)) * 1e3 / n for k, v in after.items()
                            if v > by.get(k, 0.0)})
    if not server:
        return rates
    return {"rates": rates, "server_ms_per_image": ms, "idle_share": idle,
            "thread_ms_per_image": threads}


def idle_seconds():
    """Seconds the machine's cores have been idle (or waiting on I/O) so far."""
    with open("/proc/stat") as f:
        cpu = f.readline().split()
    return (int(cpu[4]) + int(cpu[5])) / os.sysconf("SC_CLK_TCK")


def consume(x, y, batch):
    """The trainer's side: a float32 batch [n, 3, 224, 224] (or NHWC) and labels."""
    assert x.shape[0] == len(y) and x.shape[0] <= batch, (x.shape, len(y))
    return x.shape[0]


@contextlib.contextmanager
def sluice_job(a):
    """`sluice serve` on this machine over the images, and the job of SQL
    on them, submitted and ready: (the job, the server)."""
    sys.path.insert(0, HERE)
    from sluice_server import Server

    work = tempfile.mkdtemp(prefix="sluice-bench-loaders-")
    try:
        server = Server(a.sluice, work, a.data)
        with server as client:
            client.ingest("imagenet", a.data)
            job = client.submit(SQL, batch_size=a.batch, epochs=a.runs + 1, shuffle={"seed": 1})
            job.wait()
            yield job, server
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_sluice(a, paths, labels):
    with sluice_job(a) as (job, server):
        def epoch(e):
            return sum(consume(b["image"], b["label"], a.batch)
                       for b in job.reader(0, e, numpy=True))

        return timed_epochs(epoch, a.runs, server)


def run_sluice_torch(a, paths, labels):
    """The same job through sluice's torch ``Dataset`` and a DataLoader of
    ``workers`` persistent workers: each reads every Nth batch of the
    rank's share and hands batches to the trainer in a shared-memory
    ring."""
    import torch
    from sluice.torch import Dataset

    with sluice_job(a) as (job, server):
        ds = Dataset(job)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=a.workers,
                                             persistent_workers=True)

        def epoch(e):
            ds.set_epoch(e)
            return sum(consume(b["image"], b["label"], a.batch) for b in loader)

        return timed_epochs(epoch, a.runs, server)


def run_torch(a, paths, labels):
    import torch
    from PIL import Image
    from torchvision import transforms

    tf = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(MEAN, STD),
    ])

    class Files(torch.utils.data.Dataset):
        def __len__(self):
            return len(paths)

        def __getitem__(self, i):
            with open(paths[i], "rb") as f:
                img = Image.open(f).convert("RGB")
            return tf(img), labels[i]

    torch.set_num_threads(1)
    loader = torch.utils.data.DataLoader(Files(), batch_size=a.batch, shuffle=True,
                                         num_workers=a.workers, persistent_workers=True)
    return timed_epochs(lambda e: sum(consume(x, y, a.batch) for x, y in loader), a.runs)


def run_tf(a, paths, labels):
    import tensorflow as tf

    mean = tf.constant(MEAN) * 255.0
    std = tf.constant(STD) * 255.0

    def load(path, label):
        data = tf.io.read_file(path)
        shape = tf.io.extract_jpeg_shape(data)
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape, tf.zeros([0, 0, 4]), min_object_covered=0.0, aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=(0.08, 1.0), max_attempts=10, use_image_if_no_bounding_boxes=True)
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        img = tf.io.decode_and_crop_jpeg(data, window, channels=3)
        img = tf.image.resize(img, [224, 224], method="bilinear", antialias=True)
        img = tf.image.random_flip_left_right(img)
        return tf.transpose((img - mean) / std, [2, 0, 1]), label

    ds = (tf.data.Dataset.from_tensor_slices((paths, labels))
          .shuffle(len(paths), reshuffle_each_iteration=True)
          .map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
          .batch(a.batch)
          .prefetch(tf.data.AUTOTUNE))
    return timed_epochs(lambda e: sum(consume(x.numpy(), y.numpy(), a.batch) for x, y in ds), a.runs)


def run_dali(a, paths, labels):
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    @pipeline_def(batch_size=a.batch, num_threads=a.workers, device_id=None)
    def pipe():
        jpegs, label = fn.readers.file(files=paths, labels=labels, random_shuffle=True, name="r")
        img = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                            random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        img = fn.resize(img, resize_x=224, resize_y=224)
        img = fn.crop_mirror_normalize(img, dtype=types.FLOAT, output_layout="CHW",
                                       mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD],
                                       mirror=fn.random.coin_flip())
        return img, label

    p = pipe()
    p.build()
    it = DALIGenericIterator(p, ["x", "y"], reader_name="r", last_batch_policy=LastBatchPolicy.PARTIAL,
                             auto_reset=True)
    return timed_epochs(lambda e: sum(consume(b[0]["x"], b[0]["y"], a.batch) for b in it), a.runs)


RUNNERS = {"sluice": run_sluice, "sluice-torch": run_sluice_torch, "torch-pil": run_torch,
           "torch-pillow-simd": run_torch, "tf.data": run_tf, "dali": run_dali}


def worker(a):
    paths, labels = listing(a.data)
    print(json.dumps(RUNNERS[a.worker](a, paths, labels)))


# ---- the run ---------------------------------------------------------------

def kernel_rate(a, at_once=1):
    """sluice's per-core rate for the same SQL over the same files in memory;
    with `at_once` > 1, that many one-core runs at the same time, and the
    sum of their rates (what the machine's cores decode together, sharing
    caches and memory bandwidth as the server's threads do)."""
    flat = tempfile.mkdtemp(prefix="sluice-bench-kernel-")
    try:
        paths, _ = listing(a.data)
        for p in paths:
            os.symlink(p, os.path.join(flat, os.path.basename(p)))
        sql = SQL.replace("label, ", "").replace("FROM imagenet", "FROM files")
        outs = [os.path.join(flat, f"rate{i}.json") for i in range(at_once)]
        runs = [subprocess.Popen([a.sluice, "bench", "udf", "--dir", flat, "--sql", sql, "--runs",
                                  str(a.runs), "--json", out], stdout=subprocess.DEVNULL)
                for out in outs]
        for r in runs:
            if r.wait() != 0:
                sys.exit(f"bench_loaders: sluice bench udf failed ({r.returncode})")
        return sum(json.load(open(out))["samples_per_s"] for out in outs)
    finally:
        shutil.rmtree(flat, ignore_errors=True)


def where_the_gap_is(costs, per_core):
    """Splits sluice's share of the decode-bound limit into its two factors:
    the kernels' CPU per image over the server's (work the server does
    besides the kernels: reads, the copy into the slot, scheduling) and
    the share of the cores that were busy (waiting), epoch by epoch.
    Their product is the epoch's share of the limit, less what the
    trainer process and the rest of the machine used."""
    kernel_ms = 1e3 / per_core
    threads = costs.get("thread_ms_per_image") or [{}] * len(costs["rates"])
    for i, (ms, idle, by) in enumerate(zip(costs["server_ms_per_image"], costs["idle_share"],
                                          threads), 1):
        split = ", ".join(f"{k} {v:.2f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1])
                          if v >= 0.01)
        print(f"    epoch {i}: server {ms:.2f} ms of CPU per image (kernels {kernel_ms:.2f}: "
              f"{kernel_ms / ms:.2f}), cores idle {idle:.0%}; by thread: {split}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sluice", required=True, help="the sluice binary (release build)")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="DataLoader workers / DALI threads")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/sluice"),
                    help="where the peers' venvs and the generated images live")
    ap.add_argument("--json", help="also write the medians here (scripts/report.py plots them)")
    ap.add_argument("--worker", choices=LOADERS, help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    if "/debug/" in os.path.realpath(a.sluice):
        sys.exit("bench_loaders: use the optimized build (cargo build --release), not a debug binary")
    py, spy = ensure_venvs(a.cache)
    a.data = os.path.join(a.cache, "bench-imagenet")
    subprocess.run([py, "-c", f"import sys; sys.path.insert(0, {HERE!r}); import bench_loaders as b; "
                    f"b.make_dataset({a.data!r}, {a.images}, {a.classes}, 7)"], check=True)
    paths, _ = listing(a.data)
    sizes = [os.path.getsize(p) for p in paths]
    print(f"{len(paths)} JPEGs, mean {statistics.mean(sizes) / 1e3:.0f} KB, median "
          f"{statistics.median(sizes) / 1e3:.0f} KB; batches of {a.batch}; {a.workers} workers/threads; "
          f"median of {a.runs} epochs after a warm-up; {os.cpu_count()} cores", flush=True)
    results, costs = {}, {}
    # The kernel rate is taken right before and right after sluice's own
    # run: this machine's speed drifts over the minutes the peers take.
    kernel, together = [], []
    for name in a.loaders.split(","):
        python = spy if name == "torch-pillow-simd" else py
        if name == "sluice":
            kernel.append(kernel_rate(a))
            together.append(kernel_rate(a, os.cpu_count()))
        cmd = [python, __file__, "--sluice", a.sluice, "--worker", name, "--data", a.data,
               "--batch", str(a.batch), "--workers", str(a.workers), "--runs", str(a.runs)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"  {name}: failed\n{out.stderr[-2000:]}", flush=True)
            continue
        rates = json.loads(out.stdout.strip().splitlines()[-1])
        if isinstance(rates, dict):
            costs[name] = rates
            rates = rates["rates"]
        results[name] = statistics.median(rates)
        print(f"  {name:<20} {results[name]:8.1f} images/s  (epochs: "
              f"{', '.join(f'{r:.0f}' for r in rates)})", flush=True)
        if name == "sluice":
            kernel.append(kernel_rate(a))
            together.append(kernel_rate(a, os.cpu_count()))
    kernel = kernel or [kernel_rate(a)]
    per_core = statistics.mean(kernel)
    limit = per_core * os.cpu_count()
    print(f"  decode-bound limit: {per_core:.1f} images/s per core x {os.cpu_count()} = {limit:.1f} "
          f"(per core before and after sluice's run: {', '.join(f'{k:.0f}' for k in kernel)})")
    # The same kernels on every core at once: the cores share caches and
    # memory bandwidth, as the server's threads do.
    all_cores = statistics.mean(together) if together else None
    if all_cores:
        print(f"  decode-bound limit, every core at once: {all_cores:.1f} images/s "
              f"(before and after: {', '.join(f'{k:.0f}' for k in together)}; "
              f"{all_cores / limit:.2f} of the one-core figure x cores)")
    if "sluice" in results:
        ours = results["sluice"]
        for name, r in results.items():
            if name != "sluice":
                print(f"  sluice / {name}: {ours / r:.2f}x")
        peers = [results[n] for n in ("torch-pillow-simd", "tf.data", "dali") if n in results]
        if peers:
            print(f"  sluice / best of tf.data, DALI, Pillow-SIMD: {ours / max(peers):.2f}x (goal 1.2x)")
        if "torch-pil" in results:
            print(f"  sluice / DataLoader + PIL: {ours / results['torch-pil']:.2f}x (goal 2.0x)")
        print(f"  sluice / decode-bound limit: {ours / limit:.2f} (goal 0.85)"
              + (f"; / every core at once: {ours / all_cores:.2f}" if all_cores else ""))
        if "sluice" in costs:
            where_the_gap_is(costs["sluice"], per_core)
    if "sluice-torch" in results:
        ours = results["sluice-torch"]
        peers = [results[n] for n in ("torch-pillow-simd", "tf.data", "dali") if n in results]
        if peers:
            print(f"  sluice-torch / best of tf.data, DALI, Pillow-SIMD: {ours / max(peers):.2f}x")
        print(f"  sluice-torch / decode-bound limit: {ours / limit:.2f}"
              + (f"; / every core at once: {ours / all_cores:.2f}" if all_cores else ""))
        if "sluice-torch" in costs:
            where_the_gap_is(costs["sluice-torch"], per_core)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"title": f"{len(paths)} ImageNet-like JPEGs, the standard training transform, "
                                f"batches of {a.batch}, {os.cpu_count()} cores, median of {a.runs} epochs",
                       "source": "scripts/bench_loaders.py --json",
                       "images_per_s": {**results, "decode-bound limit": limit,
                                        **({"decode-bound limit, every core at once": all_cores}
                                           if all_cores else {})}}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
