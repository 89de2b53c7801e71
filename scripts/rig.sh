#!/usr/bin/env bash
# A rig of real hosts on one machine: each storage node, each compute node
# and the coordinator (`sluice serve`) in its own network namespace, joined
# by veth pairs through a bridge, with the storage→compute link shaped by
# `tc` (a kernel token bucket filter on the storage hosts' egress, and
# netem's delay where the kernel has it: a real TCP path, not sluice's own
# token bucket) and each process pinned to its own CPUs with `taskset`. Needs root and
# Debian's iproute2 (ip, tc) and util-linux (taskset).
#
#   bash scripts/rig.sh up --storage N --compute M [--link 1Gbit] [--delay 1ms]
#                          [--ingest-root DIR] [--replicas R] [--storage-cpus 0] [--compute-cpus 1]
#                          [--tokens] [--tls] [--bin PATH] [-- EXTRA SERVE ARGS]
#   bash scripts/rig.sh link RATE [--delay D]   # reshape the running rig (tc qdisc change)
#   bash scripts/rig.sh add-storage             # one more storage node; it registers itself
#   bash scripts/rig.sh restart-storage I       # kill -9 storage node I, start it again over its data
#   bash scripts/rig.sh status
#   bash scripts/rig.sh down                    # every namespace, link, process and dir it made
#
# `up` prints, as its last lines, the coordinator's `REST=http://…` and
# `FLIGHT=http://…` (`https://` with --tls), then `STORAGE=` and `COMPUTE=` (comma-separated node
# URLs); the same lines are in $SLUICE_RIG_DIR/rig.env. With
# --ingest-root, every directory below DIR is ingested as a dataset of its
# name over REST on the coordinator (`sluice ingest --url`), which spreads
# it over the storage nodes (part I of N is every N-th object from the
# I-th, held by R nodes: I … I+R-1, R = --replicas, default 2 with at least
# 2 storage nodes) and commits it on all of them or on none: the N parts
# together are exactly what one data dir would hold. Storage nodes take ingests beneath
# DIR (`storage-node --ingest-root`) and register with the coordinator
# (`--coordinator`), which is also given their list.
#
# --tokens: the rig runs as a cluster with identities. `up` writes a tokens
# file ($SLUICE_RIG_DIR/tokens.yaml, hashes only) with an admin token, a
# node token of the coordinator's, one of each compute node's and one the
# storage nodes share; every process is given the file and its own node
# token (SLUICE_TOKENS, SLUICE_NODE_TOKEN, never on a command line), the
# storage nodes take calls only from node tokens, and `rig.env` has
# TOKEN=<the admin token> for clients. Secrets are in
# $SLUICE_RIG_DIR/secrets/ (0600).
#
# --tls: every link of the rig is TLS. `up` makes the rig's CA with
# `sluice certs` ($SLUICE_RIG_DIR/pki) and a certificate per host for its
# address; every process is given the CA and its own certificate
# (SLUICE_TLS_CA, SLUICE_TLS_CERT, SLUICE_TLS_KEY), URLs are `https://`
# and Flight locations `grpc+tls://`, storage nodes serve only callers
# holding a certificate of the CA, and `rig.env` has CA=<the CA file> for
# clients. Without it the rig's processes serve plain text on the rig's
# own bridge (SLUICE_INSECURE).
#
# CPUs: storage nodes share --storage-cpus and the coordinator and compute
# nodes share --compute-cpus; by default the machine's CPUs are cut in two
# halves (on 2 cores: storage on CPU 0, compute on CPU 1). Each process is
# told how many cores it has, so the planner models what it really gets.
#
# The coordinator (`serve --storage …`) holds the jobs; each compute node
# registers with it (`--coordinator`, `--advertise`; no storage list: it
# learns the storage nodes from the coordinator), is given trainer
# ranks (rank r goes to the r mod M-th node), plans the jobs it is asked
# for from the coordinator's records, and answers SQL clients (`sluice sql
# --connect`) over the same storage nodes. With no compute node, the
# coordinator serves every rank itself.
#
# Where the kernel refuses network namespaces (an unprivileged container),
# `up` says so and exits 3; tests that need the rig skip with that message.
set -Eeuo pipefail
cd "$(dirname "$0")/.."

