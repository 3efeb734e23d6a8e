#!/usr/bin/env bash
# Verify the caps on a real GPU node, with HAMi-core as clusters run it today (an unmodified
# libvgpu.so, prebuilt: this repository neither carries nor builds HAMi-core) and the preload
# library, as an operator would: processes started with an EMPTY environment (`env -i`, as an SSH
# login, `su -`, `sudo` or cron starts one), the limits file read-only at /overrideEnv, the preload
# list at /etc/ld.so.preload; then the per-container folder exactly as a container gets it (root's
# 0755, usage.cache pre-created root's 0666) shared by root and an unprivileged user.
#
#   sudo tests/gpu/run.sh --bin DIR --hami-core-lib FILE [--hook DIR] [--report FILE]
#
#   --bin DIR            holds hami-device-plugin, hami-webhook, hami-limits and libhami_preload.so
#                        (the shipped artifact from scripts/build-preload)
#   --hami-core-lib F    a built libvgpu.so (HAMi's image carries one as
#                        /k8s-vgpu/lib/nvidia/libvgpu.so.<version>; a Release build with hidden
#                        visibility interposes nothing, see docs/design.md)
#   --hook DIR           scratch hook path (default: a new temporary folder); never /usr/local
#   --report FILE        also write the result table (Markdown) there
#   HAMI_LIMITS_REV=...  the hami-limits revision to name in the report (default: git HEAD)
#   HAMI_CORE_REV=...    the HAMi-core revision to name in the report (default: the file's name)
#   HAMI_PRELOAD_BEFORE=F  an older libhami_preload.so for the per-exec cost table (optional)
#   BENCH_RUNS, BENCH_N  rounds and execs per round of the per-exec cost (default 5 and 2000)
#   SM_RUNS              runs per SM-limit series (default 12)
#   HAMI_REGION_EXPORTER a command printing the exporter's metrics for a hook path (optional)
#   HAMI_GPU_SECTIONS    the sections to run: cases,folder,regions,sm,bench (default all)
#
# Needs root, nvidia-smi, nvcc (for the probe), cc, unshare, mount, mknod and python3.
# Nothing global is left changed but /tmp/vgpulock, which plan --write makes as the plugin does
# (root's 0755 with root's 0666 `lock`): every case runs in a private mount namespace where the
# files are bind-mounted; empty mount points /overrideEnv and /etc/ld.so.preload are created only
# when absent and removed at the end, and so is a loader-cache entry for the driver's folder when
# one is needed.
# Exit status: 0 when every case gave the expected answer, 1 otherwise.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin="" hami_lib="" hook="" report=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2;;
    --hami-core-lib) hami_lib=$2; shift 2;;
    --hook) hook=$2; shift 2;;
    --report) report=$2; shift 2;;
    -h|--help) sed -n '2,33p' "$0"; exit 0;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 64;;
  esac
