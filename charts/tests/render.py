#!/usr/bin/env python3
"""Lint and render the hami-limits chart with real Helm (PyPI helm-python-sdk, Helm v4 inside).

Usage: render.py OUT_DIR

Writes OUT_DIR/<scenario>/<template file name> for every scenario below (the Rust test
tests/tests/chart.rs parses every manifest into k8s-openapi types and asserts the key fields), and
checks here what only Helm can tell: lint is clean, each scenario passes the values schema, and the
schema rejects bad values. Exits non-zero, naming the failure, on any problem.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path

try:
    import celpy
    import helm_python as helm
except ImportError as e:  # pragma: no cover - the message is the point
    sys.exit(f"render.py: cannot import {e.name} ({e}); run: pip install -r scripts/requirements-test.txt")

CHART = Path(__file__).resolve().parent.parent / "hami-limits"
RELEASE = "hl"
NAMESPACE = "hami-system"
PREFIX = f"{RELEASE}-hami-limits"
APP_VERSION = "0.1.0"

DIGEST = "sha256:" + "ab" * 32
SE_LINUX = {"type": "spc_t", "level": "s0"}


def workload_overrides(name: str, args: list[str], env: list[dict]) -> dict:
    """The same kind of overrides for each workload, told apart by name."""
    return {
        "podAnnotations": {"policy.example.com/owner": name, "checksum/config": "not-the-chart's"},
        "podLabels": {"team.example.com/owner": name, "app.kubernetes.io/component": "hijacked"},
        "podSecurityContext": {"seLinuxOptions": SE_LINUX, "supplementalGroups": [4242]},
        "securityContext": {"seLinuxOptions": SE_LINUX, "appArmorProfile": {"type": "RuntimeDefault"}},
        "extraArgs": args,
        "extraEnv": env,
    }


OVERRIDES: dict = {
    "global": {"imageRegistry": "registry.example.com:5000/mirror"},
    "imagePullSecrets": [{"name": "mirror-pull"}],
    "devicePlugin": {
        "image": {"digest": DIGEST},
        "serviceMonitor": {
            "enabled": True,
            "interval": "1m",
            "labels": {"release": "kube-prometheus-stack"},
            "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"}],
        },
        **workload_overrides(
            "device-plugin",
            ["--register-interval=15"],
            [
                {"name": "HAMI_REGISTER_RETRY", "value": "2"},
                {"name": "HAMI_KUBELET_WATCH_INTERVAL_MS", "valueFrom": {"configMapKeyRef": {"name": "tuning", "key": "watch-ms"}}},
            ],
        ),
    },
    "hookInstaller": {
        "enabled": True,
        "pauseImage": {"digest": DIGEST},
        **workload_overrides("hook-installer", ["--log-format=json"], [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]),
    },
    "webhook": {
        "serviceMonitor": {"enabled": True, "scrapeTimeout": "", "metricRelabelings": [{"regex": "go_.*", "action": "labeldrop"}]},
        **workload_overrides(
            "webhook", ["--worker-threads=2"], [{"name": "HAMI_WEBHOOK_EXTRA", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
        ),
    },
    "certs": {
        "certgen": {
            "image": {"digest": DIGEST},
            **workload_overrides("certgen", ["--log-format=text"], [{"name": "TZ", "value": "UTC"}]),
        }
    },
}

# Scenario name -> values overrides (merged over the chart defaults by Helm).
SCENARIOS: dict[str, dict] = {
    "default": {},
    "cert-manager": {"certs": {"certManager": {"enabled": True}}},
    "cert-manager-issuer": {
        "certs": {
            "secretName": "custom-tls",
            "certManager": {"enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}},
        }
    },
    "env-delivery": {"devicePlugin": {"limitDelivery": "env"}},
    "per-node": {
        "devicePlugin": {
            "limitDelivery": "env",
            "nodeConfig": [
                {"name": "gpu-canary-1", "limitdelivery": "file"},
                {
                    "name": "gpu-a100-7",
                    "operatingmode": "hami-core",
                    "devicesplitcount": 4,
                    "devicememoryscaling": 1.5,
                    "devicecorescaling": 1,
                    "libcudaloglevel": 2,
                    "filterdevices": {"uuid": ["GPU-0d9e7f3a"], "index": [3]},
                    "enablegetpreferredallocation": True,
                    "limitdelivery": "file",
                },
            ],
        }
    },
    "per-gpu-vram": {"webhook": {"kai": {"perGpuVramMib": 81920}}},
    "kai": {
        "webhook": {
            "kai": {
                "schedulerNames": ["kai-scheduler", "kai-scheduler-batch"],
                "hookPath": "/opt/vgpu",
                "preloadContainers": "all",
                "limitDelivery": "env",
                "missingBasis": "warn",
            },
            "tenancy": {
                "schedulerAnnotationWriters": [
                    "system:serviceaccount:hami-system:hami-scheduler",
                    "system:serviceaccount:hami-limits:hami-limits-device-plugin",
                ],
                "allowHamiCoreEnvNamespaces": ["legacy-ml"],
                "forbidEnvDeliveryNamespaces": ["tenant-a", "tenant-b"],
                "kaiOptOutNamespaces": ["kai-debug"],
            },
        }
    },
    "custom-names": {
        "devicePlugin": {
            "resourceCountName": "example.com/vgpu",
            "resourceMemoryName": "example.com/vgpu-memory",
            "gpuCorePolicy": "force",
            "libCudaLogLevel": 3,
            "deviceSplitCount": 4,
            "deviceMemoryScaling": 2,
            "hookPath": "/opt/hami",
            "runtimeClassName": "nvidia",
            "disableHealthChecks": "48,109",
        }
    },
    "ignore-no-conditions": {
        "webhook": {
            "failurePolicy": "Ignore",
            "matchConditions": False,
            "timeoutSeconds": 5,
            "replicas": 1,
            "excludeNamespaces": ["monitoring"],
        },
        "certs": {"certgen": {"renewal": {"enabled": False}}},
    },
    "webhook-only": {"devicePlugin": {"enabled": False}},
    # The hook installer beside the device plugin, both on a non-default hook path.
    "hook-installer": {
        "devicePlugin": {"hookPath": "/opt/hami"},
        "hookInstaller": {
            "enabled": True,
            "nodeSelector": {"kai.example.com/gpu-pool": "shared"},
            "tolerations": [{"key": "kai.example.com/gpu", "operator": "Equal", "value": "shared", "effect": "NoSchedule"}],
            "priorityClassName": "",
            "resources": {"requests": {"cpu": "2m", "memory": "4Mi"}, "limits": {"memory": "12Mi"}},
        },
    },
    # A KAI cluster without HAMi: webhook and hook installer only, on the KAI hook folder.
    "kai-only": {
        "devicePlugin": {"enabled": False},
        "hookInstaller": {"enabled": True, "pauseImage": {"repository": "mirror.example.com/pause", "tag": "3.10", "pullPolicy": "Always"}},
        "webhook": {"kai": {"hookPath": "/opt/kai/vgpu"}},
    },
    "device-plugin-only": {"webhook": {"enabled": False}, "devicePlugin": {"hamiCore": {"install": False}}},
    # Nodes without NVML: the inventory reaches the plugin and both install-hook init containers
    # (the node GPU file); the hook installer on the NVIDIA runtime class.
    "inventory": {
        "devicePlugin": {
            "inventory": [
                {"uuid": "GPU-11111111-aaaa-4000-8000-000000000001", "name": "NVIDIA H200", "memoryMib": 143771, "minor": 3},
                {"uuid": "GPU-22222222-bbbb-4000-8000-000000000002", "name": "NVIDIA H200", "memoryMib": 143771, "numaNode": 1},
            ]
        },
        "hookInstaller": {"enabled": True, "runtimeClassName": "nvidia"},
    },
    # HAMi's vGPU monitor off; the ServiceMonitor then scrapes the plugin's port only.
    "no-monitor": {"devicePlugin": {"monitor": {"enabled": False}, "serviceMonitor": {"enabled": True}}},
    # The monitor from another image and port, tuned, with the plugin on HAMi's old port.
    "monitor-custom": {
        "devicePlugin": {
            "hookPath": "/opt/hami",
            "metricsPort": 9394,
            "serviceMonitor": {"enabled": True},
            "monitor": {
                "image": {"repository": "mirror.example.com/hami", "tag": "v2.10.1", "pullPolicy": "Always"},
                "port": 9500,
                "resyncInterval": "90s",
                "extraArgs": ["-v=4", "--legacy-metrics=true"],
                "extraEnv": [{"name": "KLOG_V", "value": "4"}],
                "securityContext": {"seLinuxOptions": SE_LINUX},
            },
        }
    },
    # HAMi v2.10's devicePlugin values (and its scheduler policy) under HAMi's names: each becomes
    # the variable HAMi's DaemonSet sets, or the device-config / node-config key HAMi reads.
    "hami-values": {
        "scheduler": {"defaultSchedulerPolicy": {"gpuSchedulerPolicy": "topology-aware"}},
        "devicePlugin": {
            "migStrategy": "single",
            "deviceListStrategy": "volume-mounts,cdi-annotations",
            "passDeviceSpecsEnabled": True,
            "nvidiaHookPath": "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
            "nvidiaDriverRoot": "/run/nvidia/driver",
            "gdrcopyEnabled": True,
            "gdsEnabled": False,
            "mofedEnabled": True,
            "enableNumaTopology": True,
            "nodeConfig": [{"name": "gpu-numa-off", "enablenumatopology": False}],
        },
    },
    # HAMi's own device-config ConfigMap (one source of truth with HAMi's scheduler).
    "existing-device-config": {"deviceConfig": {"existingConfigMap": "hami-scheduler-device", "key": "device-config.yaml"}},
    # Every per-workload override a policy engine or a private registry asks for, on every workload.
    "overrides": OVERRIDES,
}

# Values the schema must refuse: (description, overrides, text the error must contain).
BAD_VALUES: list[tuple[str, dict, str]] = [
    ("limitDelivery in capitals", {"devicePlugin": {"limitDelivery": "FILE"}}, "limitDelivery"),
    ("limitDelivery unknown", {"devicePlugin": {"limitDelivery": "both"}}, "limitDelivery"),
    ("per-node limitdelivery in capitals", {"devicePlugin": {"nodeConfig": [{"name": "n1", "limitdelivery": "ENV"}]}}, "limitdelivery"),
    ("per-node entry without name", {"devicePlugin": {"nodeConfig": [{"limitdelivery": "env"}]}}, "name"),
    ("per-node unknown key", {"devicePlugin": {"nodeConfig": [{"name": "n1", "limitDelivry": "env"}]}}, "limitDelivry"),
    ("dynamic MIG spelled wrong", {"devicePlugin": {"nodeConfig": [{"name": "n1", "operatingmode": "MIG"}]}}, "operatingmode"),
    ("gpuCorePolicy in capitals", {"devicePlugin": {"gpuCorePolicy": "FORCE"}}, "gpuCorePolicy"),
    ("deviceSplitCount zero", {"devicePlugin": {"deviceSplitCount": 0}}, "deviceSplitCount"),
    ("libCudaLogLevel above 4", {"devicePlugin": {"libCudaLogLevel": 5}}, "libCudaLogLevel"),
    ("health checks spelt wrong", {"devicePlugin": {"disableHealthChecks": "none"}}, "disableHealthChecks"),
    ("relative hookPath", {"devicePlugin": {"hookPath": "usr/local"}}, "hookPath"),
    ("relative KAI hookPath", {"webhook": {"kai": {"hookPath": "vgpu"}}}, "hookPath"),
    ("typo in a devicePlugin key", {"devicePlugin": {"limitDelivry": "env"}}, "limitDelivry"),
    ("failurePolicy lower case", {"webhook": {"failurePolicy": "fail"}}, "failurePolicy"),
    ("timeoutSeconds zero", {"webhook": {"timeoutSeconds": 0}}, "timeoutSeconds"),
    ("timeoutSeconds above 30", {"webhook": {"timeoutSeconds": 31}}, "timeoutSeconds"),
    ("replicas as a string", {"webhook": {"replicas": "2"}}, "replicas"),
    ("perGpuVramMib zero", {"webhook": {"kai": {"perGpuVramMib": 0}}}, "perGpuVramMib"),
    ("perGpuVramMib as a string", {"webhook": {"kai": {"perGpuVramMib": "80Gi"}}}, "perGpuVramMib"),
    ("preloadContainers unknown", {"webhook": {"kai": {"preloadContainers": "first"}}}, "preloadContainers"),
    ("KAI limitDelivery in capitals", {"webhook": {"kai": {"limitDelivery": "Env"}}}, "limitDelivery"),
    ("missingBasis unknown", {"webhook": {"kai": {"missingBasis": "ignore"}}}, "missingBasis"),
    ("tenancy namespace not a DNS label", {"webhook": {"tenancy": {"kaiOptOutNamespaces": ["ML_Team"]}}}, "kaiOptOutNamespaces"),
    ("tenancy namespace list as a string", {"webhook": {"tenancy": {"allowHamiCoreEnvNamespaces": "ml"}}}, "allowHamiCoreEnvNamespaces"),
    ("tenancy writer with a comma", {"webhook": {"tenancy": {"schedulerAnnotationWriters": ["a,b"]}}}, "schedulerAnnotationWriters"),
    ("tenancy key spelt wrong", {"webhook": {"tenancy": {"kaiOptOutNamespace": []}}}, "kaiOptOutNamespace"),
    ("logFormat unknown", {"webhook": {"logFormat": "yaml"}}, "logFormat"),
    ("certDays zero", {"certs": {"certDays": 0}}, "certDays"),
    ("issuerRef kind unknown", {"certs": {"certManager": {"issuerRef": {"name": "x", "kind": "Vault"}}}}, "kind"),
    ("unknown top-level key", {"devicePlugins": {}}, "devicePlugins"),
    ("hookInstaller.enabled as a string", {"hookInstaller": {"enabled": "true"}}, "enabled"),
    ("typo in a hookInstaller key", {"hookInstaller": {"nodeSelectr": {"a": "b"}}}, "nodeSelectr"),
    ("hookInstaller nodeSelector value not a string", {"hookInstaller": {"nodeSelector": {"gpu": True}}}, "nodeSelector"),
    ("hookInstaller toleration without a list", {"hookInstaller": {"tolerations": "nvidia.com/gpu"}}, "tolerations"),
    ("hookInstaller toleration operator lower case", {"hookInstaller": {"tolerations": [{"key": "k", "operator": "exists"}]}}, "operator"),
    ("hookInstaller toleration unknown key", {"hookInstaller": {"tolerations": [{"key": "k", "effects": "NoSchedule"}]}}, "effects"),
    ("hookInstaller resources unknown key", {"hookInstaller": {"resources": {"limit": {"memory": "16Mi"}}}}, "limit"),
    ("hookInstaller memory with a space", {"hookInstaller": {"resources": {"limits": {"memory": "16 Mi"}}}}, "memory"),
    ("hookInstaller pause image without tag", {"hookInstaller": {"pauseImage": {"tag": ""}}}, "tag"),
    ("hookInstaller pause pullPolicy lower case", {"hookInstaller": {"pauseImage": {"pullPolicy": "always"}}}, "pullPolicy"),
    ("digest without algorithm", {"webhook": {"image": {"digest": "ab" * 32}}}, "digest"),
    ("digest too short", {"devicePlugin": {"image": {"digest": "sha256:abc"}}}, "digest"),
    ("digest in capitals", {"certs": {"certgen": {"image": {"digest": "sha256:" + "AB" * 32}}}}, "digest"),
    ("imageRegistry with a scheme", {"global": {"imageRegistry": "https://registry.example.com"}}, "imageRegistry"),
    ("unknown global key", {"global": {"imageRegistries": "r"}}, "imageRegistries"),
    ("pull secret as a string", {"imagePullSecrets": ["mirror-pull"]}, "imagePullSecrets"),
    ("podAnnotations value not a string", {"webhook": {"podAnnotations": {"a": 1}}}, "podAnnotations"),
    ("podLabels value not a string", {"devicePlugin": {"podLabels": {"tier": True}}}, "podLabels"),
    ("podLabels key with a space", {"hookInstaller": {"podLabels": {"my label": "x"}}}, "my label"),
    ("extraArgs not a list", {"webhook": {"extraArgs": "--worker-threads=2"}}, "extraArgs"),
    ("extraArgs item not a string", {"devicePlugin": {"extraArgs": [15]}}, "extraArgs"),
    ("extraEnv without name", {"certs": {"certgen": {"extraEnv": [{"value": "x"}]}}}, "name"),
    ("extraEnv value not a string", {"webhook": {"extraEnv": [{"name": "N", "value": 2}]}}, "value"),
    ("extraEnv value and valueFrom", {"webhook": {"extraEnv": [{"name": "N", "value": "a", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}}, "extraEnv"),
    ("extraEnv unknown valueFrom source", {"devicePlugin": {"extraEnv": [{"name": "N", "valueFrom": {"vaultRef": {"key": "k"}}}]}}, "vaultRef"),
    ("securityContext unknown key", {"webhook": {"securityContext": {"readOnlyRootFS": True}}}, "readOnlyRootFS"),
    ("securityContext runAsUser as a string", {"certs": {"certgen": {"securityContext": {"runAsUser": "1000"}}}}, "runAsUser"),
    ("securityContext seccomp type unknown", {"hookInstaller": {"securityContext": {"seccompProfile": {"type": "Default"}}}}, "type"),
    ("securityContext capability lower case", {"devicePlugin": {"securityContext": {"capabilities": {"add": ["net_admin"]}}}}, "add"),
    ("podSecurityContext container-only key", {"webhook": {"podSecurityContext": {"readOnlyRootFilesystem": True}}}, "readOnlyRootFilesystem"),
    ("podSecurityContext fsGroup negative", {"devicePlugin": {"podSecurityContext": {"fsGroup": -1}}}, "fsGroup"),
    ("serviceMonitor.enabled as a string", {"webhook": {"serviceMonitor": {"enabled": "true"}}}, "enabled"),
    ("serviceMonitor interval without unit", {"devicePlugin": {"serviceMonitor": {"interval": "30"}}}, "interval"),
    ("serviceMonitor unknown key", {"devicePlugin": {"serviceMonitor": {"port": "metrics"}}}, "port"),
    ("serviceMonitor relabel action unknown", {"webhook": {"serviceMonitor": {"relabelings": [{"action": "rename"}]}}}, "action"),
    ("extraArgs on the pause image", {"hookInstaller": {"pauseImage": {"extraArgs": []}}}, "extraArgs"),
    ("removed value defaultMemory (HAMi's scheduler reads it)", {"devicePlugin": {"defaultMemory": 1000}}, "defaultMemory"),
    ("removed value memoryFactor (HAMi's scheduler reads it)", {"devicePlugin": {"memoryFactor": 2}}, "memoryFactor"),
    ("removed value defaultCores (HAMi's scheduler reads it)", {"devicePlugin": {"defaultCores": 20}}, "defaultCores"),
    ("defaultGpuNum negative", {"devicePlugin": {"defaultGpuNum": -1}}, "defaultGpuNum"),
    ("monitor.enabled as a string", {"devicePlugin": {"monitor": {"enabled": "false"}}}, "enabled"),
    ("monitor port privileged", {"devicePlugin": {"monitor": {"port": 80}}}, "port"),
    ("monitor resyncInterval without unit", {"devicePlugin": {"monitor": {"resyncInterval": "300"}}}, "resyncInterval"),
    ("monitor image repository without tag or digest", {"devicePlugin": {"monitor": {"image": {"repository": "mirror/hami"}}}}, "tag"),
    ("HAMi's monitor.ctrPath", {"devicePlugin": {"monitor": {"ctrPath": "/usr/local/vgpu/containers"}}}, "<devicePlugin.hookPath>/vgpu/containers"),
    ("monitor unknown key", {"devicePlugin": {"monitor": {"ctrpath": "/usr/local/vgpu/containers"}}}, "ctrpath"),
    ("existingConfigMap not a DNS name", {"deviceConfig": {"existingConfigMap": "HAMi_Device"}}, "existingConfigMap"),
    ("deviceConfig key with a slash", {"deviceConfig": {"key": "a/b.yaml"}}, "key"),
    ("inventory minor of /dev/nvidiactl", {"devicePlugin": {"inventory": [{"uuid": "GPU-a", "name": "x", "memoryMib": 1, "minor": 255}]}}, "minor"),
    ("inventory memory beyond 16 TiB", {"devicePlugin": {"inventory": [{"uuid": "GPU-a", "name": "x", "memoryMib": 16777217}]}}, "memoryMib"),
    ("migStrategy unknown", {"devicePlugin": {"migStrategy": "all"}}, "migStrategy"),
    ("deviceListStrategy unknown", {"devicePlugin": {"deviceListStrategy": "env"}}, "deviceListStrategy"),
    ("passDeviceSpecsEnabled as a string", {"devicePlugin": {"passDeviceSpecsEnabled": "true"}}, "passDeviceSpecsEnabled"),
    ("gdsEnabled as a string", {"devicePlugin": {"gdsEnabled": "true"}}, "gdsEnabled"),
    ("relative nvidiaDriverRoot", {"devicePlugin": {"nvidiaDriverRoot": "run/nvidia/driver"}}, "nvidiaDriverRoot"),
    ("per-node enablenumatopology as a string", {"devicePlugin": {"nodeConfig": [{"name": "n1", "enablenumatopology": "true"}]}}, "enablenumatopology"),
    ("gpuSchedulerPolicy unknown", {"scheduler": {"defaultSchedulerPolicy": {"gpuSchedulerPolicy": "topology"}}}, "gpuSchedulerPolicy"),
    ("HAMi's other scheduler values", {"scheduler": {"kubeScheduler": {"enabled": True}}}, "kubeScheduler"),
    # HAMi's names that hami-limits spells otherwise (or has no use for): the error names ours.
    ("HAMi's libPath", {"devicePlugin": {"libPath": "/usr/local/vgpu"}}, "set devicePlugin.hookPath"),
    ("HAMi's pluginPath", {"devicePlugin": {"pluginPath": "/var/lib/kubelet/device-plugins"}}, "set devicePlugin.kubeletDir"),
    ("HAMi's nvidiaNodeSelector", {"devicePlugin": {"nvidiaNodeSelector": {"gpu": "on"}}}, "set devicePlugin.nodeSelector"),
    ("HAMi's extraEnvs", {"devicePlugin": {"extraEnvs": {}}}, "set devicePlugin.extraEnv"),
    ("HAMi's nodeConfiguration", {"devicePlugin": {"nodeConfiguration": {"config": "{}"}}}, "set devicePlugin.nodeConfig"),
    ("HAMi's disablecorelimit", {"devicePlugin": {"disablecorelimit": "false"}}, "set devicePlugin.disableCoreLimit"),
    ("HAMi's hostPID", {"devicePlugin": {"hostPID": True}}, "needs no host PID namespace"),
    ("HAMi's hostNetwork", {"devicePlugin": {"hostNetwork": False}}, "needs no host network"),
    ("HAMi's gpuOperatorToolkitReady", {"devicePlugin": {"gpuOperatorToolkitReady": {"enabled": False}}}, "gpuOperatorToolkitReady"),
    ("HAMi's createRuntimeClass", {"devicePlugin": {"createRuntimeClass": False}}, "set devicePlugin.runtimeClassName"),
    ("HAMi's service", {"devicePlugin": {"service": {"type": "NodePort"}}}, "devicePlugin.metricsPort"),
    ("HAMi's monitor.extraEnvs", {"devicePlugin": {"monitor": {"extraEnvs": {}}}}, "set devicePlugin.monitor.extraEnv"),
    ("HAMi's image.registry", {"webhook": {"image": {"registry": "docker.io"}}}, "set global.imageRegistry"),
    ("HAMi's image.pullSecrets", {"devicePlugin": {"image": {"pullSecrets": ["regcred"]}}}, "set imagePullSecrets"),
    ("HAMi's global.imagePullSecrets", {"global": {"imagePullSecrets": ["regcred"]}}, "set imagePullSecrets"),
    ("hookInstaller runtimeClassName not a DNS name", {"hookInstaller": {"runtimeClassName": "NVIDIA_runtime"}}, "runtimeClassName"),
]

# certs.certgen.renewal.schedule: what the schema must accept (what Kubernetes' CronJob parser
# accepts) and refuse.
CRON_ACCEPTED = [
    "17 3 * * *",
    "*/5 * * * *",
    "0 0 1 1 *",
    "0-59/15 0-23 1-31 1-12 0-6",
    "0 9-17 * * MON-FRI",
    "0 0 * JAN,MAR,DEC SUN",
    "30 2 ? * sun",
    "5 4 1,15 */2 *",
    "0 0 * * 1-5/2",
    "00 03 01 01 0",
    "7\t3  *   * *",  # tabs and runs of blanks separate fields
    "@hourly",
    "@daily",
    "@midnight",
    "@weekly",
    "@monthly",
    "@yearly",
    "@annually",
    "@every 1h30m",
]
CRON_REJECTED = [
    "",
    "daily",
    "17 3 * *",
    "17 3 * * * *",
    "60 * * * *",
    "* 24 * * *",
    "* * 0 * *",
    "* * 32 * *",
    "* * * 13 *",
    "* * * * 7",
    "*/0 * * * *",
    "-1 * * * *",
    "1- * * * *",
    "1,,2 * * * *",
    "0 0 L * *",
    "0 0 * * MONDAY",
    "0 0 * FOO *",
    "a b c d e",
    "@reboot",
    "@Daily",
    "@every",
    "TZ=UTC 0 0 * * *",
    "CRON_TZ=Europe/Paris 0 0 * * *",
    " 17 3 * * *",
    "17 3 * * * # nightly",
    "17 3 * * *; rm -rf /",
]


# Values the schema accepts but the templates refuse (relations between values): (what, overrides,
# text the error must contain).
TEMPLATE_REJECTS: list[tuple[str, dict, str]] = [
    (
        "the vGPU monitor and the plugin on one port",
        {"devicePlugin": {"metricsPort": 9394}},
        "devicePlugin.monitor.port (9394) and devicePlugin.metricsPort (9394) are both ports of the device plugin pod",
    ),
    ("certDays inside the renewal window", {"certs": {"certDays": 30}}, "certs.certDays (30) must be greater"),
    ("caDays inside the renewal window", {"certs": {"caDays": 20, "renewBeforeDays": 25, "certDays": 40}}, "certs.caDays (20)"),
    (
        "hook installer on a KAI folder not named vgpu",
        {"hookInstaller": {"enabled": True}, "webhook": {"kai": {"hookPath": "/opt/hami-core"}}},
        'the KAI hook folder "/opt/hami-core"',
    ),
    (
        "hook installer on /vgpu (no hook path above it)",
        {"hookInstaller": {"enabled": True}, "devicePlugin": {"hookPath": "/"}},
        'the KAI hook folder "/vgpu"',
    ),
]


class Failure(Exception):
    pass


def documents(text: str) -> list[dict]:
    """The YAML documents of one rendered template (comment-only documents dropped)."""
    docs = []
    for part in re.split(r"(?m)^---[ \t]*$", text):
        doc = helm.values_from_yaml(part) if part.strip() else {}
        if doc:
            docs.append(doc)
    return docs


def manifests(rendered: dict[str, str]) -> list[dict]:
    return [d for k, text in sorted(rendered.items()) if not k.endswith("NOTES.txt") for d in documents(text)]


def pod_templates(objs: list[dict]) -> list[tuple[str, dict]]:
    """(KIND/NAME, pod template) of every workload."""
    out = []
    for o in objs:
        kind, name = o["kind"], o["metadata"]["name"]
        if kind in ("Deployment", "DaemonSet", "Job"):
            out.append((f"{kind}/{name}", o["spec"]["template"]))
        elif kind == "CronJob":
            out.append((f"{kind}/{name}", o["spec"]["jobTemplate"]["spec"]["template"]))
    return out


def containers(template: dict) -> list[dict]:
    spec = template["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def expect(cond: bool, message: str) -> None:
    if not cond:
        raise Failure(message)


def check_ca_bundle_never_rendered(rendered: dict[str, str], scenario: str) -> int:
    """The rollback guarantee, as far as rendering shows it: no revision's manifest holds a caBundle
    (so Helm's three-way merge and server-side apply never remove the live one), and the certgen
    patch Job is also a post-rollback hook (Helm runs the hooks of the revision rolled back to)."""
    objs = manifests(rendered)
    configs = [o for o in objs if o["kind"] == "MutatingWebhookConfiguration"]
    for c in configs:
        for w in c["webhooks"]:
            expect("caBundle" not in w["clientConfig"], f"{scenario}: {c['metadata']['name']} renders a caBundle: {w['clientConfig']}")
    hooks = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Job"}
    patch, create = hooks.get(f"{PREFIX}-certgen-patch"), hooks.get(f"{PREFIX}-certgen-create")
    if patch is None:
        return len(configs)
    ann = patch["metadata"]["annotations"]
    expect(ann["helm.sh/hook"] == "post-install,post-upgrade,post-rollback", f"{scenario}: patch hook events {ann}")
    expect(create["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade,pre-rollback", f"{scenario}: create hook events")
    # The hook identity exists for every event either Job runs on, before it (lower weight).
    events = set(ann["helm.sh/hook"].split(",")) | set(create["metadata"]["annotations"]["helm.sh/hook"].split(","))
    rbac = [o for o in objs if o["metadata"]["name"] == f"{PREFIX}-certgen-hook"]
    expect(len(rbac) == 5, f"{scenario}: certgen hook RBAC objects: {[o['kind'] for o in rbac]}")
    for o in rbac:
        a = o["metadata"]["annotations"]
        expect(set(a["helm.sh/hook"].split(",")) == events, f"{scenario}: {o['kind']} hook events {a['helm.sh/hook']}")
        expect(int(a["helm.sh/hook-weight"]) < int(create["metadata"]["annotations"]["helm.sh/hook-weight"]), f"{scenario}: {o['kind']} weight")
    return len(configs)


def lint() -> None:
    for name, overrides in [("default", {})] + [(n, v) for n, v in SCENARIOS.items() if v]:
        report = helm.lint(CHART, overrides or None, strict=True, namespace=NAMESPACE, kube_version="v1.30.0")
        problems = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
        if report.get("errors") or problems:
            raise Failure(f"helm lint ({name}): errors={report.get('errors')} messages={problems}")
    print(f"lint: clean for default and {len(SCENARIOS) - 1} variants (strict, kube v1.30.0)")


def render_all(chart: "helm.Chart", out: Path) -> None:
    for name, overrides in SCENARIOS.items():
        chart.validate_schema(overrides)
        rendered = chart.render(overrides, name=RELEASE, namespace=NAMESPACE, is_install=True)
        target = out / name
        target.mkdir(parents=True, exist_ok=True)
        count = 0
        for template, text in sorted(rendered.items()):
            if not text.strip() or template.endswith("NOTES.txt"):
                continue
            (target / Path(template).name).write_text(text)
            count += 1
        cel_cases = check_match_conditions(rendered, name)
        check_ca_bundle_never_rendered(rendered, name)
        check_metrics_services(rendered, name, overrides)
        if name == "overrides":
            check_overrides(rendered)
        notes = next((t for k, t in rendered.items() if k.endswith("NOTES.txt")), "")
        if "/overrideEnv" not in notes:
            raise Failure(f"render ({name}): NOTES.txt does not explain the /overrideEnv check")
        (target / "values.json").write_text(json.dumps(chart.merge_values(overrides), indent=1))
        cel = f", matchConditions right for {cel_cases} pods" if cel_cases else ""
        print(f"render: {name}: {count} template files{cel}")


def check_metrics_services(rendered: dict[str, str], scenario: str, overrides: dict) -> None:
    """The device plugin's metrics port has a (headless) Service; a ServiceMonitor is rendered for a
    component exactly when its serviceMonitor.enabled is true, and it selects one Service whose
    `metrics` port reaches a container port named `metrics` of that component's pods."""
    objs = manifests(rendered)
    services = [o for o in objs if o["kind"] == "Service"]
    monitors = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ServiceMonitor"}
    templates = pod_templates(objs)
    wanted = set()
    for section, component in (("devicePlugin", "device-plugin"), ("webhook", "webhook")):
        values = overrides.get(section, {})
        enabled = values.get("enabled", True)
        if section == "devicePlugin" and enabled:
            svc = next((s for s in services if s["metadata"]["name"] == f"{PREFIX}-device-plugin-metrics"), None)
            expect(svc is not None, f"{scenario}: no device plugin metrics Service")
            expect(svc["spec"].get("clusterIP") == "None", f"{scenario}: the plugin's metrics Service is not headless")
        if enabled and values.get("serviceMonitor", {}).get("enabled"):
            wanted.add(f"{PREFIX}-{component}")
    expect(set(monitors) == wanted, f"{scenario}: ServiceMonitors {sorted(monitors)}, expected {sorted(wanted)}")
    for name, sm in monitors.items():
        expect(sm["apiVersion"] == "monitoring.coreos.com/v1", f"{name}: apiVersion")
        expect(sm["metadata"]["namespace"] == NAMESPACE and sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}, f"{name}: namespace")
        selector = sm["spec"]["selector"]["matchLabels"]
        chosen = [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
        expect(len(chosen) == 1, f"{scenario}: ServiceMonitor {name} selects {[s['metadata']['name'] for s in chosen]}")
        svc = chosen[0]
        # The device plugin's pod also runs HAMi's vGPU monitor (port `monitor`) unless disabled.
        monitor_on = name.endswith("device-plugin") and overrides.get("devicePlugin", {}).get("monitor", {}).get("enabled", True)
        expected_ports = ["metrics", "monitor"] if monitor_on else ["metrics"]
        endpoints = sm["spec"]["endpoints"]
        expect([e["port"] for e in endpoints] == expected_ports, f"{name}: endpoints {endpoints}, expected ports {expected_ports}")
        pods = [t for _, t in templates if svc["spec"]["selector"].items() <= t["metadata"]["labels"].items()]
        expect(len(pods) == 1, f"{name}: the Service selects {len(pods)} pod templates")
        for endpoint in endpoints:
            expect(endpoint["path"] == "/metrics" and endpoint["scheme"] == "http", f"{name}: {endpoint}")
            port = next((p for p in svc["spec"]["ports"] if p["name"] == endpoint["port"]), None)
            expect(port is not None and port["targetPort"] == endpoint["port"], f"{name}: Service {svc['metadata']['name']} has no {endpoint['port']} port")
            ports = [p for c in pods[0]["spec"]["containers"] for p in c.get("ports", []) if p["name"] == endpoint["port"]]
            expect(len(ports) == 1 and ports[0]["containerPort"] == port["port"], f"{name}: container {endpoint['port']} port {ports} vs Service {port}")


def check_overrides(rendered: dict[str, str]) -> None:
    """Scenario `overrides`: every workload carries its own pod labels and annotations, security
    context overlays (the chart's hardening kept), extra arguments and environment, the mirror
    registry and digests, and the pull secret."""
    objs = manifests(rendered)
    mirror = "registry.example.com:5000/mirror"
    images = {
        "webhook": f"{mirror}/hami-limits/hami-webhook:{APP_VERSION}",
        "device-plugin": f"{mirror}/hami-limits/hami-device-plugin@{DIGEST}",
        "install-hook": f"{mirror}/hami-limits/hami-device-plugin@{DIGEST}",
        "copy-hami-core": f"{mirror}/projecthami/hami:v2.10.0",
        "vgpu-monitor": f"{mirror}/projecthami/hami:v2.10.0",
        "pause": f"{mirror}/pause@{DIGEST}",
        "create": f"{mirror}/hami-limits/hami-certgen@{DIGEST}",
        "patch": f"{mirror}/hami-limits/hami-certgen@{DIGEST}",
    }
    sections = {
        "webhook": OVERRIDES["webhook"],
        "device-plugin": OVERRIDES["devicePlugin"],
        "hook-installer": OVERRIDES["hookInstaller"],
        "certgen": OVERRIDES["certs"]["certgen"],
    }
    # Which container of each workload takes extraArgs / extraEnv.
    extra_targets = {"webhook": {"webhook"}, "device-plugin": {"device-plugin"}, "hook-installer": {"install-hook"}, "certgen": {"create", "patch"}}
    seen = set()
    templates = pod_templates(objs)
    expect(len(templates) == 6, f"overrides: {len(templates)} workloads: {[o for o, _ in templates]}")
    for owner, template in templates:
        labels = template["metadata"]["labels"]
        component = labels["app.kubernetes.io/component"]
        expect(component in sections, f"{owner}: component {component!r}: podLabels overrode a selector label")
        seen.add(component)
        v = sections[component]
        expect(labels["team.example.com/owner"] == component, f"{owner}: podLabels {labels}")
        ann = template["metadata"].get("annotations", {})
        expect(ann.get("policy.example.com/owner") == component, f"{owner}: podAnnotations {ann}")
        if component in ("webhook", "device-plugin"):
            expect(re.fullmatch(r"[0-9a-f]{64}", ann["checksum/config"]) is not None, f"{owner}: the chart's checksum lost to podAnnotations")
        spec = template["spec"]
        expect(spec.get("imagePullSecrets") == [{"name": "mirror-pull"}], f"{owner}: imagePullSecrets {spec.get('imagePullSecrets')}")
        psc = spec["securityContext"]
        expect(psc.get("seLinuxOptions") == SE_LINUX and psc.get("supplementalGroups") == [4242], f"{owner}: podSecurityContext {psc}")
        expect(psc.get("seccompProfile") == {"type": "RuntimeDefault"}, f"{owner}: the chart's seccompProfile lost: {psc}")
        if component in ("webhook", "certgen"):
            expect(psc.get("runAsNonRoot") is True and psc.get("runAsUser") == 65532, f"{owner}: non-root lost: {psc}")
        for c in containers(template):
            cname = c["name"]
            expect(c["image"] == images[cname], f"{owner}/{cname}: image {c['image']}, expected {images[cname]}")
            sc = c["securityContext"]
            expect(sc.get("seLinuxOptions") == SE_LINUX and sc.get("appArmorProfile") == {"type": "RuntimeDefault"}, f"{owner}/{cname}: securityContext {sc}")
            expect(sc.get("readOnlyRootFilesystem") is True and sc.get("allowPrivilegeEscalation") is False, f"{owner}/{cname}: hardening lost: {sc}")
            expect(sc["capabilities"]["drop"] == ["ALL"], f"{owner}/{cname}: capabilities {sc['capabilities']}")
            if cname == "device-plugin":
                expect(sc["capabilities"].get("add") == ["DAC_OVERRIDE", "FOWNER"] and sc.get("runAsUser") == 0, f"{owner}/{cname}: {sc}")
            if cname == "vgpu-monitor":
                expect("add" not in sc["capabilities"] and sc.get("runAsUser") == 0 and sc.get("privileged") is False, f"{owner}/{cname}: {sc}")
            args, env = c.get("args", []), c.get("env", [])
            if cname in extra_targets[component]:
                n = len(v["extraArgs"])
                expect(args[-n:] == v["extraArgs"], f"{owner}/{cname}: args {args} do not end with {v['extraArgs']}")
                expect(env[-len(v["extraEnv"]):] == v["extraEnv"], f"{owner}/{cname}: env {env} does not end with {v['extraEnv']}")
            else:
                for extra in sections.values():
                    expect(not set(extra["extraArgs"]) & set(args), f"{owner}/{cname}: another container's extraArgs in {args}")
                    expect(all(e not in env for e in extra["extraEnv"]), f"{owner}/{cname}: another container's extraEnv")
    expect(seen == set(sections), f"overrides: workloads {seen}")
    monitors = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ServiceMonitor"}
    dp = monitors[f"{PREFIX}-device-plugin"]
    expect(dp["metadata"]["labels"]["release"] == "kube-prometheus-stack", f"device plugin ServiceMonitor labels {dp['metadata']['labels']}")
    expect(dp["metadata"]["labels"]["app.kubernetes.io/component"] == "device-plugin", "ServiceMonitor lost the chart's labels")
    for ep in dp["spec"]["endpoints"]:  # the plugin's and the vGPU monitor's, alike
        expect(ep["interval"] == "1m" and ep["scrapeTimeout"] == "10s" and ep["honorLabels"] is False, f"device plugin endpoint {ep}")
        expect(ep["relabelings"] == OVERRIDES["devicePlugin"]["serviceMonitor"]["relabelings"], f"relabelings {ep.get('relabelings')}")
    [ep] = monitors[f"{PREFIX}-webhook"]["spec"]["endpoints"]
    expect("scrapeTimeout" not in ep and ep["interval"] == "30s", f"webhook endpoint {ep}: empty scrapeTimeout must leave Prometheus' default")
    expect(ep["metricRelabelings"] == [{"regex": "go_.*", "action": "labeldrop"}] and "relabelings" not in ep, f"webhook endpoint {ep}")
    print(f"overrides: {len(templates)} workloads carry their labels, annotations, security overlays, extra args/env, mirror images; 2 ServiceMonitors")


def check_overlay_semantics(chart: "helm.Chart") -> None:
    """false, 0 and a replaced list in an override win over the chart's value (sprig's merge would
    drop them); keys not given keep the chart's value."""
    rendered = chart.render(
        {
            "webhook": {"securityContext": {"readOnlyRootFilesystem": False, "runAsUser": 0, "capabilities": {"drop": ["NET_RAW"]}}},
            "devicePlugin": {"podSecurityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "gpu.json"}}},
        },
        name=RELEASE,
        namespace=NAMESPACE,
        is_install=True,
    )
    objs = manifests(rendered)
    [(_, web)] = [t for t in pod_templates(objs) if t[0] == f"Deployment/{PREFIX}-webhook"]
    sc = web["spec"]["containers"][0]["securityContext"]
    expect(sc == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["NET_RAW"]}, "readOnlyRootFilesystem": False, "runAsNonRoot": True, "runAsUser": 0}, f"overlay: {sc}")
    [(_, dp)] = [t for t in pod_templates(objs) if t[0] == f"DaemonSet/{PREFIX}-device-plugin"]
    expect(dp["spec"]["securityContext"] == {"seccompProfile": {"type": "Localhost", "localhostProfile": "gpu.json"}}, f"overlay: {dp['spec']['securityContext']}")
    print("overlay: false, 0 and lists override the chart's security context; other keys kept")


