# Sourced by test.sh: the S3-compatible server the object-store tests run
# against (tests/python/s3server.py). It is `s3s-fs`, the file-backed
# server of the s3s project, from crates.io: a real server of S3's REST
# protocol (Signature V4, ranged GETs, paginated ListObjectsV2) that runs
# as its own process, and builds in about a minute and a half on 2 cores.
# Installed once per machine beside the target dir, with a target dir of
# its own (its dependencies are not sluice's). Sets SLUICE_S3_SERVER.
S3S_VERSION=0.14.1
S3S_ROOT="$(dirname "$CARGO_TARGET_DIR")/tools"
SLUICE_S3_SERVER="$S3S_ROOT/bin/s3s-fs"
if ! [ -x "$SLUICE_S3_SERVER" ] \
  || ! grep -q "s3s-fs $S3S_VERSION" "$S3S_ROOT/.crates.toml" 2>/dev/null; then
  echo "== s3s-fs $S3S_VERSION (the object-store tests' S3 server)"
  CARGO_TARGET_DIR="$CARGO_TARGET_DIR/tools" cargo install s3s-fs --version "$S3S_VERSION" \
    --features binary --locked --root "$S3S_ROOT" --quiet
fi
export SLUICE_S3_SERVER