RIG_DIR="${SLUICE_RIG_DIR:-/tmp/sluice-rig}"
NET="${SLUICE_RIG_NET:-10.213.0}"        # a /24 of the bridge: .1 this host, .2 coordinator
BRIDGE="slrig0"
PREFIX="slrig"
STORAGE_PORT=50051
COMPUTE_PORT=50052
FLIGHT_PORT=50050
REST_PORT=8080

die() { echo "rig: $*" >&2; exit 1; }
log() { echo "rig: $*" >&2; }

# Parses the CPU list syntax taskset takes (0,2-3) into a count.
cpu_count() {
  local n=0 part a b
  IFS=',' read -ra parts <<< "$1"
  for part in "${parts[@]}"; do
    if [[ "$part" == *-* ]]; then a="${part%-*}"; b="${part#*-}"; n=$((n + b - a + 1)); else n=$((n + 1)); fi
  done
  echo "$n"
}

# CPUs $1 to $2 as taskset writes them (`0`, `2-3`).
cpu_range() {
  if [ "$1" = "$2" ]; then echo "$1"; else echo "$1-$2"; fi
}

need_tools() {
  local t
  for t in ip tc taskset setsid; do
    command -v "$t" > /dev/null || die "needs '$t' (Debian: iproute2, util-linux)"
  done
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces, veth, tc)"
}

# Whether this kernel lets us make a namespace at all.
probe_namespaces() {
  local probe="${PREFIX}-probe$$"
  if ! ip netns add "$probe" 2> "$RIG_DIR/probe.err"; then
    echo "rig: this kernel refuses network namespaces ($(tr -d '\n' < "$RIG_DIR/probe.err")); the rig cannot run here" >&2
    rm -rf "$RIG_DIR"
    exit 3
  fi
  if [ -n "${1:-}" ] && ! have_netem "$probe"; then
    ip netns del "$probe"
    rm -rf "$RIG_DIR"
    die "--delay needs the kernel's netem qdisc (sch_netem), which this kernel does not have"
  fi
  ip netns del "$probe"
}

# A host: namespace $1 with address $NET.$2 on the bridge.
add_host() {
  local ns="$1" octet="$2" host_if="${1#"$PREFIX"-}"
  host_if="slr-$host_if"
  ip netns add "$ns"
  ip link add "$host_if" type veth peer name eth0 netns "$ns"
  ip link set "$host_if" master "$BRIDGE" up
  ip -n "$ns" addr add "$NET.$octet/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  echo "$ns" >> "$RIG_DIR/namespaces"
}

# Bytes per second of a tc rate (100Mbit, 1Gbit, 10gbit, 125mbps...).
rate_bytes() {
  local r="${1,,}" num unit
  num="${r%%[a-z]*}"
  unit="${r#"$num"}"
  case "$unit" in
    bit) echo $((num / 8)) ;;
    kbit) echo $((num * 1000 / 8)) ;;
    mbit) echo $((num * 1000000 / 8)) ;;
    gbit) echo $((num * 1000000000 / 8)) ;;
    kbps) echo $((num * 1000)) ;;
    mbps) echo $((num * 1000000)) ;;
    gbps) echo $((num * 1000000000)) ;;
    *) die "bad link rate '$1' (integer with bit, kbit, Mbit, Gbit, kbps, Mbps or Gbps)" ;;
  esac
}

# Whether this kernel has netem (a delay); tbf (the rate) is in every kernel we know.
have_netem() {
  local ns="$1"
  ip netns exec "$ns" tc qdisc add dev lo root netem delay 0ms 2> /dev/null || return 1
  ip netns exec "$ns" tc qdisc del dev lo root 2> /dev/null || true
}

