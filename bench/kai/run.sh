#!/usr/bin/env bash
# KAI admission throughput: hami-webhook against the Go standard-library baseline
# (../shared/bench/go-peer, the hami_kai seed's mutation), same run, same method as
# bench/webhook/run.sh: servers pinned to core 0, h2load on core 1, TLS, HTTP/1.1 keep-alive,
# 16 connections, medians of RUNS runs, ratio of requests/s. Writes OUT (default
# bench/results/kai/results.md): reports go under bench/results/ (ignored by git), never
# into a tracked file (figures worth keeping are copied into docs/benchmarks.md).
#
#   bench/kai/run.sh                       # RUNS=3 N=40000 N_LARGE=10000
#
# Like for like: the Go peer runs with -vram 16384, preloads into every container and delivers the
# limit as an env var only; `ours-env-all` is hami-webhook with --per-gpu-vram-mib 16384,
# kai.preloadContainers: all and kai.limitDelivery: env: the same mutation, plus validation.
# The others are hami-webhook's defaults (preload into the fraction container only): `ours-env`
# (env delivery), `ours-file` (file delivery: also the per-container limits-file annotations, the
# downward-API volume and the /overrideEnv mounts), and `ours-nodes` (file delivery, basis from a
# 10,000-node NodeList given with --nodes instead of --per-gpu-vram-mib).
#
# Needs: h2load (nghttp2-client), go (golang-go), openssl, taskset, python3.
#
# On another machine (e.g. an idle many-core one) with prebuilt parts, nothing is built:
#   BIN=path/to/hami-webhook GO_PEER_BIN=path/to/go-peer FIXTURES_DIR=dir/with/kai-fraction-*.json \
#   H2LOAD=path/to/h2load bench/kai/run.sh
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HANDBOOK=${HANDBOOK:-$(cd "$ROOT/.." && pwd)/shared}
RUNS=${RUNS:-3}
N=${N:-40000}
N_LARGE=${N_LARGE:-10000}
CLIENTS=${CLIENTS:-16}
SERVER_CORE=${SERVER_CORE:-0}
LOAD_CORE=${LOAD_CORE:-1}
OUT=${OUT:-$ROOT/bench/results/kai/results.md}
mkdir -p "$(dirname "$OUT")"

H2LOAD=${H2LOAD:-h2load}
FIXTURES_DIR=${FIXTURES_DIR:-$HANDBOOK/bench/fixtures}
needs=(openssl taskset python3 curl "$H2LOAD")
[ -n "${GO_PEER_BIN:-}" ] || needs+=(go)
for t in "${needs[@]}"; do
  command -v "$t" >/dev/null 2>&1 || { echo "missing $t (apt-get install -y nghttp2-client golang-go openssl)" >&2; exit 1; }
done

