"""Odd but valid images, as real collections hold them and a generator of
clean test data never makes: sluice decodes each to the pixels Pillow
gives (exactly for lossless formats, within a stated tolerance for AVIF),
or refuses it by name with a reason a user can act on.

The files are made here: with Pillow where it writes the layout (CCITT
Group 3/4 TIFF, AVIF), by editing Pillow's output where the oddity is a
few bytes (junk in a JPEG's headers, a GIF without a palette), and by hand
where nothing writes it (an LZMA TIFF, BMP run-length data that runs
across rows, an ICO whose entry disagrees with its directory).
"""

import io
import lzma
import os
import struct
import subprocess
import tempfile

import numpy as np
import pyarrow as pa
from PIL import Image, TiffImagePlugin, TiffTags, features

from serve import SLUICE


def gradient(w, h, mode="RGB"):
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :]
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None]
    rgb = np.stack([x + 0 * y, y + 0 * x, (x + y) / 2], axis=-1).astype(np.uint8)
    return Image.fromarray(rgb).convert(mode)


def jpeg(**kw):
    out = io.BytesIO()
    gradient(48, 32).save(out, "JPEG", quality=90, **kw)
    return out.getvalue()


def insert_before_marker(data, marker, junk):
    """`data` with `junk` inserted just before the first `FF <marker>`."""
    at = data.index(bytes([0xFF, marker]), 2)
    return data[:at] + junk + data[at:]


def jpeg_junk_before_quant_table():
    # Stray bytes between two segments ("Corrupt JPEG data: 5 extraneous
    # bytes before marker 0xdb"): Pillow skips them, so does libjpeg.
    return insert_before_marker(jpeg(), 0xDB, b"\x00\x11\x22\x33\x44")


def jpeg_ff00_before_marker():
    # An escaped FF 00 where a marker should be.
    return insert_before_marker(jpeg(), 0xDB, b"\xff\x00")


def jpeg_truncated_app14():
    # An Adobe APP14 segment whose length (13) stops one byte short of its
    # transform flag, which is left before the next marker (Pillow's
    # truncated_app14.jpg): libjpeg warns, the `image` crate refuses.
    segment = b"\xff\xee\x00\x0dAdobe\x00\x64\x40\x00\x00\x00\x01"
    return insert_before_marker(jpeg(), 0xDB, segment)


