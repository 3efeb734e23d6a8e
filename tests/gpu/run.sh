#!/usr/bin/env bash
# Verify the caps on a real GPU node, with the HAMi-core clusters run today (built unmodified from
# its public source) and the preload library, as an operator would: processes started with an
# EMPTY environment (`env -i`, as an SSH login, `su -`, `sudo` or cron starts one), the limits file
# read-only at /overrideEnv, the preload list at /etc/ld.so.preload.
#
#   sudo tests/gpu/run.sh --bin DIR --hami-core-src DIR [--hook DIR] [--report FILE]
#   sudo tests/gpu/run.sh --bin DIR --hami-core-lib libvgpu.so ...
#
#   --bin DIR            holds hami-device-plugin, hami-webhook and libhami_preload.so (the shipped
#                        artifact from scripts/build-preload)
#   --hami-core-src DIR  a checkout of github.com/Project-HAMi/HAMi-core, built here as its build.sh
#                        does (Debug: a Release build with hidden visibility interposes nothing)
#   --hami-core-lib F    an already built libvgpu.so (e.g. copied out of HAMi's image) instead
#   --hook DIR           scratch hook path (default: a new temporary folder); never /usr/local
#   --report FILE        also write the result table (Markdown) there
#   HAMI_LIMITS_REV=...  the hami-limits revision to name in the report (default: git HEAD)
#   HAMI_PRELOAD_BEFORE=F  an older libhami_preload.so for the per-exec cost table (optional)
#   BENCH_RUNS, BENCH_N  rounds and execs per round of the per-exec cost (default 5 and 2000)
#
# Needs root, nvidia-smi, nvcc (for the probe), cc, cmake (for --hami-core-src), unshare, mount,
# mknod and python3.
# Nothing global is left changed: every case runs in a private mount namespace where the files are
# bind-mounted; empty mount points /overrideEnv and /etc/ld.so.preload are created only when absent
# and removed at the end, and so is a loader-cache entry for the driver's folder when one is needed.
# Exit status: 0 when every case gave the expected answer, 1 otherwise.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin="" hami_src="" hami_lib="" hook="" report=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2;;
    --hami-core-src) hami_src=$2; shift 2;;
    --hami-core-lib) hami_lib=$2; shift 2;;
    --hook) hook=$2; shift 2;;
    --report) report=$2; shift 2;;
    -h|--help) sed -n '2,26p' "$0"; exit 0;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 64;;
  esac
