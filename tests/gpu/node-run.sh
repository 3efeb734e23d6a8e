#!/usr/bin/env bash
# The node of `scripts/cluster up --node` on the GPU machine, and the design's own experiment on it:
# a HAMi pod granted 3000 MiB, an SSH login into it that asks for 4096 MiB (refused), `nvidia-smi`
# in that session (3000 MiB), the entrypoint and the session counted against one cap.
#
# Everything runs as on the dev machine's node: etcd, kube-apiserver, kube-controller-manager and
# kube-scheduler (Kubernetes from tests/cluster/versions.env), containerd 2 and runc (built from
# their modules, scripts/runtime-build), kubelet, the workload and pause images of scripts/images.
# What the GPU machine lacks is stood in for and said so in the report: no iproute2, iptables or
# CNI plugins (HAMI_NODE_NETWORK=host: hostNetwork pods, no kube-proxy), no NVIDIA container
# toolkit (a CDI spec for the real GPU written here as `nvidia-ctk cdi generate` lays one out: the
# device nodes, the driver's libraries and nvidia-smi; the device plugin hands it out by
# `cdi-cri`), no HAMi scheduler (examples/node-schedule-as-hami.sh plays it). Our device plugin
# runs as a host process with NVML; HAMi-core is built on the GPU machine by the caller.
#
# The machine has no network and a 64 MiB carry per call, so CARRY (a git-ignored folder, filled
# over several calls) holds the binaries built on the dev machine, each `xz`ed:
#
#   CARRY/bin/{etcd,kube-apiserver,kube-controller-manager,kube-scheduler,kubelet,kubectl}.xz
#   CARRY/bin/{containerd,containerd-shim-runc-v2,ctr,runc,hami-device-plugin}.xz
#   CARRY/lib/libseccomp.so.2   CARRY/lib/libhami_preload.so (scripts/build-preload)
#   CARRY/bin/openssl, CARRY/lib/{libssl,libcrypto}.so.3 (Debian's, used where the machine has none)
#   CARRY/images/{images.txt,pause.tar,workload.tar} (scripts/images build DIR --only pause,workload;
#   their layers are gzip'd already: `xz` gains nothing)
#
#   tests/gpu/node-run.sh CARRY LIBVGPU PROBE    # as root; report in $OUT/node-run.md
#
# LIBVGPU: HAMi-core's libvgpu.so; PROBE: tests/gpu/probe.cu built for the GPU (nvcc -arch=sm_90).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
carry=$(cd "${1:?usage: tests/gpu/node-run.sh CARRY LIBVGPU PROBE}" && pwd)
libvgpu=${2:?libvgpu.so}
probe=${3:?probe binary}
out=${OUT:-/tmp/node-run-out}
mkdir -p "$out"
w=/tmp/hl-gpu-cluster
. "$repo/tests/cluster/versions.env"
rep="$out/node-run.md"
{ echo "| step | result | detail |"; echo "|---|---|---|"; } > "$rep"
failures=0
row() { printf '| %s | %s | %s |\n' "$1" "$2" "$(echo "$3" | tr '\n|' ' /' | cut -c1-600)" >> "$rep"; echo "[$2] $1: $3"; }
check() { # check NAME CONDITION-RESULT DETAIL
  if [ "$2" = ok ]; then row "$1" ok "$3"; else row "$1" FAILED "$3"; failures=$((failures + 1)); fi
}

