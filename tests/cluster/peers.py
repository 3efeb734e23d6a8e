#!/usr/bin/env python3
"""Stand-ins for the peers' admission code and KAI's binder, as the tests need them.

Each function reproduces what one file of a peer does to a pod, read from the peer's source at
the tag named; nothing of the peers' code is here, only what it does. The reference facts are in
the team handbook (REFERENCE.md, "KAI v0.17 for real", "HAMi scheduler"), and
`tests/cluster/peers_test.py` pins each stand-in against them.

KAI-Scheduler v0.17.0 (commit f218c69b):
  - admission plugins, in the order `cmd/admission/main.go` registers them: `gpusharing`
    (`pkg/admission/webhook/v1alpha2/gpusharing/gpu_sharing.go`), `hamicore` when
    `--hami-core-enabled` (`.../hamicore/hamicore.go`), `deviceaccess` when
    `--block-nvidia-visible-devices` (not reproduced: off by default), `runtimeenforcement`
    when a fraction runtime class is set (`.../runtimeenforcement/runtime_enforcement.go`, chart
    default `nvidia`);
  - the helpers they call: `pkg/binder/common/gpu_access.go` (`GetFractionContainerRef`,
    `AddGPUSharingEnvVars`), `env_vars.go` (`AddEnvVarToContainer` drops every entry of the name
    and appends one; `AddDirectEnvVarsConfigMapSource`), `volumes.go` (`SetConfigMapVolume`),
    `gpusharingconfigmap/config_map.go` (the `runai/shared-gpu-configmap` prefix and names);
  - its MutatingWebhookConfiguration (`pkg/operator/operands/admission/resources.go`): name
    `mutating-kai-admission`, CREATE only, `failurePolicy: Fail`, `reinvocationPolicy:
    IfNeeded`, a match condition on `schedulerName`;
  - the binder: `pkg/binder/plugins/gpusharing/gpu_sharing.go` (the capabilities and `-evar`
    ConfigMaps, `NVIDIA_VISIBLE_DEVICES`, `GPU_PORTION` and `RUNAI_NUM_OF_GPUS`),
    `pkg/binder/plugins/hamicore/hami_core.go` (`CUDA_DEVICE_MEMORY_LIMIT` =
    `int64(nvidia.com/gpu.memory × portion)` + `m`; no label: nothing written, the pod is bound
    anyway), `pkg/binder/binding/resourcereservation/resource_reservation.go` (the reservation
    pod `gpu-reservation-<sha256(node/group)[:8]>` in `kai-resource-reservation`).

HAMi v2.10.0:
  - `pkg/scheduler/webhook.go` (`Handle`: skips a pod of another scheduler; every init container
    then container through `MutateAdmission`; `schedulerName` set when a container has a
    resource; a pod with `nodeName` denied) and `pkg/device/nvidia/device.go`
    (`MutateAdmission`: appends `CUDA_TASK_PRIORITY` from the priority limit and
    `GPU_CORE_UTILIZATION_POLICY` for a non-default core policy, without looking for an
    existing entry; `NVIDIA_VISIBLE_DEVICES=none` with `overwriteEnv` in a container without a
    GPU; `runtimeClassName` when configured);
  - its MutatingWebhookConfiguration (`charts/hami/templates/scheduler/webhook.yaml`, values):
    name `hami-webhook`, CREATE, `failurePolicy: Ignore`, `reinvocationPolicy: Never`,
    namespace and object selectors on `hami.io/webhook != ignore`.

Usage:
  peers.py admit kai|hami [OPTIONS_JSON] < pod.json      the mutated pod on stdout
  peers.py serve HOST PORT CERT KEY OPTIONS_FILE          HTTPS webhooks at /kai and /hami;
                                                          options re-read on every request
  peers.py kai-bind OPTIONS_JSON                          KAI's binder for one pod, via kubectl
Standard library only.
"""

import base64
import copy
import hashlib
import http.server
import json
import math
import random
import re
import ssl
import string
import subprocess
import sys

# --- KAI v0.17.0 ---------------------------------------------------------------------------------

KAI_CONFIGMAP_ANNOTATION = "runai/shared-gpu-configmap"
KAI_CONFIGMAP_SUFFIX = "shared-gpu"
KAI_RESERVATION_NAMESPACE = "kai-resource-reservation"
KAI_RESERVATION_PREFIX = "gpu-reservation"
KAI_GPU_GROUP_LABEL = "runai-gpu-group"
KAI_DEFAULT_QUEUE = "default-queue"
KAI_SCHEDULER_NAME = "kai-scheduler"
KAI_WEBHOOK_CONFIGURATION = "mutating-kai-admission"

KAI_DEFAULTS = {
    "hamicore": False,
    "runtimeClassName": "nvidia",
    # KAI draws 7 random characters; the tests fix them so that a replay is repeatable.
    "random": None,
}