# Shapes the egress of namespace $1's eth0: a token bucket filter at rate
# $2 (none: unlimited) with netem's delay $3 below it. `replace` swaps the
# qdisc in place, so the running rig's TCP connections see the new link.
shape() {
  local ns="$1" rate="$2" delay="$3" bytes burst
  ip netns exec "$ns" tc qdisc del dev eth0 root 2> /dev/null || true
  [ "$rate" = unlimited ] && rate=""
  if [ -n "$delay" ] && [ "$delay" != 0 ] && ! have_netem "$ns"; then
    die "--delay needs the kernel's netem qdisc (sch_netem), which this kernel does not have"
  fi
  if [ -n "$rate" ]; then
    bytes="$(rate_bytes "$rate")"
    # The bucket holds 4 ms of the rate (at least two 64 KiB GSO
    # segments), the queue 50 ms: TCP sees a link, not a wall.
    burst=$(( bytes / 250 > 131072 ? bytes / 250 : 131072 ))
    ip netns exec "$ns" tc qdisc add dev eth0 root handle 1: tbf rate "$rate" burst "$burst" latency 50ms
    if [ -n "$delay" ] && [ "$delay" != 0 ]; then
      ip netns exec "$ns" tc qdisc add dev eth0 parent 1:1 handle 10: netem delay "$delay" limit 100000
    fi
  elif [ -n "$delay" ] && [ "$delay" != 0 ]; then
    ip netns exec "$ns" tc qdisc add dev eth0 root handle 10: netem delay "$delay" limit 100000
  fi
}

# Starts `$@` in namespace $1 on CPUs $2, logging to $3; records its pid.
start() {
  local ns="$1" cpus="$2" out="$3"
  shift 3
  setsid ip netns exec "$ns" taskset -c "$cpus" "$@" > "$out" 2>&1 < /dev/null &
  echo "$! $out" >> "$RIG_DIR/pids"
}

# With --tokens: a new token NAME of SCOPE in the rig's tokens file, its
# secret kept in secrets/NAME.
add_token() {
  local bin="$1" name="$2" scope="$3"
  mkdir -p -m 700 "$RIG_DIR/secrets"
  (umask 077; "$bin" tokens add "$RIG_DIR/tokens.yaml" "$name" --scope "$scope" \
    > "$RIG_DIR/secrets/$name" 2> /dev/null)
}

# With --tls: the schemes of the rig's URLs (REST, storage nodes) and of
# its Flight locations.
web() { if [ -d "$RIG_DIR/pki" ]; then echo https; else echo http; fi; }
grpc() { if [ -d "$RIG_DIR/pki" ]; then echo grpc+tls; else echo grpc; fi; }

# With --tls: a certificate of the rig's CA for host NAME at ADDRESS
# (made once; binary $1).
issue_cert() {
  local bin="$1" name="$2" addr="$3"
  [ -d "$RIG_DIR/pki" ] || return 0
  [ -f "$RIG_DIR/pki/$name.pem" ] || "$bin" certs node "$RIG_DIR/pki" "$name" "$addr" > /dev/null
}

# The environment a process of the rig runs with, as `env` arguments: with
# --tls, the CA and the certificate CERT (default NAME), else leave to
# serve plain text off loopback; with --tokens, the tokens file and the
# node token NAME.
identity() {
  local name="$1" cert="${2:-$1}"
  if [ -d "$RIG_DIR/pki" ]; then
    echo "SLUICE_TLS_CA=$RIG_DIR/pki/ca.pem SLUICE_TLS_CERT=$RIG_DIR/pki/$cert.pem" \
      "SLUICE_TLS_KEY=$RIG_DIR/pki/$cert.key"
  else
    echo "SLUICE_INSECURE=true"
  fi
  [ -f "$RIG_DIR/tokens.yaml" ] || return 0
  echo "SLUICE_TOKENS=$RIG_DIR/tokens.yaml SLUICE_AUDIT_LOG=$RIG_DIR/audit.jsonl" \
    "SLUICE_NODE_TOKEN=$(cat "$RIG_DIR/secrets/$name")"
}

# Waits for `pattern` in log $1 (the process prints it once it listens).
wait_for() {
  local out="$1" pattern="$2" pid
  pid="$(awk -v out="$out" '$2 == out {print $1}' "$RIG_DIR/pids")"
  for _ in $(seq 600); do
    grep -q "$pattern" "$out" 2> /dev/null && return 0
    if ! kill -0 "$pid" 2> /dev/null; then
      cat "$out" >&2
      die "$out: the process exited before it listened"
    fi
    sleep 0.1
  done
  cat "$out" >&2
  die "timed out waiting for '$pattern' in $out"
}