def check_image_references(chart: "helm.Chart") -> None:
    """global.imageRegistry replaces a registry host or prefixes a Docker Hub name; a digest replaces the tag."""
    cases = [
        ({}, "ghcr.io/hami-limits/hami-webhook:0.1.0", "projecthami/hami:v2.10.0"),
        ({"global": {"imageRegistry": "mirror.local"}}, "mirror.local/hami-limits/hami-webhook:0.1.0", "mirror.local/projecthami/hami:v2.10.0"),
        ({"global": {"imageRegistry": "localhost:5000/"}}, "localhost:5000/hami-limits/hami-webhook:0.1.0", "localhost:5000/projecthami/hami:v2.10.0"),
        (
            {"webhook": {"image": {"tag": "9.9.9", "digest": DIGEST}}, "devicePlugin": {"hamiCore": {"image": {"repository": "localhost/hami", "digest": DIGEST}}}},
            f"ghcr.io/hami-limits/hami-webhook@{DIGEST}",
            f"localhost/hami@{DIGEST}",
        ),
        (
            {"global": {"imageRegistry": "r.example.com"}, "devicePlugin": {"hamiCore": {"image": {"repository": "localhost/hami"}}}},
            "r.example.com/hami-limits/hami-webhook:0.1.0",
            "r.example.com/hami:v2.10.0",
        ),
    ]
    for values, webhook, hami in cases:
        chart.validate_schema(values)
        objs = manifests(chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True))
        found = {c["name"]: c["image"] for _, t in pod_templates(objs) for c in containers(t)}
        expect(found["webhook"] == webhook and found["copy-hami-core"] == hami, f"images for {values}: {found}")
    print(f"images: {len(cases)} registry/digest cases")


