#!/usr/bin/env bash
# What the preload library costs per exec, against an empty preloaded library and (on a GPU
# machine) against HAMi-core's libvgpu.so itself, all in one run.
#
#   sudo bench/preload/run.sh                         # RUNS=5 rounds of N=2000 execs per variant
#   sudo LIBVGPU=/path/libvgpu.so bench/preload/run.sh    # + libvgpu.so alone, and both together
#   sudo LIB_BEFORE=/path/old/libhami_preload.so bench/preload/run.sh   # + an older build of ours
#   RUNS=5 N=2000 LIB=path/to/libhami_preload.so OUT=/tmp/preload.md bench/preload/run.sh
#
# Each exec is `/usr/bin/true` started by bench/preload/execbench.c (posix_spawn + waitpid, the
# variants taking turns exec by exec) with only LD_PRELOAD in its environment, inside a private
# mount namespace chrooted into a temporary root: the host's /usr (read-only bind), the libraries
# and a test /overrideEnv; nothing on the host changes. Two roots:
#   - HAMi: a device plugin's limits file (6 entries: read, parsed, applied on every exec);
#   - KAI:  a gpu-fraction container's file (HAMI_GPU_FRACTION, HAMI_NODE_GPUS), the node GPU file
#           and /dev/nvidia0 (195:0): the per-node step runs on every exec as well.
# Needs root, unshare, cc, python3, mknod. LIB defaults to the shipped artifact
# (scripts/build-preload). Writes OUT (default bench/results/preload/results.md, also printed):
# per variant the median over the rounds of each round's median exec, and for our library the cost
# over the empty one per round, its median and its best round. Targets, so that every exec in a
# GPU container stays cheap: at most 25 µs over the empty library (best of the rounds), at most
# 10 % of what libvgpu.so itself costs over the empty library, at most 64 KiB on disk.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-5}
N=${N:-2000}
out=${OUT:-bench/results/preload/results.md}
mkdir -p "$(dirname "$out")"
[ "$(id -u)" = 0 ] || { echo "bench/preload: needs root (mount namespace, mknod)" >&2; exit 2; }
LIB=${LIB:-$(scripts/build-preload | tail -n 1)}
LIBVGPU=${LIBVGPU:-}
LIB_BEFORE=${LIB_BEFORE:-}

