#!/usr/bin/env bash
# Play HAMi v2.10's scheduler for a one-container pod on the local node of
# `scripts/cluster up --with-chart` (no hami-scheduler runs there): the node lock naming the pod,
# the pod's annotations (vgpu-node, vgpu-time, devices to allocate and allocated, bind-phase
# allocating, bind-time), then the Binding. The real kubelet then calls the device plugin's
# Allocate and starts the container. The pod's annotations are written as HAMi's scheduler
# ServiceAccount (impersonated): only the users of webhook.tenancy.schedulerAnnotationWriters may.
#
#   examples/node-schedule-as-hami.sh NAMESPACE POD [MIB] [CORES] [GPU-UUID]
set -euo pipefail
ns=${1:?namespace}; pod=${2:?pod}; mib=${3:-3000}; cores=${4:-30}
uuid=${5:-GPU-6a5b0c1e-0000-4000-8000-000000000000}   # the first GPU of scripts/cluster's inventory
node=hami-node
now=$(date +%s)
dev="$uuid,NVIDIA,$mib,$cores:;"
kubectl annotate node "$node" --overwrite "hami.io/mutex.lock=$(date -u -d "@$now" +%Y-%m-%dT%H:%M:%SZ),$ns,$pod" >/dev/null
kubectl --as=system:serviceaccount:kube-system:hami-scheduler --as-group=system:masters \
  -n "$ns" annotate pod "$pod" --overwrite "hami.io/vgpu-node=$node" "hami.io/vgpu-time=$now" \
  "hami.io/vgpu-devices-to-allocate=$dev" "hami.io/vgpu-devices-allocated=$dev" \
  hami.io/bind-phase=allocating "hami.io/bind-time=$now" >/dev/null
printf '{"apiVersion":"v1","kind":"Binding","metadata":{"name":"%s"},"target":{"apiVersion":"v1","kind":"Node","name":"%s"}}' "$pod" "$node" \
  | kubectl create --raw "/api/v1/namespaces/$ns/pods/$pod/binding" -f - >/dev/null
kubectl -n "$ns" wait --for=condition=Ready "pod/$pod" --timeout=60s
