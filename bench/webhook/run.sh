#!/usr/bin/env bash
# Admission throughput and latency: hami-webhook against the Go standard-library baseline, same run,
# same method (../shared/bench/README.md). Server pinned to core 0, h2load on core 1, TLS,
# HTTP/1.1 keep-alive, 16 connections. Writes OUT (default bench/results/webhook/results.md). Reports
# go under bench/results/ (ignored by git), never into a tracked file (figures worth
# keeping are copied into docs/benchmarks.md).
#
#   bench/webhook/run.sh                  # RUNS=3 N=40000 RATE_N=50000
#   RUNS=5 bench/webhook/run.sh
#
# Needs: h2load (nghttp2-client), go (golang-go), openssl, taskset. Installed with apt-get when
# missing and running as root.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HANDBOOK=${HANDBOOK:-$(cd "$ROOT/.." && pwd)/shared}
RUNS=${RUNS:-3}
N=${N:-40000}
CLIENTS=${CLIENTS:-16}
RATE_PER_CLIENT=${RATE_PER_CLIENT:-313} # x 16 clients ~ 5,000 req/s
RATE_N=${RATE_N:-50000}
SERVER_CORE=${SERVER_CORE:-0}
LOAD_CORE=${LOAD_CORE:-1}
OURS_PORT=${OURS_PORT:-18443}
OURS_METRICS=${OURS_METRICS:-18090}
GO_PORT=${GO_PORT:-19443}
OUT=${OUT:-$ROOT/bench/results/webhook/results.md}
mkdir -p "$(dirname "$OUT")"

# On another machine (e.g. an idle many-core one) with prebuilt parts, nothing is built or installed:
#   BIN=path/to/hami-webhook GO_PEER_BIN=path/to/go-peer FIXTURES_DIR=dir/with/the/handbook/fixtures \
#   H2LOAD=path/to/h2load bench/webhook/run.sh
H2LOAD=${H2LOAD:-h2load}
FIXTURES_DIR=${FIXTURES_DIR:-$HANDBOOK/bench/fixtures}
need() { command -v "$1" >/dev/null 2>&1; }
if [ -z "${GO_PEER_BIN:-}" ] && { ! need "$H2LOAD" || ! need go; }; then
  if [ "$(id -u)" = 0 ]; then
    echo "== installing nghttp2-client golang-go"
    apt-get update -qq && apt-get install -y -qq nghttp2-client golang-go >/dev/null
  else
    echo "h2load and go are needed: apt-get install -y nghttp2-client golang-go" >&2
    exit 1
  fi
fi
for t in "$H2LOAD" openssl taskset; do need "$t" || { echo "missing $t" >&2; exit 1; }; done
[ -n "${GO_PEER_BIN:-}" ] || need go || { echo "missing go" >&2; exit 1; }

# WORK, cleanup, BIN, the Go peer, the test certificate.
. "$ROOT/bench/lib.sh"

echo "== starting servers on core $SERVER_CORE"
HAMI_KAI__PER_GPU_VRAM_MIB=16384 RUST_LOG=warn taskset -c "$SERVER_CORE" "$BIN" serve --listen "127.0.0.1:$OURS_PORT" \
  --metrics-listen "127.0.0.1:$OURS_METRICS" --tls-cert "$WORK/cert.pem" --tls-key "$WORK/key.pem" \
  --worker-threads 1 >"$WORK/ours.log" 2>&1 &
OURS_PID=$!
PIDS+=("$OURS_PID")
taskset -c "$SERVER_CORE" "$WORK/go-peer-bin" -cert "$WORK/cert.pem" -key "$WORK/key.pem" \
  -listen "127.0.0.1:$GO_PORT" >"$WORK/go.log" 2>&1 &
GO_PID=$!
PIDS+=("$GO_PID")
for _ in $(seq 1 100); do
  if curl -sf "http://127.0.0.1:$OURS_METRICS/readyz" >/dev/null &&
     curl -sk -o /dev/null "https://127.0.0.1:$GO_PORT/mutate"; then break; fi
  sleep 0.1
