#!/usr/bin/env bash
# Admission cost of a gpu-fraction pod's node affinity against a 10,000-node VRAM index, before and
# after, same run: this tree against a base revision (default: main), each built from the same
# bench sources (webhook/benches/affinity_cost.rs is copied into the base tree, which has the API it
# uses) in a target folder of its own, each binary pinned to one core, interleaved base, this,
# this, base. Check the outcomes column: the base rows are refused for "no GPU node" after the
# full evaluation, this tree's over-limit rows for the limit. Also the Criterion
# `decide` bench and the `kai_vram_index` bench of both, for the ordinary fixtures and lookups.
# Writes OUT_DIR/results.md and the raw outputs in OUT_DIR/raw/ (default OUT_DIR:
# bench/results/affinity): reports go under bench/results/ (ignored by git), never into a tracked
# file (figures worth keeping are copied into docs/benchmarks.md).
#
#   bench/affinity/run.sh                           # BASE=main CORE=0 SAMPLES=15 SLOW_SECONDS=30
#   BUILD_ONLY=1 bench/affinity/run.sh              # build both into <target>/affinity-bench/{this,base}
#   BASE_BIN_DIR=dir THIS_BIN_DIR=dir bench/affinity/run.sh   # prebuilt binaries (another machine)
#
# The binaries in a *_BIN_DIR are named affinity_cost, decide and kai_vram_index.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BASE=${BASE:-main}
CORE=${CORE:-0}
export SAMPLES=${SAMPLES:-15} SLOW_SECONDS=${SLOW_SECONDS:-30}
CRITERION_ARGS=${CRITERION_ARGS:---warm-up-time 1 --measurement-time 3}
# cargo's target folder (CARGO_TARGET_DIR honoured): this tree's build, and the base's beside it.
TARGET=$("$ROOT/scripts/target-dir")
OUT_DIR=${OUT_DIR:-$ROOT/bench/results/affinity}

# Build one tree's three bench binaries into $2 (named without Cargo's hash).
build() {
  local tree=$1 dest=$2
  mkdir -p "$dest"
  (cd "$tree" && cargo bench -p hami-webhook --bench affinity_cost --bench decide \
      --bench kai_vram_index --no-run --message-format=json 2>/dev/null) |
    python3 -c '
import json, shutil, sys
dest = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "bench" in m["target"]["kind"]:
        shutil.copy(m["executable"], dest + "/" + m["target"]["name"])
' "$dest"
}

if [ -z "${THIS_BIN_DIR:-}" ]; then
  THIS_BIN_DIR=$TARGET/affinity-bench/this
  build "$ROOT" "$THIS_BIN_DIR"
fi
if [ -z "${BASE_BIN_DIR:-}" ]; then
  BASE_TREE=$TARGET/affinity-bench/base-tree
  rm -rf "$BASE_TREE" && mkdir -p "$BASE_TREE"
  git -C "$ROOT" archive "$BASE" | tar -x -C "$BASE_TREE"
  cp "$ROOT/webhook/benches/affinity_cost.rs" "$BASE_TREE/webhook/benches/"
  grep -q 'name = "affinity_cost"' "$BASE_TREE/webhook/Cargo.toml" ||
    printf '\n[[bench]]\nname = "affinity_cost"\nharness = false\n' >>"$BASE_TREE/webhook/Cargo.toml"
  # A target folder of its own: Cargo names a workspace member's artifacts by its path inside the
  # workspace, so two trees in one folder overwrite each other's library and a bench links the
  # other tree's. Seeded with a copy of this tree's release build, so only the members rebuild.
  BASE_TARGET=$TARGET/affinity-bench/base-target
  if [ ! -d "$BASE_TARGET/release" ] && [ -d "$TARGET/release" ]; then
    mkdir -p "$BASE_TARGET" && cp -a "$TARGET/release" "$BASE_TARGET/"
  fi
  BASE_BIN_DIR=$TARGET/affinity-bench/base
  CARGO_TARGET_DIR=$BASE_TARGET build "$BASE_TREE" "$BASE_BIN_DIR"
fi

if [ -n "${BUILD_ONLY:-}" ]; then
  echo "built: $THIS_BIN_DIR $BASE_BIN_DIR" >&2
  exit 0
fi

RAW=$OUT_DIR/raw
mkdir -p "$RAW"
run() { # name rev dir
  echo "== $1 ($2)" >&2
  REV=$2 taskset -c "$CORE" "$3/affinity_cost" >"$RAW/affinity_cost-$1.md"
}
run 1-base "before ($BASE)" "$BASE_BIN_DIR"
run 2-this "after" "$THIS_BIN_DIR"
run 3-this "after" "$THIS_BIN_DIR"
run 4-base "before ($BASE)" "$BASE_BIN_DIR"
for pass in 1 2; do
  for which in base this; do
    dir=$BASE_BIN_DIR; [ $which = this ] && dir=$THIS_BIN_DIR
    echo "== decide $which $pass" >&2
    # shellcheck disable=SC2086
    taskset -c "$CORE" "$dir/decide" --bench --noplot $CRITERION_ARGS >"$RAW/decide-$pass-$which.txt" 2>&1
    echo "== kai_vram_index $which $pass" >&2
    "$dir/kai_vram_index" >"$RAW/kai_vram_index-$pass-$which.md" 2>/dev/null
  done
done

{
  echo "# Node-affinity admission cost: before ($BASE) and after, same run"
  echo
  echo "$(date -u +%F\ %H:%M) UTC, $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')), load $(cut -d' ' -f1-3 /proc/loadavg); each binary on core $CORE."
  echo
  for f in "$RAW"/affinity_cost-*.md; do cat "$f"; echo; done
  echo "## Criterion decide (time per review: low / median / high)"
  echo
  for f in "$RAW"/decide-*.txt; do
    echo "$(basename "$f" .txt):"
    echo '```'
    grep -E '^(review|decide)/|time:' "$f" | paste - - | sed 's/  */ /g'
    echo '```'
  done
  echo
  echo "## kai_vram_index"
  echo
  for f in "$RAW"/kai_vram_index-*.md; do echo "$(basename "$f" .md):"; echo; cat "$f"; echo; done
} >"$OUT_DIR/results.md"
echo "wrote $OUT_DIR/results.md" >&2
