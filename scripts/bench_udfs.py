#!/usr/bin/env python3
"""sluice's UDF pipelines vs the Python loaders people use, per core, in one run.

Generates the inputs, then times on one core, from bytes in memory:

* images: decode + random_resized_crop(224) + horizontal flip + normalize
  (float32 CHW), as torchvision's standard training transform, on ~500x375
  JPEGs and on 12 MP JPEGs.
  - sluice: `sluice bench udf` (the SQL UDFs, one partition);
  - Pillow: Image.open + convert + resize(box=crop) + transpose + numpy,
    plain (as torchvision does) and with Image.draft (Pillow's own DCT
    downscaling, which torchvision does not use);
  - Pillow-SIMD, the same code, when `--simd-python` names a Python that has it.
* video: 16 frames at 112x112 RGB from the start of each clip.
  - sluice: decode_video(data, 16, 112, 112);
  - PyAV: decode + frame.to_ndarray(width, height, 'rgb24'), one thread.

Prints samples/s (median of --runs) and sluice's ratio to each baseline.
"""

import argparse
import atexit
import io
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
SQL_IMAGES = (
    "SELECT normalize(random_horizontal_flip(random_resized_crop(decode_image(data), 224, 224)), "
    "[0.485, 0.456, 0.406], [0.229, 0.224, 0.225]) FROM files"
)
SQL_VIDEO = "SELECT decode_video(data, 16, 112, 112) FROM files"


def photo(w, h, seed):
    """A photo-like RGB image: smooth colour fields plus fine noise."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(max(h // 64, 2), max(w // 64, 2), 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(small).resize((w, h), Image.BICUBIC), dtype=np.int16)
    noise = rng.integers(-12, 13, size=(h, w, 3), dtype=np.int16)
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))


def write_images(d, n, w, h):
    os.makedirs(d, exist_ok=True)
    for i in range(n):
        photo(w, h, i).save(os.path.join(d, f"img{i:05d}.jpg"), quality=90)


def write_clips(d, n, frames=48, w=320, h=240):
    import av

    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        path = os.path.join(d, f"clip{i:04d}.mp4")
        with av.open(path, "w") as out:
            s = out.add_stream("libx264", rate=25)
            s.width, s.height, s.pix_fmt = w, h, "yuv420p"
            base = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
            for t in range(frames):
                img = np.roll(base, 4 * t, axis=1)
                for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                    out.mux(p)
            for p in s.encode():
                out.mux(p)


def rrc_params(rng, height, width, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision.transforms.RandomResizedCrop.get_params."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    return 0, 0, height, width


def pil_pipeline(blobs, draft):
    rng = random.Random(1)
    for b in blobs:
        im = Image.open(io.BytesIO(b))
        top, left, h, w = rrc_params(rng, im.height, im.width)
        if draft:
            # Pillow's DCT scaling: ask for the smallest size that still covers
            # the crop at 224, then map the box into the reduced image.
            full_w, full_h = im.size
            s = min(w / 224, h / 224)
            im.draft("RGB", (max(1, int(full_w / s)), max(1, int(full_h / s))))
            fx, fy = full_w / im.size[0], full_h / im.size[1]
            box = (left / fx, top / fy, (left + w) / fx, (top + h) / fy)
        else:
            box = (left, top, left + w, top + h)
        im = im.convert("RGB").resize((224, 224), Image.BILINEAR, box=box)
        if rng.random() < 0.5:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        a = (np.asarray(im, dtype=np.float32) / 255.0 - MEAN) / STD
        np.ascontiguousarray(a.transpose(2, 0, 1))


def pyav_pipeline(blobs):
    import av

    for b in blobs:
        with av.open(io.BytesIO(b)) as c:
            s = c.streams.video[0]
            s.thread_type = "NONE"
            s.codec_context.thread_count = 1
            frames = []
            for f in c.decode(s):
                frames.append(f.to_ndarray(width=112, height=112, format="rgb24"))
                if len(frames) == 16:
                    break
            np.stack(frames)


def timed(fn, blobs, runs):
    fn(blobs[: max(1, len(blobs) // 10)])  # warm-up
    rates = []
    for _ in range(runs):
        t = time.perf_counter()
        fn(blobs)
        rates.append(len(blobs) / (time.perf_counter() - t))
    return statistics.median(rates)


def load(d):
    return [open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))]


def sluice_rate(sluice, d, sql, runs):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            [sluice, "bench", "udf", "--dir", d, "--sql", sql, "--runs", str(runs), "--json", out.name],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        return json.load(open(out.name))["samples_per_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sluice", required=True, help="the sluice binary")
    ap.add_argument("--small", type=int, default=300, help="~500x375 JPEGs")
    ap.add_argument("--large", type=int, default=12, help="12 MP JPEGs")
    ap.add_argument("--clips", type=int, default=24, help="H.264 clips")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--simd-python", help="a Python with Pillow-SIMD installed")
    ap.add_argument("--pil-only", nargs=2, metavar=("DIR", "DRAFT"), help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.pil_only:  # run inside the Pillow-SIMD interpreter
        d, draft = args.pil_only
        print(json.dumps(timed(lambda b: pil_pipeline(b, draft == "1"), load(d), args.runs)))
        return

    work = tempfile.mkdtemp(prefix="sluice-bench-udfs-")
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    sets = [
        ("images ~500x375", os.path.join(work, "small"), args.small, (500, 375)),
        ("images 12 MP", os.path.join(work, "large"), args.large, (4000, 3000)),
    ]
    rows = []
    for name, d, n, (w, h) in sets:
        if n == 0:
            continue
        write_images(d, n, w, h)
        blobs = load(d)
        ours = sluice_rate(args.sluice, d, SQL_IMAGES, args.runs)
        base = {
            "Pillow": timed(lambda b: pil_pipeline(b, False), blobs, args.runs),
            "Pillow+draft": timed(lambda b: pil_pipeline(b, True), blobs, args.runs),
        }
        if args.simd_python:
            for label, draft in (("Pillow-SIMD", "0"), ("Pillow-SIMD+draft", "1")):
                out = subprocess.run(
                    [args.simd_python, __file__, "--sluice", args.sluice, "--runs", str(args.runs), "--pil-only", d, draft],
                    check=True, capture_output=True, text=True,
                )
                base[label] = float(out.stdout.strip())
        rows.append((name, ours, base))
    if args.clips:
        d = os.path.join(work, "clips")
        write_clips(d, args.clips)
        ours = sluice_rate(args.sluice, d, SQL_VIDEO, args.runs)
        rows.append(("video 16x112² from 320x240 H.264", ours, {"PyAV": timed(pyav_pipeline, load(d), args.runs)}))

    print(f"{'workload':<36} {'sluice/s':>10}   baselines (samples/s, sluice ratio)")
    for name, ours, base in rows:
        cells = "  ".join(f"{k} {v:.1f} ({ours / v:.2f}x)" for k, v in base.items())
        print(f"{name:<36} {ours:>10.1f}   {cells}")
    subprocess.run(["rm", "-rf", work], check=False)


if __name__ == "__main__":
    sys.exit(main())