done
curl -sf "http://127.0.0.1:$OURS_METRICS/readyz" >/dev/null || { cat "$WORK/ours.log"; exit 1; }

FIXTURES=(
  "plain-pod:$FIXTURES_DIR/plain-pod.json"
  "hami-pod:$ROOT/bench/webhook/fixtures/hami-pod.json"
  "kai-fraction-small:$FIXTURES_DIR/kai-fraction-small.json"
  "kai-fraction-large:$FIXTURES_DIR/kai-fraction-large.json"
)

# CPU time (user + system) of a process so far, in clock ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)

# h2load against one server; prints "req_per_s p50_us p99_us failed cpu_us_per_request".
# CPU per request does not depend on what else the machine runs; requests/s and latency do.
load() { # pid port fixture extra-args...
  local pid=$1 port=$2 fixture=$3
  shift 3
  local log="$WORK/h2load.log" out t0 t1
  rm -f "$log"
  t0=$(ticks "$pid")
  out=$(taskset -c "$LOAD_CORE" "$H2LOAD" --h1 -c "$CLIENTS" -m 1 -d "$fixture" \
    -H 'Content-Type: application/json' --log-file="$log" "$@" "https://127.0.0.1:$port/mutate" 2>&1)
  t1=$(ticks "$pid")
  local rps failed
  rps=$(sed -n 's/^finished in .*, \([0-9.]*\) req\/s.*/\1/p' <<<"$out")
  failed=$(sed -n 's/^requests: .* \([0-9]*\) failed.*/\1/p' <<<"$out")
  local non200
  non200=$(awk -F'\t' '$2 != 200' "$log" | wc -l)
  read -r p50 p99 < <(cut -f3 "$log" | sort -n | awk '{a[NR]=$1} END {
    i50=int(NR*0.50); if (i50<1) i50=1; i99=int(NR*0.99); if (i99<1) i99=1; print a[i50], a[i99] }')
  local done_n cpu
  done_n=$(wc -l <"$log")
  cpu=$(awk -v d=$((t1 - t0)) -v hz="$HZ" -v n="$done_n" 'BEGIN {printf "%.1f", d * 1e6 / hz / n}')
  echo "$rps $p50 $p99 $((failed + non200)) $cpu"
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A RES
echo "== throughput: $RUNS runs x ${#FIXTURES[@]} fixtures, -n $N -c $CLIENTS"
for run in $(seq 1 "$RUNS"); do
  for f in "${FIXTURES[@]}"; do
    name=${f%%:*} path=${f#*:}
    for server in ours go; do
      port=$OURS_PORT pid=$OURS_PID; [ "$server" = go ] && port=$GO_PORT pid=$GO_PID
      r=$(load "$pid" "$port" "$path" -n "$N")
      RES[$name,$server,$run]=$r
      echo "  run $run $name $server: $r"
    done
  done
done

echo "== latency at $((RATE_PER_CLIENT * CLIENTS)) req/s: $RUNS runs, -n $RATE_N"
for run in $(seq 1 "$RUNS"); do
  for f in "${FIXTURES[@]:0:2}"; do
    name=${f%%:*} path=${f#*:}
    for server in ours go; do
      port=$OURS_PORT pid=$OURS_PID; [ "$server" = go ] && port=$GO_PORT pid=$GO_PID
      r=$(load "$pid" "$port" "$path" -n "$RATE_N" --rps "$RATE_PER_CLIENT")
      RES[rate-$name,$server,$run]=$r
      echo "  run $run rate $name $server: $r"
    done
  done
done

hwm() { awk '/VmHWM/ {printf "%.1f", $2/1024}' "/proc/$1/status"; }
OURS_RSS=$(hwm "$OURS_PID")
GO_RSS=$(hwm "$GO_PID")

col() { # key server field(1-based)
  for run in $(seq 1 "$RUNS"); do awk -v i="$3" '{print $i}' <<<"${RES[$1,$2,$run]}"; done | median
}
fails() { local t=0; for run in $(seq 1 "$RUNS"); do t=$((t + $(awk '{print $4}' <<<"${RES[$1,$2,$run]}"))); done; echo $t; }
us2ms() { awk -v u="$1" 'BEGIN {printf "%.2f", u/1000}'; }

{
  echo "# hami-webhook admission benchmark"
  echo
  echo "Generated by \`bench/webhook/run.sh\` on $(date -u +%Y-%m-%dT%H:%MZ) ($(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))."
  echo "Servers pinned to core $SERVER_CORE (\`taskset -c $SERVER_CORE\`; hami-webhook with \`--worker-threads 1\`),"
  echo "load on core $LOAD_CORE: \`h2load --h1 -c $CLIENTS -m 1 -n $N\` over TLS (keep-alive). Medians of $RUNS runs;"
  echo "latency percentiles from h2load's per-request log. Baseline: the Go standard-library webhook in"
  echo "\`../shared/bench/go-peer/\`, measured in the same run."
  echo
  echo "## Throughput"
  echo
  echo "| fixture | hami-webhook req/s | Go req/s | ratio | hami-webhook p50 / p99 ms | Go p50 / p99 ms | CPU µs/req (ours / Go) | CPU ratio (Go/ours) | failed (ours/Go) |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for f in "${FIXTURES[@]}"; do
    name=${f%%:*}
    o=$(col "$name" ours 1) g=$(col "$name" go 1)
    ratio=$(awk -v o="$o" -v g="$g" 'BEGIN {printf "%.2f", o/g}')
    oc=$(col "$name" ours 5) gc=$(col "$name" go 5)
    cratio=$(awk -v o="$oc" -v g="$gc" 'BEGIN {printf "%.2f", g/o}')
    echo "| $name | $(printf %.0f "$o") | $(printf %.0f "$g") | **${ratio}x** | $(us2ms "$(col "$name" ours 2)") / $(us2ms "$(col "$name" ours 3)") | $(us2ms "$(col "$name" go 2)") / $(us2ms "$(col "$name" go 3)") | $oc / $gc | **${cratio}x** | $(fails "$name" ours)/$(fails "$name" go) |"
  done
  echo
  echo "## Latency at $((RATE_PER_CLIENT * CLIENTS)) req/s"
  echo
  echo "\`h2load --h1 -c $CLIENTS --rps $RATE_PER_CLIENT -n $RATE_N\` (rate is per client)."
  echo
  echo "| fixture | hami-webhook p50 / p99 ms | Go p50 / p99 ms | achieved req/s (ours / Go) |"
  echo "|---|---:|---:|---:|"
  for f in "${FIXTURES[@]:0:2}"; do
    name=${f%%:*}
    echo "| $name | $(us2ms "$(col "rate-$name" ours 2)") / $(us2ms "$(col "rate-$name" ours 3)") | $(us2ms "$(col "rate-$name" go 2)") / $(us2ms "$(col "rate-$name" go 3)") | $(printf %.0f "$(col "rate-$name" ours 1)") / $(printf %.0f "$(col "rate-$name" go 1)") |"
  done
  echo
  echo "## Peak memory"
  echo
  echo "| server | VmHWM (MiB) |"
  echo "|---|---:|"
  echo "| hami-webhook | $OURS_RSS |"
  echo "| Go peer | $GO_RSS |"
  echo
  echo "Load average while running: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine inflates latency and"
  echo "lowers requests/s for both servers alike; CPU µs per request is not affected by it)."
  echo
  echo "Notes: the Go peer performs only the KAI mutation and the limit-delivery check; on \`hami-pod\` it"
  echo "returns no patch while hami-webhook applies HAMi's mutation (scheduler, CUDA_TASK_PRIORITY)."
} >"$OUT"
echo "== wrote $OUT"
cat "$OUT"