done
die() { echo "run.sh: $*" >&2; exit 2; }
abs() { case "$1" in /*) printf '%s' "$1";; *) printf '%s/%s' "$PWD" "$1";; esac; }
[ -z "$bin" ] || bin=$(abs "$bin")
[ -z "$hami_lib" ] || hami_lib=$(abs "$hami_lib")
[ -z "$hook" ] || hook=$(abs "$hook")
[ "$(id -u)" = 0 ] || die "needs root (mount namespaces, bind mounts)"
[ -n "$bin" ] || die "--bin DIR is required"
for f in hami-device-plugin hami-webhook libhami_preload.so; do
  [ -f "$bin/$f" ] || die "$bin/$f missing"
done
[ -n "$hami_lib" ] || die "--hami-core-lib FILE (a built libvgpu.so) is required"
[ -f "$hami_lib" ] || die "$hami_lib missing"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found"
work=$(mktemp -d /tmp/hami-gpu-test.XXXXXX)
# An unprivileged user runs the probe from here (the per-container folder cases).
chmod 0755 "$work"
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

# --- HAMi-core, unmodified, prebuilt ----------------------------------------------------------
cuda=${CUDA_HOME:-/usr/local/cuda}
hami_rev=${HAMI_CORE_REV:-"prebuilt $(basename "$hami_lib")"}

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
[ -f "$vgpu/node-gpus" ] || die "install-hook published no $vgpu/node-gpus (NVML)"
echo "-- $vgpu/node-gpus:"; cat "$vgpu/node-gpus"
node_mib=$(sed -n 's/^NVIDIA0_MIB=//p' "$vgpu/node-gpus")
smi_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | tr -d ' ')
[ "$node_mib" = "$smi_mib" ] || die "node-gpus says $node_mib MiB for minor 0, nvidia-smi $smi_mib MiB"
half=$((node_mib / 2))
# The fraction file's cap on this card (0.021 x its VRAM: 3019 MiB on an H200, 1712 on an H100).
frac_mib=$(sed -n 's/^CUDA_DEVICE_MEMORY_LIMIT=\([0-9]*\)m$/\1/p' "$work/kai-fraction.limits")
[ -n "$frac_mib" ] || die "no CUDA_DEVICE_MEMORY_LIMIT in the gpu-fraction file"
# The per-node cap: a gpu-fraction 0.5 pod admitted in a cluster whose smallest card has half this
# card's VRAM (the admission-time cap is a quarter of this card), running on this node, whose GPU
# install-hook described from NVML in node-gpus. The preload library then caps it at half of
# *this* card: granted above the admission-time cap, refused above half.
basis=$((node_mib / 2)) admit_mib=$((node_mib / 4))
sed 's/gpu-fraction: "0.021"/gpu-fraction: "0.5"/' "$repo/examples/kai-gpu-fraction-pod.yaml" > "$work/kai-half-pod.yaml"
kai_file "$work/kai-half-pod.yaml" "$basis" > "$work/kai-half.limits"
grep -q '^HAMI_GPU_FRACTION=0.5$' "$work/kai-half.limits" || die "the webhook wrote no HAMI_GPU_FRACTION for the 0.5 pod"
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
# HAMI_GPU_SECTIONS: a comma-separated subset of cases,folder,regions,sm,bench (default all).
want() { case ",${HAMI_GPU_SECTIONS:-all}," in *,all,*|*",$1,"*) return 0;; esac; return 1; }
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
largest=- smi=- base=() base_ms=- sm_args=(1500 1000000)
if want cases; then
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
  run_case "KAI gpu-fraction file" "$work/kai-fraction.limits" "$full" ld.so.preload granted $api $((frac_mib / 2))
  run_case "KAI gpu-fraction 0.5, per-node cap ($half MiB of node-gpus' $node_mib; admission-time $admit_mib)" "$work/kai-half.limits" "$full" ld.so.preload granted $api $((half - 1000))
  run_case "KAI gpu-fraction 0.5, per-node cap ($half MiB of node-gpus' $node_mib; admission-time $admit_mib)" "$work/kai-half.limits" "$full" ld.so.preload refused $api $((half + 1000))
  run_case "KAI gpu-fraction 0.5, per-node cap, spoofed variables" "$work/kai-half.limits" "$full" ld.so.preload refused $api $((half + 1000)) CUDA_DEVICE_MEMORY_LIMIT=140g NVIDIA_VISIBLE_DEVICES=all
  run_case "KAI gpu-fraction 0.5, node file out of reach: admission-time cap" "$work/kai-half-no-node.limits" "$full" ld.so.preload refused $api $((half - 1000))
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
fi

# --- the per-container folder, as a container has it -----------------------------------------
# plan --write makes <hook>/vgpu/containers/<podUID>_<ctr> as Allocate does: root's 0755 with
# usage.cache (the HAMi file's CUDA_DEVICE_MEMORY_SHARED_CACHE) pre-created, root's 0666, empty.
# in_ctr binds it at <hook>/vgpu as kubelet does, HAMi-core's and the preload library's files on
# top (their mount points made by root, as runc makes them), and runs the command as root or as
# nobody (65534, no groups): every process of the container shares that one region.
ctr_dir=${hami_file%.limits}
stage="$work/stage"; mkdir -p "$stage"
fresh_ctr() { # a new allocation: the folder recreated, the region empty again
  "$bin/hami-device-plugin" plan --pod "$repo/examples/hami-pod-scheduled.yaml" --node gpu-0 \
    --hook-path "$hook" --write > /dev/null
}
in_ctr() { # USER CMD... (IN_CTR_LIST: another preload list; IN_CTR_FILE: another limits file)
  local who=$1; shift
  unshare --mount -- /bin/sh -c '
    vgpu=$1 ctr=$2 stage=$3 file=$4 who=$5 list=$6; shift 6
    # The limits file first: it lives under the folder the container folder is bound over.
    mount --bind "$file" /overrideEnv || exit 97
    mount -o remount,bind,ro /overrideEnv 2>/dev/null || true
    mount --bind "$vgpu" "$stage" || exit 97
    mount --bind "$ctr" "$vgpu" || exit 97
    for f in libvgpu.so libhami_preload.so; do
      [ -e "$vgpu/$f" ] || : > "$vgpu/$f" || exit 97
      mount --bind "$stage/$f" "$vgpu/$f" || exit 97
    done
    # Last: from here on every exec preloads the list, whose files are now in place.
    [ -n "$list" ] || list="$stage/ld.so.preload"
    mount --bind "$list" /etc/ld.so.preload || exit 97
    [ "$who" = root ] && exec "$@"
    command -v setpriv >/dev/null && exec setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"
    exec python3 -c "import os, sys; os.setgroups([]); os.setgid(65534); os.setuid(65534); os.execvp(sys.argv[1], sys.argv[1:])" "$@"
  ' sh "$vgpu" "$ctr_dir" "$stage" "${IN_CTR_FILE:-$hami_file}" "$who" "${IN_CTR_LIST:-}" "$@"
}
frows=()
fcheck() { # NAME WHO EXPECTED GOT [DETAIL]
  local verdict=ok
  if [ "$3" != "$4" ]; then verdict="**UNEXPECTED**"; failures=$((failures + 1)); fi
  frows+=("| $1 | $2 | $3 | $4 | ${5:-} | $verdict |")
  echo "$1 / $2 -> $4 ${5:-} (expected $3) [$verdict]"
}
probe_line() { grep -E '^(granted|refused|error) ' "$1" | tail -n 1; }
fprobe() { # NAME WHO EXPECT API MIB: one probe with an empty environment in the container
  in_ctr "$2" env -i "$work/probe" "$4" "$5" > "$work/case.out" 2>&1 || true
  local out; out=$(probe_line "$work/case.out" || true); [ -n "$out" ] || out=$(tail -n 1 "$work/case.out")
  fcheck "$1: $4 API asks $5 MiB" "$2" "$3" "${out%% *}" "${out#* }"
}
fjoint() { # HOLDER ASKER MIB EXPECT: HOLDER holds 1000 MiB while ASKER asks MIB
  in_ctr "$1" env -i "$work/probe" runtime 1000 12 > "$work/hold.out" 2>&1 &
  local holder=$! i
  for i in $(seq 1 120); do grep -qE '^(granted|refused|error) ' "$work/hold.out" && break; sleep 0.25; done
  fprobe "$1 holds 1000 MiB ($(probe_line "$work/hold.out" | cut -d' ' -f1,3)); meanwhile" "$2" "$4" runtime "$3"
  wait "$holder" 2>/dev/null || true
}
if want folder; then
echo "== the per-container folder (root's 0755, usage.cache pre-created), root and nobody"
fresh_ctr
fcheck "the folder (uid mode type)" - "0 755 directory" "$(stat -c '%u %a %F' "$ctr_dir")"
fcheck "usage.cache after Allocate (uid mode type size links)" - "0 666 regular empty file 0 1" \
  "$(stat -c '%u %a %F %s %h' "$ctr_dir/usage.cache")"
fcheck "/tmp/vgpulock and its lock (uid mode type)" - "0 755 directory; 0 666 regular empty file" \
  "$(stat -c '%u %a %F' /tmp/vgpulock); $(stat -c '%u %a %F' /tmp/vgpulock/lock)"
fprobe "nobody first: initialises the pre-created region" nobody refused runtime 4096
fprobe "root after nobody, same region" root granted runtime 2048
fprobe "root after nobody, same region" root refused driver 4096
fresh_ctr
fprobe "root first" root refused runtime 4096
fprobe "nobody after root, same region" nobody granted driver 2048
fprobe "nobody after root, same region" nobody refused driver 4096
fresh_ctr
fjoint root nobody 1500 refused
fjoint root nobody 300 granted
fresh_ctr
fjoint nobody root 1500 refused
fjoint nobody root 300 granted
fcheck "usage.cache after use (uid mode type links)" - "0 666 regular file 1" \
  "$(stat -c '%u %a %F %h' "$ctr_dir/usage.cache")"
fcheck "the folder's entries (HAMi-core made none)" - "libhami_preload.so libvgpu.so usage.cache" \
  "$(ls "$ctr_dir" | sort | tr '\n' ' ' | sed 's/ $//')"
# What a user of the container tries on the region: replace it with a link, remove it, add a file.
# (Before, with the folder 0777, the first of these made root's next CUDA process create a
# root-owned 0666 file wherever the link pointed.)
tenant=$(in_ctr nobody /bin/sh -c "
  ln -sf /tmp/planted $vgpu/usage.cache 2>/dev/null && echo linked || echo link-refused
  rm -f $vgpu/usage.cache 2>/dev/null && echo removed || echo remove-refused
  touch $vgpu/new.cache 2>/dev/null && echo created || echo create-refused" 2>&1 | tr '\n' ' ' | sed 's/ $//' || true)
fcheck "nobody: ln -sf usage.cache, rm usage.cache, create new.cache" nobody \
  "link-refused remove-refused create-refused" "$tenant"
# Old HAMi-core (before 2026-02) opens /tmp/vgpulock/lock O_CREAT|O_RDWR and flocks it, as any UID.
lockres=$(in_ctr nobody python3 -c "import os, fcntl; fd = os.open('/tmp/vgpulock/lock', os.O_CREAT | os.O_RDWR, 0o666); fcntl.flock(fd, fcntl.LOCK_EX); print('locked')" 2>&1 | tail -n 1 || true)
fcheck "nobody: open /tmp/vgpulock/lock O_CREAT + O_RDWR, flock" nobody locked "$lockres"
fi


# --- the shared region, read back (hami-limits region: the reader the exporters use) ----------
# Regions made by the real HAMi-core in the container folder, read by `hami-limits region` with
# the container's limits file: the usage HAMi-core recorded against nvidia-smi's, and the verdicts
# (capped; uncapped when a process with no variables seeds the region: HAMi#2125; mismatch when
# one with other values does).
rrows=()
rcheck() { # NAME EXPECTED GOT [DETAIL]
  local verdict=ok
  if [ "$2" != "$3" ]; then verdict="**UNEXPECTED**"; failures=$((failures + 1)); fi
  rrows+=("| $1 | $2 | $3 | ${4:-} | $verdict |")
  echo "region: $1 -> $3 ${4:-} (expected $2) [$verdict]"
}
region_read() { # -> $work/region.json (the first container's report)
  "$bin/hami-limits" region "$ctr_dir" --limits "$hami_file" --json --pids host > "$work/region.json" 2> "$work/region.err" || true
}
rq() { # PYTHON-EXPRESSION over j, the first container of $work/region.json
  python3 -c 'import json, sys
try:
    j = json.load(open(sys.argv[1]))["containers"][0]
    print(eval(sys.argv[2]))
except Exception as e:
    print("unreadable: %s" % e)' "$work/region.json" "$1"
}
exporter_check() { # NAME VERDICT: the exporter's text for the hook (HAMI_REGION_EXPORTER, or the
  # plugin's `regions` one-shot when --bin has it) names the container with VERDICT.
  local cmd=${HAMI_REGION_EXPORTER:-"$bin/hami-device-plugin regions --pids host --hook-path"} line
  # shellcheck disable=SC2086
  $cmd "$hook" > "$work/exporter.txt" 2>&1 || true
  line=$(grep '^hami_limits_region_cap_verdict{' "$work/exporter.txt" | head -n 1)
  rcheck "$1" "$2" "$(sed -n 's/.*verdict="\([a-z-]*\)".*/\1/p' <<<"$line")" "$(grep -E '^hami_limits_region_(stamped_limit_bytes|file_limit_bytes|used_bytes|processes)\{' "$work/exporter.txt" | sed 's/{.*}//' | tr '\n' ' ')"
}
wait_line() { local i; for i in $(seq 1 160); do grep -qE '^(granted|refused|error) ' "$1" && return 0; sleep 0.25; done; return 1; }
hami_env=$(grep -v '^HAMI_' "$hami_file" | tr '\n' ' ')
if ! want regions; then
  :
elif [ -x "$bin/hami-limits" ]; then
  echo "== the shared region, read back"
  "$bin/hami-limits" region --layout > "$work/layout.json"
  fresh_ctr
  region_read
  rcheck "a fresh container folder" no-region "$(rq 'j["verdict"]["verdict"]')"
  # The entrypoint (HAMi's variables in its environment) holds 1000 MiB; an env-less process of
  # another user holds 500 MiB; meanwhile the region and nvidia-smi are read.
  # shellcheck disable=SC2086
  in_ctr root env -i $hami_env "$work/probe" runtime 1000 25 > "$work/r-entry.out" 2>&1 &
  r_entry=$!
  wait_line "$work/r-entry.out" || true
  in_ctr nobody env -i "$work/probe" runtime 500 25 > "$work/r-envless.out" 2>&1 &
  r_envless=$!
  wait_line "$work/r-envless.out" || true
  sleep 6 # HAMi-core's watcher fills in the host PIDs
  region_read
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$work/smi-apps.csv" 2>/dev/null || true
  cp "$work/region.json" "$work/region-joint.json"
  rcheck "entrypoint holds 1000 MiB, env-less process (nobody) 500 MiB: verdict" capped "$(rq 'j["verdict"]["verdict"]')" \
    "stamped $(rq 'j["verdict"]["gpus"][0]["stamped_limit"] >> 20') MiB, file $(rq '(j["verdict"]["gpus"][0]["file_limit"] or 0) >> 20') MiB, SM stamped $(rq 'j["verdict"]["gpus"][0]["stamped_sm"]') file $(rq 'j["verdict"]["gpus"][0]["file_sm"]'), switch $(rq 'j["verdict"]["utilization"]["stamped_switch"]')"
  rcheck "processes in the region" 2 "$(rq 'j["verdict"]["gpus"][0]["processes"]')" \
    "slots (pid/host pid): $(rq '" ".join("%d/%d" % (s["pid"], s["hostpid"]) for s in j["verdict"]["slots"])')"
  # The region's usage per host PID against nvidia-smi's, within one CUDA context.
  cmp=$(python3 - "$work/region-joint.json" "$work/smi-apps.csv" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["containers"][0]
smi = {}
for line in open(sys.argv[2]):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
        smi[int(parts[0])] = int(parts[1])
procs = (j.get("region") or {}).get("procs") or []
out, worst = [], 0
for p in procs:
    host = p.get("hostpid") or 0
    used = p.get("used") or []
    total = sum((u.get("total") if isinstance(u, dict) else 0) or 0 for u in used) >> 20
    s = smi.get(host)
    out.append("pid %s host %s: region %s MiB, nvidia-smi %s MiB" % (p.get("pid"), host, total, s))
    if s is not None:
        worst = max(worst, abs(s - total))
    else:
        worst = max(worst, 10**6)
print("%d|%s" % (worst, "; ".join(out) or "no processes in the region JSON"))
PY
)
  worst=${cmp%%|*}
  within=no; [ "$worst" -le 600 ] && within=yes
  rcheck "region usage = nvidia-smi per process, within a CUDA context (600 MiB)" yes "$within" "${cmp#*|}"
  wait "$r_entry" "$r_envless" 2>/dev/null || true
  # HAMi#2125: a process with the region's path but no limit and no preload library stamps 0.
  fresh_ctr
  IN_CTR_LIST="$hami_only" in_ctr root env -i "CUDA_DEVICE_MEMORY_SHARED_CACHE=$vgpu/usage.cache" "$work/probe" runtime 100 > "$work/case.out" 2>&1 || true
  region_read
  rcheck "seeded by a process with no variables and no preload library" uncapped "$(rq 'j["verdict"]["verdict"]')" "stamped $(rq 'j["verdict"]["gpus"][0]["stamped_limit"]') bytes; file $(rq '(j["verdict"]["gpus"][0]["file_limit"] or 0) >> 20') MiB"
  exporter_check "the exporter (hami-device-plugin regions) on the same folder" uncapped
  in_ctr root env -i "$work/probe" runtime 4096 > "$work/case.out" 2>&1 || true
  out=$(probe_line "$work/case.out" || true)
  rcheck "then an env-less process under the preload library asks 4096 MiB (the region's 0 wins)" granted "${out%% *}" "${out#* }"
  fresh_ctr
  IN_CTR_LIST="$hami_only" in_ctr root env -i "CUDA_DEVICE_MEMORY_SHARED_CACHE=$vgpu/usage.cache" CUDA_DEVICE_MEMORY_LIMIT_0=1000m CUDA_DEVICE_SM_LIMIT=50 "$work/probe" runtime 100 > "$work/case.out" 2>&1 || true
  region_read
  rcheck "seeded by a process with other values (1000 MiB, SM 50)" mismatch "$(rq 'j["verdict"]["verdict"]')" "stamped $(rq 'j["verdict"]["gpus"][0]["stamped_limit"] >> 20') MiB / SM $(rq 'j["verdict"]["gpus"][0]["stamped_sm"]'); mismatched: $(rq '",".join(j["verdict"]["gpus"][0]["mismatched"])')"
  fresh_ctr
  in_ctr nobody env -i "$work/probe" runtime 100 > "$work/case.out" 2>&1 || true
  region_read
  # HAMi-core leaves the slot of a process that exited until the next process's start clears it:
  # the container is `stale` (its old usage still counted), with the file's limits stamped.
  rcheck "seeded by an env-less process under the preload library, which then exited" "stale True" \
    "$(rq 'j["verdict"]["verdict"] + " " + str(j["verdict"]["gpus"][0]["stamped_limit"] == j["verdict"]["gpus"][0]["file_limit"] and j["verdict"]["gpus"][0]["stamped_sm"] == j["verdict"]["gpus"][0]["file_sm"])')" \
    "stamped $(rq 'j["verdict"]["gpus"][0]["stamped_limit"] >> 20') MiB / SM $(rq 'j["verdict"]["gpus"][0]["stamped_sm"]'); slots $(rq 'len(j["verdict"]["slots"])')"
  in_ctr nobody env -i "$work/probe" runtime 100 30 > "$work/r-live.out" 2>&1 &
  r_live=$!
  wait_line "$work/r-live.out" || true
  sleep 6
  region_read
  rcheck "a second process running (the first one's slot cleared)" capped "$(rq 'j["verdict"]["verdict"]')" "slots $(rq 'len(j["verdict"]["slots"])')"
  exporter_check "the exporter (hami-device-plugin regions) on the same folder" capped
  kill "$r_live" 2>/dev/null || true; wait "$r_live" 2>/dev/null || true
else
  echo "(no $bin/hami-limits: the region checks are skipped)"
  rrows+=("| region checks | - | skipped: no hami-limits in --bin | | **SKIPPED** |")
  failures=$((failures + 1))
fi

if want sm; then
# --- the SM limit: when does HAMi-core's compute limiter engage? ----------------------------
# Series of SM_RUNS runs of a busy kernel (1,500 launches) under the HAMi file's SM limit (30),
# each series from a fresh region: the entrypoint (HAMi's variables), an env-less process under the
# preload library, and an env-less process after a warm-up process initialised the region. A run
# is throttled when it takes more than 1.5 x the unthrottled median. HAMi-core's log
# (LIBCUDA_LOG_LEVEL=4) shows whether it found the host PID and what switch it read.
srows=()
sm_runs=${SM_RUNS:-12}
"$cuda/bin/nvcc" -O1 -o "$work/sm_probe" "$here/sm_probe.cu" || die "nvcc failed (sm_probe)"
sm_args=(1500 1000000)
{ grep -v '^CUDA_DEVICE_SM_LIMIT=' "$hami_file"; } > "$work/no-sm.limits"
{ cat "$hami_file"; echo "LIBCUDA_LOG_LEVEL=4"; } | sort > "$work/sm-log.limits"
sm_once() { # LABEL -> appends "ms|pidfound|switch" to $work/sm.out from $work/sm-case.out
  local ms pid sw
  ms=$(sed -n 's/^elapsed_ms=\([0-9.]*\).*/\1/p' "$work/sm-case.out" | tail -n 1)
  pid=yes; grep -q "SET_TASK_PID FAILED" "$work/sm-case.out" && pid=no
  sw=$(grep -o 'util_switch=[0-9]*' "$work/sm-case.out" | head -n 1 | cut -d= -f2)
  echo "${ms:-?}|$pid|${sw:--}"
}
base=()
for i in 1 2 3; do
  fresh_ctr
  IN_CTR_FILE="$work/no-sm.limits" in_ctr root env -i "$work/sm_probe" "${sm_args[@]}" > "$work/sm-case.out" 2>&1 || true
  base+=("$(sm_once | cut -d'|' -f1)")
done
base_ms=$(printf '%s\n' "${base[@]}" | sort -n | sed -n 2p)
echo "SM: unthrottled runs ${base[*]} ms (median $base_ms)"
sm_series() { # NAME MODE
  local name=$1 mode=$2 i line ms thr n=0 runs=() slots
  fresh_ctr
  if [ "$mode" = warm ]; then IN_CTR_FILE="$work/sm-log.limits" in_ctr root env -i "$work/probe" runtime 10 > /dev/null 2>&1 || true; fi
  for i in $(seq 1 "$sm_runs"); do
    case "$mode" in fresh-*) fresh_ctr;; esac
    # The slots in the region before this run (a process that exited leaves its slot).
    slots=0
    if [ -x "$bin/hami-limits" ]; then region_read; slots=$(rq 'len(j["verdict"]["slots"])' 2>/dev/null); fi
    case "$mode" in
      entry|fresh-entry) # shellcheck disable=SC2086
        IN_CTR_FILE="$work/sm-log.limits" in_ctr root env -i $hami_env LIBCUDA_LOG_LEVEL=4 "$work/sm_probe" "${sm_args[@]}" > "$work/sm-case.out" 2>&1 || true;;
      *) IN_CTR_FILE="$work/sm-log.limits" in_ctr root env -i "$work/sm_probe" "${sm_args[@]}" > "$work/sm-case.out" 2>&1 || true;;
    esac
    line=$(sm_once); ms=${line%%|*}
    thr=no
    python3 -c "import sys; sys.exit(0 if float('$ms') > 1.5 * float('$base_ms') else 1)" 2>/dev/null && thr=yes
    [ $thr = yes ] && n=$((n + 1))
    runs+=("$i:${ms}ms/$thr/pid=$(cut -d'|' -f2 <<<"$line")/sw=$(cut -d'|' -f3 <<<"$line")/slots=$slots")
  done
  srows+=("| $name | $n of $sm_runs | ${runs[*]} |")
  echo "SM: $name: throttled $n of $sm_runs: ${runs[*]}"
}
echo "== SM limit 30: series of $sm_runs (unthrottled median $base_ms ms)"
sm_series "entrypoint (HAMi's variables in its environment), fresh region" entry
sm_series "env-less process under the preload library, fresh region" envless
sm_series "env-less process under the preload library, region initialised by a warm-up process" warm
sm_series "entrypoint, a fresh region for every run" fresh-entry
sm_series "env-less process under the preload library, a fresh region for every run" fresh-envless
fi

