#!/usr/bin/env bash
# Allocate latency benchmark: the fake kubelet calls Allocate over the plugin's unix socket, the
# plugin finds the pod (its watch-fed pod cache, else the in-process API server), publishes the
# limits file on local disk (fsync'd) and patches the pod. Sequential, then CONCURRENCY calls at
# once; ALLOCATIONS each, alternating in chunks with a baseline plugin that has no pod cache
# (every pod read from the API server); the whole run repeated RUNS times (a fresh world each
# time). With REST, each phase starts after that many seconds of pause.
#
#   bench/allocate/run.sh                       # 3 runs of 1000 allocations, 8 concurrent, /var/tmp
#   RUNS=1 REST=0 ALLOCATIONS=200 CONCURRENCY=4 BENCH_DIR=/mnt/disk bench/allocate/run.sh
#
# Writes OUT (default bench/results/allocate/results.md, also printed): the median p99 over the runs
# first, then each run's full report. Reports go under bench/results/ (ignored by git),
# never into a tracked file (figures worth keeping are copied into docs/benchmarks.md). Release
# build. Run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
ALLOCATIONS=${ALLOCATIONS:-1000}
CONCURRENCY=${CONCURRENCY:-8}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
RUNS=${RUNS:-3}
REST=${REST:-0}
cargo build --release -p hami-tests --example allocate_bench
bin="$(scripts/target-dir)/release/examples/allocate_bench"
out=${OUT:-bench/results/allocate/results.md}
mkdir -p "$(dirname "$out")"
reports=$(mktemp -d)
# The runs' files are kept until the last run is over, then removed: deleting thousands of files
# makes ext4 pass over the recently deleted inodes (ext4_new_inode -> recently_deleted(), a window
# of 60 s, 300 s while the inode table block is dirty) on every file creation for minutes, which
# a run started meanwhile would measure instead of the plugin. For the same reason, start it a few
# minutes after a build or `cargo clean` (the disk floor at the end of each report shows the state).
work=$(mktemp -d "$BENCH_DIR/hami-allocate-bench-run.XXXXXX")
trap 'rm -rf "$reports" "$work"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for run in $(seq 1 "$RUNS"); do
  "$bin" --allocations "$ALLOCATIONS" --concurrency "$CONCURRENCY" --rest "$REST" --dir "$work" > "$reports/$run.md"
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# The latency table's rows: | run | allocations | errors | p50 | p90 | p99 | max | mean |
row() { grep -F "| $1 | " "$2" | grep -E "^\| [^|]+ \| [0-9]+ \| [0-9]+ \|"; }
median() { sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else printf "%.3f\n", (v[NR/2]+v[NR/2+1])/2}'; }
tmp=$(mktemp)
{
  echo "# Allocate latency"
  echo
  echo "Command: \`RUNS=$RUNS REST=$REST ALLOCATIONS=$ALLOCATIONS CONCURRENCY=$CONCURRENCY BENCH_DIR=$BENCH_DIR bench/allocate/run.sh\` (release build)"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'))," \
       "$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r)"
  echo "- disk: $(df -T "$BENCH_DIR" | awk 'NR==2 {print $2 " on " $1}') ($BENCH_DIR)"
  echo "- load average before the runs: $load_before; after: $load_after"
  echo
  echo "## Summary over $RUNS runs (target: p99 ≤ 10 ms, zero errors)"
  echo
  echo "| run | p99 ms per run | median p99 ms | median p50 ms | errors (all runs) |"
  echo "|---|---|---:|---:|---:|"
  for name in sequential "sequential, no pod cache (baseline)" "$CONCURRENCY concurrent" \
              "$CONCURRENCY concurrent, no pod cache (baseline)"; do
    p99s=$(for f in "$reports"/*.md; do row "$name" "$f" | awk -F'|' '{gsub(/ /,"",$7); print $7}'; done)
    p50s=$(for f in "$reports"/*.md; do row "$name" "$f" | awk -F'|' '{gsub(/ /,"",$5); print $5}'; done)
    errors=$(for f in "$reports"/*.md; do row "$name" "$f" | awk -F'|' '{gsub(/ /,"",$4); print $4}'; done | awk '{s+=$1} END {print s+0}')
    echo "| $name | $(echo "$p99s" | paste -sd' ' | sed 's/ /, /g') | $(echo "$p99s" | median) | $(echo "$p50s" | median) | $errors |"
  done
  floor=$(for f in "$reports"/*.md; do grep -E "^\| $CONCURRENCY at once \|" "$f" | awk -F'|' '{gsub(/ /,"",$5); print $5}'; done)
  echo "| disk floor: publish_atomic alone, $CONCURRENCY at once | $(echo "$floor" | paste -sd' ' | sed 's/ /, /g') | $(echo "$floor" | median) | | |"
  for run in $(seq 1 "$RUNS"); do
    echo
    echo "## Run $run"
    echo
    cat "$reports/$run.md"
  done
} > "$tmp"
mv "$tmp" "$out"
cat "$out"