def check_cron_schedules(chart: "helm.Chart") -> None:
    for schedule in CRON_ACCEPTED:
        values = {"certs": {"certgen": {"renewal": {"schedule": schedule}}}}
        try:
            chart.validate_schema(values)
        except helm.HelmError as e:
            raise Failure(f"schema refuses the cron schedule {schedule!r}: {e}") from e
        objs = manifests(chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True))
        [cron] = [o for o in objs if o["kind"] == "CronJob"]
        expect(cron["spec"]["schedule"] == schedule, f"CronJob schedule {cron['spec']['schedule']!r}, expected {schedule!r}")
    for schedule in CRON_REJECTED:
        try:
            chart.validate_schema({"certs": {"certgen": {"renewal": {"schedule": schedule}}}})
        except helm.HelmError as e:
            expect("schedule" in str(e), f"cron {schedule!r}: error does not name the schedule: {e}")
        else:
            raise Failure(f"schema accepted the cron schedule {schedule!r}")
    print(f"cron: {len(CRON_ACCEPTED)} schedules accepted (and rendered as given), {len(CRON_REJECTED)} refused")


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each instruction, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    current = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        keyword, _, args = current.partition(" ")
        out.append((keyword.upper(), args.strip()))
        current = ""
    return out


def check_dockerfile() -> None:
    """What can be checked of the Dockerfile without a container engine: every base image pinned by
    digest, dependencies built in their own layers from manifests and stand-ins that cover every
    target cargo requires, SOURCE_DATE_EPOCH applied, and every RUN is valid sh."""
    import shutil
    import subprocess
    import tomllib

    root = CHART.parent.parent
    instructions = dockerfile_instructions((root / "Dockerfile").read_text())
    global_args: dict[str, str] = {}
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for keyword, args in instructions:
        if keyword == "ARG" and current is None:
            name, _, default = args.partition("=")
            global_args[name] = default
        elif keyword == "FROM":
            image, _, stage = args.partition(" AS ")
            image = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], image.strip())
            if image not in stages:
                expect(
                    re.fullmatch(r"[a-z0-9./:_-]+(:[\w.-]+)?@sha256:[0-9a-f]{64}", image) is not None,
                    f"Dockerfile: FROM {image} is not pinned by digest",
                )
            current = stages.setdefault(stage.strip(), [])
        elif current is not None:
            current.append((keyword, args))
    expect({"skeleton", "build", "preload", "webhook", "device-plugin", "certgen"} <= set(stages), f"Dockerfile stages {sorted(stages)}")

    # Dependencies in layers of their own: the skeleton copies manifests only, and `build` compiles
    # before it copies the sources.
    for keyword, args in stages["skeleton"]:
        if keyword == "COPY":
            for source in args.split()[:-1]:
                expect(
                    source.endswith(("Cargo.toml", "Cargo.lock", "build.rs")) or source == "device-plugin/proto",
                    f"Dockerfile: the skeleton stage copies {source} (sources would void the dependency cache)",
                )
    for stage, command in (("build", "cargo build"), ("preload", "cargo zigbuild")):
        steps = stages[stage]
        copy_all = steps.index(("COPY", ". ."))
        expect(any(k == "RUN" and command in a for k, a in steps[:copy_all]), f"Dockerfile: {stage} builds no dependencies before COPY . .")
        after = [a for k, a in steps[copy_all:] if k == "RUN"]
        expect(any(command in a and "touch" in a for a in after), f"Dockerfile: {stage} does not touch the sources before its real build")
        expect(("ARG", "SOURCE_DATE_EPOCH=0") in steps[copy_all:], f"Dockerfile: {stage} declares no SOURCE_DATE_EPOCH after its dependency layer")
        expect(any('--date="@${SOURCE_DATE_EPOCH}"' in a for a in after), f"Dockerfile: {stage} does not apply SOURCE_DATE_EPOCH")
        flags = [a for k, a in steps if k == "ENV" and "RUSTFLAGS" in a]
        expect(len(flags) == 1 and steps.index(("ENV", flags[0])) < copy_all, f"Dockerfile: {stage}: RUSTFLAGS must be set once, before the dependency build")

    # The stand-ins and copies cover every target of every member that cargo needs to load the
    # workspace.
    skeleton_text = "\n".join(a for _, a in stages["skeleton"])
    workspace = tomllib.loads((root / "Cargo.toml").read_text())["workspace"]
    needed = []
    for member in workspace["members"]:
        manifest = tomllib.loads((root / member / "Cargo.toml").read_text())
        expect(f"{member}/Cargo.toml" in skeleton_text, f"Dockerfile: the skeleton does not copy {member}/Cargo.toml")
        for default in ("src/lib.rs", "src/main.rs", "build.rs"):
            if (root / member / default).exists():
                needed.append(f"{member}/{default}")
        for section in ("bin", "bench", "example", "test"):
            for target in manifest.get(section, []):
                default = {"bench": f"benches/{target['name']}.rs", "example": f"examples/{target['name']}.rs", "test": f"tests/{target['name']}.rs"}
                path = target.get("path") or default.get(section)
                if path:
                    needed.append(os.path.normpath(f"{member}/{path}"))
    missing = [n for n in needed if n not in skeleton_text]
    expect(not missing, f"Dockerfile: the skeleton has no stand-in for {missing}")

    # Shell syntax of every RUN (shell form; BuildKit flags such as --mount removed).
    sh = shutil.which("sh")
    runs = [a for steps in stages.values() for k, a in steps if k == "RUN"]
    for run in runs:
        script = re.sub(r"^(--[\w-]+=\S+\s+)+", "", run)
        result = subprocess.run([sh, "-n"], input=script, text=True, capture_output=True)
        expect(result.returncode == 0, f"Dockerfile: RUN is not valid sh ({result.stderr.strip()}):\n{script}")
    print(f"dockerfile: {len(stages)} stages, bases pinned by digest, dependency layers cover {len(needed)} targets, {len(runs)} RUN scripts pass sh -n")