def _annotations(pod):
    return (pod.get("metadata") or {}).get("annotations") or {}


def kai_requests_fraction(pod):
    """`resources.RequestsGPUFraction`: either annotation present, whatever its value."""
    a = _annotations(pod)
    return "gpu-fraction" in a or "gpu-memory" in a


def kai_fraction_container(pod):
    """`common.GetFractionContainerRef`: (kind, index, container); init containers first; the
    default is `containers[0]`; a name that matches nothing is an error."""
    spec = pod["spec"]
    name = _annotations(pod).get("gpu-fraction-container-name")
    if name is None:
        return ("regular", 0, spec["containers"][0])
    for i, c in enumerate(spec.get("initContainers") or []):
        if c.get("name") == name:
            return ("init", i, c)
    for i, c in enumerate(spec["containers"]):
        if c.get("name") == name:
            return ("regular", i, c)
    raise ValueError(f"container with name {name} not found for fraction request")


def kai_configmap_prefix(pod, index, rand=None):
    """`generateConfigMapNamePrefix`: the owner's name (else the pod's), cut so that the volume
    name fits 63 characters, then 7 random characters and `shared-gpu`."""
    meta = pod.get("metadata") or {}
    owners = meta.get("ownerReferences") or []
    base = owners[0]["name"] if owners else meta.get("name", "")
    max_len = (63 - (7 + 6)) - len(KAI_CONFIGMAP_SUFFIX) - len(str(index)) - 1 - 5
    base = base[:max_len].rstrip(".-")
    if rand is None:
        rand = "".join(random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(7))
    return f"{base}-{rand}-{KAI_CONFIGMAP_SUFFIX}"


def kai_configmap_names(pod, kind, index):
    """(capabilities, direct env): `<prefix>-<index>` (`i<index>` for an init container) and
    that with `-evar`."""
    prefix = _annotations(pod)[KAI_CONFIGMAP_ANNOTATION]
    idx = f"i{index}" if kind == "init" else str(index)
    cm = f"{prefix}-{idx}"
    return cm, f"{cm}-evar"


def _add_env(container, entry):
    """`AddEnvVarToContainer`: every entry of that name dropped, the new one appended."""
    env = [e for e in (container.get("env") or []) if e.get("name") != entry["name"]]
    env.append(entry)
    container["env"] = env


def _cm_ref(cm, key, optional=None):
    ref = {"name": cm, "key": key}
    if optional is not None:
        ref["optional"] = optional
    return {"name": key, "valueFrom": {"configMapKeyRef": ref}}


def kai_volume_name(cm):
    """`GetConfigVolumeName`."""
    name = re.sub(r"[^a-z0-9-]+", "-", (cm + "-vol").lower())
    return name.strip("-")


def kai_admission(pod, options=None):
    """KAI v0.17's admission mutations of one pod (CREATE), in plugin order."""
    o = dict(KAI_DEFAULTS, **(options or {}))
    pod = copy.deepcopy(pod)
    spec = pod["spec"]
    if not spec.get("containers") or not kai_requests_fraction(pod):
        return pod
    kind, index, container = kai_fraction_container(pod)
    # gpusharing
    meta = pod.setdefault("metadata", {})
    annotations = meta.setdefault("annotations", {})
    if KAI_CONFIGMAP_ANNOTATION not in annotations:
        annotations[KAI_CONFIGMAP_ANNOTATION] = kai_configmap_prefix(pod, index, o["random"])
    cm, evar = kai_configmap_names(pod, kind, index)
    for key in ("NVIDIA_VISIBLE_DEVICES", "RUNAI_NUM_OF_GPUS", "GPU_PORTION"):
        _add_env(container, _cm_ref(cm, key))
    volume = kai_volume_name(cm)
    volumes = [v for v in (spec.get("volumes") or []) if v.get("name") != volume]
    volumes.append({"name": volume, "configMap": {"name": cm}})
    spec["volumes"] = volumes
    env_from = container.get("envFrom") or []
    if not any((s.get("configMapRef") or {}).get("name") == evar for s in env_from):
        env_from.append({"configMapRef": {"name": evar, "optional": False}})
    container["envFrom"] = env_from
    # hamicore
    if o["hamicore"]:
        _add_env(container, _cm_ref(cm, "CUDA_DEVICE_MEMORY_LIMIT", optional=True))
    # runtimeenforcement
    if o["runtimeClassName"] and not spec.get("runtimeClassName"):
        spec["runtimeClassName"] = o["runtimeClassName"]
    return pod


