#!/usr/bin/env bash
# The main job on the embedded default: generate a sample image dataset,
# ingest it into the data dir (SLUICE_DATA_DIR, default ./sluice-data),
# list it, and query it with SQL, reading images zero-copy from the device
# and preprocessing them with sluice's UDFs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cargo build --quiet --bin sluice
sluice() { "$CARGO_TARGET_DIR/debug/sluice" "$@"; }

src="$(mktemp -d)"
trap 'rm -rf "$src"' EXIT
sluice gen-sample "$src/pets" --classes 4 --per-class 50
printf 'not an image\n' > "$src/pets/class_0/README.txt"   # skipped, and named

echo "== ingest"
sluice ingest pets "$src/pets"
echo "== datasets"
sluice datasets
echo "== per-class statistics (metadata only: no extent is read)"
sluice sql "SELECT label, count(*) AS samples, sum(length) AS bytes, avg(width) AS avg_width
            FROM pets GROUP BY label ORDER BY label"
echo "== large images, with their bytes read from the device (data shows byte length)"
sluice sql "SELECT key, format, width, height, data FROM pets WHERE width * height > 200000 ORDER BY key LIMIT 5"
echo "== the plan: the filter runs inside the storage fragment's scan, before any object is read"
sluice sql "EXPLAIN SELECT key, data FROM pets WHERE label = 'class_1'" --format csv
echo "== a training transform: decode, random resized crop, flip, normalize (seed 7, epoch 0)"
sluice sql "SELECT key, label,
                   normalize(random_horizontal_flip(random_resized_crop(decode_image(data), 224, 224)),
                             [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]) AS x
            FROM pets ORDER BY key LIMIT 4" --seed 7 --epoch 0
echo "== its plan: decode and crop fused (JPEG DCT downscaling), seed/epoch/key filled in"
sluice sql "EXPLAIN SELECT key, random_resized_crop(decode_image(data), 224, 224) AS x FROM pets" --seed 7
echo "== UDF cost profiles (the planner's inputs)"
sluice udfs
train="SELECT key, label, normalize(random_horizontal_flip(random_resized_crop(decode_image(data), 224, 224)),
                                   [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]) AS x FROM pets"
echo "== where each stage runs, and why: over an unlimited link, then a 1 Gbit/s one to an 8-core storage node"
sluice explain "$train" --storage-cores 2 --compute-cores 2
sluice explain "$train" --link-bandwidth 1Gbit --storage-cores 8 --compute-cores 2
echo "== sluice serve: both sides in one process, queried over Arrow Flight"
"$CARGO_TARGET_DIR/debug/sluice" serve --listen 127.0.0.1:0 > "$src/serve.out" &
serve_pid=$!
for _ in $(seq 50); do grep -q listening "$src/serve.out" 2>/dev/null && break; sleep 0.1; done
addr="$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$src/serve.out")"
sluice sql "SELECT label, count(*) AS samples FROM pets GROUP BY label ORDER BY label" --connect "http://$addr"
kill "$serve_pid"; wait "$serve_pid" || true
echo "== device"
sluice info