def check_schema_rejects(chart: "helm.Chart") -> None:
    for what, overrides, needle in BAD_VALUES:
        try:
            chart.validate_schema(overrides)
        except helm.HelmError as e:
            if needle not in str(e):
                raise Failure(f"schema ({what}): error does not name {needle!r}: {e}") from e
        else:
            raise Failure(f"schema accepted bad values ({what}): {json.dumps(overrides)}")
        # Rendering (what `helm install` does) must refuse them too.
        try:
            chart.render(overrides, name=RELEASE, namespace=NAMESPACE, is_install=True)
        except helm.HelmError:
            pass
        else:
            raise Failure(f"render accepted bad values ({what}): {json.dumps(overrides)}")
    print(f"schema: {len(BAD_VALUES)} bad value sets rejected by validation and by render")
    for what, overrides, needle in TEMPLATE_REJECTS:
        chart.validate_schema(overrides)
        try:
            chart.render(overrides, name=RELEASE, namespace=NAMESPACE, is_install=True)
        except helm.HelmError as e:
            if needle not in str(e):
                raise Failure(f"render ({what}): error does not say {needle!r}: {e}") from e
        else:
            raise Failure(f"render accepted {what}: {json.dumps(overrides)}")
    print(f"templates: {len(TEMPLATE_REJECTS)} inconsistent value sets refused with a message")


