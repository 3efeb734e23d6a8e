#!/usr/bin/env bash
# How far a real node gets on the GPU machine (the same node as in CI, on a real GPU): one run
# that tries each part and reports every step, ok or FAILED with the reason, instead of stopping at
# the first failure. The GPU machine has no network and a 64 MiB carry, so it cannot hold a whole
# cluster (the Kubernetes binaries alone are 430 MB); what it gets, from a folder carried beside
# the working tree (built on the dev machine, `.git/info/exclude`d):
#
#   CARRY/bin/{containerd,containerd-shim-runc-v2,runc,ctr,kubelet,hami-device-plugin,hami-webhook}.xz
#   CARRY/bin/libseccomp.so.2 (runc's one library)  CARRY/bin/libhami_preload.so (scripts/build-preload)
#   CARRY/pause.tar (scripts/images build DIR --only pause)  CARRY/libvgpu.so (HAMi-core, prebuilt:
#   this repository neither carries nor builds it)
#
#   tests/gpu/node-probe.sh CARRY        # as root; the report goes to $OUT/report.md (or /tmp)
#
# Steps: the machine (kernel, cgroups, overlayfs, namespaces, oom_score_adj, NVIDIA tools);
# containerd and runc (Debian's, carried) running a container; a GPU container started by containerd
# and runc with the carried HAMi-core, the preload library, the limits file read-only at
# /overrideEnv and the preload list at /etc/ld.so.preload: its entrypoint holds 1500 MiB while an
# `env -i` process in the same container asks for 1500 MiB (refused: one 3000 MiB cap, counted
# together, contexts included) and 300 MiB (granted, seeing the 3000 MiB total); kubelet (standalone, no API server: none fits in the carry)
# running a static pod through containerd. Everything it starts is stopped and removed at the end.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
carry=$(cd "${1:?usage: tests/gpu/node-probe.sh CARRY}" && pwd)
out=${OUT:-/tmp/node-probe-out}
mkdir -p "$out"
w=/tmp/hl-gpu-node
rm -rf "$w"
mkdir -p "$w"/{bin,lib,hook,manifests,logs,probe}
rep="$out/report.md"
{ echo "| step | result | detail |"; echo "|---|---|---|"; } > "$rep"
failures=0
row() { printf '| %s | %s | %s |\n' "$1" "$2" "$(echo "$3" | tr '\n|' ' /' | cut -c1-400)" >> "$rep"; echo "[$2] $1: $3"; }
try() { # try NAME CMD...: a row with the last line of the output, or the last lines of the error
  local name=$1 o; shift
  if o=$("$@" 2>&1); then row "$name" ok "$(echo "$o" | tail -n 2)"; return 0; fi
  row "$name" FAILED "$(echo "$o" | tail -n 4)"; failures=$((failures + 1)); return 1
}
cleanup() {
  [ -f "$w/kubelet.pid" ] && kill -KILL "$(cat "$w/kubelet.pid")" 2>/dev/null
  if [ -S "$w/cd/containerd.sock" ]; then
    for t in $(ctr --address "$w/cd/containerd.sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$w/cd/containerd.sock" -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1
      ctr --address "$w/cd/containerd.sock" -n k8s.io tasks delete -f "$t" >/dev/null 2>&1
    done
  fi
  [ -f "$w/containerd.pid" ] && kill -KILL "$(cat "$w/containerd.pid")" 2>/dev/null
  pkill -KILL -f "containerd-shim-runc-v2 .*$w" 2>/dev/null
  sleep 0.5
  for m in $(awk -v d="$w/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
  done
  for f in "$w"/logs/*.log; do [ -f "$f" ] && tail -n 60 "$f" > "$out/$(basename "$f")"; done
  rm -rf "$w" /var/lib/kubelet
  # kubelet's own iptables chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT).
  local tool table rule chain
  for tool in iptables ip6tables; do
    command -v "$tool" >/dev/null || continue
    for table in filter nat mangle; do
      "$tool" -t "$table" -S 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-' | sed 's/^-A /-D /' \
        | while read -r rule; do eval "$tool -t $table $rule" 2>/dev/null; done
      for chain in $("$tool" -t "$table" -S 2>/dev/null | awk '/^-N KUBE-/ {print $2}'); do
        "$tool" -t "$table" -F "$chain" 2>/dev/null; "$tool" -t "$table" -X "$chain" 2>/dev/null
      done
    done
  done
}
trap cleanup EXIT

# --- the machine ---------------------------------------------------------------------------------
row "kernel" info "$(uname -r) (init: $(cat /proc/1/comm 2>/dev/null))"
row "cgroups" info "$(stat -fc %T /sys/fs/cgroup 2>/dev/null) at /sys/fs/cgroup; $(grep -c cgroup /proc/self/mounts) cgroup mounts"
try "nvidia-smi" nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader -i 0
for t in containerd runc docker nvidia-ctk nvidia-container-cli cmake ip iptables; do
  row "on the machine: $t" info "$(command -v "$t" || echo absent)"
done
try "overlayfs mount" sh -c "mkdir -p $w/ov/l $w/ov/u $w/ov/w $w/ov/m && mount -t overlay overlay -o lowerdir=$w/ov/l,upperdir=$w/ov/u,workdir=$w/ov/w $w/ov/m && umount $w/ov/m && echo mounted"
try "namespaces (mount, net, pid, ipc, uts)" unshare --mount --net --pid --fork --ipc --uts true
try "lower oom_score_adj as root" sh -c 'echo -1 > /proc/self/oom_score_adj && echo lowered'

# --- containerd and runc ---------------------------------------------------------------------------
for f in "$carry"/bin/*.xz; do xz -dc "$f" > "$w/bin/$(basename "$f" .xz)" && chmod 755 "$w/bin/$(basename "$f" .xz)"; done
cp "$carry/bin/libseccomp.so.2" "$w/lib/"
mv "$w/bin/runc" "$w/bin/runc.real"
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$w/lib" "$w/bin/runc.real" > "$w/bin/runc"
chmod 755 "$w/bin/runc"
export PATH="$w/bin:$PATH"
try "runc (Debian 1.1.5, carried)" runc --version
mkdir -p "$w/cd"
cat > "$w/cd/config.toml" <<EOF
version = 2
root = "$w/cd/root"
state = "$w/cd/state"
[grpc]
  address = "$w/cd/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$w/cd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/hami-limits/pause:test"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      BinaryName = "$w/bin/runc"
      Root = "$w/runc"
EOF
(setsid containerd --config "$w/cd/config.toml" > "$w/logs/containerd.log" 2>&1 < /dev/null & echo $! > "$w/containerd.pid")
c() { ctr --address "$w/cd/containerd.sock" -n k8s.io "$@"; }
for _ in $(seq 1 100); do c version >/dev/null 2>&1 && break; sleep 0.1; done
try "containerd (Debian 1.6.20, carried) answers" c version
try "import the pause image" c images import "$carry/pause.tar"
try "a container runs (containerd, runc)" sh -c "ctr --address $w/cd/containerd.sock -n k8s.io run -d localhost/hami-limits/pause:test p1 >/dev/null && sleep 1 && ctr --address $w/cd/containerd.sock -n k8s.io tasks ls | grep p1"
c tasks kill -s SIGKILL p1 >/dev/null 2>&1; sleep 0.5; c tasks delete -f p1 >/dev/null 2>&1; c containers rm p1 >/dev/null 2>&1

# --- a GPU container, capped -----------------------------------------------------------------------
cuda=${CUDA_HOME:-/usr/local/cuda}
lib=""
if try "HAMi-core prebuilt (CARRY/libvgpu.so)" test -f "$carry/libvgpu.so"; then
  lib="$carry/libvgpu.so"
fi
try "build the probe (nvcc)" "$cuda/bin/nvcc" -O1 -o "$w/probe/probe" "$repo/tests/gpu/probe.cu" -L"$cuda/lib64/stubs" -lcuda
if [ -n "$lib" ] && [ -x "$w/probe/probe" ]; then
  mkdir -p "$w/hami-image"
  cp "$lib" "$w/hami-image/libvgpu.so.v2.10.0"
  echo "/usr/local/vgpu/libvgpu.so" > "$w/hami-image/ld.so.preload"
  try "install-hook (HAMi v2.10 layout)" hami-device-plugin install-hook --hami-core-dir "$w/hami-image" \
    --preload "$carry/bin/libhami_preload.so" --hook-path "$w/hook"
  try "limits file (plan --write, 3000 MiB)" sh -c "hami-device-plugin plan --pod $repo/examples/hami-pod-scheduled.yaml --node gpu-0 --hook-path $w/hook --write > $w/plan.json && find $w/hook/vgpu/containers -name '*.limits' -exec cat {} +"
  limits=$(find "$w/hook/vgpu/containers" -name '*.limits' | head -n 1)
  # The image: this machine's own root filesystem through an overlay (nothing can be pulled), the
  # driver's libraries from wherever the loader finds them, the GPU's device nodes.
  mkdir -p "$w/rootfs" "$w/rootfs-up" "$w/rootfs-work"
  mount -t overlay overlay -o "lowerdir=/,upperdir=$w/rootfs-up,workdir=$w/rootfs-work" "$w/rootfs" 2>"$w/logs/rootfs.log" \
    || row "container root filesystem (overlay of /)" FAILED "$(cat "$w/logs/rootfs.log")"
  mounts=(--mount "type=bind,src=$limits,dst=/overrideEnv,options=rbind:ro"
          --mount "type=bind,src=$w/hook/vgpu/ld.so.preload,dst=/etc/ld.so.preload,options=rbind:ro"
          --mount "type=bind,src=$w/hook/vgpu,dst=$w/hook/vgpu,options=rbind:rw"
          --mount "type=bind,src=$w/probe,dst=/probe,options=rbind:ro")
  for d in $(ldconfig -p | awk '/libcuda.so.1|libnvidia-ml.so.1/ {print $NF}' | xargs -r -n1 dirname | sort -u) $(dirname "$(command -v nvidia-smi)"); do
    mounts+=(--mount "type=bind,src=$d,dst=$d,options=rbind:ro")
  done
  devs=()
  for d in /dev/nvidia*; do [ -c "$d" ] && devs+=(--device "$d"); done
  row "GPU device nodes" info "${devs[*]}"
  cat > "$w/probe/inside.sh" <<'EOF'
#!/bin/sh
# The container's entrypoint: hold 1500 MiB for 25 s; meanwhile processes with an EMPTY environment.
# HAMi-core counts each process's CUDA context (~520 MiB on an H200) against the cap too.
/probe/probe runtime 1500 25 > /tmp/entry.out 2>&1 &
sleep 10
# (HAMi-core's own log lines are left out: only the probe's answer)
r='^(granted|refused|error)'
echo "entrypoint: $(grep -E "$r" /tmp/entry.out)"
echo "env -i, 1500 MiB: $(env -i /probe/probe runtime 1500 2>&1 | grep -E "$r")"
echo "env -i, 300 MiB: $(env -i /probe/probe runtime 300 2>&1 | grep -E "$r")"
echo "env -i printenv: $(env -i /usr/bin/printenv | tr '\n' ' ')"
wait
EOF
  chmod 755 "$w/probe/inside.sh"
  if try "GPU container (containerd, runc): entrypoint and env -i share the cap" sh -c "ctr --address $w/cd/containerd.sock -n k8s.io run --rm --rootfs ${devs[*]} $(printf '%q ' "${mounts[@]}") $w/rootfs gpu1 /probe/inside.sh > $w/logs/gpu-container.log 2>&1; cat $w/logs/gpu-container.log"; then
    out_gpu=$(cat "$w/logs/gpu-container.log")
    entry=$(sed -n 's/^entrypoint: //p' <<<"$out_gpu"); big=$(sed -n 's/^env -i, 1500 MiB: //p' <<<"$out_gpu"); small=$(sed -n 's/^env -i, 300 MiB: //p' <<<"$out_gpu")
    if [[ $entry == granted* && $entry == *total=3000* && $big == refused* && $small == granted* && $small == *total=3000* ]]; then
      row "one 3000 MiB cap for the entrypoint and the env -i process" ok "entrypoint 1500: $entry; env -i 1500: $big; env -i 300: $small"
    else
      row "one 3000 MiB cap for the entrypoint and the env -i process" FAILED "entrypoint 1500: $entry; env -i 1500: $big; env -i 300: $small"
      failures=$((failures + 1))
    fi
  fi
  umount "$w/rootfs" 2>/dev/null
fi

# --- the device plugin's NVML inventory (what `run` would advertise to kubelet) -----------------
try "hami-device-plugin inventory (NVML)" sh -c "hami-device-plugin inventory --node-name gpu-0 2>&1 | head -n 12"

# --- kubelet, standalone ------------------------------------------------------------------------
cat > "$w/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: $w/manifests
containerRuntimeEndpoint: unix://$w/cd/containerd.sock
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
readOnlyPort: 0
port: 10350
healthzPort: 10348
evictionHard: {memory.available: 100Mi, nodefs.available: "1%", imagefs.available: "1%"}
EOF
cat > "$w/manifests/static.yaml" <<EOF
apiVersion: v1
kind: Pod
metadata: {name: static-pause, namespace: default}
spec:
  hostNetwork: true
  containers: [{name: pause, image: localhost/hami-limits/pause:test, imagePullPolicy: Never}]
EOF
(setsid kubelet --config "$w/kubelet.yaml" --root-dir "$w/kubelet" --v=1 > "$w/logs/kubelet.log" 2>&1 < /dev/null & echo $! > "$w/kubelet.pid")
ok=""
for _ in $(seq 1 60); do
  kill -0 "$(cat "$w/kubelet.pid")" 2>/dev/null || break
  if c containers ls 2>/dev/null | grep -v pause:test | grep -q . && c tasks ls 2>/dev/null | grep -q RUNNING; then ok=1; break; fi
  sleep 1
done
if [ -n "$ok" ]; then
  row "kubelet (v1.34.4, standalone) runs a static pod through containerd" ok "$(c tasks ls | tail -n +2 | wc -l) tasks running"
else
  row "kubelet (v1.34.4, standalone) runs a static pod through containerd" FAILED "$(grep -E ' E[0-9]{4}|Error|error' "$w/logs/kubelet.log" | tail -n 3)"
  failures=$((failures + 1))
fi

echo; cat "$rep"
echo "node-probe: $failures failed step(s)"
exit 0