def kai_portion(pod, node_memory_mib):
    """The portion KAI's scheduler puts in the BindRequest: `gpu-fraction` as asked; `gpu-memory`
    as `ceil(MiB / floor100(label) × 100) / 100`; written `%.2f`."""
    a = _annotations(pod)
    if "gpu-fraction" in a:
        return "%.2f" % float(a["gpu-fraction"])
    floor100 = (node_memory_mib // 100) * 100
    return "%.2f" % (math.ceil(int(a["gpu-memory"]) / floor100 * 100) / 100)


def kai_memory_limit(node_label, portion):
    """The `hamicore` binder plugin's value; None when it writes nothing (label missing, not a
    positive integer, or a zero result)."""
    if node_label is None:
        return None
    try:
        total = int(node_label)
    except ValueError:
        return None
    if total <= 0 or float(portion) <= 0:
        return None
    mib = int(total * float(portion))
    return f"{mib}m" if mib > 0 else None


def kai_reservation_name(node, group):
    return f"{KAI_RESERVATION_PREFIX}-{hashlib.sha256((node + '/' + group).encode()).hexdigest()[:16]}"


def kai_reservation_pod(node, group, image, tolerations=None):
    """The reservation pod the binder creates (no schedulerName: the default scheduler's, but
    `nodeName` is set)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": kai_reservation_name(node, group),
            "namespace": KAI_RESERVATION_NAMESPACE,
            "labels": {"app": "kai-resource-reservation", KAI_GPU_GROUP_LABEL: group},
            "annotations": {"karpenter.sh/do-not-disrupt": "true"},
        },
        "spec": {
            "nodeName": node,
            "tolerations": tolerations or [],
            "containers": [{
                "name": "resource-reservation",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "infinity"],
                "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                ],
            }],
        },
    }


def kai_binder_configmaps(pod, uuid, portion, node_label, hamicore):
    """The two ConfigMaps the binder leaves for the fraction container: {name: data}."""
    kind, index, container = kai_fraction_container(pod)
    cm, evar = kai_configmap_names(pod, kind, index)
    data = {"NVIDIA_VISIBLE_DEVICES": uuid, "RUNAI_NUM_OF_GPUS": portion, "GPU_PORTION": portion}
    if hamicore:
        limit = kai_memory_limit(node_label, portion)
        if limit is not None:
            data["CUDA_DEVICE_MEMORY_LIMIT"] = limit
    return {cm: data, evar: {}}


def kai_bind(o):
    """KAI's binder for one admitted pod, through kubectl (`o`: kubectl argv prefix, namespace,
    pod, node, uuid, hamicore, image, reserve): ConfigMaps owned by the pod, the reservation pod
    (when `reserve`), the pod's GPU-group label (an UPDATE), then the binding."""
    kubectl = o["kubectl"]

    def run(args, stdin=None):
        out = subprocess.run(kubectl + args, input=stdin, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr}")
        return out.stdout

    ns, name, node = o["namespace"], o["pod"], o["node"]
    pod = json.loads(run(["get", "pod", "-n", ns, name, "-o", "json"]))
    nodeobj = json.loads(run(["get", "node", node, "-o", "json"]))
    label = (nodeobj["metadata"].get("labels") or {}).get("nvidia.com/gpu.memory")
    if "gpu-memory" in _annotations(pod) and not (label or "").isdigit():
        raise RuntimeError(f"node {node} has no nvidia.com/gpu.memory: KAI cannot place gpu-memory")
    portion = kai_portion(pod, int(label) if (label or "").isdigit() else 0)
    group = o.get("group") or f"{name}-group"
    owner = [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod["metadata"]["uid"]}]
    for cm, data in kai_binder_configmaps(pod, o["uuid"], portion, label, o["hamicore"]).items():
        run(["apply", "-f", "-"], json.dumps({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": cm, "namespace": ns, "ownerReferences": owner},
            "data": data,
        }))
    if o.get("reserve"):
        run(["apply", "-f", "-"], json.dumps(kai_reservation_pod(node, group, o["image"])))
    run(["label", "pod", "-n", ns, name, f"{KAI_GPU_GROUP_LABEL}={group}", "--overwrite"])
    run(["create", "--raw", f"/api/v1/namespaces/{ns}/pods/{name}/binding", "-f", "-"],
        json.dumps({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node}}))
    return {"portion": portion, "group": group}


# --- HAMi v2.10.0 --------------------------------------------------------------------------------

HAMI_WEBHOOK_CONFIGURATION = "hami-webhook"
HAMI_DEFAULTS = {
    "schedulerName": "hami-scheduler",
    "forceOverwriteDefaultScheduler": True,
    "resourceCountName": "nvidia.com/gpu",
    "resourceMemoryName": "nvidia.com/gpumem",
    "resourceMemoryPercentageName": "nvidia.com/gpumem-percentage",
    "resourceCoreName": "nvidia.com/gpucores",
    "resourcePriorityName": "nvidia.com/priority",
    "gpuCorePolicy": "default",
    "overwriteEnv": False,
    "runtimeClassName": "",
}