def check_defaults_match_values_yaml(chart: "helm.Chart") -> None:
    values = chart.values
    if values["devicePlugin"]["limitDelivery"] != "file":
        raise Failure("default devicePlugin.limitDelivery is not file")
    if values["hookInstaller"]["enabled"] is not False:
        raise Failure("the hook installer is on by default (it is for KAI clusters only)")
    chart.validate_schema(copy.deepcopy(values))


def pod(annotations=None, containers=None, init_containers=None) -> dict:
    spec: dict = {"containers": containers or [{"name": "main", "image": "busybox"}]}
    if init_containers is not None:
        spec["initContainers"] = init_containers
    meta: dict = {"name": "p", "namespace": "team-a"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def ctr(limits=None, requests=None) -> dict:
    c: dict = {"name": "c", "image": "cuda"}
    res = {}
    if limits is not None:
        res["limits"] = limits
    if requests is not None:
        res["requests"] = requests
    if res:
        c["resources"] = res
    return c


# (what, pod, sent to the webhook?) for the default resource names.
MATCH_CASES = [
    ("plain pod", pod(), False),
    ("cpu/memory only", pod(containers=[ctr(limits={"cpu": "1", "memory": "1Gi"}, requests={"cpu": "1"})]), False),
    ("empty resources", pod(containers=[{"name": "c", "image": "x", "resources": {}}]), False),
    ("unrelated annotations", pod(annotations={"team": "a", "gpu-fraction-num-devices": "2"}), False),
    ("nvidia.com/gpu limit", pod(containers=[ctr(limits={"nvidia.com/gpu": "1"})]), True),
    ("gpumem request only", pod(containers=[ctr(requests={"nvidia.com/gpumem": "3000"})]), True),
    ("priority limit in the second container", pod(containers=[ctr(), ctr(limits={"nvidia.com/priority": "0"})]), True),
    ("gpucores in an init container", pod(init_containers=[ctr(limits={"nvidia.com/gpucores": "50"})]), True),
    ("gpumem-percentage", pod(containers=[ctr(limits={"nvidia.com/gpumem-percentage": "50"})]), True),
    ("other vendor GPU", pod(containers=[ctr(limits={"amd.com/gpu": "1"})]), False),
    ("KAI gpu-memory", pod(annotations={"gpu-memory": "4000"}), True),
    ("KAI gpu-fraction", pod(annotations={"gpu-fraction": "0.5"}), True),
    ("limit-delivery annotation on a CPU pod", pod(annotations={"hami.io/limit-delivery": "FILE"}), True),
]

CUSTOM_MATCH_CASES = [
    ("custom count name", pod(containers=[ctr(limits={"example.com/vgpu": "1"})]), True),
    ("default name no longer configured", pod(containers=[ctr(limits={"nvidia.com/gpu": "1"})]), False),
    ("KAI annotations still sent", pod(annotations={"gpu-fraction": "0.25"}), True),
]


LIMITS_FILE = "CUDA_DEVICE_MEMORY_LIMIT=4096m\nHAMI_LIMITS_FORMAT=1\n"
MUTATED = {"gpu-fraction": "0.5", "limits.hami.io/c": LIMITS_FILE}

# (what, old pod, new pod, sent to the UPDATE webhook)
UPDATE_MATCH_CASES = [
    ("plain pod relabelled", pod(), pod(annotations={"team": "a"}), False),
    ("plain pod without annotations", pod(), pod(), False),
    ("HAMi GPU pod relabelled (nothing owned)", pod(containers=[ctr(limits={"nvidia.com/gpu": "1"})]),
     pod(annotations={"x": "y"}, containers=[ctr(limits={"nvidia.com/gpu": "1"})]), False),
    ("mutated KAI pod, unchanged", pod(annotations=MUTATED), pod(annotations=MUTATED), True),
    ("mutated KAI pod, limits file raised", pod(annotations=MUTATED),
     pod(annotations={**MUTATED, "limits.hami.io/c": "CUDA_DEVICE_MEMORY_LIMIT=999999m\n"}), True),
    ("limits file removed with every annotation", pod(annotations=MUTATED), pod(), True),
    ("limits file added to a plain pod", pod(annotations={"team": "a"}),
     pod(annotations={"team": "a", "limits.hami.io/c": LIMITS_FILE}), True),
    ("KAI request removed", pod(annotations={"gpu-memory": "4000"}), pod(annotations={}), True),
    ("limit-delivery added", pod(), pod(annotations={"hami.io/limit-delivery": "FILE"}), True),
    ("look-alike key", pod(), pod(annotations={"x.limits.hami.io/c": "1", "limits.hami.io.x/c": "1"}), False),
]


def check_match_conditions(rendered: dict[str, str], scenario: str) -> int:
    """Evaluates the rendered CEL matchConditions (cel-python) against pods: which are sent, to the
    CREATE webhook (the first) and the UPDATE one (the second)."""
    text = next((t for k, t in rendered.items() if k.endswith("mutatingwebhook.yaml")), "")
    if not text.strip():
        return 0
    config = helm.values_from_yaml(text)
    hooks = config["webhooks"]
    if len(hooks) != 2:
        raise Failure(f"matchConditions ({scenario}): {len(hooks)} webhooks, expected CREATE and UPDATE")
    conditions = hooks[0].get("matchConditions")
    update_conditions = hooks[1].get("matchConditions")
    if not conditions or not update_conditions:
        if conditions or update_conditions:
            raise Failure(f"matchConditions ({scenario}): on one webhook only")
        return 0
    env = celpy.Environment()

    def compiled(conds: list) -> list:
        return [(c["name"], env.program(env.compile(c["expression"]))) for c in conds]

    programs = compiled(conditions)
    cases = CUSTOM_MATCH_CASES if scenario == "custom-names" else MATCH_CASES
    for what, candidate, expected in cases:
        # The webhook is called only when every condition is true.
        sent = all(bool(p.evaluate({"object": celpy.json_to_cel(candidate)})) for _, p in programs)
        if sent != expected:
            raise Failure(f"matchConditions ({scenario}): {what}: sent={sent}, expected {expected}")
    update_programs = compiled(update_conditions)
    for what, old, new, expected in UPDATE_MATCH_CASES:
        activation = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old)}
        sent = all(bool(p.evaluate(activation)) for _, p in update_programs)
        if sent != expected:
            raise Failure(f"UPDATE matchConditions ({scenario}): {what}: sent={sent}, expected {expected}")
    return len(cases) + len(UPDATE_MATCH_CASES)