def tiff_g4():
    # CCITT Group 4 with its bits in LSB-first order (FillOrder 2), as fax
    # software writes it.
    img = Image.fromarray((np.indices((40, 56)).sum(axis=0) // 5 % 2 * 255).astype(np.uint8))
    out = io.BytesIO()
    img.convert("1").save(out, "TIFF", compression="group4", tiffinfo={266: 2})
    return out.getvalue()


def tiff_g3_zero_pages():
    # CCITT Group 3 with a PageNumber tag saying page 0 of 0 (Pillow's
    # writer mangles the tag's values, so they are set in the bytes).
    img = Image.fromarray((np.indices((24, 40)).sum(axis=0) // 3 % 2 * 255).astype(np.uint8))
    out = io.BytesIO()
    ifd = TiffImagePlugin.ImageFileDirectory_v2()
    ifd[297] = (1, 1)
    ifd.tagtype[297] = TiffTags.SHORT
    img.convert("1").save(out, "TIFF", compression="group3", tiffinfo=ifd)
    data = bytearray(out.getvalue())
    assert data[:4] == b"II*\0"
    (at,) = struct.unpack_from("<I", data, 4)
    (n,) = struct.unpack_from("<H", data, at)
    for i in range(n):
        entry = at + 2 + 12 * i
        if struct.unpack_from("<H", data, entry)[0] == 297:
            struct.pack_into("<HH", data, entry + 8, 0, 0)
            return bytes(data)
    raise AssertionError("no PageNumber tag written")


def tiff_by_hand(w, h, strip, compression):
    """A little-endian RGB TIFF of one strip."""
    entries = [
        (256, 4, 1, w), (257, 4, 1, h), (258, 3, 1, 8), (259, 3, 1, compression),
        (262, 3, 1, 2), (273, 4, 1, 0), (277, 3, 1, 3), (278, 4, 1, h),
        (279, 4, 1, len(strip)), (284, 3, 1, 1),
    ]
    ifd_at = 8
    data_at = ifd_at + 2 + 12 * len(entries) + 4
    ifd = struct.pack("<H", len(entries))
    for tag, typ, count, value in entries:
        value = data_at if tag == 273 else value
        packed = struct.pack("<H", value) + b"\0\0" if typ == 3 else struct.pack("<I", value)
        ifd += struct.pack("<HHI", tag, typ, count) + packed
    ifd += struct.pack("<I", 0)
    return b"II*\0" + struct.pack("<I", ifd_at) + ifd + strip


def tiff_lzma():
    raw = np.asarray(gradient(20, 12)).tobytes()
    return tiff_by_hand(20, 12, lzma.compress(raw), 34925)


def avif():
    out = io.BytesIO()
    gradient(64, 48).save(out, "AVIF", quality=90)
    return out.getvalue()


def gif_without_palette():
    # Pillow's GIF of a grey ramp, its global colour table taken out: the
    # frame has no palette at all, and readers show indices as grey.
    out = io.BytesIO()
    img = Image.fromarray(np.arange(16 * 8, dtype=np.uint8).reshape(8, 16) * 2, "L")
    img.save(out, "GIF")
    data = bytearray(out.getvalue())
    flags = data[10]
    assert flags & 0x80, "Pillow wrote no global colour table"
    table = 3 * (2 << (flags & 7))
    data[10] = flags & 0x70
    del data[13:13 + table]
    return bytes(data)


def bmp_rle8(w, h, rle):
    """A w×h RLE8 BMP of 4 colours (a negative h: top-down)."""
    palette = b"".join(bytes([i * 60, 255 - i * 60, 100, 0]) for i in range(4))
    header_size = 14 + 40 + len(palette)
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 8, 1, len(rle), 2835, 2835, 4, 0)
    head = b"BM" + struct.pack("<IHHI", header_size + len(rle), 0, 0, header_size)
    return head + info + palette + rle


def bmp_rle8_runs_across_rows():
    # A literal run of six pixels in rows of four (it goes on into the
    # next row), an end of line, then an encoded run of six (clipped at
    # the row's end), end of bitmap.
    return bmp_rle8(4, 3, bytes([0, 6, 1, 2, 3, 1, 2, 3, 0, 0, 6, 2, 0, 1]))


def bmp_rle8_top_down_with_delta():
    # Top-down (which the BMP specification does not allow for RLE, and
    # writers make anyway), and a delta skipping two pixels.
    return bmp_rle8(4, -3, bytes([1, 3, 0, 2, 2, 0, 1, 1, 0, 0, 4, 2, 0, 0, 4, 1, 0, 1]))


def ico_png_entry_of_another_size():
    """An ICO whose directory says 16×16 for an entry that is a 24×20 PNG."""
    out = io.BytesIO()
    gradient(24, 20, "RGBA").save(out, "PNG")
    png = out.getvalue()
    entry = struct.pack("<BBBBHHII", 16, 16, 0, 0, 1, 32, len(png), 6 + 16)
    return struct.pack("<HHH", 0, 1, 1) + entry + png


CASES = {
    "jpeg_junk_before_quant_table.jpg": (jpeg_junk_before_quant_table, "exact"),
    "jpeg_ff00_before_marker.jpg": (jpeg_ff00_before_marker, "exact"),
    "jpeg_truncated_app14.jpg": (jpeg_truncated_app14, "exact"),
    "tiff_g4.tif": (tiff_g4, "exact"),
    "tiff_g3_zero_pages.tif": (tiff_g3_zero_pages, "exact"),
    "tiff_lzma.tif": (tiff_lzma, "exact"),
    "gif_without_palette.gif": (gif_without_palette, "exact"),
    "bmp_rle8_runs_across_rows.bmp": (bmp_rle8_runs_across_rows, "exact"),
    "bmp_rle8_top_down_with_delta.bmp": (bmp_rle8_top_down_with_delta, "exact"),
    "ico_png_entry_of_another_size.ico": (ico_png_entry_of_another_size, "exact"),
}
if features.check("avif"):
    # Lossy: libavif (Pillow) and swscale (sluice) upsample chroma apart.
    CASES["avif.avif"] = (avif, "lossy")


def pillow_rgb(data):
    with Image.open(io.BytesIO(data)) as im:
        im.load()
        return np.asarray(im.convert("RGB"))


def ingest_files(d, files):
    """`files` ({name: bytes}) ingested as the dataset `odd` into a data dir
    under `d`: the environment that names it, and the ingest's report."""
    src = os.path.join(d, "src")
    os.mkdir(src)
    for name, data in files.items():
        with open(os.path.join(src, name), "wb") as f:
            f.write(data)
    env = dict(os.environ, SLUICE_DATA_DIR=os.path.join(d, "data"),
               SLUICE_DEVICE_SIZE="256MiB", SLUICE_CHUNK_SIZE="1MiB")
    ingest = subprocess.run([SLUICE, "ingest", "odd", src], env=env,
                            capture_output=True, text=True)
    assert ingest.returncode == 0, ingest.stderr
    return env, ingest.stdout + ingest.stderr


def sluice_decode_all(files, mode="RGB"):
    """{name: array} for every file, decoded by sluice (any refusal fails)."""
    with tempfile.TemporaryDirectory() as d:
        env, report = ingest_files(d, files)
        assert f"{len(files)} samples" in report, report
        sql = f"SELECT key, decode_image(data, '{mode}') AS img FROM odd ORDER BY key"
        q = subprocess.run([SLUICE, "sql", sql, "--on-error", "fail", "--format", "arrow"],
                           env=env, capture_output=True)
        assert q.returncode == 0, q.stderr.decode()
        table = pa.ipc.open_stream(io.BytesIO(q.stdout)).read_all()
    out = {}
    for key, img in zip(table.column("key").to_pylist(), table.column("img").to_pylist()):
        px = np.frombuffer(img["pixels"], dtype=np.uint8)
        out[key] = px.reshape(img["height"], img["width"], img["channels"])
    return out


def test_odd_but_valid_images_decode_to_pillows_pixels():
    files = {name: make() for name, (make, _) in CASES.items()}
    # Each file is odd indeed: Pillow opens it, and it is not what a clean
    # writer makes (checked for the cases the image crate refuses in
    # tests of the Rust modules).
    got = sluice_decode_all(files)
    assert sorted(got) == sorted(files)
    for name, data in files.items():
        want = pillow_rgb(data)
        assert got[name].shape == want.shape, (name, got[name].shape, want.shape)
        diff = np.abs(got[name].astype(np.int16) - want.astype(np.int16))
        if CASES[name][1] == "lossy":
            # The stated tolerance (docs/architecture.md): under 1 level on
            # average, at most 8 at the 99th percentile.
            assert diff.mean() < 1 and np.percentile(diff, 99) <= 8, (
                name, float(diff.mean()), float(np.percentile(diff, 99)))
        else:
            assert diff.max() == 0, (name, int(diff.max()), float(diff.mean()))


def test_a_broken_file_of_a_new_path_is_one_named_bad_sample():
    g4 = tiff_g4()
    files = {
        "good.tif": g4,
        # An LZMA strip that is not LZMA: libtiff's own reason, after the
        # tiff crate's.
        "not_lzma.tif": tiff_by_hand(20, 12, b"\x00" * 64, 34925),
    }
    with tempfile.TemporaryDirectory() as d:
        env, _ = ingest_files(d, files)
        q = subprocess.run(
            [SLUICE, "sql", "SELECT key, decode_image(data) IS NOT NULL AS ok FROM odd",
             "--on-error", "skip", "--format", "csv"], env=env, capture_output=True, text=True)
    assert q.returncode == 0, q.stderr
    decoded = dict(line.split(",") for line in q.stdout.splitlines()[1:])
    assert decoded == {"good.tif": "true", "not_lzma.tif": "false"}, q.stdout
    bad = [line for line in q.stderr.splitlines() if "not_lzma.tif" in line]
    assert bad and "libtiff" in bad[0] and "LZMA" in bad[0], q.stderr
