"""`sluice sql --format arrow` read by pyarrow: fixed-shape tensors arrive as
pyarrow's FixedShapeTensorArray and become numpy arrays without a copy."""

import os
import subprocess
import tempfile

import numpy as np
import pyarrow as pa

SLUICE = os.environ["SLUICE_BIN"]


def sluice(data_dir, *args, **kw):
    env = dict(os.environ, SLUICE_DATA_DIR=data_dir, SLUICE_DEVICE_SIZE="256MiB", SLUICE_CHUNK_SIZE="1MiB")
    return subprocess.run([SLUICE, *args], env=env, check=True, capture_output=True, **kw)


def test_tensors_arrive_as_fixed_shape_tensor_arrays():
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "src")
        sluice(os.path.join(d, "data"), "gen-sample", src, "--classes", "2", "--per-class", "3")
        sluice(os.path.join(d, "data"), "ingest", "pets", src)
        out = sluice(
            os.path.join(d, "data"),
            "sql",
            "SELECT key, label, to_tensor(random_resized_crop(decode_image(data), 16, 12)) AS x, "
            "normalize(resize(decode_image(data), 8, 8), [0.5, 0.5, 0.5], [0.25, 0.25, 0.25]) AS n "
            "FROM pets ORDER BY key",
            "--format", "arrow", "--seed", "7",
        ).stdout
        table = pa.ipc.open_stream(out).read_all()
        assert table.num_rows == 6
        x = table.column("x").combine_chunks()
        assert isinstance(x.type, pa.FixedShapeTensorType)
        assert x.type.shape == [16, 12, 3]
        arr = x.to_numpy_ndarray()
        assert arr.shape == (6, 16, 12, 3) and arr.dtype == np.uint8
        n = table.column("n").combine_chunks().to_numpy_ndarray()
        assert n.shape == (6, 3, 8, 8) and n.dtype == np.float32
        # (x/255 - 0.5) / 0.25 lies in [-2, 2].
        assert n.min() >= -2.0 - 1e-6 and n.max() <= 2.0 + 1e-6
        # Same seed, same bytes; another seed, other crops.
        again = pa.ipc.open_stream(sluice(os.path.join(d, "data"), "sql",
            "SELECT key, to_tensor(random_resized_crop(decode_image(data), 16, 12)) AS x FROM pets ORDER BY key",
            "--format", "arrow", "--seed", "7").stdout).read_all()
        assert np.array_equal(again.column("x").combine_chunks().to_numpy_ndarray(), arr)
        other = pa.ipc.open_stream(sluice(os.path.join(d, "data"), "sql",
            "SELECT key, to_tensor(random_resized_crop(decode_image(data), 16, 12)) AS x FROM pets ORDER BY key",
            "--format", "arrow", "--seed", "8").stdout).read_all()
        assert not np.array_equal(other.column("x").combine_chunks().to_numpy_ndarray(), arr)


def test_array_and_image_columns_become_numpy_views():
    # What a reader's numpy=True gives for npz(...) and decode_image(...):
    # per-row arrays equal to np.load's and PIL's, over the Arrow buffer.
    from PIL import Image

    from sluice.client import to_numpy

    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "src")
        os.makedirs(src)
        rng = np.random.default_rng(3)
        want = {}
        for i, (shape, dtype) in enumerate([((4, 5, 6), np.float32), ((7,), np.int16),
                                            ((3, 2), np.uint8)]):
            x = rng.integers(0, 100, size=shape).astype(dtype)
            np.savez(os.path.join(src, f"v{i}.npz"), x=x, y=np.zeros(2))
            want[f"v{i}.npz"] = x
        grey = rng.integers(0, 255, size=(9, 11), dtype=np.uint8)
        Image.fromarray(grey).save(os.path.join(src, "g.png"))
        sluice(os.path.join(d, "data"), "ingest", "vols", src)
        out = sluice(os.path.join(d, "data"), "sql",
                     "SELECT key, npz(data, 'x') AS x FROM vols WHERE key LIKE '%.npz' "
                     "ORDER BY key", "--format", "arrow").stdout
        batch = pa.ipc.open_stream(out).read_all().combine_chunks().to_batches()[0]
        got = to_numpy(batch)
        assert list(got["key"]) == sorted(want)
        for key, x in zip(got["key"], got["x"]):
            assert x.dtype == want[key].dtype and np.array_equal(x, want[key]), key
            assert not x.flags["OWNDATA"]  # a view of the Arrow buffer
        out = sluice(os.path.join(d, "data"), "sql",
                     "SELECT decode_image(data, 'L') AS img FROM vols WHERE key = 'g.png'",
                     "--format", "arrow").stdout
        img = to_numpy(pa.ipc.open_stream(out).read_all().combine_chunks().to_batches()[0])["img"]
        assert img[0].shape == (9, 11, 1) and np.array_equal(img[0][:, :, 0], grey)
