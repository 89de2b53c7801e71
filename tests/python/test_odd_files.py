"""Odd but valid images, the kind a generator of clean test data never
makes: progressive, CMYK, grayscale, 4:4:4 and EXIF-tagged JPEGs; 16-bit,
gray+alpha, palette-with-transparency, 1-bit, 1x1 and 1x4000 PNGs; LZW,
deflate and 16-bit TIFFs, and tiled TIFFs with separate planes (8- and
16-bit, RGB and RGBA, raw and deflate: the `image` crate asserts on them,
sluice reads them tile by tile); Adam7-interlaced PNGs; RLE8, 5-6-5
bitfield and 32-bit BMPs; animated GIF; lossless, lossy and
alpha WebP; PPM; ICO. Each is ingested and decoded by `sluice`; every
file is either decoded with the pixels Pillow gives (16-bit ones scaled by
1/257 where Pillow clips to 255), or refused by name at ingest (a float32
TIFF: neither the `image` crate nor libtiff's RGBA reader converts it).
None is lost without a word. (The files the `image` crate refuses and
other libraries read are test_decode_fallbacks.py's.)"""

import os
import struct
import subprocess
import tempfile
import zlib

import numpy as np
import pyarrow as pa
import tifffile
from PIL import Image

from serve import SLUICE


# Writers for what Pillow cannot write but reads: Adam7-interlaced PNGs,
# RLE8 and 5-6-5 bitfield BMPs.
def png_chunk(kind, data):
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def png_interlaced(a, path):
    """An 8-bit PNG of `a` (h x w x 1, 3 or 4) with Adam7 interlacing."""
    h, w, c = a.shape
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4),
              (1, 0, 2, 2), (0, 1, 1, 2)]
    raw = b""
    for x0, y0, dx, dy in passes:
        sub = a[y0::dy, x0::dx]
        if sub.size:
            raw += b"".join(b"\0" + row.tobytes() for row in sub)
    ihdr = struct.pack(">IIBBBBB", w, h, 8, {1: 0, 3: 2, 4: 6}[c], 0, 0, 1)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
                + png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b""))


def bmp(path, bits, compression, extra, pixels, colours=0):
    header = struct.pack("<IiiHHIIiiII", 40, pixels[0], pixels[1], 1, bits, compression,
                         len(pixels[2]), 2835, 2835, colours, 0)
    offset = 14 + 40 + len(extra)
    with open(path, "wb") as f:
        f.write(b"BM" + struct.pack("<IHHI", offset + len(pixels[2]), 0, 0, offset)
                + header + extra + pixels[2])


def bmp_rle8(idx, palette, path):
    """An RLE8-compressed palette BMP of indices `idx` (bottom-up runs)."""
    h, w = idx.shape
    data = b""
    for row in idx[::-1]:
        x = 0
        while x < w:
            n = 1
            while x + n < w and row[x + n] == row[x] and n < 255:
                n += 1
            data += bytes([n, row[x]])
            x += n
        data += b"\0\0"
    data += b"\0\1"
    pal = b"".join(bytes([b, g, r, 0]) for r, g, b in palette)
    bmp(path, 8, 1, pal, (w, h, data), colours=len(palette))


def bmp_bitfields565(a, path):
    """A 16-bit BI_BITFIELDS BMP of RGB `a` with 5-6-5 masks."""
    h, w, _ = a.shape
    a = a.astype(np.uint16)
    px = ((a[..., 0] >> 3) << 11 | (a[..., 1] >> 2) << 5 | a[..., 2] >> 3).astype("<u2")
    stride = (w * 2 + 3) // 4 * 4
    data = b"".join(row.tobytes().ljust(stride, b"\0") for row in px[::-1])
    bmp(path, 16, 3, struct.pack("<III", 0xF800, 0x07E0, 0x001F), (w, h, data))