# --- per-exec cost: a plain exec, an empty library, ours, libvgpu.so alone, both --------------
if want bench; then
echo "== per-exec cost (bench/preload/run.sh)"
LIB="$bin/libhami_preload.so" LIBVGPU="$hami_lib" OUT="$work/preload-bench.md" \
  LIB_BEFORE="${HAMI_PRELOAD_BEFORE:-}" RUNS="${BENCH_RUNS:-5}" N="${BENCH_N:-2000}" \
  "$repo/bench/preload/run.sh" > "$work/preload-bench.log" 2>&1 \
  || { tail -n 20 "$work/preload-bench.log" >&2; echo "(bench/preload/run.sh failed: see above)" > "$work/preload-bench.md"; failures=$((failures + 1)); }
fi

{
  echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0); $("$cuda/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/CUDA \1/p'); HAMi-core $hami_rev (unmodified); hami-limits ${HAMI_LIMITS_REV:-$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
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
  echo "The per-node cap: install-hook wrote \`NVIDIA0_MIB=$node_mib\` into node-gpus from NVML (nvidia-smi: $smi_mib MiB); a 0.5 pod admitted against a $basis MiB card ($admit_mib MiB) is capped at floor(0.5 x $node_mib) = $half MiB on this GPU, from an empty environment."
  echo
  echo "### The per-container folder as a container has it (root and nobody, one region)"
  echo
  echo "The folder bound at the hook's vgpu folder, HAMi-core's and the preload library's files on top, the HAMi file at /overrideEnv; every probe with \`env -i\`; nobody = UID/GID 65534, no groups. \"holds\" = a probe holding 1000 MiB meanwhile (the cap is 3000 MiB, each CUDA context counted)."
  echo
  echo "| check | user | expected | got | detail | |"
  echo "|---|---|---|---|---|---|"
  printf '%s\n' "${frows[@]}"
  echo
  echo "### The shared region read back (hami-limits region)"
  echo
  echo "The same folder; \`hami-limits region <folder> --limits <file> --json --pids host\` after each step. Layout the reader assumes: $(tr -d '\n' < "$work/layout.json" 2>/dev/null | cut -c1-400)"
  echo
  echo "| check | expected | got | detail | |"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${rrows[@]}"
  echo
  echo "### SM limit 30: when HAMi-core throttles"
  echo
  echo "Busy kernel, ${sm_args[0]} launches; unthrottled runs (no SM limit): ${base[*]} ms; throttled = over 1.5 x $base_ms ms. Per run: time / throttled / host PID found (no \`SET_TASK_PID FAILED\`) / the utilization switch HAMi-core's watcher read (- = its watcher logged none) / the slots in the region before the run (\`hami-limits region\`)."
  echo
  echo "| series | throttled | runs |"
  echo "|---|---|---|"
  printf '%s\n' "${srows[@]}"
  echo
  if [ -f "$work/preload-bench.md" ]; then sed 's/^# /### /' "$work/preload-bench.md"; fi
} > "$work/report.md"
echo; cat "$work/report.md"
[ -z "$report" ] || cp "$work/report.md" "$report"
if [ $failures -gt 0 ]; then echo "run.sh: $failures unexpected result(s)" >&2; exit 1; fi
echo "run.sh: all cases as expected"