class Denied(Exception):
    pass


def _quantity_int(v):
    return int(str(v))


def hami_admission(pod, options=None):
    """HAMi v2.10's webhook on one pod (CREATE): the mutated pod, or Denied."""
    o = dict(HAMI_DEFAULTS, **(options or {}))
    pod = copy.deepcopy(pod)
    spec = pod["spec"]
    if not spec.get("containers"):
        raise Denied("pod has no containers")
    sched = spec.get("schedulerName", "")
    if sched and (sched != "default-scheduler" or not o["forceOverwriteDefaultScheduler"]) and (
            not o["schedulerName"] or sched != o["schedulerName"]):
        return pod
    has_resource = False
    for c in (spec.get("initContainers") or []) + spec["containers"]:
        limits = (c.get("resources") or {}).get("limits") or {}
        if o["resourcePriorityName"] in limits:
            c.setdefault("env", []).append(
                {"name": "CUDA_TASK_PRIORITY", "value": str(_quantity_int(limits[o["resourcePriorityName"]]))})
        if o["gpuCorePolicy"] and o["gpuCorePolicy"] != "default":
            c.setdefault("env", []).append({"name": "GPU_CORE_UTILIZATION_POLICY", "value": o["gpuCorePolicy"]})
        found = o["resourceCountName"] in limits or any(
            k in limits for k in (o["resourceCoreName"], o["resourceMemoryName"], o["resourceMemoryPercentageName"]))
        if found and o["resourceCountName"] not in limits:
            # `mutateContainerResource`: memory or cores without a count get one GPU.
            c["resources"]["limits"][o["resourceCountName"]] = "1"
        if found and o["runtimeClassName"] and not spec.get("runtimeClassName"):
            spec["runtimeClassName"] = o["runtimeClassName"]
        if not found and o["overwriteEnv"]:
            c.setdefault("env", []).append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"})
        has_resource = has_resource or found
    if has_resource and o["schedulerName"]:
        spec["schedulerName"] = o["schedulerName"]
        if spec.get("nodeName"):
            raise Denied("pod has node assigned")
    return pod


# --- the webhook server --------------------------------------------------------------------------

def _patch(before, after):
    """A JSONPatch from `before` to `after`: the peers compute a diff of the whole object
    (controller-runtime's `PatchResponseFromRaw`); replacing `metadata` and `spec` gives the API
    server the same object."""
    ops = []
    for key in ("metadata", "spec"):
        if before.get(key) != after.get(key):
            ops.append({"op": "add" if key not in before else "replace", "path": f"/{key}", "value": after[key]})
    return ops


class Handler(http.server.BaseHTTPRequestHandler):
    options_file = None

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        review = json.loads(body)
        request = review["request"]
        pod = request.get("object") or {}
        with open(self.options_file) as f:
            options = json.load(f)
        response = {"uid": request["uid"], "allowed": True}
        which = self.path.strip("/").split("?")[0]
        log = {"peer": which, "pod": (pod.get("metadata") or {}).get("name")
               or (pod.get("metadata") or {}).get("generateName"), "operation": request.get("operation")}
        try:
            if which == "kai":
                after = kai_admission(pod, options.get("kai"))
            elif which == "hami":
                after = hami_admission(pod, options.get("hami"))
            else:
                raise Denied(f"no peer at {self.path}")
            patch = _patch(pod, after)
            if patch:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
            log["patched"] = bool(patch)
        except (Denied, ValueError) as e:
            response = {"uid": request["uid"], "allowed": False, "status": {"code": 403, "message": str(e)}}
            log["denied"] = str(e)
        sys.stderr.write(json.dumps(log) + "\n")
        sys.stderr.flush()
        out = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, fmt, *args):
        pass


def serve(host, port, cert, key, options_file):
    Handler.options_file = options_file
    server = http.server.ThreadingHTTPServer((host, port), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    print("serving", flush=True)
    server.serve_forever()


def main(argv):
    if len(argv) >= 2 and argv[0] == "admit":
        options = json.loads(argv[2]) if len(argv) > 2 else {}
        pod = json.load(sys.stdin)
        try:
            out = kai_admission(pod, options) if argv[1] == "kai" else hami_admission(pod, options)
        except (Denied, ValueError) as e:
            print(json.dumps({"denied": str(e)}))
            return 0
        print(json.dumps(out))
        return 0
    if len(argv) == 6 and argv[0] == "serve":
        serve(argv[1], int(argv[2]), argv[3], argv[4], argv[5])
        return 0
    if len(argv) == 2 and argv[0] == "kai-bind":
        print(json.dumps(kai_bind(json.loads(argv[1]))))
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
