"""Writes the seed corpora of the fuzz targets under tests/fuzz/corpus: small
valid files of each kind a target reads (images in every format sluice
accepts, clips in four containers, arrays, plans, tickets, job bodies).
Run from the repository root in the test venv (Pillow, PyAV, numpy); the
files are committed, so this runs only when the seeds change."""
import io, json, os, shutil, struct, zipfile
import numpy as np
from PIL import Image
import av

root = "tests/fuzz/corpus"
def d(name):
    p = os.path.join(root, name); os.makedirs(p, exist_ok=True); return p
rng = np.random.default_rng(7)
y, x = np.mgrid[0:20, 0:24]
rgb = Image.fromarray(np.stack([x * 10, y * 12, (x ^ y) * 8], -1).astype(np.uint8))
img = d("decode_image")
p = lambda n: os.path.join(img, n)
rgb.save(p("baseline.jpg"), quality=80)
rgb.save(p("progressive.jpg"), progressive=True)
rgb.save(p("sub444.jpg"), subsampling=0)
rgb.convert("CMYK").save(p("cmyk.jpg"))
rgb.convert("L").save(p("gray.jpg"))
rgb.save(p("rgb.png"))
rgb.convert("P").save(p("palette_trns.png"), transparency=3)
Image.fromarray((rng.integers(0, 65535, (9, 11))).astype(np.uint16)).save(p("gray16.png"))
rgb.convert("LA").save(p("gray_alpha.png"))
rgb.convert("1").save(p("bilevel.png"))
rgb.convert("P").save(p("image.gif"))
rgb.save(p("rgb.bmp"))
rgb.convert("1").save(p("bilevel.bmp"))
rgb.save(p("lzw.tif"), compression="tiff_lzw")
rgb.save(p("raw.tif"))
rgb.save(p("lossy.webp"), quality=50)
rgb.save(p("lossless.webp"), lossless=True)
rgb.save(p("rgb.ppm"))
rgb.save(p("icon.ico"), sizes=[(16, 16)])

win = d("decode_window")
for name, kw in [("baseline", {}), ("sub444", {"subsampling": 0}), ("progressive", {"progressive": True})]:
    big = rgb.resize((72, 56))
    b = io.BytesIO(); big.save(b, "JPEG", quality=85, **kw)
    for knobs in [bytes([0, 40, 40, 128]), bytes([7, 0, 0, 255]), bytes([11, 200, 100, 30])]:
        open(os.path.join(win, f"{name}_{knobs.hex()}.bin"), "wb").write(knobs + b.getvalue())
vid = d("video")
def clip(path, fmt, codec, n=6, gop=3):
    out = av.open(path, "w", format=fmt)
    s = out.add_stream(codec, rate=10)
    s.width, s.height, s.pix_fmt = 32, 24, ("yuvj420p" if codec == "mjpeg" else "yuv420p")
    s.codec_context.gop_size = gop
    for i in range(n):
        f = av.VideoFrame.from_ndarray(np.roll(np.asarray(rgb.resize((32, 24))), i, 1), format="rgb24")
        for pk in s.encode(f): out.mux(pk)
    for pk in s.encode(): out.mux(pk)
    out.close()
clip(os.path.join(vid, "mpeg4.avi"), "avi", "mpeg4")
clip(os.path.join(vid, "mpeg2.mpg"), "mpeg", "mpeg2video")
clip(os.path.join(vid, "mjpeg.mkv"), "matroska", "mjpeg")
clip(os.path.join(vid, "mpeg4_one_key.mp4"), "mp4", "mpeg4", n=8, gop=100)
arr = d("arrays")
def npy(a):
    b = io.BytesIO(); np.save(b, a); return b.getvalue()
open(os.path.join(arr, "f32.npy"), "wb").write(npy(rng.random((3, 4), dtype=np.float32)))
open(os.path.join(arr, "u8_3d.npy"), "wb").write(npy(rng.integers(0, 255, (2, 3, 4), dtype=np.uint8)))
open(os.path.join(arr, "fortran.npy"), "wb").write(npy(np.asfortranarray(rng.random((3, 2)))))
open(os.path.join(arr, "i16_be.npy"), "wb").write(npy(np.arange(6, dtype=">i2")))
b = io.BytesIO(); np.savez(b, x=np.arange(5, dtype=np.float32)); open(os.path.join(arr, "x.npz"), "wb").write(b.getvalue())
b = io.BytesIO(); np.savez_compressed(b, x=np.arange(8, dtype=np.int32).reshape(2, 4)); open(os.path.join(arr, "x_deflated.npz"), "wb").write(b.getvalue())
pr = d("probe")
for src in ("decode_image", "video", "arrays"):
    for f in os.listdir(os.path.join(root, src)):
        shutil.copy(os.path.join(root, src, f), os.path.join(pr, f))