# WORK, cleanup, BIN, the Go peer, the test certificate.
. "$ROOT/bench/lib.sh"
echo "== settings, a 10,000-node NodeList"
printf 'kai:\n  limitDelivery: env\n' >"$WORK/env-mode.yaml"
printf 'kai:\n  limitDelivery: env\n  preloadContainers: all\n' >"$WORK/env-all.yaml"
python3 - "$WORK/nodes.json" <<'PY'
import json, sys
sizes = [81920, 81559, 16384, 23028, 23034, 46068]  # every pod may land anywhere: min is 16384
zones = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"]
items = [{"metadata": {"name": f"gpu-{i:05d}", "labels": {
    "nvidia.com/gpu.memory": str(sizes[i % len(sizes)]),
    "topology.kubernetes.io/zone": zones[(i // 6) % 4],
    "kubernetes.io/hostname": f"gpu-{i:05d}"}}} for i in range(10000)]
json.dump({"apiVersion": "v1", "kind": "NodeList", "items": items}, open(sys.argv[1], "w"))
PY

# Ports of their own (bench/webhook/run.sh uses 18443/18090/19443): a server that cannot bind must
# not let the load go to someone else's.
for p in 28443 28444 28445 28446 28090 28091 28092 28093 29443; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "port $p is in use" >&2; exit 1; fi
done

# name port metrics-port args...
start_ours() {
  local name=$1 port=$2 mport=$3
  shift 3
  RUST_LOG=warn taskset -c "$SERVER_CORE" "$BIN" serve --listen "127.0.0.1:$port" \
    --metrics-listen "127.0.0.1:$mport" --tls-cert "$WORK/cert.pem" --tls-key "$WORK/key.pem" \
    --worker-threads 1 "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=("$!")
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$mport/readyz" >/dev/null && return; sleep 0.1; done
  cat "$WORK/$name.log"; exit 1
}
echo "== starting servers on core $SERVER_CORE"
start_ours ours-env-all 28446 28093 --config "$WORK/env-all.yaml" --per-gpu-vram-mib 16384
start_ours ours-env 28443 28090 --config "$WORK/env-mode.yaml" --per-gpu-vram-mib 16384
start_ours ours-file 28444 28091 --per-gpu-vram-mib 16384
start_ours ours-nodes 28445 28092 --nodes "$WORK/nodes.json"
taskset -c "$SERVER_CORE" "$WORK/go-peer-bin" -cert "$WORK/cert.pem" -key "$WORK/key.pem" \
  -listen 127.0.0.1:29443 -vram 16384 >"$WORK/go.log" 2>&1 &
PIDS+=("$!")
for _ in $(seq 1 100); do curl -sk -o /dev/null https://127.0.0.1:29443/mutate && break; sleep 0.1; done

declare -A PORT=([go]=29443 [ours-env-all]=28446 [ours-env]=28443 [ours-file]=28444 [ours-nodes]=28445)
SERVERS=(go ours-env-all ours-env ours-file ours-nodes)
FIXTURES=(
  "kai-fraction-small:$FIXTURES_DIR/kai-fraction-small.json:$N"
  "kai-fraction-large:$FIXTURES_DIR/kai-fraction-large.json:$N_LARGE"
)

# Same answer from each server: the limit they compute (0.25 and 0.5 of 16384 MiB).
for f in "${FIXTURES[@]}"; do
  IFS=: read -r name path _ <<<"$f"
  for s in "${SERVERS[@]}"; do
    curl -sk -H 'Content-Type: application/json' --data-binary "@$path" "https://127.0.0.1:${PORT[$s]}/mutate" |
      python3 -c 'import sys,json,base64,re; r=json.load(sys.stdin)["response"]; p=base64.b64decode(r["patch"]).decode(); print("  check", sys.argv[1], sys.argv[2], "allowed" if r["allowed"] else "DENIED", sorted(set(re.findall(r"CUDA_DEVICE_MEMORY_LIMIT\W+value\W+(\d+m)", p))), len(p), "patch bytes")' "$name" "$s"
  done
done

load() { # port fixture n -> "req_per_s failed"
  local out rps failed
  out=$(taskset -c "$LOAD_CORE" "$H2LOAD" --h1 -c "$CLIENTS" -m 1 -n "$3" -d "$2" \
    -H 'Content-Type: application/json' "https://127.0.0.1:$1/mutate" 2>&1)
  rps=$(sed -n 's/^finished in .*, \([0-9.]*\) req\/s.*/\1/p' <<<"$out")
  failed=$(sed -n 's/^requests: .* \([0-9]*\) failed.*/\1/p' <<<"$out")
  local codes
  codes=$(sed -n 's/^status codes: \([0-9]*\) 2xx.*/\1/p' <<<"$out")
  echo "$rps $((failed + $3 - codes))"
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A RES
for run in $(seq 1 "$RUNS"); do
  for f in "${FIXTURES[@]}"; do
    IFS=: read -r name path n <<<"$f"
    for s in "${SERVERS[@]}"; do
      r=$(load "${PORT[$s]}" "$path" "$n")
      RES[$name,$s,$run]=$r
      echo "  run $run $name $s: $r"
    done
  done
done
col() { for run in $(seq 1 "$RUNS"); do awk '{print $1}' <<<"${RES[$1,$2,$run]}"; done | median; }
fails() { local t=0; for run in $(seq 1 "$RUNS"); do t=$((t + $(awk '{print $2}' <<<"${RES[$1,$2,$run]}"))); done; echo $t; }

{
  echo "# KAI admission benchmark"
  echo
  echo "Generated by \`bench/kai/run.sh\` on $(date -u +%Y-%m-%dT%H:%MZ) ($(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))."
  echo "Servers pinned to core $SERVER_CORE (\`taskset -c $SERVER_CORE\`; hami-webhook \`--worker-threads 1\`); load on core"
  echo "$LOAD_CORE: \`taskset -c $LOAD_CORE h2load --h1 -c $CLIENTS -m 1 -n N -d FIXTURE\` over TLS (keep-alive); N = $N (small),"
  echo "$N_LARGE (large). Medians of $RUNS runs, all servers in the same run. Ratio = hami-webhook / Go."
  echo
  echo "| fixture | Go \`-vram 16384\` req/s | ours, same mutation (preload all, env) req/s (ratio) | ours default preload, env delivery (ratio) | ours default: file delivery (ratio) | ours, file, basis from 10k-node \`--nodes\` (ratio) | failed/non-2xx (Go/all/env/file/nodes) |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  for f in "${FIXTURES[@]}"; do
    IFS=: read -r name _ _ <<<"$f"
    g=$(col "$name" go)
    cell() { local o; o=$(col "$name" "$1"); printf '%.0f (**%.2fx**)' "$o" "$(awk -v o="$o" -v g="$g" 'BEGIN {print o/g}')"; }
    echo "| $name | $(printf %.0f "$g") | $(cell ours-env-all) | $(cell ours-env) | $(cell ours-file) | $(cell ours-nodes) | $(fails "$name" go)/$(fails "$name" ours-env-all)/$(fails "$name" ours-env)/$(fails "$name" ours-file)/$(fails "$name" ours-nodes) |"
  done
} >"$OUT"
echo "== wrote $OUT"
cat "$OUT"
