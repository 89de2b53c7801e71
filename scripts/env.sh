# Sourced by the other scripts: where builds go.
#
# A target directory outside the clone is reused across clones (CI clones
# afresh each run), so the heavy DataFusion build happens once per machine.
: "${CARGO_TARGET_DIR:=${XDG_CACHE_HOME:-$HOME/.cache}/sluice/target}"
export CARGO_TARGET_DIR
mkdir -p "$CARGO_TARGET_DIR"
