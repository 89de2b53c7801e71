"""Which images of a directory Pillow opens and sluice does not, and how
far sluice's pixels are from Pillow's where both decode.

    python scripts/survey_decode.py --sluice target/release/sluice --dir IMAGES

Every file of DIR (flat: subdirectories are not read) is opened by Pillow
(first frame, converted to RGB) and by sluice (`decode_image(data, 'RGB')`
over a dataset ingested from DIR). The report lists:

- files Pillow decodes and sluice refuses, with sluice's reason;
- files both decode, whose sizes differ or whose pixels differ by more
  than --tolerance (largest absolute difference of a channel);
- counts of each.

It exits 1 when a file Pillow decodes is refused without a reason that
names its codec as out of reach ("not supported"), so it can guard a
corpus. It reads the images it is given and nothing else; the corpus is
yours (for example Pillow's own `Tests/images`).
"""

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pyarrow as pa
from PIL import Image


def pillow_rgb(path):
    try:
        with Image.open(path) as im:
            im.seek(0)
            im.load()
            return np.asarray(im.convert("RGB")), None
    except Exception as e:  # noqa: BLE001 - any failure is "Pillow refuses"
        return None, f"{type(e).__name__}: {e}"


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=kw.pop("text", True), **kw)


def sluice_rgb(sluice, data_dir, key):
    """(array, None) or (None, reason) for one sample."""
    sql = f"SELECT decode_image(data, 'RGB') AS img FROM survey WHERE key = '{key}'"
    p = run([sluice, "--data-dir", data_dir, "sql", sql, "--on-error", "fail",
             "--format", "arrow"], text=False)
    if p.returncode != 0:
        return None, p.stderr.decode(errors="replace").strip().splitlines()[-1]
    table = pa.ipc.open_stream(io.BytesIO(p.stdout)).read_all()
    if table.num_rows != 1:
        return None, f"{table.num_rows} rows"
    img = table.column("img")[0].as_py()
    px = np.frombuffer(img["pixels"], dtype=np.uint8)
    return px.reshape(img["height"], img["width"], img["channels"]), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sluice", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--tolerance", type=int, default=0,
                    help="largest channel difference counted as equal (0: exact)")
    ap.add_argument("--json", help="write the findings here too")
    args = ap.parse_args()

    names = sorted(n for n in os.listdir(args.dir)
                   if os.path.isfile(os.path.join(args.dir, n)) and "'" not in n)
    with tempfile.TemporaryDirectory() as work:
        data_dir = os.path.join(work, "data")
        p = run([args.sluice, "--data-dir", data_dir, "--device-size", "4GiB",
                 "ingest", "survey", args.dir])
        if p.returncode != 0:
            sys.exit(f"ingest failed: {p.stderr}")
        # Objects the ingest's probe refused, as "  NAME: REASON" lines.
        at_ingest = {}
        for line in (p.stdout + p.stderr).splitlines():
            name, sep, reason = line.strip().partition(": ")
            if sep and name in names:
                at_ingest[name] = "at ingest: " + reason
        findings = {"refused": [], "differs": [], "equal": 0, "pillow_refuses": 0}
        for name in names:
            want, why = pillow_rgb(os.path.join(args.dir, name))
            if want is None:
                findings["pillow_refuses"] += 1
                continue
            if name in at_ingest:
                got, reason = None, at_ingest[name]
            else:
                got, reason = sluice_rgb(args.sluice, data_dir, name)
            if got is None:
                findings["refused"].append({"file": name, "reason": reason})
                print(f"REFUSED  {name}: {reason}")
            elif got.shape != want.shape:
                findings["differs"].append({"file": name, "sluice": list(got.shape),
                                            "pillow": list(want.shape)})
                print(f"SIZE     {name}: sluice {got.shape} pillow {want.shape}")
            else:
                diff = int(np.abs(got.astype(np.int16) - want.astype(np.int16)).max())
                if diff > args.tolerance:
                    findings["differs"].append({"file": name, "max_diff": diff})
                    print(f"PIXELS   {name}: largest difference {diff}")
                else:
                    findings["equal"] += 1
    print(f"\nPillow decodes {len(names) - findings['pillow_refuses']} of {len(names)} files; "
          f"sluice: {findings['equal']} equal, {len(findings['differs'])} differ, "
          f"{len(findings['refused'])} refused "
          f"({sum('not supported' in r['reason'] for r in findings['refused'])} "
          "of them as a codec out of reach)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(findings, f, indent=1)
    unexplained = [r for r in findings["refused"] if "not supported" not in r["reason"]]
    sys.exit(1 if unexplained else 0)


if __name__ == "__main__":
    main()