done
die() { echo "run.sh: $*" >&2; exit 2; }
abs() { case "$1" in /*) printf '%s' "$1";; *) printf '%s/%s' "$PWD" "$1";; esac; }
[ -z "$bin" ] || bin=$(abs "$bin")
[ -z "$hami_src" ] || hami_src=$(abs "$hami_src")
[ -z "$hami_lib" ] || hami_lib=$(abs "$hami_lib")
[ -z "$hook" ] || hook=$(abs "$hook")
[ "$(id -u)" = 0 ] || die "needs root (mount namespaces, bind mounts)"
[ -n "$bin" ] || die "--bin DIR is required"
for f in hami-device-plugin hami-webhook libhami_preload.so; do
  [ -f "$bin/$f" ] || die "$bin/$f missing"
done
[ -n "$hami_src$hami_lib" ] || die "give --hami-core-src DIR or --hami-core-lib FILE"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found"
work=$(mktemp -d /tmp/hami-gpu-test.XXXXXX)
[ -n "$hook" ] || hook="$work/hook"
case "$hook" in /usr/local|/usr/local/) die "use a scratch --hook, not the node's real /usr/local";; esac
mkdir -p "$hook"

created=()
cleanup() {
  for p in "${created[@]}"; do
    rm -f "$p"
  done
  if [ -f /etc/ld.so.conf.d/zz-hami-gpu-test.conf ]; then
    rm -f /etc/ld.so.conf.d/zz-hami-gpu-test.conf
    ldconfig
  fi
}
trap cleanup EXIT

# --- HAMi-core, unmodified -------------------------------------------------------------------
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ -z "$hami_lib" ]; then
  echo "== building HAMi-core from $hami_src (as its build.sh does, Debug)"
  rm -rf "$work/hami-build"; mkdir -p "$work/hami-build"
  ( cd "$work/hami-build" &&
    LIBRARY_PATH="$cuda/lib64/stubs:${LIBRARY_PATH:-}" cmake "$hami_src" \
      -DDLSYM_HOOK_ENABLE=1 -DMULTIPROCESS_LIMIT_ENABLE=1 -DHOOK_MEMINFO_ENABLE=1 \
      -DHOOK_NVML_ENABLE=1 -DCMAKE_BUILD_TYPE=Debug -DTEST_DEVICE_ID=0 \
      -DCMAKE_POLICY_VERSION_MINIMUM=3.5 >"$work/cmake.log" 2>&1 &&
    LIBRARY_PATH="$cuda/lib64/stubs:${LIBRARY_PATH:-}" make -j"$(nproc)" vgpu >"$work/make.log" 2>&1 ) \
    || { tail -n 30 "$work/cmake.log" "$work/make.log" >&2; die "HAMi-core build failed"; }
  hami_lib=$(find "$work/hami-build" -name libvgpu.so -type f | head -n 1)
  [ -n "$hami_lib" ] || die "the HAMi-core build produced no libvgpu.so"
  if [ -d "$hami_src/.git" ]; then hami_rev=$(git -C "$hami_src" rev-parse --short HEAD)
  else hami_rev=$(cat "$hami_src/REVISION" 2>/dev/null || echo unknown); fi
else
  hami_rev="prebuilt $(basename "$hami_lib")"
fi

# --- install-hook, from a folder laid out as HAMi's image since v2.5 (libvgpu.so.<version>) ---
mkdir -p "$work/hami-image"
cp "$hami_lib" "$work/hami-image/libvgpu.so.v2.10.0"
echo "/usr/local/vgpu/libvgpu.so" > "$work/hami-image/ld.so.preload"   # what HAMi's image carries
echo "== install-hook into $hook"
"$bin/hami-device-plugin" install-hook --hami-core-dir "$work/hami-image" \
  --preload "$bin/libhami_preload.so" --hook-path "$hook"
vgpu="$hook/vgpu"
echo "-- $vgpu/ld.so.preload:"; cat "$vgpu/ld.so.preload"
printf '%s\n' "$vgpu/libvgpu.so" > "$work/ld.so.preload.hami-only"

# --- the probe ------------------------------------------------------------------------------
echo "== building the probe"
"$cuda/bin/nvcc" -O1 -o "$work/probe" "$here/probe.cu" -L"$cuda/lib64/stubs" -lcuda \
  || die "nvcc failed"

# --- the files, as the programs write them --------------------------------------------------
echo "== limits files"
"$bin/hami-device-plugin" plan --pod "$repo/examples/hami-pod-scheduled.yaml" --node gpu-0 \
  --hook-path "$hook" --write > "$work/plan.json"
hami_file=$(find "$vgpu/containers" -name '*.limits' | head -n 1)
[ -n "$hami_file" ] || die "plan --write published no limits file"
vram=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | tr -d ' ')
kai_file() { # pod file [basis MiB] -> the limits file the webhook projects at /overrideEnv
  # kai.hookPath is the scratch hook's vgpu folder, where install-hook published node-gpus.
  HAMI_KAI__HOOKPATH="$vgpu" "$bin/hami-webhook" mutate -f "$1" --per-gpu-vram-mib "${2:-$vram}" --patch > "$work/patch.json"
  python3 - "$work/patch.json" <<'PY'
import json, sys
ops = json.load(open(sys.argv[1]))
def walk(v):
    if isinstance(v, dict):
        for k, x in v.items():
            if k.startswith("limits.hami.io/") and isinstance(x, str):
                yield x
            yield from walk(x)
    elif isinstance(v, list):
        for x in v:
            yield from walk(x)
    elif isinstance(v, str):
        return
for op in ops:
    path = op.get("path", "")
    if path.startswith("/metadata/annotations/limits.hami.io~1"):
        sys.stdout.write(op["value"]); sys.exit(0)
    for x in walk(op.get("value")):
        sys.stdout.write(x); sys.exit(0)
sys.exit("no limits.hami.io annotation in the patch")
PY
}
kai_file "$repo/examples/kai-gpu-memory-pod.yaml" > "$work/kai-memory.limits"
kai_file "$repo/examples/kai-gpu-fraction-pod.yaml" > "$work/kai-fraction.limits"
# The per-node cap: a gpu-fraction 0.5 pod admitted in a cluster whose smallest card has 80 GiB
# (81,920 MiB: the admission-time cap is 40,960 MiB), running on this node, whose GPU install-hook
# described from NVML in node-gpus. The preload library then caps it at half of *this* card.
sed 's/gpu-fraction: "0.021"/gpu-fraction: "0.5"/' "$repo/examples/kai-gpu-fraction-pod.yaml" > "$work/kai-half-pod.yaml"
kai_file "$work/kai-half-pod.yaml" 81920 > "$work/kai-half.limits"
grep -q '^HAMI_GPU_FRACTION=0.5$' "$work/kai-half.limits" || die "the webhook wrote no HAMI_GPU_FRACTION for the 0.5 pod"
[ -f "$vgpu/node-gpus" ] || die "install-hook published no $vgpu/node-gpus (NVML)"
echo "-- $vgpu/node-gpus:"; cat "$vgpu/node-gpus"
node_mib=$(sed -n 's/^NVIDIA0_MIB=//p' "$vgpu/node-gpus")
smi_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | tr -d ' ')
[ "$node_mib" = "$smi_mib" ] || die "node-gpus says $node_mib MiB for minor 0, nvidia-smi $smi_mib MiB"
half=$((node_mib / 2))
# The same file with the node file out of reach: the admission-time cap stands.
sed "s|^HAMI_NODE_GPUS=.*|HAMI_NODE_GPUS=$work/no-such-node-gpus|" "$work/kai-half.limits" > "$work/kai-half-no-node.limits"
{ echo "this first line has no equals sign"; cat "$work/kai-memory.limits"; } > "$work/hand-edited.limits"
: > "$work/empty.limits"
for f in "$hami_file" "$work/kai-memory.limits" "$work/kai-fraction.limits" "$work/kai-half.limits" "$work/hand-edited.limits"; do
  echo "-- $f:"; cat "$f"
done

# --- the driver for processes with an empty environment -------------------------------------
mkdir -p /tmp/vgpulock
if ! ldconfig -p | grep -q 'libcuda\.so\.1 '; then
  dir=$(dirname "$(find /usr/lib /usr/lib64 /usr/local -name 'libcuda.so.1' 2>/dev/null | head -n 1)")
  [ -n "$dir" ] && [ "$dir" != . ] || die "libcuda.so.1 not found"
  echo "$dir" > /etc/ld.so.conf.d/zz-hami-gpu-test.conf
  ldconfig
fi
for p in /overrideEnv /etc/ld.so.preload; do
  if [ ! -e "$p" ]; then : > "$p"; created+=("$p"); fi
done

# --- the cases -------------------------------------------------------------------------------
# with_files FILE LIST CMD...: run CMD with FILE bind-mounted at /overrideEnv and LIST at
# /etc/ld.so.preload ("-": none), in a private mount namespace where unshare works, else with
# global bind mounts undone right after (the machine's other processes then see them meanwhile).
if unshare --mount -- true 2>/dev/null; then use_ns=1; else use_ns=0; echo "(no mount namespaces here: global bind mounts, undone after each case)"; fi
with_files() {
  local file=$1 list=$2; shift 2
  if [ $use_ns = 1 ]; then
    unshare --mount -- /bin/sh -c '
      mount --bind "$1" /overrideEnv || exit 97
      mount -o remount,bind,ro /overrideEnv 2>/dev/null || true
      if [ "$2" != - ]; then
        mount --bind "$2" /etc/ld.so.preload || exit 97
        mount -o remount,bind,ro /etc/ld.so.preload 2>/dev/null || true
      fi
      shift 2
      exec "$@"' sh "$file" "$list" "$@"
  else
    local rc=0
    mount --bind "$file" /overrideEnv || return 97
    if [ "$list" != - ]; then mount --bind "$list" /etc/ld.so.preload || { umount /overrideEnv; return 97; }; fi
    "$@" || rc=$?
    [ "$list" = - ] || umount /etc/ld.so.preload
    umount /overrideEnv
    return $rc
  fi
}
# run_case NAME FILE LIST VIA EXPECT API MIB [VAR=VALUE...]
#   VIA: ld.so.preload (LIST at /etc/ld.so.preload) | LD_PRELOAD (LIST's libraries in LD_PRELOAD).
rows=()
failures=0
run_case() {
  local name=$1 file=$2 list=$3 via=$4 expect=$5 api=$6 mib=$7; shift 7
  local vars=("$@") extra=()
  if [ "$via" = LD_PRELOAD ]; then extra=("LD_PRELOAD=$(paste -sd: "$list")"); list=-; fi
  rm -f "$vgpu/usage.cache" /tmp/cudevshr.cache
  with_files "$file" "$list" env -i "${extra[@]}" "${vars[@]}" "$work/probe" "$api" "$mib" > "$work/case.out" 2>&1 || true
  # The probe's answer line (HAMi-core may print its own messages after it, e.g. its exit cleanup).
  local out; out=$(grep -E '^(granted|refused|error) ' "$work/case.out" | tail -n 1)
  [ -n "$out" ] || out=$(tail -n 1 "$work/case.out")
  local got=${out%% *} total
  total=$(sed -n 's/.* total=\([0-9]*\).*/\1/p' <<<"$out")
  local verdict=ok
  if [ "$got" != "$expect" ]; then verdict="**UNEXPECTED** ($out)"; failures=$((failures + 1)); fi
  local env_shown="${vars[*]:-(empty)}"
  rows+=("| $name | $via | $env_shown | $api | $mib MiB | $got | ${total:-?} MiB | $verdict |")
  echo "$name / $via / $api $mib MiB / env: $env_shown -> $out [$verdict]"
}
full="$vgpu/ld.so.preload"
hami_only="$work/ld.so.preload.hami-only"
spoof=(CUDA_DEVICE_MEMORY_LIMIT_0=16g CUDA_DEVICE_MEMORY_LIMIT=16g)
echo "== cases (GPU 0: $vram MiB)"
for api in runtime driver; do
  run_case "HAMi file, released HAMi-core alone" "$hami_file" "$hami_only" ld.so.preload granted $api 4096
  run_case "HAMi file" "$hami_file" "$full" ld.so.preload refused $api 4096
  run_case "HAMi file" "$hami_file" "$full" ld.so.preload granted $api 2048
  run_case "HAMi file, spoofed variables" "$hami_file" "$full" ld.so.preload refused $api 4096 "${spoof[@]}"
  run_case "KAI gpu-memory file, released HAMi-core alone" "$work/kai-memory.limits" "$hami_only" ld.so.preload granted $api 4096
  run_case "KAI gpu-memory file" "$work/kai-memory.limits" "$full" ld.so.preload refused $api 4096
  run_case "KAI gpu-memory file" "$work/kai-memory.limits" "$full" ld.so.preload granted $api 2048
  run_case "KAI gpu-memory file, spoofed indexed variable" "$work/kai-memory.limits" "$full" ld.so.preload refused $api 4096 CUDA_DEVICE_MEMORY_LIMIT_0=16g
  run_case "KAI gpu-fraction file" "$work/kai-fraction.limits" "$full" ld.so.preload refused $api 4096
  run_case "KAI gpu-fraction file" "$work/kai-fraction.limits" "$full" ld.so.preload granted $api 2048
  run_case "KAI gpu-fraction 0.5, per-node cap ($half MiB of node-gpus' $node_mib; admission-time 40960)" "$work/kai-half.limits" "$full" ld.so.preload granted $api 60000
  run_case "KAI gpu-fraction 0.5, per-node cap ($half MiB of node-gpus' $node_mib; admission-time 40960)" "$work/kai-half.limits" "$full" ld.so.preload refused $api $((half + 1000))
  run_case "KAI gpu-fraction 0.5, per-node cap, spoofed variables" "$work/kai-half.limits" "$full" ld.so.preload refused $api $((half + 1000)) CUDA_DEVICE_MEMORY_LIMIT=140g NVIDIA_VISIBLE_DEVICES=all
  run_case "KAI gpu-fraction 0.5, node file out of reach: admission-time cap" "$work/kai-half-no-node.limits" "$full" ld.so.preload refused $api 60000
  run_case "first line without =, hand-edited" "$work/hand-edited.limits" "$full" ld.so.preload refused $api 4096
  run_case "HAMi file" "$hami_file" "$full" LD_PRELOAD refused $api 4096
  run_case "HAMi file" "$hami_file" "$full" LD_PRELOAD granted $api 2048
  run_case "env delivery (empty file)" "$work/empty.limits" "$full" ld.so.preload refused $api 4096 CUDA_DEVICE_MEMORY_LIMIT_0=3000m
  run_case "no limit anywhere (empty file)" "$work/empty.limits" "$full" ld.so.preload granted $api 4096