# Starts storage node $1 (host $NET.(10+$1)) with link $2, delay $3, on
# CPUs $4 ($5 cores), binary $6, taking ingests beneath $7 (if given); it
# registers with the coordinator at $NET.2.
start_storage() {
  local i="$1" link="$2" delay="$3"
  mkdir -p "$RIG_DIR/storage$i"
  add_host "$PREFIX-s$i" $((10 + i))
  shape "$PREFIX-s$i" "$link" "$delay"
  run_storage "$i" "$4" "$5" "$6" "${7:-}"
}

# Runs storage node $1's process in its (existing) namespace: CPUs $2 ($3
# cores), binary $4, ingest root $5 (if given); its data dir is kept.
run_storage() {
  local i="$1" cpus="$2" cores="$3" bin="$4" root="${5:-}"
  local dir="$RIG_DIR/storage$i" roots=()
  [ -n "$root" ] && roots=(--ingest-root "$root")
  issue_cert "$bin" "storage$i" "$NET.$((10 + i))"
  # Its log says what it does with ingest parts (prepared, committed, dropped).
  # shellcheck disable=SC2046
  start "$PREFIX-s$i" "$cpus" "$dir/node.log" \
    env $(identity storage "storage$i") SLUICE_LOG="${SLUICE_LOG:-warn,sluice_storage::ingest=info}" \
    "$bin" --data-dir "$dir/data" \
    storage-node --listen "$NET.$((10 + i)):$STORAGE_PORT" --cores "$cores" \
    --coordinator "$(web)://$NET.2:$REST_PORT" --advertise "$(grpc)://$NET.$((10 + i)):$STORAGE_PORT" \
    "${roots[@]}"
}

