#!/usr/bin/env bash
# An SSH login into a HAMi pod on the local node of `scripts/cluster up --with-chart`: a fresh key
# pair, a pod of the workload image (3000 MiB, 30 % of the cores) whose entrypoint starts sshd with
# that key for root, HAMi's scheduler played by examples/node-schedule-as-hami.sh, then
# `ssh root@POD-IP printenv` from this host (the pod's address is on the node's bridge). A login
# builds a fresh environment; the limits come from /overrideEnv: CUDA_DEVICE_MEMORY_LIMIT_0=3000m.
# What tests/tests/real_node/sessions.rs does for every other session (sudo, cron, login, su).
#
#   examples/node-ssh-demo.sh NAMESPACE POD
set -euo pipefail
ns=${1:?namespace}; pod=${2:?pod}
here=$(cd "$(dirname "$0")" && pwd)
keys=$(mktemp -d)
trap 'rm -rf "$keys"' EXIT
ssh-keygen -q -t ed25519 -N '' -C "$pod" -f "$keys/id"
kubectl -n "$ns" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $pod
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: cuda
      image: localhost/hami-limits/workload:test
      imagePullPolicy: Never
      env: [{name: SSH_AUTHORIZED_KEY, value: "$(cat "$keys/id.pub")"}]
      command:
        - sh
        - -c
        - >-
          install -d -m 700 /root/.ssh && printf '%s\n' "\$SSH_AUTHORIZED_KEY" > /root/.ssh/authorized_keys
          && ssh-keygen -A -q && install -d -m 755 /run/sshd && /usr/sbin/sshd && exec sleep infinity
      readinessProbe: {tcpSocket: {port: 22}, periodSeconds: 1}
      resources:
        limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 3000, nvidia.com/gpucores: 30}
YAML
"$here/node-schedule-as-hami.sh" "$ns" "$pod" >/dev/null
ip=$(kubectl -n "$ns" get pod "$pod" -o jsonpath='{.status.podIP}')
ssh -i "$keys/id" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes \
  -o LogLevel=ERROR "root@$ip" printenv