done
# The largest single allocation under the 3000 MiB cap (HAMi-core counts the CUDA context).
largest=0 lo=1 hi=3000
while [ $lo -le $hi ]; do
  mid=$(( (lo + hi) / 2 ))
  rm -f "$vgpu/usage.cache"
  with_files "$hami_file" "$full" env -i "$work/probe" runtime "$mid" > "$work/case.out" 2>&1 || true
  r=$(grep -E '^(granted|refused|error) ' "$work/case.out" | tail -n 1)
  if [ "${r%% *}" = granted ]; then largest=$mid; lo=$((mid + 1)); else hi=$((mid - 1)); fi
done
rm -f "$vgpu/usage.cache"
smi_bin=$(command -v nvidia-smi)
with_files "$hami_file" "$full" env -i "$smi_bin" --query-gpu=memory.used,memory.total --format=csv,noheader -i 0 > "$work/case.out" 2>/dev/null || true
smi=$(grep MiB "$work/case.out" | tail -n 1)
rm -f "$vgpu/usage.cache" /tmp/cudevshr.cache

# --- per-exec cost: a plain exec, an empty library, ours, libvgpu.so alone, both --------------
echo "== per-exec cost (bench/preload/run.sh)"
LIB="$bin/libhami_preload.so" LIBVGPU="$hami_lib" OUT="$work/preload-bench.md" \
  LIB_BEFORE="${HAMI_PRELOAD_BEFORE:-}" RUNS="${BENCH_RUNS:-5}" N="${BENCH_N:-2000}" \
  "$repo/bench/preload/run.sh" > "$work/preload-bench.log" 2>&1 \
  || { tail -n 20 "$work/preload-bench.log" >&2; echo "(bench/preload/run.sh failed: see above)" > "$work/preload-bench.md"; failures=$((failures + 1)); }