export HAMI_CLUSTER_DIR=$w/cluster HAMI_CACHE=$w/cache HAMI_NODE_NETWORK=host HAMI_IMAGES_DIR=$w/images
export PATH=$w/bin:$PATH
cluster() { "$repo/scripts/cluster" "$@"; }
finish() {
  [ -f "$w/plugin.pid" ] && kill -TERM "$(cat "$w/plugin.pid")" 2>/dev/null && sleep 2
  for f in "$w/cluster/logs"/*.log; do [ -f "$f" ] && tail -n 80 "$f" > "$out/$(basename "$f")"; done
  cluster down >/dev/null 2>&1
  echo; cat "$rep"; echo "node-run: $failures failed step(s)"
}
trap finish EXIT

# --- the binaries, where scripts/k8s-build and scripts/runtime-build keep theirs -----------------
k8s=$w/cache/k8s-$K8S_VERSION cd_dir=$w/cache/containerd-$CONTAINERD_VERSION runc_dir=$w/cache/runc-$RUNC_VERSION
mkdir -p "$k8s" "$cd_dir" "$runc_dir" "$w/bin" "$w/lib" "$w/images" "$w/keys"
unxz_to() { xz -dc "$carry/bin/$2.xz" > "$1/$2" && chmod 755 "$1/$2"; }
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do unxz_to "$k8s" "$b"; done
# No kube-proxy with HAMI_NODE_NETWORK=host; the list is scripts/k8s-build's own.
echo "kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl etcd" > "$k8s/.complete"
for b in containerd containerd-shim-runc-v2 ctr; do unxz_to "$cd_dir" "$b"; done
echo "containerd containerd-shim-runc-v2 ctr" > "$cd_dir/.complete"
unxz_to "$runc_dir" runc && mv "$runc_dir/runc" "$runc_dir/runc.real"
cp "$carry/lib/libseccomp.so.2" "$w/lib/"
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$w/lib" "$runc_dir/runc.real" > "$runc_dir/runc"
chmod 755 "$runc_dir/runc"
echo runc > "$runc_dir/.complete"
unxz_to "$w/bin" hami-device-plugin
# scripts/cluster makes its certificates with openssl: Debian's, carried, where the machine has none.
if ! command -v openssl >/dev/null && [ -x "$carry/bin/openssl" ]; then
  mkdir -p "$w/openssl"
  cp "$carry/bin/openssl" "$carry/lib/libssl.so.3" "$carry/lib/libcrypto.so.3" "$w/openssl/"
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$w/openssl" "$w/openssl/openssl" > "$w/bin/openssl"
  chmod 755 "$w/bin/openssl"
  row "openssl" info "none on the machine: Debian's $("$w/bin/openssl" version), carried"
fi
ln -sf "$k8s/kubectl" "$w/bin/kubectl"
cp "$carry/images/images.txt" "$w/images/"
for a in "$carry"/images/*.tar; do cp "$a" "$w/images/"; done
for a in "$carry"/images/*.tar.xz; do [ -f "$a" ] && xz -dc "$a" > "$w/images/$(basename "$a" .xz)"; done
row "binaries" info "Kubernetes $K8S_VERSION, containerd $CONTAINERD_VERSION, runc $RUNC_VERSION ($("$runc_dir/runc" --version | head -1)), hami-device-plugin $(hami-device-plugin --version 2>&1)"

# --- the node's address: kubelet refuses a loopback one ---------------------------------------------
hostip=$(python3 - <<'PY'
import fcntl, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _, name in socket.if_nameindex():
    try:
        a = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))[20:24])
    except OSError:
        continue
    if not a.startswith("127."):
        print(a)
        break
PY
)
if [ -z "$hostip" ]; then
  # No interface but lo: an address of its own on an alias of lo (SIOCSIFADDR; no iproute2 here).
  hostip=10.254.254.1
  python3 - "$hostip" <<'PY' || row "node address" FAILED "cannot add $hostip to lo:hl"
import fcntl, socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
addr = struct.pack("256s", b"lo:hl\0" .ljust(16, b"\0") + struct.pack("HH4s", socket.AF_INET, 0, socket.inet_aton(sys.argv[1])))
fcntl.ioctl(s.fileno(), 0x8916, addr)  # SIOCSIFADDR
PY
  row "node address" info "no interface but lo: $hostip on lo:hl"
else
  row "node address" info "$hostip"
fi
export HAMI_HOST_IP=$hostip

# --- the cluster and the node ----------------------------------------------------------------------
if ! cluster up --node > "$w/up.log" 2>&1; then
  check "scripts/cluster up --node (HAMI_NODE_NETWORK=host)" FAILED "$(tail -n 8 "$w/up.log")"
  exit 1
fi
eval "$(cluster env)"
nd=$w/cluster/node
check "scripts/cluster up --node (HAMI_NODE_NETWORK=host)" ok "$(grep -E 'Ready|up in' "$w/up.log" | tr '\n' ' ')"
row "node" info "$(kubectl get node hami-node -o jsonpath='{.status.nodeInfo.kubeletVersion} {.status.nodeInfo.containerRuntimeVersion} {.status.nodeInfo.kernelVersion} {.status.nodeInfo.osImage}')"

# --- CDI: the real GPU, as nvidia-ctk would lay it out (device nodes, driver libraries, nvidia-smi) --
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')
python3 - "$nd/cdi/etc/nvidia.json" "$uuid" <<'PY'
import glob, json, os, subprocess, sys
path, uuid = sys.argv[1], sys.argv[2]
libs = {}
for line in subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout.splitlines():
    name = line.strip().split(" ", 1)[0]
    if " => " in line and (name.startswith("libcuda.so") or name.startswith("libnvidia-")) and "x86-64" in line:
        libs[name] = line.split(" => ", 1)[1].strip()
mounts = []
for name, host in sorted(libs.items()):
    mounts.append({"hostPath": os.path.realpath(host), "containerPath": f"/usr/lib/x86_64-linux-gnu/{name}",
                   "options": ["ro", "nosuid", "nodev", "bind"]})
smi = subprocess.run(["sh", "-c", "command -v nvidia-smi"], capture_output=True, text=True).stdout.strip()
mounts.append({"hostPath": os.path.realpath(smi), "containerPath": "/usr/bin/nvidia-smi", "options": ["ro", "nosuid", "nodev", "bind"]})
common = [{"path": p} for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools") if os.path.exists(p)]
gpu = {"deviceNodes": [{"path": "/dev/nvidia0"}]}
spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": gpu}, {"name": uuid, "containerEdits": gpu},
                    {"name": "all", "containerEdits": gpu}],
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"], "deviceNodes": common, "mounts": mounts}}
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump(spec, f, indent=1)
os.rename(tmp, path)
print(f"{len(mounts)} mounts, {len(common) + 1} device nodes, devices 0, {uuid}, all")
PY
row "CDI spec $nd/cdi/etc/nvidia.json" info "$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(len(s["containerEdits"]["mounts"]), "mounts:", " ".join(m["containerPath"].rsplit("/",1)[1] for m in s["containerEdits"]["mounts"]))' "$nd/cdi/etc/nvidia.json")"

# --- HAMi-core and the preload library in the hook folder; the device plugin --------------------
mkdir -p "$w/hami-image" "$w/probe"
cp "$libvgpu" "$w/hami-image/libvgpu.so.v2.10.0"
echo "/usr/local/vgpu/libvgpu.so" > "$w/hami-image/ld.so.preload"
cp "$probe" "$w/probe/probe"
if o=$(hami-device-plugin install-hook --hami-core-dir "$w/hami-image" --preload "$carry/lib/libhami_preload.so" --hook-path "$nd/hook" 2>&1); then
  check "install-hook (HAMi v2.10 layout)" ok "$o"
else
  check "install-hook (HAMi v2.10 layout)" FAILED "$o"; exit 1
fi
(KUBECONFIG=$w/cluster/admin.kubeconfig setsid hami-device-plugin run --node-name hami-node \
   --hook-path "$nd/hook" --device-list-strategy cdi-cri --metrics-listen 127.0.0.1:9396 \
   > "$w/cluster/logs/hami-device-plugin.log" 2>&1 < /dev/null & echo $! > "$w/plugin.pid")
gpus=""
for _ in $(seq 1 120); do
  gpus=$(kubectl get node hami-node -o jsonpath='{.status.allocatable.nvidia\.com/gpu}' 2>/dev/null)
  [ -n "$gpus" ] && [ "$gpus" != 0 ] && kubectl get node hami-node -o jsonpath='{.metadata.annotations}' | grep -q node-nvidia-register && break
  sleep 0.5
done
if [ -n "$gpus" ] && [ "$gpus" != 0 ]; then
  check "device plugin registered (NVML), node annotated for HAMi's scheduler" ok "nvidia.com/gpu allocatable $gpus; $(kubectl get node hami-node -o jsonpath='{.metadata.annotations.hami\.io/node-nvidia-register}' | cut -c1-160)"
else
  check "device plugin registered (NVML), node annotated for HAMi's scheduler" FAILED "$(tail -n 5 "$w/cluster/logs/hami-device-plugin.log")"; exit 1
fi

# --- the HAMi pod: 3000 MiB; its entrypoint holds 1500 MiB and runs sshd ---------------------------
kubectl create namespace tenant >/dev/null
kubectl -n tenant apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: ssh-gpu}
spec:
  terminationGracePeriodSeconds: 1
  hostNetwork: true
  containers:
    - name: cuda
      image: localhost/hami-limits/workload:test
      imagePullPolicy: Never
      command:
        - sh
        - -c
        - >-
          ssh-keygen -A -q && install -d -m 755 /run/sshd
          && /usr/sbin/sshd -p 2222 -o ListenAddress=127.0.0.1
          && (/probe/probe runtime 1500 900 > /tmp/entry.out 2>&1 &)
          && exec sleep infinity
      readinessProbe: {exec: {command: [sh, -c, "grep -qE '^(granted|refused|error)' /tmp/entry.out"]}, periodSeconds: 1}
      volumeMounts: [{name: probe, mountPath: /probe, readOnly: true}]
      resources:
        limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 3000, nvidia.com/gpucores: 50}
  volumes: [{name: probe, hostPath: {path: $w/probe, type: Directory}}]
YAML
if o=$("$repo/examples/node-schedule-as-hami.sh" tenant ssh-gpu 3000 50 "$uuid" 2>&1) \
  && kubectl -n tenant exec ssh-gpu -- grep -q '^granted' /tmp/entry.out; then
  check "HAMi pod (3000 MiB, 50 % cores) scheduled as HAMi would, Allocate'd, Ready" ok "$(kubectl -n tenant get pod ssh-gpu -o jsonpath='{.status.phase} on {.spec.nodeName}'); entrypoint: $(kubectl -n tenant exec ssh-gpu -- sh -c "grep -E '^(granted|refused|error)' /tmp/entry.out")"
else
  check "HAMi pod (3000 MiB, 50 % cores) scheduled as HAMi would, Allocate'd, Ready" FAILED "$o $(kubectl -n tenant exec ssh-gpu -- sh -c 'tail -n 12 /tmp/entry.out; ls /dev/nvidia*' 2>&1) $(kubectl -n tenant logs ssh-gpu --previous 2>&1 | tail -n 5) $(kubectl -n tenant describe pod ssh-gpu | tail -n 12) $(tail -n 5 "$w/cluster/logs/hami-device-plugin.log")"
  exit 1
fi
kx() { kubectl -n tenant exec ssh-gpu -- "$@"; }
row "the pod's mounts" info "$(kx sh -c 'grep -E "overrideEnv|ld.so.preload|vgpu|nvidia" /proc/self/mountinfo | awk "{print \$5}" | sort | tr "\n" " "')"

# --- an SSH login (key authentication) into the pod: a fresh environment, the file's limits ------
kx sh -c 'install -d -m 700 /root/.ssh && ssh-keygen -q -t ed25519 -N "" -f /root/.ssh/id && cat /root/.ssh/id.pub >> /root/.ssh/authorized_keys' >/dev/null
ssh_in() { kx ssh -i /root/.ssh/id -p 2222 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR root@127.0.0.1 "$@"; }
r='^(granted|refused|error)'
env_ssh=$(ssh_in 'printenv | grep -E "^(CUDA_|LD_PRELOAD|SSH_CONNECTION)" | sort' 2>&1)
row "ssh: printenv" info "$env_ssh"
echo "$env_ssh" | grep -q '^SSH_CONNECTION=' && echo "$env_ssh" | grep -q '^CUDA_DEVICE_MEMORY_LIMIT_0=3000m$' \
  && check "ssh: a login session, the file's 3000 MiB" ok "SSH_CONNECTION set; CUDA_DEVICE_MEMORY_LIMIT_0=3000m" \
  || check "ssh: a login session, the file's 3000 MiB" FAILED "$env_ssh"
a=$(ssh_in '/probe/probe runtime 4096' 2>&1 | grep -E "$r")
[[ $a == refused* && $a == *total=3000* ]] && check "ssh: asks for 4096 MiB" ok "$a" || check "ssh: asks for 4096 MiB" FAILED "$a"
a=$(ssh_in 'CUDA_DEVICE_MEMORY_LIMIT=8192m CUDA_DEVICE_MEMORY_LIMIT_0=8192m /probe/probe runtime 4096' 2>&1 | grep -E "$r")
[[ $a == refused* && $a == *total=3000* ]] && check "ssh: asks for 4096 MiB with CUDA_DEVICE_MEMORY_LIMIT[_0]=8192m of its own" ok "$a" || check "ssh: asks for 4096 MiB with CUDA_DEVICE_MEMORY_LIMIT[_0]=8192m of its own" FAILED "$a"
# (HAMi-core's own log lines, on by LIBCUDA_LOG_LEVEL, left out: only nvidia-smi's CSV line)
smi=$(ssh_in 'nvidia-smi --query-gpu=memory.total,memory.used --format=csv,noheader,nounits' 2>&1 | grep -E '^ *[0-9]+, *[0-9]+ *$' | tail -n 1)
total=$(echo "$smi" | cut -d, -f1 | tr -d ' '); used=$(echo "$smi" | cut -d, -f2 | tr -d ' ')
[ "$total" = 3000 ] && [ "${used:-0}" -ge 1500 ] 2>/dev/null \
  && check "ssh: nvidia-smi shows the cap, the entrypoint's memory in use" ok "memory.total $total MiB, memory.used $used MiB (nvidia-smi on the host: $(nvidia-smi --query-gpu=memory.total,memory.used --format=csv,noheader -i 0))" \
  || check "ssh: nvidia-smi shows the cap, the entrypoint's memory in use" FAILED "$smi"
big=$(ssh_in '/probe/probe runtime 1500' 2>&1 | grep -E "$r")
small=$(ssh_in '/probe/probe runtime 300' 2>&1 | grep -E "$r")
[[ $big == refused* && $small == granted* && $small == *total=3000* ]] \
  && check "ssh: counted with the entrypoint (1500 MiB held): 1500 refused, 300 granted" ok "1500: $big; 300: $small" \
  || check "ssh: counted with the entrypoint (1500 MiB held): 1500 refused, 300 granted" FAILED "1500: $big; 300: $small"

# --- the other sessions of the design, in the same pod ----------------------------------------------
for s in "su - -c" "su - other -c" "env -i sh -c" "setsid sh -c"; do
  a=$(ssh_in "$s '/probe/probe runtime 4096'" 2>&1 | grep -E "$r")
  [[ $a == refused* && $a == *total=3000* ]] && check "ssh, then $s: asks for 4096 MiB" ok "$a" || check "ssh, then $s: asks for 4096 MiB" FAILED "$a"
done
a=$(kx sh -c '/probe/probe runtime 4096' 2>&1 | grep -E "$r")
[[ $a == refused* && $a == *total=3000* ]] && check "kubectl exec: asks for 4096 MiB" ok "$a" || check "kubectl exec: asks for 4096 MiB" FAILED "$a"
sleep 2
m=$(python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:9396/metrics", timeout=5).read().decode())' 2>&1 | grep -E '^hami_limits_region_(cap_verdict|used_bytes|file_limit_bytes|stamped_limit_bytes|processes)' | grep -v ' 0$')
echo "$m" | grep -q 'verdict="capped"' \
  && check "the device plugin's region exporter: the cap in force" ok "$(echo "$m" | tr '\n' ' ')" \
  || check "the device plugin's region exporter: the cap in force" FAILED "$(echo "$m" | tr '\n' ' ')"
exit 0