pl = d("plan")
for f in os.listdir("examples/pipelines"):
    if f.endswith(".yaml"):
        shutil.copy(os.path.join("examples/pipelines", f), os.path.join(pl, f))
plan = {"source": "pets", "filters": ["width >= 64"], "stages": [
    {"name": "image", "udf": "decode_resize", "args": ["data", 224, 224]},
    {"name": "t", "udf": "to_tensor", "args": ["image", {"lit": "float32"}]}], "outputs": ["key", "t"]}
open(os.path.join(pl, "plan.json"), "w").write(json.dumps(plan))
tk = d("ticket")
tickets = {
    "job.json": {"job": "job-1-abc", "rank": 1, "epoch": 0, "offset": 4, "limit": 8},
    "query.json": {"sql": "SELECT key FROM pets", "offload": "compute", "udf": {"on_error": "skip", "seed": 1, "epoch": 0,
                   "limits": {"max_pixels": 1000, "max_frames": 10, "max_decoded_bytes": 100, "max_sample_ms": 10}}},
    "checkpoint.json": {"checkpoint": "run/step-10", "version": 3, "offset": 0, "length": 4096},
}
for n, t in tickets.items():
    body = json.dumps(t).encode()
    open(os.path.join(tk, n), "wb").write(body)
    msg = b"\x0a" + bytes([len(body)]) + body  # Ticket { ticket: bytes = 1 }
    open(os.path.join(tk, n + ".grpc"), "wb").write(b"\x00" + struct.pack(">I", len(msg)) + msg)
jb = d("job_body")
bodies = {
    "sql.json": {"sql": "SELECT key, decode_resize(data, 64, 64) AS image FROM pets", "batch_size": 32, "epochs": 2,
                 "shuffle": {"seed": 7}, "world_size": 2, "drop_last": True, "on_error": "skip", "offload": "auto"},
    "plan.json": {"plan": plan, "batch_size": 8},
    "plan_text.json": {"plan": open("examples/pipelines/pets.yaml").read()},
    "mix.json": {"sql": "SELECT key, label FROM pets", "mix_epoch": {"samples": 100},
                 "resume": {"sluice": 1, "epoch": 0, "position": 7, "samples": 100, "shuffle": None},
                 "mix": [{"dataset": "pets", "weight": 0.6}, {"dataset": "cats@2", "weight": 0.3},
                         {"name": "own", "weight": 0.1, "plan": plan}]},
    "mix_sql.json": {"sql": "SELECT key FROM mix(pets => 0.7, \"x y\" => 0.3, mix_epoch => 'resample')"},
}
for n, b in bodies.items():
    open(os.path.join(jb, n), "w").write(json.dumps(b))

# Ingest manifests: the first byte picks the format (0 CSV, 1 JSON lines,
# 2 Parquet), as the target reads them.
import pyarrow as pa, pyarrow.parquet as pq
mf = d("manifest")
open(os.path.join(mf, "paths.csv"), "wb").write(b"\x00path,key,label,score\na.jpg,k1,cat,0.5\nsub/b.png,k2,dog,1\n")
open(os.path.join(mf, "quoted.csv"), "wb").write(b'\x00path,label\n"with,comma.jpg","a ""b"""\n/abs/c.jpg,\n')
open(os.path.join(mf, "rows.jsonl"), "wb").write(
    b'\x01{"path": "a.jpg", "label": "cat", "size": [1, 2]}\n{"path": "b.jpg", "key": "k", "label": null}\n')
table = pa.table({"path": ["a.jpg", "b.jpg"], "label": ["cat", "dog"], "w": pa.array([1, 2], pa.int16())})
sink = io.BytesIO(); pq.write_table(table, sink)
open(os.path.join(mf, "rows.parquet"), "wb").write(b"\x02" + sink.getvalue())

# A catalog: a real one, made by the binary (SLUICE_BIN) with two datasets.
if os.environ.get("SLUICE_BIN"):
    import subprocess, tempfile
    with tempfile.TemporaryDirectory() as t:
        env = dict(os.environ, SLUICE_DATA_DIR=os.path.join(t, "data"), SLUICE_DEVICE_SIZE="64MiB",
                   SLUICE_CHUNK_SIZE="1MiB")
        run = lambda *a: subprocess.run([os.environ["SLUICE_BIN"], *a], env=env, check=True, capture_output=True)
        run("gen-sample", os.path.join(t, "src"), "--classes", "2", "--per-class", "3")
        run("ingest", "pets", os.path.join(t, "src"))
        run("ingest", "pets", os.path.join(t, "src"))
        run("ingest", "more", os.path.join(t, "src", "class_0"))
        shutil.copy(os.path.join(t, "data", "catalog.redb"), os.path.join(d("catalog"), "two_datasets.redb"))