{
  echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0); $("$cuda/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/CUDA \1/p'); HAMi-core $hami_rev (unmodified, Debug); hami-limits ${HAMI_LIMITS_REV:-$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  echo
  echo "Every process started with \`env -i\`; the limits file read-only at /overrideEnv; \"alone\" = /etc/ld.so.preload lists only libvgpu.so (no preload library)."
  echo
  echo "| case | loaded by | environment | API | asked | result | total seen | |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "Largest single cudaMalloc under the HAMi file's 3000 MiB cap: $largest MiB (HAMi-core counts the CUDA context against the cap)."
  echo "nvidia-smi under the same file (memory.used, memory.total): $smi."
  echo
  echo "The per-node cap: install-hook wrote \`NVIDIA0_MIB=$node_mib\` into node-gpus from NVML (nvidia-smi: $smi_mib MiB); a 0.5 pod admitted against an 81,920 MiB card (40,960 MiB) is capped at floor(0.5 x $node_mib) = $half MiB on this H200, from an empty environment."
  echo
  sed 's/^# /### /' "$work/preload-bench.md"
} > "$work/report.md"
echo; cat "$work/report.md"
[ -z "$report" ] || cp "$work/report.md" "$report"
if [ $failures -gt 0 ]; then echo "run.sh: $failures unexpected result(s)" >&2; exit 1; fi
echo "run.sh: all cases as expected"
