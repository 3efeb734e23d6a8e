#!/usr/bin/env bash
# What the preload library costs per exec: `env -i /usr/bin/true` against
# `env -i LD_PRELOAD=libhami_preload.so /usr/bin/true`, same run, interleaved, with a real limits
# file at /overrideEnv (the path the library always applies: read, parse, remove, set). Both
# commands pay the same `env` exec; the difference is the library's load and constructor in `true`.
#
#   sudo bench/preload/run.sh                  # RUNS=5 rounds of N=3000 execs per command
#   RUNS=3 N=1000 LIB=path/to/libhami_preload.so bench/preload/run.sh
#
# Runs in a private mount namespace chrooted into a temporary root holding the host's /usr
# (read-only bind), the library and a test /overrideEnv: nothing on the host changes. Needs root,
# hyperfine (Debian package hyperfine), unshare, python3, cc. LIB defaults to the shipped artifact,
# built with scripts/build-preload. Writes bench/preload/results.md (also printed): the median over
# the rounds of each command's median exec time, the difference and the ratio. Target: at most
# 0.5 ms per exec.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-5}
N=${N:-3000}
out=${OUT:-bench/preload/results.md}
[ "$(id -u)" = 0 ] || { echo "bench/preload: needs root (mount namespace)" >&2; exit 2; }
command -v hyperfine >/dev/null || { echo "bench/preload: hyperfine not found (apt-get install hyperfine)" >&2; exit 2; }
LIB=${LIB:-$(scripts/build-preload | tail -n 1)}

root=$(mktemp -d /tmp/hami-preload-bench.XXXXXX)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{usr,etc,hook,tmp,results,dev}
: > "$root/dev/null"
for l in bin:usr/bin sbin:usr/sbin lib:usr/lib lib64:usr/lib64; do ln -s "${l#*:}" "$root/${l%%:*}"; done
cp /etc/ld.so.cache "$root/etc/"
cp "$LIB" "$root/hook/libhami_preload.so"
# A reference: an empty shared library, to show what any preloaded library costs on this machine.
echo 'int hami_bench_empty;' > "$root/empty.c"
cc -shared -fPIC -O2 -o "$root/hook/libempty.so" "$root/empty.c"
printf '%s\n' CUDA_DEVICE_MEMORY_LIMIT_0=3000m CUDA_DEVICE_MEMORY_LIMIT_1=3000m \
  CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/usage.cache CUDA_DEVICE_SM_LIMIT=50 \
  CUDA_TASK_PRIORITY=1 HAMI_LIMITS_FORMAT=1 > "$root/overrideEnv"

for r in $(seq 1 "$RUNS"); do
  unshare --mount -- /bin/sh -c '
    set -e
    mount --bind -o ro /usr "$1/usr"
    mount --bind "$1/results" "$1/tmp"
    mount --bind /dev/null "$1/dev/null"
    exec chroot "$1" /usr/bin/hyperfine -N --style none --warmup 200 --runs "$2" \
      --export-json "/tmp/run-$3.json" \
      -n plain "/usr/bin/env -i /usr/bin/true" \
      -n preload "/usr/bin/env -i LD_PRELOAD=/hook/libhami_preload.so /usr/bin/true" \
      -n empty "/usr/bin/env -i LD_PRELOAD=/hook/libempty.so /usr/bin/true"' \
    sh "$root" "$N" "$r" >/dev/null
  echo "round $r/$RUNS done" >&2
done

python3 - "$root/results" "$RUNS" "$N" "$LIB" "$(uname -r)" "$(nproc)" > "$out" <<'PY'
import json, os, statistics, sys
d, runs, n, lib, kernel, cpus = sys.argv[1:]
per = {"plain": [], "preload": [], "empty": []}
for i in range(1, int(runs) + 1):
    for r in json.load(open(os.path.join(d, f"run-{i}.json")))["results"]:
        per[r["command"]].append(r["median"] * 1e3)
plain, pre = statistics.median(per["plain"]), statistics.median(per["preload"])
diffs = [b - a for a, b in zip(per["plain"], per["preload"])]
diff = statistics.median(diffs)
print("# Preload library: cost per exec\n")
print(f"`bench/preload/run.sh`: RUNS={runs} rounds of N={n} execs per command (hyperfine -N, 200 warm-up), "
      f"interleaved in each round; {cpus} CPUs, kernel {kernel}; library `{os.path.basename(lib)}` "
      f"({os.path.getsize(lib)} bytes, the shipped glibc 2.17 build). A real limits file at /overrideEnv "
      "(6 entries: the library reads, parses and applies it on every exec).\n")
print("| command | median exec (ms), median of rounds | per round |")
print("|---|---|---|")
print(f"| `env -i /usr/bin/true` (plain) | {plain:.3f} | {', '.join(f'{x:.3f}' for x in per['plain'])} |")
print(f"| `env -i LD_PRELOAD=libhami_preload.so /usr/bin/true` | {pre:.3f} | {', '.join(f'{x:.3f}' for x in per['preload'])} |")
print(f"| `env -i LD_PRELOAD=libempty.so /usr/bin/true` (reference: an empty library) | {statistics.median(per['empty']):.3f} | {', '.join(f'{x:.3f}' for x in per['empty'])} |")
empty_diff = statistics.median([b - a for a, b in zip(per["plain"], per["empty"])])
print()
verdict = "within" if diff <= 0.5 else "OVER"
print(f"**Cost of the library: {diff:.3f} ms per exec** (median of the per-round differences; "
      f"ratio {pre / plain:.2f}x of a plain exec of `env` + `true`), {verdict} the 0.5 ms target. "
      f"Any preloaded library costs {empty_diff:.3f} ms here (the empty one): the loader's open, mmap and "
      f"page faults; the library's own work is the remaining {diff - empty_diff:.3f} ms.")
PY
cat "$out"
