# Sourced by test.sh and demo.sh: the Python venv beside the target dir
# (pyarrow and numpy for the client, Pillow and PyAV as the benchmarks'
# baselines, pytest and an OpenAPI validator for the tests), with the
# sluice client package (python/) installed editable. Sets $VENV.
VENV="${SLUICE_VENV:-$(dirname "$CARGO_TARGET_DIR")/venv}"
if ! "$VENV/bin/python" -c "import pyarrow, numpy, PIL, av, pytest, openapi_spec_validator" 2>/dev/null; then
  echo "== python venv $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -r python/requirements-dev.txt
fi
if [ "$("$VENV/bin/python" -c 'import sluice, os; print(os.path.realpath(os.path.dirname(sluice.__file__)))' 2>/dev/null)" \
     != "$(realpath python/sluice)" ]; then
  echo "== installing the sluice Python client (editable)"
  "$VENV/bin/pip" install -q -e python
fi
export VENV
