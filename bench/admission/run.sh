#!/usr/bin/env bash
# One review's cost against its size: the oversized reviews written by gen.py, answered by the
# release `hami-webhook review` (the same parse + decide + encode the server runs per request), each
# under /usr/bin/time -v: wall time, peak RSS, answer and response size. Writes OUT (default
# bench/results/admission/results.md): reports go under bench/results/ (ignored by git),
# never into a tracked file (figures worth keeping are copied into docs/benchmarks.md).
#
#   bench/admission/run.sh            # RUNS=3
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RUNS=${RUNS:-3}
OUT=${OUT:-$ROOT/bench/results/admission/results.md}
mkdir -p "$(dirname "$OUT")"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cargo build --release -p hami-webhook --manifest-path "$ROOT/Cargo.toml" >&2
BIN=$("$ROOT/scripts/target-dir")/release/hami-webhook
python3 "$ROOT/bench/admission/gen.py" "$WORK" >&2
{
  echo "# One review's cost against its size"
  echo
  echo "\`bench/admission/run.sh\` ($(date -u +%Y-%m-%d), $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load average $(cut -d' ' -f1-3 /proc/loadavg)); RUNS=$RUNS, median wall time, largest peak RSS. \`hami-webhook review --per-gpu-vram-mib 81920 --file <review>\` (release); before the webhook bounded a review's size: kai-91358 10 s, 550 MiB, a 58.6 MiB patch; kai-239973 no answer in 40 s; hami-7.9MiB 129 MiB."
  echo
  echo "| review | body | answer | response | wall (median) | peak RSS (max) |"
  echo "|---|---:|---|---:|---:|---:|"
} >"$OUT"
for f in kai-small kai-1000 kai-91358 kai-239973 hami-7.9MiB; do
  input=$WORK/$f.json
  walls=(); rss=0
  for _ in $(seq "$RUNS"); do
    /usr/bin/time -v "$BIN" review --per-gpu-vram-mib 81920 --file "$input" >"$WORK/out.json" 2>"$WORK/time.txt" || true
    wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$WORK/time.txt")
    walls+=("$(python3 -c "p='$wall'.split(':'); print(round(1000 * (float(p[-1]) + 60*float(p[-2]))))")")
    r=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$WORK/time.txt")
    [ "$r" -gt "$rss" ] && rss=$r
  done
  median=$(printf '%s\n' "${walls[@]}" | sort -n | sed -n "$(( (RUNS + 1) / 2 ))p")
  answer=$(python3 - "$WORK/out.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["response"]
if r["allowed"]:
    import base64
    print(f"allowed, patch {len(base64.b64decode(r['patch']))/1024:.1f} KiB" if "patch" in r else "allowed")
else:
    print("denied: " + r["status"]["message"][:90].replace("|", "/") + "…")
PY
)
  body=$(python3 -c "import os; n=os.path.getsize(\"$input\"); print(f'{n/2**20:.1f} MiB' if n >= 2**20 else f'{n/1024:.0f} KiB')")
  resp=$(python3 -c "import os; print(f'{os.path.getsize(\"$WORK/out.json\")/1024:.1f} KiB')")
  echo "| $f | $body | $answer | $resp | ${median} ms | $((rss / 1024)) MiB |" >>"$OUT"
  echo "$f: $answer; ${median} ms; $((rss / 1024)) MiB" >&2
done
cat "$OUT"