# Maps whose keys are data (labels, quantities), not chart values.
LEAF_MAPS = {"nodeSelector", "requests", "limits", "issuerRef", "affinity", "commonLabels"}


def value_keys(prefix: str, node: object) -> list[str]:
    if isinstance(node, dict) and node and prefix.rsplit(".", 1)[-1] not in LEAF_MAPS:
        keys: list[str] = []
        for k, v in node.items():
            keys += value_keys(f"{prefix}.{k}" if prefix else k, v)
        return keys
    return [prefix]


def check_docs_list_every_value(chart: "helm.Chart") -> None:
    doc = (CHART.parent.parent / "docs" / "configuration.md").read_text()
    begin, end = "<!-- values:begin -->", "<!-- values:end -->"
    if begin not in doc or end not in doc:
        raise Failure("docs/configuration.md has no chart values section")
    section = doc[doc.index(begin) : doc.index(end)]
    keys = value_keys("", chart.values)
    missing = [k for k in keys if f"| `{k}` |" not in section]
    if missing:
        raise Failure(f"docs/configuration.md's chart values table misses: {', '.join(missing)}")
    print(f"docs: all {len(keys)} values listed with their defaults")


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    print(f"helm sdk {helm.helm_sdk_version()} (helm-python-sdk {helm.__version__})")
    try:
        lint()
        with helm.Chart.load(CHART) as chart:
            check_defaults_match_values_yaml(chart)
            render_all(chart, out)
            check_schema_rejects(chart)
            check_cron_schedules(chart)
            check_overlay_semantics(chart)
            check_image_references(chart)
            check_dockerfile()
            check_docs_list_every_value(chart)
    except (Failure, helm.HelmError) as e:
        print(f"chart test FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