cmd_up() {
  local storage=1 compute=1 link="" delay="" ingest_root="" storage_cpus="" compute_cpus=""
  local replicas=()
  local bin="${SLUICE_BIN:-}" serve_extra=() tokens="" tls=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --storage) storage="$2"; shift 2 ;;
      --compute) compute="$2"; shift 2 ;;
      --link) link="$2"; shift 2 ;;
      --delay) delay="$2"; shift 2 ;;
      --ingest-root) ingest_root="$2"; shift 2 ;;
      --replicas) replicas=(--replicas "$2"); shift 2 ;;
      --storage-cpus) storage_cpus="$2"; shift 2 ;;
      --compute-cpus) compute_cpus="$2"; shift 2 ;;
      --bin) bin="$2"; shift 2 ;;
      --tokens) tokens=1; shift ;;
      --tls) tls=1; shift ;;
      --) shift; serve_extra=("$@"); break ;;
      *) die "unknown option $1 (see the top of scripts/rig.sh)" ;;
    esac
  done
  [[ "$storage" =~ ^[1-9][0-9]?$ ]] || die "--storage must be 1 to 99, not '$storage'"
  [[ "$compute" =~ ^[0-9][0-9]?$ ]] || die "--compute must be 0 to 99, not '$compute'"
  if [ -z "$bin" ]; then
    source scripts/env.sh
    bin="$CARGO_TARGET_DIR/debug/sluice"
  fi
  [ -x "$bin" ] || die "no sluice binary at $bin (build it, or give --bin)"
  if [ -n "$ingest_root" ]; then
    [ -d "$ingest_root" ] || die "--ingest-root $ingest_root is not a directory"
    ingest_root="$(cd "$ingest_root" && pwd)"
  fi
  need_tools
  [ -e "$RIG_DIR/namespaces" ] && die "a rig is already up ($RIG_DIR); run 'bash scripts/rig.sh down' first"
  mkdir -p "$RIG_DIR"
  [ "$delay" = 0 ] && delay=""
  probe_namespaces "$delay"

  local cpus half
  cpus="$(nproc)"
  half=$(( cpus / 2 > 0 ? cpus / 2 : 1 ))
  if [ -z "$storage_cpus" ]; then storage_cpus="$(cpu_range 0 $((half - 1)))"; fi
  if [ -z "$compute_cpus" ]; then
    if [ "$cpus" -ge 2 ]; then compute_cpus="$(cpu_range "$half" $((cpus - 1)))"; else compute_cpus=0; fi
  fi
  local storage_cores compute_cores
  storage_cores="$(cpu_count "$storage_cpus")"
  compute_cores="$(cpu_count "$compute_cpus")"

  # Failing half-way leaves nothing behind.
  trap 'if [ $? -ne 0 ]; then log "up failed; removing what it made"; cmd_down > /dev/null 2>&1 || true; fi' EXIT

  if [ -n "$tls" ]; then
    "$bin" certs ca "$RIG_DIR/pki" > /dev/null
    issue_cert "$bin" coordinator "$NET.2"
  fi
  if [ -n "$tokens" ]; then
    add_token "$bin" admin admin
    add_token "$bin" coordinator node
    add_token "$bin" storage node
    for ((j = 0; j < compute; j++)); do add_token "$bin" "compute$j" node; done
  fi

  ip link add "$BRIDGE" type bridge
  echo "$BRIDGE" > "$RIG_DIR/bridge"
  ip addr add "$NET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up

  # Storage nodes: each registers with the coordinator (which is also
  # given their list: either way works) and takes ingests beneath the
  # ingest root, which every host of the rig sees at the same path.
  local urls=() i j
  for ((i = 0; i < storage; i++)); do
    start_storage "$i" "$link" "$delay" "$storage_cpus" "$storage_cores" "$bin" "$ingest_root"
    urls+=("$(web)://$NET.$((10 + i)):$STORAGE_PORT")
  done
  for ((i = 0; i < storage; i++)); do wait_for "$RIG_DIR/storage$i/node.log" "listening on"; done
  local storage_list
  storage_list="$(IFS=,; echo "${urls[*]}")"

  # The coordinator: REST and jobs, the compute side of jobs, and the
  # sharded ingest over REST.
  mkdir -p "$RIG_DIR/coordinator"
  add_host "$PREFIX-coord" 2
  shape "$PREFIX-coord" "" "$delay"
  local ingest_args=()
  [ -n "$ingest_root" ] && ingest_args=(--ingest-root "$ingest_root")
  # shellcheck disable=SC2046
  start "$PREFIX-coord" "$compute_cpus" "$RIG_DIR/coordinator/serve.log" \
    env $(identity coordinator) "$bin" --data-dir "$RIG_DIR/coordinator/data" serve --storage "$storage_list" \
    --rest "$NET.2:$REST_PORT" --flight "$NET.2:$FLIGHT_PORT" --compute-cores "$compute_cores" \
    "${ingest_args[@]}" "${serve_extra[@]}"

  # Compute nodes are given only the coordinator: they learn the storage
  # nodes from it (registering once before they listen).
  wait_for "$RIG_DIR/coordinator/serve.log" "REST API on"
  local compute_urls=()
  for ((j = 0; j < compute; j++)); do
    local dir="$RIG_DIR/compute$j"
    mkdir -p "$dir"
    add_host "$PREFIX-c$j" $((100 + j))
    issue_cert "$bin" "compute$j" "$NET.$((100 + j))"
    shape "$PREFIX-c$j" "" "$delay"
    # shellcheck disable=SC2046
    start "$PREFIX-c$j" "$compute_cpus" "$dir/node.log" \
      env $(identity "compute$j") "$bin" --data-dir "$dir/data" compute-node --listen "$NET.$((100 + j)):$COMPUTE_PORT" \
      --compute-cores "$compute_cores" \
      --coordinator "$(web)://$NET.2:$REST_PORT" --advertise "$(grpc)://$NET.$((100 + j)):$COMPUTE_PORT"
    compute_urls+=("$(web)://$NET.$((100 + j)):$COMPUTE_PORT")
  done
  for ((j = 0; j < compute; j++)); do wait_for "$RIG_DIR/compute$j/node.log" "listening on"; done

  # Each directory below the ingest root, ingested over REST on the
  # coordinator: spread over the storage nodes, committed on all or none.
  if [ -n "$ingest_root" ]; then
    local ds
    for ds in "$ingest_root"/*/; do
      ds="${ds%/}"
      # shellcheck disable=SC2046
      env $([ -n "$tokens" ] && echo "SLUICE_TOKEN=$(cat "$RIG_DIR/secrets/admin")") \
        $([ -n "$tls" ] && echo "SLUICE_TLS_CA=$RIG_DIR/pki/ca.pem") \
        "$bin" ingest "$(basename "$ds")" "$ds" --url "$(web)://$NET.2:$REST_PORT" "${replicas[@]}" \
        >> "$RIG_DIR/ingest.log" 2>&1 || { cat "$RIG_DIR/ingest.log" >&2; die "ingest of $ds over REST failed"; }
    done
  fi
  trap - EXIT

  {
    echo "LINK=${link:-unlimited}"
    echo "DELAY=${delay:-0}"
    echo "STORAGE_CPUS=$storage_cpus"
    echo "INGEST_ROOT=$ingest_root"
    echo "COMPUTE_CPUS=$compute_cpus"
    echo "STORAGE=$storage_list"
    echo "COMPUTE=$(IFS=,; echo "${compute_urls[*]}")"
    echo "FLIGHT=$(web)://$NET.2:$FLIGHT_PORT"
    echo "REST=$(web)://$NET.2:$REST_PORT"
    if [ -n "$tokens" ]; then echo "TOKEN=$(cat "$RIG_DIR/secrets/admin")"; fi
    if [ -n "$tls" ]; then echo "CA=$RIG_DIR/pki/ca.pem"; fi
  } > "$RIG_DIR/rig.env"
  log "up: $storage storage node(s) on CPUs $storage_cpus, coordinator and $compute compute node(s) on CPUs $compute_cpus, link ${link:-unlimited}, delay ${delay:-0}; logs in $RIG_DIR"
  cat "$RIG_DIR/rig.env"
}

cmd_link() {
  local rate="${1:-}" delay=""
  [ -n "$rate" ] || die "usage: rig.sh link RATE [--delay D]"
  shift
  [ "${1:-}" = --delay ] && delay="${2:-}"
  [ -e "$RIG_DIR/namespaces" ] || die "no rig is up"
  [ -z "$delay" ] && delay="$(sed -n 's/^DELAY=//p' "$RIG_DIR/rig.env")"
  [ "$delay" = 0 ] && delay=""
  [ "$rate" = unlimited ] || rate_bytes "$rate" > /dev/null
  local ns
  while read -r ns; do
    case "$ns" in
      "$PREFIX"-s*)
        if [ -z "$delay" ] && [ "$rate" != unlimited ]; then
          # Only the rate changes: `tc qdisc change` keeps the queue.
          ip netns exec "$ns" tc qdisc change dev eth0 root handle 1: tbf rate "$rate" \
            burst "$(( $(rate_bytes "$rate") / 250 > 131072 ? $(rate_bytes "$rate") / 250 : 131072 ))" latency 50ms \
            2> /dev/null || shape "$ns" "$rate" "$delay"
        else
          shape "$ns" "$rate" "$delay"
        fi
        ;;
    esac
  done < "$RIG_DIR/namespaces"
  sed -i "s/^LINK=.*/LINK=$rate/" "$RIG_DIR/rig.env"
  log "link now $rate${delay:+, delay $delay}"
}