work=$(mktemp -d /tmp/hami-preload-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
cc -O2 -o "$work/execbench" bench/preload/execbench.c
echo 'int hami_bench_empty;' > "$work/empty.c"
cc -shared -fPIC -O2 -o "$work/libempty.so" "$work/empty.c"

make_root() { # DIR LIMITS-FILE
  local r=$1
  mkdir -p "$r"/{usr,etc,hook,tmp,dev}
  : > "$r/dev/null"
  for l in bin:usr/bin sbin:usr/sbin lib:usr/lib lib64:usr/lib64; do ln -s "${l#*:}" "$r/${l%%:*}"; done
  cp /etc/ld.so.cache "$r/etc/"
  cp "$LIB" "$r/hook/libhami_preload.so"
  cp "$work/libempty.so" "$r/hook/libempty.so"
  [ -z "$LIBVGPU" ] || cp "$LIBVGPU" "$r/hook/libvgpu.so"
  [ -z "$LIB_BEFORE" ] || cp "$LIB_BEFORE" "$r/hook/libhami_preload_before.so"
  cp "$work/execbench" "$r/execbench"
  cp "$2" "$r/overrideEnv"
}
printf '%s\n' CUDA_DEVICE_MEMORY_LIMIT_0=3000m CUDA_DEVICE_MEMORY_LIMIT_1=3000m \
  CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/usage.cache CUDA_DEVICE_SM_LIMIT=50 \
  CUDA_TASK_PRIORITY=1 HAMI_LIMITS_FORMAT=1 > "$work/hami.limits"
printf '%s\n' CUDA_DEVICE_MEMORY_LIMIT=40779m HAMI_GPU_FRACTION=0.5 HAMI_LIMITS_FORMAT=1 \
  HAMI_NODE_GPUS=/hook/node-gpus > "$work/kai.limits"
make_root "$work/hami" "$work/hami.limits"
make_root "$work/kai" "$work/kai.limits"
printf '%s\n' HAMI_NODE_GPUS_FORMAT=1 NVIDIA0_MIB=143771 NVIDIA0_UUID=GPU-bench > "$work/kai/hook/node-gpus"
mknod "$work/kai/dev/nvidia0" c 195 0
mknod "$work/kai/dev/nvidiactl" c 195 255

set_variants() {
  variants=(- /hook/libempty.so /hook/libhami_preload.so)
  names=(plain empty ours)
  if [ -n "$LIB_BEFORE" ]; then variants+=(/hook/libhami_preload_before.so); names+=(before); fi
  if [ -n "$LIBVGPU" ]; then
    # pair-env: the empty library then libvgpu.so, the limits file's entries already in the
    # environment (as a HAMi container's entrypoint has them): as many libraries as `both`, and
    # HAMi-core doing the same work as under ours, so both - pair-env is what our library adds
    # beside HAMi-core.
    variants+=(/hook/libvgpu.so "/hook/libempty.so /hook/libvgpu.so|$(paste -sd'|' "$work/$root_file")"
      "/hook/libhami_preload.so /hook/libvgpu.so")
    names+=(vgpu pair-env both)
  fi
}
for root in hami kai; do
  root_file=$root.limits
  set_variants
  echo "== $root root: ${#variants[@]} variants, $RUNS rounds of $N execs each" >&2
  unshare --mount -- /bin/sh -c '
    set -e
    r=$1; shift
    mount --bind -o ro /usr "$r/usr"
    mount --bind /dev/null "$r/dev/null"
    exec chroot "$r" /execbench "$@"' \
    sh "$work/$root" "$N" "$RUNS" /usr/bin/true "${variants[@]}" > "$work/$root.txt"
done

python3 - "$work" "$RUNS" "$N" "$LIB" "$(uname -r)" "$(nproc)" "${LIBVGPU:-}" "${LIB_BEFORE:-}" "${names[@]}" > "$out" <<'PY'
import os, statistics, sys
work, runs, n, lib, kernel, cpus, vgpu, before, *names = sys.argv[1:]
def load(root):
    per = {name: [] for name in names}
    for line in open(os.path.join(work, f"{root}.txt")):
        _, r, _, v, _, ns = line.split()
        per[names[int(v)]].append(int(ns) / 1000.0)  # µs
    return per
roots = {"hami": load("hami"), "kai": load("kai")}
med = statistics.median
def over(per, a, b):  # per-round b - a
    return [y - x for x, y in zip(per[a], per[b])]
print("# Preload library: cost per exec\n")
print(f"`bench/preload/run.sh`: RUNS={runs} rounds of N={n} execs per variant (bench/preload/execbench.c: "
      f"posix_spawn of `/usr/bin/true` with only LD_PRELOAD set, variants taking turns exec by exec, "
      f"median exec per round); {cpus} CPUs, kernel {kernel}. Library `{os.path.basename(lib)}`: "
      f"{os.path.getsize(lib):,} bytes.\n")
labels = {
    "plain": "no library",
    "empty": "an empty library (reference)",
    "ours": "libhami_preload.so",
    "before": "libhami_preload.so, previous build (LIB_BEFORE)",
    "vgpu": "libvgpu.so (HAMi-core) alone",
    "pair-env": "the empty library + libvgpu.so, the file's entries set as variables",
    "both": "libhami_preload.so + libvgpu.so",
}
for root, title in (("hami", "HAMi limits file (6 entries)"), ("kai", "KAI gpu-fraction file: per-node step (node GPU file, /dev scan)")):
    per = roots[root]
    print(f"## {title}\n")
    print("| LD_PRELOAD | median exec (µs), median of rounds | over the empty library (µs) | per round (µs) |")
    print("|---|---|---|---|")
    for name in names:
        extra = "" if name in ("plain", "empty") else f"{med(over(per, 'empty', name)):+.1f}"
        print(f"| {labels[name]} | {med(per[name]):.1f} | {extra} | {', '.join(f'{x:.1f}' for x in per[name])} |")
    ours = over(per, "empty", "ours")
    verdict = "within" if min(ours) <= 25 else "OVER"
    print(f"\n**Ours over the empty library: median {med(ours):.1f} µs, best round {min(ours):.1f} µs** "
          f"({verdict} the 25 µs target, best of {runs} rounds); per round: {', '.join(f'{x:.1f}' for x in ours)}.")
    if "vgpu" in per:
        v = over(per, "empty", "vgpu")
        both = over(per, "vgpu", "both")
        share = med(ours) / med(v) * 100 if med(v) > 0 else float("nan")
        same = over(per, "pair-env", "both")
        print(f"libvgpu.so costs {med(v):.1f} µs over the empty library; ours is {share:.1f} % of that "
              f"({'within' if share <= 10 else 'OVER'} the 10 % target). Beside libvgpu.so, ours costs "
              f"{med(same):+.1f} µs (median; best round {min(same):+.1f} µs) over the empty library in its "
              f"place with the same settings as variables (same libraries loaded, same HAMi-core work).")
    if "before" in per:
        b = over(per, "empty", "before")
        print(f"The previous build costs {med(b):.1f} µs over the empty library.")
    print()
PY
cat "$out"
