#!/usr/bin/env bash
# Allocate latency benchmark: the fake kubelet calls Allocate over the plugin's unix socket, the
# plugin finds the pod in the in-process API server, publishes the limits file on local disk
# (fsync'd) and patches the pod. Sequential, then CONCURRENCY calls at once; ALLOCATIONS each.
#
#   bench/allocate/run.sh                       # 1000 allocations, 8 concurrent, in /var/tmp
#   ALLOCATIONS=200 CONCURRENCY=4 BENCH_DIR=/mnt/disk bench/allocate/run.sh
#
# Writes bench/allocate/results.md (also printed). Release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
ALLOCATIONS=${ALLOCATIONS:-1000}
CONCURRENCY=${CONCURRENCY:-8}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release -p hami-tests --example allocate_bench
bin="$CARGO_TARGET_DIR/release/examples/allocate_bench"
out=${OUT:-bench/allocate/results.md}
tmp=$(mktemp)
{
  echo "# Allocate latency"
  echo
  echo "Command: \`ALLOCATIONS=$ALLOCATIONS CONCURRENCY=$CONCURRENCY BENCH_DIR=$BENCH_DIR bench/allocate/run.sh\` (release build)"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'))," \
       "$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r)"
  echo "- disk: $(df -T "$BENCH_DIR" | awk 'NR==2 {print $2 " on " $1}') ($BENCH_DIR)"
  echo "- load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  "$bin" --allocations "$ALLOCATIONS" --concurrency "$CONCURRENCY" --dir "$BENCH_DIR"
  echo
  echo "- load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$tmp"
mv "$tmp" "$out"
cat "$out"