# One more storage node, on the next address, given to no one: it
# registers with the coordinator by itself. Prints its `STORAGE_URL=`.
cmd_add_storage() {
  [ -e "$RIG_DIR/namespaces" ] || die "no rig is up"
  local i=0 bin="${SLUICE_BIN:-}" env_link env_delay cpus cores root
  while [ -d "$RIG_DIR/storage$i" ]; do i=$((i + 1)); done
  if [ -z "$bin" ]; then
    source scripts/env.sh
    bin="$CARGO_TARGET_DIR/debug/sluice"
  fi
  env_link="$(sed -n 's/^LINK=//p' "$RIG_DIR/rig.env")"
  env_delay="$(sed -n 's/^DELAY=//p' "$RIG_DIR/rig.env")"
  [ "$env_link" = unlimited ] && env_link=""
  [ "$env_delay" = 0 ] && env_delay=""
  cpus="$(sed -n 's/^STORAGE_CPUS=//p' "$RIG_DIR/rig.env")"
  cores="$(cpu_count "$cpus")"
  root="$(sed -n 's/^INGEST_ROOT=//p' "$RIG_DIR/rig.env")"
  start_storage "$i" "$env_link" "$env_delay" "$cpus" "$cores" "$bin" "$root"
  wait_for "$RIG_DIR/storage$i/node.log" "listening on"
  log "storage node $i up at $(web)://$NET.$((10 + i)):$STORAGE_PORT; it registers with the coordinator"
  echo "STORAGE_URL=$(web)://$NET.$((10 + i)):$STORAGE_PORT"
}