def corpus(d):
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 255, (37, 53, 3), dtype=np.uint8))
    p = lambda name: os.path.join(d, name)  # noqa: E731
    rgb.save(p("progressive.jpg"), progressive=True, quality=85)
    rgb.convert("CMYK").save(p("cmyk.jpg"))
    rgb.convert("L").save(p("gray.jpg"))
    rgb.save(p("sub444.jpg"), subsampling=0)
    rgb.save(p("optimized.jpg"), optimize=True)
    exif = Image.Exif()
    exif[0x0112] = 6
    rgb.save(p("exif_rotated.jpg"), exif=exif)
    Image.fromarray(rng.integers(0, 65535, (29, 31)).astype(np.uint16)).save(p("gray16.png"))
    rgb.convert("LA").save(p("gray_alpha.png"))
    rgb.convert("P").save(p("palette.png"), transparency=0)
    rgb.convert("RGBA").save(p("rgba.png"))
    rgb.convert("1").save(p("bilevel.png"))
    Image.fromarray(rng.integers(0, 255, (1, 1, 3), dtype=np.uint8)).save(p("one_pixel.png"))
    Image.fromarray(rng.integers(0, 255, (1, 4000, 3), dtype=np.uint8)).save(p("thin.png"))
    rgb.save(p("lzw.tif"), compression="tiff_lzw")
    rgb.save(p("deflate.tif"), compression="tiff_adobe_deflate")
    Image.fromarray(rng.integers(0, 65535, (21, 22)).astype(np.uint16)).save(p("gray16.tif"))
    Image.fromarray(rng.random((20, 20), dtype=np.float32)).save(p("float32.tif"))
    # Tiled, planar configuration 2 (one plane per sample), as microscopy
    # and GIS tools write them.
    a16 = rng.integers(0, 65535, (70, 90, 4)).astype(np.uint16)
    a8 = rng.integers(0, 255, (70, 90, 3)).astype(np.uint8)
    planes = lambda a: np.ascontiguousarray(np.moveaxis(a, -1, 0))  # noqa: E731
    tiled = dict(tile=(32, 32), planarconfig="separate", photometric="rgb")
    tifffile.imwrite(p("tiled_planar16_rgb.tif"), planes(a16[..., :3]), **tiled)
    tifffile.imwrite(p("tiled_planar16_rgb_deflate.tif"), planes(a16[..., :3]),
                     compression="zlib", **tiled)
    tifffile.imwrite(p("tiled_planar16_rgba_deflate.tif"), planes(a16), compression="zlib",
                     extrasamples=["unassalpha"], **tiled)
    tifffile.imwrite(p("tiled_planar8_rgb.tif"), planes(a8), **tiled)
    tifffile.imwrite(p("strips_planar16_rgb.tif"), planes(a16[..., :3]),
                     planarconfig="separate", photometric="rgb", rowsperstrip=16)
    png_interlaced(rng.integers(0, 255, (37, 53, 3), dtype=np.uint8), p("interlaced_rgb.png"))
    png_interlaced(rng.integers(0, 255, (13, 9, 4), dtype=np.uint8), p("interlaced_rgba.png"))
    png_interlaced(rng.integers(0, 255, (21, 30, 1), dtype=np.uint8), p("interlaced_gray.png"))
    idx = (np.arange(40 * 30).reshape(30, 40) // 7 % 5).astype(np.uint8)
    bmp_rle8(idx, [(255, 0, 0), (0, 255, 0), (0, 0, 255), (10, 20, 30), (200, 100, 50)],
             p("rle8.bmp"))
    bmp_bitfields565(rng.integers(0, 255, (11, 13, 3), dtype=np.uint8), p("bitfields565.bmp"))
    rgb.convert("RGBA").save(p("bgra32.bmp"))
    frames = [rgb.convert("P"), rgb.rotate(90).convert("P")]
    frames[0].save(p("animated.gif"), save_all=True, append_images=frames[1:])
    rgb.save(p("lossless.webp"), lossless=True)
    rgb.save(p("lossy.webp"), quality=70)
    rgb.convert("RGBA").save(p("alpha.webp"))
    rgb.save(p("rgb.ppm"))
    rgb.save(p("icon.ico"))


# Files sluice refuses although Pillow reads them, at ingest. (An ICO
# holding an RGB PNG, which the `image` crate refuses, is read entry by
# entry now.)
REFUSED = {"float32.tif": "not supported"}


def test_odd_but_valid_images_decode_like_pillow_or_are_refused_by_name():
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "src")
        os.makedirs(src)
        corpus(src)
        names = sorted(os.listdir(src))
        data = os.path.join(d, "data")
        env = dict(os.environ, SLUICE_DEVICE_SIZE="256MiB", SLUICE_CHUNK_SIZE="1MiB")
        ingest = subprocess.run([SLUICE, "--data-dir", data, "ingest", "odd", src],
                                env=env, capture_output=True, text=True)
        assert ingest.returncode == 0, ingest.stderr
        report = ingest.stdout + ingest.stderr
        for name, needle in REFUSED.items():
            line = next((ln for ln in report.splitlines() if name in ln), "")
            assert needle in line.lower(), (name, report)
        run = subprocess.run(
            [SLUICE, "--data-dir", data, "sql",
             "SELECT key, decode_image(data)['height'] AS h, decode_image(data)['width'] AS w, "
             "decode_image(data)['pixels'] AS p FROM odd ORDER BY key",
             "--format", "arrow", "--on-error", "null"],
            env=env, capture_output=True, check=True)
        t = pa.ipc.open_stream(run.stdout).read_all()
        rows = list(zip(*(t.column(c).to_pylist() for c in ["key", "h", "w", "p"])))
        assert sorted([r[0] for r in rows] + list(REFUSED)) == names
        assert all(r[3] is not None for r in rows), run.stderr.decode()
        for key, h, w, p in rows:
            mine = np.frombuffer(p, np.uint8).reshape(h, w, 3).astype(int)
            if "planar16" in key:
                # Pillow reads these, but takes the wrong byte of raw
                # 16-bit planes: tifffile is the reference.
                with Image.open(os.path.join(src, key)) as im:
                    im.load()
                ref = np.moveaxis(tifffile.imread(os.path.join(src, key)), 0, -1)[..., :3]
                ref = np.round(ref.astype(float) / 257).astype(int)
                assert np.abs(mine - ref).max() <= 1, key
                continue
            with Image.open(os.path.join(src, key)) as im:
                if im.mode in ("I;16", "I"):
                    ref = np.round(np.asarray(im).astype(float) / 257).astype(int)
                    ref = np.repeat(ref[..., None], 3, axis=2)
                else:
                    ref = np.asarray(im.convert("RGB")).astype(int)
            assert mine.shape == ref.shape, key
            assert np.abs(mine - ref).max() <= 2, key
