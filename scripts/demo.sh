#!/usr/bin/env bash
# The main job on the embedded default, the whole path a user takes:
# start `sluice serve` (REST + Arrow Flight, storage and compute sides in
# one process), ingest a sample image dataset over REST, submit training
# jobs over REST (a YAML plan and its SQL twin), read them with the Python
# client in a CPU training loop (two ranks, two epochs), print where each
# stage runs and the samples/s, stop the server cleanly, then query the
# same data dir with the CLI. Data dir: SLUICE_DATA_DIR (./sluice-data).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
source scripts/deps.sh
SLUICE_VENV_MINIMAL=1 source scripts/venv.sh
# cargo prints its progress: a first build takes minutes and should look busy.
cargo build --bin sluice
sluice() { "$CARGO_TARGET_DIR/debug/sluice" "$@"; }
py() { "$VENV/bin/python" "$@"; }

src="$(mktemp -d)"
serve_pid=""
cleanup() {
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null || true
  rm -rf "$src"
}
trap cleanup EXIT
sluice gen-sample "$src/pets" --classes 4 --per-class 50 > /dev/null
printf 'not an image\n' > "$src/pets/class_0/README.txt"   # skipped at ingest, and named

echo "== sluice serve (REST and Flight on free loopback ports)"
"$CARGO_TARGET_DIR/debug/sluice" serve --rest 127.0.0.1:0 --flight 127.0.0.1:0 \
  --ingest-root "$src" > "$src/serve.out" &
serve_pid=$!
for _ in $(seq 100); do grep -q "REST API" "$src/serve.out" 2>/dev/null && break; sleep 0.1; done
cat "$src/serve.out"
rest="$(sed -n 's/REST API on \([^ ]*\).*/\1/p' "$src/serve.out")"
flight="$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$src/serve.out")"

echo "== POST /v1/datasets: ingest $src/pets"
py - "$rest" "$src/pets" <<'PY'
import json, sys, sluice
c = sluice.Client(sys.argv[1])
r = c.ingest("pets", sys.argv[2])
print(f"ingested {r['dataset']} v{r['version']}: {r['samples']} samples, {r['bytes']} bytes; "
      f"skipped {[s['key'] for s in r['skipped']]}")
print(json.dumps(c.dataset("pets"))[:160], "...")
PY

echo "== a job from a YAML plan (examples/pipelines/pets.yaml): 2 ranks, 2 epochs, shuffled"
py examples/train.py --url "$rest" --pipeline examples/pipelines/pets.yaml \
  --epochs 2 --world-size 2 --batch-size 16
echo "== an augmentation job (random crop + flip + normalize, float32 tensors), 1 epoch"
py examples/train.py --url "$rest" --pipeline examples/pipelines/pets_augmented.yaml \
  --column pixels --epochs 1 --batch-size 32
echo "== GET /v1/jobs (states, progress, samples/s, bytes per tier)"
py - "$rest" <<'PY'
import sys, sluice
for j in sluice.Client(sys.argv[1]).jobs():
    print(f"{j['id']}: {j['state']}, progress {j['progress']:.0%}, {j['delivered']} delivered, "
          f"{j['samples_per_s']:.0f} samples/s, link {j['bytes']['link']} B, trainer {j['bytes']['trainer']} B")
PY
echo "== a SQL client over the same Flight port"
sluice sql "SELECT label, count(*) AS samples FROM pets GROUP BY label ORDER BY label" --connect "http://$flight"

echo "== stop the server (SIGTERM) and check it stopped cleanly"
kill -TERM "$serve_pid"
wait "$serve_pid"
serve_pid=""
echo "stopped with status 0"

echo "== the same data dir with the CLI: metadata SQL, a transform, the placement"
sluice sql "SELECT label, count(*) AS samples, sum(length) AS bytes, avg(width) AS avg_width
            FROM pets GROUP BY label ORDER BY label"
sluice sql "SELECT key, label,
                   normalize(random_horizontal_flip(random_resized_crop(decode_image(data), 224, 224)),
                             [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]) AS x
            FROM pets ORDER BY key LIMIT 3" --seed 7 --epoch 0
train="SELECT key, label, normalize(random_horizontal_flip(random_resized_crop(decode_image(data), 224, 224)),
                                   [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]) AS x FROM pets"
echo "== where each stage runs over a 1 Gbit/s link to an 8-core storage node"
sluice explain "$train" --link-bandwidth 1Gbit --storage-cores 8 --compute-cores 2
echo "== device"
sluice info