# Storage node $1 stopped (SIGKILL, if it still runs) and started again
# over its data dir, at the same address: what a node's restart is.
cmd_restart_storage() {
  local i="${1:-}" bin="${SLUICE_BIN:-}" pid cpus
  [[ "$i" =~ ^[0-9]+$ ]] || die "usage: rig.sh restart-storage I"
  [ -d "$RIG_DIR/storage$i" ] || die "no storage node $i"
  if [ -z "$bin" ]; then
    source scripts/env.sh
    bin="$CARGO_TARGET_DIR/debug/sluice"
  fi
  for pid in $(awk -v out="$RIG_DIR/storage$i/node.log" '$2 == out {print $1}' "$RIG_DIR/pids"); do
    kill -KILL "$pid" 2> /dev/null || true
    while kill -0 "$pid" 2> /dev/null; do sleep 0.05; done
  done
  # The log of the run before is kept beside the new one.
  mv "$RIG_DIR/storage$i/node.log" "$RIG_DIR/storage$i/node.log.$(date +%s%N)"
  sed -i "\|$RIG_DIR/storage$i/node.log\$|d" "$RIG_DIR/pids"
  cpus="$(sed -n 's/^STORAGE_CPUS=//p' "$RIG_DIR/rig.env")"
  run_storage "$i" "$cpus" "$(cpu_count "$cpus")" "$bin" "$(sed -n 's/^INGEST_ROOT=//p' "$RIG_DIR/rig.env")"
  wait_for "$RIG_DIR/storage$i/node.log" "listening on"
  log "storage node $i restarted"
}

cmd_status() {
  [ -e "$RIG_DIR/namespaces" ] || { echo "no rig is up"; return 0; }
  cat "$RIG_DIR/rig.env"
  local ns
  while read -r ns; do
    echo "$ns: $(ip netns exec "$ns" tc qdisc show dev eth0 | head -1)"
  done < "$RIG_DIR/namespaces"
}

cmd_down() {
  local pid ns
  if [ -e "$RIG_DIR/pids" ]; then
    local pids
    pids="$(awk '{print $1}' "$RIG_DIR/pids")"
    for pid in $pids; do kill -TERM "$pid" 2> /dev/null || true; done
    for _ in $(seq 100); do
      local alive=0
      for pid in $pids; do kill -0 "$pid" 2> /dev/null && alive=1; done
      [ "$alive" = 0 ] && break
      sleep 0.1
    done
    for pid in $pids; do kill -KILL "$pid" 2> /dev/null || true; done
  fi
  # The host ends of the veth pairs first: deleting one end deletes the
  # pair at once, where a deleted namespace's links go away later.
  local link
  for link in $(ip -o link show 2> /dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep '^slr-' || true); do
    ip link del "$link" 2> /dev/null || true
  done
  # Every namespace of this rig, recorded or not (an `up` cut short).
  for ns in $(ip netns list 2> /dev/null | awk '{print $1}' | grep "^$PREFIX-" || true); do
    for pid in $(ip netns pids "$ns" 2> /dev/null); do kill -KILL "$pid" 2> /dev/null || true; done
    ip netns del "$ns" 2> /dev/null || true
  done
  ip link del "$BRIDGE" 2> /dev/null || true
  rm -rf "$RIG_DIR"
  log "down"
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  link) shift; cmd_link "$@" ;;
  add-storage) cmd_add_storage ;;
  restart-storage) shift; cmd_restart_storage "$@" ;;
  status) cmd_status ;;
  down) cmd_down ;;
  *) die "usage: rig.sh up|link|add-storage|restart-storage|status|down (see the top of scripts/rig.sh)" ;;
esac
