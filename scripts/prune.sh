# Sourced by test.sh after env.sh: keeps the shared target dir from
# filling the disk.
#
# The target dir outside the clone is shared by every clone of sluice on
# a machine (CI clones afresh, at a new path each run). Cargo names a
# workspace crate's artifacts by a hash of its path, so each clone builds
# its own copies of our crates, test binaries, fuzz binaries and
# incremental state beside the shared third-party artifacts: several GB
# per clone, never reused by the next one, until a link dies with SIGBUS
# on a full disk. What of ours no build has written for
# SLUICE_PRUNE_HOURS hours (default 6) goes; third-party artifacts (the
# long part of a cold build) stay.
prune_hours="${SLUICE_PRUNE_HOURS:-6}"
prune_mins=$((prune_hours * 60))
prune_free() { df -Pm "$CARGO_TARGET_DIR" | awk 'NR == 2 { print $4 }'; }
prune_before="$(prune_free)"
# Incremental state exists only for workspace crates.
find "$CARGO_TARGET_DIR" -mindepth 3 -maxdepth 5 -type d -path '*/incremental/*' \
  -mmin +"$prune_mins" -prune -exec rm -rf {} +
# Executables without a suffix in deps/ are test, bench and fuzz binaries
# (third-party crates build libraries there, proc-macros as .so files
# that must stay); then our crates' libraries.
find "$CARGO_TARGET_DIR" -mindepth 3 -maxdepth 5 -type f -path '*/deps/*' -mmin +"$prune_mins" \
  \( \( -perm -u+x ! -name '*.*' \) -o -name 'libsluice*' -o -name 'sluice*' \
  -o -name 'libspdk_sys*' -o -name 'spdk_sys*' \) -delete
prune_after="$(prune_free)"
echo "== disk: $((prune_after / 1024)) GiB free under $CARGO_TARGET_DIR" \
  "($(((prune_after - prune_before) / 1024)) GiB pruned: our artifacts unused for ${prune_hours} h)"
if [ "$prune_after" -lt 8192 ]; then
  echo "WARNING: under 8 GiB free; a full build of the tests and fuzz targets needs about" \
    "that much. Free space, or remove $CARGO_TARGET_DIR (a cold build follows)." >&2
fi
unset prune_hours prune_mins prune_before prune_after
unset -f prune_free
