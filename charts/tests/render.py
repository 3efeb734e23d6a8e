#!/usr/bin/env python3
"""Lint and render the hami-limits chart with real Helm (PyPI helm-python-sdk, Helm v4 inside).

Usage: render.py OUT_DIR

Writes OUT_DIR/<scenario>/<template file name> for every scenario below (the Rust test
tests/tests/it/chart/ parses every manifest into k8s-openapi types and asserts the key fields), and
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

# What a Kubernetes 1.30+ API server's discovery tells Helm (`helm install` asks the cluster;
# `helm template` takes --api-versions): ValidatingAdmissionPolicy is served.
VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
# Scenarios rendered as against an API server without it (Kubernetes 1.29): (api versions, kube
# version). Every other scenario is rendered with VAP_API.
WITHOUT_VAP = {"no-vap-api": ([], "v1.29.9")}


def render(chart: "helm.Chart", overrides: dict, api_versions: list[str] | None = None, kube_version: str | None = None) -> dict[str, str]:
    """`helm install --dry-run` with the capabilities of a cluster: the extra API versions (kinds
    included, as Helm's discovery lists them) and the Kubernetes version. helm-python-sdk's
    render() has no such options; its native call takes them."""
    from helm_python import _native

    opts: dict = {"name": RELEASE, "namespace": NAMESPACE, "is_install": True}
    opts["api_versions"] = [VAP_API] if api_versions is None else api_versions
    if kube_version:
        opts["kube_version"] = kube_version
    return json.loads(_native.call_string("helm_render", chart._raw(), json.dumps(overrides), json.dumps(opts)))


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
    # HAMi's environment-only delivery, and HAMi-core's own log level (libCudaLogLevel unset).
    "env-delivery": {"devicePlugin": {"limitDelivery": "env", "libCudaLogLevel": None}},
    "allow-lists": {
        "devicePlugin": {"allowPrivilegedNamespaces": ["trusted"]},
        "webhook": {"tenancy": {"allowHamiCoreEnvNamespaces": ["hami-legacy", "research"]}},
    },
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
        "admissionPolicy": {
            "schedulerIdentities": [
                "system:serviceaccount:hami-system:hami-scheduler",
                "system:serviceaccount:hami-limits:hami-limits-device-plugin",
            ]
        },
        "webhook": {
            "kai": {
                "schedulerNames": ["kai-scheduler", "kai-scheduler-batch"],
                "hookPath": "/opt/vgpu",
                "preloadContainers": "all",
                "limitDelivery": "env",
                "missingBasis": "warn",
            },
            "tenancy": {
                "allowHamiCoreEnvNamespaces": ["legacy-ml"],
                "allowVisibleDevicesNamespaces": ["gpu-monitoring"],
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
            "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        },
        "regionExport": {"interval": 15, "alert": {"enabled": True, "labels": {"role": "alert-rules"}}},
    },
    # The hostPath layout of earlier releases: the hook installer only sleeps once it has installed.
    "kai-host-path": {
        "hookInstaller": {"enabled": True, "resources": {"requests": {"cpu": "2m", "memory": "4Mi"}, "limits": {"memory": "12Mi"}}},
        "webhook": {"kai": {"hookDelivery": "hostPath"}},
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
    # With NVLink and PCIe links (the plugin's topology scores, topology-aware as HAMi's chart says it).
    "inventory": {
        "scheduler": {"defaultSchedulerPolicy": {"gpuSchedulerPolicy": "topology-aware"}},
        "devicePlugin": {
            "inventory": [
                {"uuid": "GPU-11111111-aaaa-4000-8000-000000000001", "name": "NVIDIA H200", "memoryMib": 143771, "minor": 3,
                 "links": [{"peer": "GPU-22222222-bbbb-4000-8000-000000000002", "pcie": "singleSwitch", "nvlinks": 18}]},
                {"uuid": "GPU-22222222-bbbb-4000-8000-000000000002", "name": "NVIDIA H200", "memoryMib": 143771, "numaNode": 1,
                 "links": [{"peer": "GPU-11111111-aaaa-4000-8000-000000000001", "pcie": "singleSwitch", "nvlinks": 18}]},
            ]
        },
        "hookInstaller": {"enabled": True, "runtimeClassName": "nvidia"},
    },
    # Every other key the plugin's inventory reader takes: static MIG devices (index, device
    # nodes, health) and a GPU whose NVML reports no memory (preConfiguredDeviceMemory instead).
    "inventory-mig": {
        "devicePlugin": {
            "migStrategy": "mixed",
            "preConfiguredDeviceMemory": 131072,
            "inventory": [
                {"uuid": "GPU-33333333-cccc-4000-8000-000000000003", "name": "NVIDIA H200", "memoryMib": 143771, "index": 0,
                 "minor": 0, "numaNode": 0, "migEnabled": True, "healthy": True,
                 "migDevices": [{"uuid": "MIG-33333333-cccc-4000-8000-0000000000a1", "profile": "1g.18gb", "memoryMib": 16384,
                                 "healthy": True, "index": "0:0",
                                 "devicePaths": ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"]}]},
                {"uuid": "GPU-44444444-dddd-4000-8000-000000000004", "name": "NVIDIA GB10", "index": 1, "minor": 1, "healthy": False},
            ],
        },
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
    # Kubernetes without ValidatingAdmissionPolicy (before 1.30): the webhook's UPDATE entry instead.
    "no-vap-api": {},
    # The policies turned off on a cluster that serves them: the webhook's UPDATE entry too.
    "admission-policy-off": {"admissionPolicy": {"enabled": False}},
    # More scheduler identities (HAMi's own device plugin beside ours); no device plugin of ours.
    "scheduler-identities": {
        "admissionPolicy": {"schedulerIdentities": ["system:serviceaccount:hami:hami-scheduler", "system:serviceaccount:hami:hami-device-plugin"]},
        "devicePlugin": {"enabled": False},
    },
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
    ("allow-list entry not a namespace", {"devicePlugin": {"allowPrivilegedNamespaces": ["Team_A"]}}, "Team_A"),
    ("allow-list not a list", {"devicePlugin": {"allowPrivilegedNamespaces": "trusted"}}, "allowPrivilegedNamespaces"),
    ("deviceSplitCount zero", {"devicePlugin": {"deviceSplitCount": 0}}, "deviceSplitCount"),
    ("libCudaLogLevel above 4", {"devicePlugin": {"libCudaLogLevel": 5}}, "libCudaLogLevel"),
    ("health checks spelt wrong", {"devicePlugin": {"disableHealthChecks": "none"}}, "disableHealthChecks"),
    ("relative hookPath", {"devicePlugin": {"hookPath": "usr/local"}}, "hookPath"),
    ("relative KAI hookPath", {"webhook": {"kai": {"hookPath": "vgpu"}}}, "hookPath"),
    ("KAI hookDelivery in another spelling", {"webhook": {"kai": {"hookDelivery": "hostpath"}}}, "hookDelivery"),
    ("no preload slots", {"hookInstaller": {"preloadSlots": 0}}, "preloadSlots"),
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
    ("scheduler identity with a comma", {"admissionPolicy": {"schedulerIdentities": ["a,b"]}}, "schedulerIdentities"),
    ("writers under webhook.tenancy (moved to admissionPolicy.schedulerIdentities)", {"webhook": {"tenancy": {"schedulerAnnotationWriters": ["a"]}}}, "schedulerAnnotationWriters"),
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
    ("admissionPolicy.enabled as a string", {"admissionPolicy": {"enabled": "false"}}, "enabled"),
    ("scheduler identity with a quote", {"admissionPolicy": {"schedulerIdentities": ['system:serviceaccount:a:b", "x']}}, "schedulerIdentities"),
    ("scheduler identity with a space", {"admissionPolicy": {"schedulerIdentities": ["system:serviceaccount:a:b x"]}}, "schedulerIdentities"),
    ("scheduler identity empty", {"admissionPolicy": {"schedulerIdentities": [""]}}, "schedulerIdentities"),
    ("scheduler identities not a list", {"admissionPolicy": {"schedulerIdentities": "system:serviceaccount:kube-system:hami-scheduler"}}, "schedulerIdentities"),
    ("typo in an admissionPolicy key", {"admissionPolicy": {"schedulerIdentity": []}}, "schedulerIdentity"),
    ("inventory minor of /dev/nvidiactl", {"devicePlugin": {"inventory": [{"uuid": "GPU-a", "name": "x", "memoryMib": 1, "minor": 255}]}}, "minor"),
    ("inventory memory beyond 16 TiB", {"devicePlugin": {"inventory": [{"uuid": "GPU-a", "name": "x", "memoryMib": 16777217}]}}, "memoryMib"),
    ("inventory link kind unknown", {"devicePlugin": {"inventory": [{"uuid": "GPU-a", "name": "x", "links": [{"peer": "GPU-b", "pcie": "pcie"}]}]}}, "pcie"),
    ("inventory link beyond 18 NVLinks", {"devicePlugin": {"inventory": [{"uuid": "GPU-a", "name": "x", "links": [{"peer": "GPU-b", "nvlinks": 19}]}]}}, "nvlinks"),
    ("inventory link without peer", {"devicePlugin": {"inventory": [{"uuid": "GPU-a", "name": "x", "links": [{"nvlinks": 2}]}]}}, "peer"),
    ("inventory link key spelt wrong", {"devicePlugin": {"inventory": [{"uuid": "GPU-a", "name": "x", "links": [{"peer": "GPU-b", "nvlink": 2}]}]}}, "nvlink"),
    ("inventory uuid with a slash", {"devicePlugin": {"inventory": [{"uuid": "GPU-a/b", "name": "x"}]}}, "uuid"),
    ("inventory negative NUMA node", {"devicePlugin": {"inventory": [{"uuid": "GPU-a", "name": "x", "numaNode": -1}]}}, "numaNode"),
    ("inventory MIG device not MIG-", {"devicePlugin": {"inventory": [{"uuid": "GPU-a", "name": "x", "migEnabled": True, "migDevices": [{"uuid": "GPU-b", "profile": "1g.18gb", "memoryMib": 1}]}]}}, "uuid"),
    ("inventory MIG device path outside /dev", {"devicePlugin": {"inventory": [{"uuid": "GPU-a", "name": "x", "migEnabled": True, "migDevices": [{"uuid": "MIG-b", "profile": "1g.18gb", "memoryMib": 1, "devicePaths": ["/dev/../etc/passwd"]}]}]}}, "devicePaths"),
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
        rendered = render(chart, overrides, *WITHOUT_VAP.get(name, (None, None)))
        target = out / name
        target.mkdir(parents=True, exist_ok=True)
        count = 0
        for template, text in sorted(rendered.items()):
            if not text.strip() or template.endswith("NOTES.txt"):
                continue
            (target / Path(template).name).write_text(text)
            count += 1
        cel_cases = check_match_conditions(rendered, name)
        cel_cases += check_admission_policies(rendered, name, overrides)
        check_ca_bundle_never_rendered(rendered, name)
        check_metrics_services(rendered, name, overrides)
        if name == "overrides":
            check_overrides(rendered)
        notes = next((t for k, t in rendered.items() if k.endswith("NOTES.txt")), "")
        if "/overrideEnv" not in notes:
            raise Failure(f"render ({name}): NOTES.txt does not explain the /overrideEnv check")
        # Never silently without the policies: NOTES says what is lost.
        policies = [o for o in manifests(rendered) if o["kind"] == "ValidatingAdmissionPolicy"]
        if ("WARNING: no ValidatingAdmissionPolicy installed" in notes) == bool(policies):
            raise Failure(f"render ({name}): NOTES.txt and the rendered policies disagree ({len(policies)} policies)")
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
    for section, component in (("devicePlugin", "device-plugin"), ("webhook", "webhook"), ("hookInstaller", "hook-installer")):
        values = overrides.get(section, {})
        enabled = values.get("enabled", section != "hookInstaller")
        preload = overrides.get("webhook", {}).get("kai", {}).get("hookDelivery", "device-plugin") == "device-plugin"
        if section == "hookInstaller" and enabled:
            svc = next((s for s in services if s["metadata"]["name"] == f"{PREFIX}-hook-installer-metrics"), None)
            expect((svc is not None) == preload, f"{scenario}: hook installer metrics Service {'missing' if preload else 'without the preload-plugin'}")
            enabled = preload
            if svc is not None:
                expect(svc["spec"].get("clusterIP") == "None", f"{scenario}: the hook installer's metrics Service is not headless")
        if section == "devicePlugin" and enabled:
            svc = next((s for s in services if s["metadata"]["name"] == f"{PREFIX}-device-plugin-metrics"), None)
            expect(svc is not None, f"{scenario}: no device plugin metrics Service")
            expect(svc["spec"].get("clusterIP") == "None", f"{scenario}: the plugin's metrics Service is not headless")
        if enabled and values.get("serviceMonitor", {}).get("enabled"):
            wanted.add(f"{PREFIX}-{component}")
            # HAMi's vGPU monitor, a DaemonSet of its own, is scraped beside the plugin.
            if section == "devicePlugin" and values.get("monitor", {}).get("enabled", True):
                wanted.add(f"{PREFIX}-vgpu-monitor")
    expect(set(monitors) == wanted, f"{scenario}: ServiceMonitors {sorted(monitors)}, expected {sorted(wanted)}")
    for name, sm in monitors.items():
        expect(sm["apiVersion"] == "monitoring.coreos.com/v1", f"{name}: apiVersion")
        expect(sm["metadata"]["namespace"] == NAMESPACE and sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}, f"{name}: namespace")
        selector = sm["spec"]["selector"]["matchLabels"]
        chosen = [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
        expect(len(chosen) == 1, f"{scenario}: ServiceMonitor {name} selects {[s['metadata']['name'] for s in chosen]}")
        svc = chosen[0]
        expected_ports = ["monitor"] if name.endswith("vgpu-monitor") else ["metrics"]
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
        "preload-plugin": f"{mirror}/hami-limits/hami-device-plugin@{DIGEST}",
        "create": f"{mirror}/hami-limits/hami-certgen@{DIGEST}",
        "patch": f"{mirror}/hami-limits/hami-certgen@{DIGEST}",
    }
    sections = {
        "webhook": OVERRIDES["webhook"],
        "device-plugin": OVERRIDES["devicePlugin"],
        "hook-installer": OVERRIDES["hookInstaller"],
        "certgen": OVERRIDES["certs"]["certgen"],
        # HAMi's vGPU monitor, in a DaemonSet of its own, takes the device plugin's pod overrides.
        "vgpu-monitor": OVERRIDES["devicePlugin"],
    }
    owners = {"vgpu-monitor": "device-plugin"}
    # Which container of each workload takes extraArgs / extraEnv.
    extra_targets = {"webhook": {"webhook"}, "device-plugin": {"device-plugin"}, "hook-installer": {"install-hook"}, "certgen": {"create", "patch"}, "vgpu-monitor": set()}
    seen = set()
    templates = pod_templates(objs)
    expect(len(templates) == 7, f"overrides: {len(templates)} workloads: {[o for o, _ in templates]}")
    for owner, template in templates:
        labels = template["metadata"]["labels"]
        component = labels["app.kubernetes.io/component"]
        expect(component in sections, f"{owner}: component {component!r}: podLabels overrode a selector label")
        seen.add(component)
        v = sections[component]
        expect(labels["team.example.com/owner"] == owners.get(component, component), f"{owner}: podLabels {labels}")
        ann = template["metadata"].get("annotations", {})
        expect(ann.get("policy.example.com/owner") == owners.get(component, component), f"{owner}: podAnnotations {ann}")
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
            if cname == "preload-plugin":
                expect("add" not in sc["capabilities"] and sc.get("runAsUser") == 0 and not sc.get("privileged"), f"{owner}/{cname}: {sc}")
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
    for ep in dp["spec"]["endpoints"] + monitors[f"{PREFIX}-vgpu-monitor"]["spec"]["endpoints"]:  # the plugin's and the vGPU monitor's, alike
        expect(ep["interval"] == "1m" and ep["scrapeTimeout"] == "10s" and ep["honorLabels"] is False, f"device plugin endpoint {ep}")
        expect(ep["relabelings"] == OVERRIDES["devicePlugin"]["serviceMonitor"]["relabelings"], f"relabelings {ep.get('relabelings')}")
    [ep] = monitors[f"{PREFIX}-webhook"]["spec"]["endpoints"]
    expect("scrapeTimeout" not in ep and ep["interval"] == "30s", f"webhook endpoint {ep}: empty scrapeTimeout must leave Prometheus' default")
    expect(ep["metricRelabelings"] == [{"regex": "go_.*", "action": "labeldrop"}] and "relabelings" not in ep, f"webhook endpoint {ep}")
    print(f"overrides: {len(templates)} workloads carry their labels, annotations, security overlays, extra args/env, mirror images; 3 ServiceMonitors")


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
    # A pod naming its own GPUs, in any container: refused by the webhook.
    ("NVIDIA_VISIBLE_DEVICES in a CPU container",
     pod(containers=[{"name": "c", "image": "x", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]), True),
    ("NVIDIA_VISIBLE_DEVICES by valueFrom in an init container",
     pod(init_containers=[{"name": "i", "image": "x", "env": [
         {"name": "A", "value": "1"},
         {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "m", "key": "k"}}}]}]), True),
    ("NVIDIA_VISIBLE_DEVICES in the second container", pod(containers=[ctr(), {"name": "d", "image": "x", "env": [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]}]), True),
    ("other variables only", pod(containers=[{"name": "c", "image": "x", "env": [
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0"}, {"name": "nvidia_visible_devices", "value": "all"}]}],
        init_containers=[{"name": "i", "image": "x", "env": []}]), False),
    ("device-list mount", pod(containers=[{"name": "c", "image": "x", "volumeMounts": [
        {"name": "v", "mountPath": "/data"}, {"name": "n", "mountPath": "/var/run/nvidia-container-devices/all"}]}]), True),
    ("device-list mount spelt otherwise, init container", pod(init_containers=[{"name": "i", "image": "x",
        "volumeMounts": [{"name": "n", "mountPath": "var/run/./nvidia-container-devices//GPU-0/"}]}]), True),
    ("ordinary mounts", pod(containers=[{"name": "c", "image": "x", "volumeMounts": [
        {"name": "v", "mountPath": "/var/run"}, {"name": "w", "mountPath": "/data"}]}]), False),
    # The HAMi scheduler's annotations and label on a CPU pod: stripped by the webhook.
    *[(f"scheduler annotation {k} on a CPU pod", pod(annotations={"team": "a", k: "x"}), True)
      for k in ["hami.io/vgpu-node", "hami.io/vgpu-time", "hami.io/vgpu-devices-to-allocate",
                "hami.io/vgpu-devices-allocated", "hami.io/vgpu-mig-allocations", "hami.io/bind-phase",
                "hami.io/bind-time"]],
    ("look-alike scheduler annotations", pod(annotations={"hami.io/vgpu-nodes": "x", "x.hami.io/bind-phase": "a",
                                                          "hami.io/node-nvidia-register": "[]"}), False),
    ("scheduler label on a CPU pod", {**pod(), "metadata": {"name": "p", "labels": {"hami.io/vgpu-node": "n1"}}}, True),
    ("other labels", {**pod(), "metadata": {"name": "p", "labels": {"hami.io/webhook": "x", "app": "a"}}}, False),
]

CUSTOM_MATCH_CASES = [
    ("custom count name", pod(containers=[ctr(limits={"example.com/vgpu": "1"})]), True),
    ("default name no longer configured", pod(containers=[ctr(limits={"nvidia.com/gpu": "1"})]), False),
    ("KAI annotations still sent", pod(annotations={"gpu-fraction": "0.25"}), True),
    ("NVIDIA_VISIBLE_DEVICES still sent",
     pod(containers=[{"name": "c", "image": "x", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]}]), True),
    ("scheduler annotation still sent", pod(annotations={"hami.io/bind-phase": "allocating"}), True),
]


LIMITS_FILE = "CUDA_DEVICE_MEMORY_LIMIT=4096m\nHAMI_LIMITS_FORMAT=1\n"
MUTATED = {"gpu-fraction": "0.5", "limits.hami.io/c": LIMITS_FILE}

# (what, old pod, new pod, sent to the UPDATE webhook)
UPDATE_MATCH_CASES = [
    ("plain pod relabelled", pod(), pod(annotations={"team": "a"}), False),
    ("plain pod without annotations", pod(), pod(), False),
    ("HAMi GPU pod relabelled (nothing owned)", pod(containers=[ctr(limits={"nvidia.com/gpu": "1"})]),
     pod(annotations={"x": "y"}, containers=[ctr(limits={"nvidia.com/gpu": "1"})]), False),
    # KAI's podgrouper and binder update fraction pods (a group label, pod-group-name): nothing
    # owned changes, so they never wait for the webhook.
    ("mutated KAI pod, unchanged", pod(annotations=MUTATED), pod(annotations=MUTATED), False),
    ("KAI's binder labels and annotates a mutated KAI pod", pod(annotations=MUTATED),
     {**pod(annotations={**MUTATED, "pod-group-name": "pg-x"}),
      "metadata": {"name": "p", "annotations": {**MUTATED, "pod-group-name": "pg-x"},
                   "labels": {"runai-gpu-group": "g"}}}, False),
    ("mutated KAI pod, limits file raised", pod(annotations=MUTATED),
     pod(annotations={**MUTATED, "limits.hami.io/c": "CUDA_DEVICE_MEMORY_LIMIT=999999m\n"}), True),
    ("limits file removed with every annotation", pod(annotations=MUTATED), pod(), True),
    ("limits file added to a plain pod", pod(annotations={"team": "a"}),
     pod(annotations={"team": "a", "limits.hami.io/c": LIMITS_FILE}), True),
    ("KAI request removed (the webhook decides nothing on it)", pod(annotations={"gpu-memory": "4000"}),
     pod(annotations={}), False),
    ("limit-delivery added", pod(), pod(annotations={"hami.io/limit-delivery": "FILE"}), True),
    ("look-alike key", pod(), pod(annotations={"x.limits.hami.io/c": "1", "limits.hami.io.x/c": "1"}), False),
    ("scheduler annotations added to a pending pod", pod(),
     pod(annotations={"hami.io/vgpu-devices-to-allocate": "GPU-a,NVIDIA,80000,100:;", "hami.io/bind-phase": "allocating"}),
     True),
    ("scheduler annotation removed", pod(annotations={"hami.io/bind-time": "1"}), pod(), True),
    ("scheduled pod relabelled", pod(annotations={"hami.io/vgpu-node": "n1"}),
     pod(annotations={"hami.io/vgpu-node": "n1", "team": "a"}), False),
    ("scheduler annotation changed", pod(annotations={"hami.io/vgpu-node": "n1"}),
     pod(annotations={"hami.io/vgpu-node": "n2"}), True),
    ("scheduler label changed", {**pod(), "metadata": {"name": "p", "labels": {"hami.io/vgpu-node": "n1"}}},
     {**pod(), "metadata": {"name": "p", "labels": {"hami.io/vgpu-node": "n2"}}}, True),
    ("scheduler label kept, other label added", {**pod(), "metadata": {"name": "p", "labels": {"hami.io/vgpu-node": "n1"}}},
     {**pod(), "metadata": {"name": "p", "labels": {"hami.io/vgpu-node": "n1", "app": "a"}}}, False),
    ("scheduler label added", pod(), {**pod(), "metadata": {"name": "p", "labels": {"hami.io/vgpu-node": "n1"}}}, True),
    ("scheduler label removed", {**pod(), "metadata": {"name": "p", "labels": {"hami.io/vgpu-node": "n1"}}}, pod(), True),
    ("other label added", pod(), {**pod(), "metadata": {"name": "p", "labels": {"app": "a"}}}, False),
]


def check_match_conditions(rendered: dict[str, str], scenario: str) -> int:
    """Evaluates the rendered CEL matchConditions (cel-python) against pods: which are sent, to the
    CREATE webhook (the first) and the UPDATE one (the second)."""
    text = next((t for k, t in rendered.items() if k.endswith("mutatingwebhook.yaml")), "")
    if not text.strip():
        return 0
    config = helm.values_from_yaml(text)
    hooks = config["webhooks"]
    policies = [o for o in manifests(rendered) if o["kind"] == "ValidatingAdmissionPolicy"]
    # The UPDATE entry exactly where no policy holds the UPDATE rules.
    expected = ["mutate.hami-limits.hami.io"] + ([] if policies else ["update.hami-limits.hami.io"])
    if [h["name"] for h in hooks] != expected:
        raise Failure(f"matchConditions ({scenario}): webhooks {[h['name'] for h in hooks]}, expected {expected}")
    for h in hooks:
        if "objectSelector" in h:
            raise Failure(f"{scenario}: {h['name']} has an objectSelector: a pod's own labels would choose whether it is reviewed")
    conditions = hooks[0].get("matchConditions")
    if len(hooks) == 1:
        update_conditions = conditions if conditions else None
    else:
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
    if len(hooks) == 1:
        return len(cases)
    update_programs = compiled(update_conditions)
    for what, old, new, expected in UPDATE_MATCH_CASES:
        activation = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old)}
        sent = all(bool(p.evaluate(activation)) for _, p in update_programs)
        if sent != expected:
            raise Failure(f"UPDATE matchConditions ({scenario}): {what}: sent={sent}, expected {expected}")
    return len(cases) + len(UPDATE_MATCH_CASES)


TENANT = "system:serviceaccount:team-a:bob"
SCHEDULER = "system:serviceaccount:kube-system:hami-scheduler"
PLUGIN = f"system:serviceaccount:{NAMESPACE}:{PREFIX}-device-plugin"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
DEVICES = "GPU-aaa,NVIDIA,3000,50:;"
SCHEDULED = {
    "hami.io/vgpu-node": "n1",
    "hami.io/vgpu-time": "1765000000",
    "hami.io/vgpu-devices-to-allocate": DEVICES,
    "hami.io/vgpu-devices-allocated": DEVICES,
    "hami.io/bind-phase": "allocating",
    "hami.io/bind-time": "1765000000",
}


def request(operation: str, user: str, resource: str = "pods", group: str = "", node: str | None = None, namespace: str | None = "team-a") -> dict:
    """An AdmissionRequest as the API server hands it to CEL (omitempty fields absent)."""
    user_info: dict = {"username": user, "groups": ["system:authenticated"]}
    if node is not None:
        user_info["extra"] = {NODE_CLAIM: [node], "authentication.kubernetes.io/pod-name": ["dp-x"]}
    r = {"operation": operation, "userInfo": user_info, "resource": {"group": group, "version": "v1", "resource": resource}}
    if namespace:
        r["namespace"] = namespace
    return r


def on_node(p: dict, node: str | None) -> dict:
    p = copy.deepcopy(p)
    if node:
        p["spec"]["nodeName"] = node
    return p


def node_object(name: str, annotations: dict | None = None, labels: dict | None = None) -> dict:
    meta: dict = {"name": name, "labels": labels or {"gpu": "on"}}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": {"podCIDR": "10.0.0.0/24"}}


def event(instance: str, regarding_kind: str, regarding_name: str) -> dict:
    return {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "e1", "namespace": "team-a"},
        "reportingController": "hami-device-plugin", "reportingInstance": instance,
        "regarding": {"kind": regarding_kind, "name": regarding_name}, "reason": "x", "type": "Warning", "action": "Allocate",
    }


def cel_join(items, sep):
    return celpy.celtypes.StringType(str(sep).join(str(i) for i in items))


def policy_decision(policy: dict, req: dict, new: dict, old: dict | None) -> list[str] | None:
    """What kube-apiserver decides for one request: None when the policy does not match
    (matchConstraints' operations and resources, then every matchCondition), else the messages of
    the failed validations ([] = allowed). Variables are evaluated in order, as CEL sees them."""
    spec = policy["spec"]
    resource = req["resource"]
    if not any(
        req["operation"] in r["operations"] and resource["resource"] in r["resources"] and resource["group"] in r["apiGroups"]
        for r in spec["matchConstraints"]["resourceRules"]
    ):
        return None
    excluded = [v for e in spec["matchConstraints"].get("namespaceSelector", {}).get("matchExpressions", []) if e["operator"] == "NotIn" for v in e["values"]]
    if req.get("namespace") in excluded:
        return None
    env = celpy.Environment()
    activation = {
        "request": celpy.json_to_cel(req),
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
    }

    def run(expression: str):
        return env.program(env.compile(expression), functions={"join": cel_join}).evaluate(activation)

    for c in spec.get("matchConditions", []):
        if not bool(run(c["expression"])):
            return None
    variables: dict = {}
    for v in spec.get("variables", []):
        activation["variables"] = celpy.celtypes.MapType(variables)
        value = run(v["expression"])
        if isinstance(value, celpy.CELEvalError):
            raise Failure(f"{policy['metadata']['name']}: variable {v['name']} fails: {value}")
        variables[celpy.celtypes.StringType(v["name"])] = value
    activation["variables"] = celpy.celtypes.MapType(variables)
    messages = []
    for v in spec["validations"]:
        ok = run(v["expression"])
        if isinstance(ok, celpy.CELEvalError):
            raise Failure(f"{policy['metadata']['name']}: {v['expression']} fails: {ok}")
        if not bool(ok):
            message = run(v["messageExpression"]) if "messageExpression" in v else v["message"]
            if isinstance(message, celpy.CELEvalError):
                raise Failure(f"{policy['metadata']['name']}: messageExpression fails: {message}")
            messages.append(str(message))
    return messages


def annotated(annotations: dict, node: str | None = None, labels: dict | None = None) -> dict:
    p = on_node(pod(annotations=annotations, containers=[ctr(limits={"nvidia.com/gpu": "1"})]), node)
    if labels:
        p["metadata"]["labels"] = labels
    return p


# (what, request, new object, old object, None (not matched) | [] (allowed) | texts the one denial
# must contain) for the pod annotation policy, with the default identities.
POD_POLICY_CASES = [
    ("tenant sets bind-phase on a pending pod", request("UPDATE", TENANT), annotated({"hami.io/bind-phase": "allocating"}), annotated({}),
     ["pod team-a/p: annotation hami.io/bind-phase may not be added, changed or removed by " + TENANT, "written only by system:serviceaccount:", "(admissionPolicy.schedulerIdentities)"]),
    ("tenant raises its own allocation", request("UPDATE", TENANT), annotated({**SCHEDULED, "hami.io/vgpu-devices-to-allocate": "GPU-aaa,NVIDIA,80000,100:;"}),
     annotated(SCHEDULED), ["annotation hami.io/vgpu-devices-to-allocate may not be added, changed or removed"]),
    ("tenant forges every scheduler annotation", request("UPDATE", TENANT), annotated(SCHEDULED), annotated({"team": "a"}),
     ["annotation hami.io/vgpu-node, hami.io/vgpu-devices-to-allocate, hami.io/vgpu-devices-allocated, hami.io/bind-phase, hami.io/bind-time, hami.io/vgpu-time may not"]),
    ("tenant removes vgpu-node", request("UPDATE", TENANT), annotated({k: v for k, v in SCHEDULED.items() if k != "hami.io/vgpu-node"}), annotated(SCHEDULED),
     ["annotation hami.io/vgpu-node may not be added, changed or removed"]),
    ("tenant labels a scheduled pod", request("UPDATE", TENANT), annotated(SCHEDULED, labels={"team": "a"}), annotated(SCHEDULED), None),
    ("tenant sets the scheduler's label", request("UPDATE", TENANT), annotated({}, labels={"hami.io/vgpu-node": "n1"}), annotated({}),
     ["pod team-a/p: label hami.io/vgpu-node may not be added, changed or removed by " + TENANT]),
    ("tenant moves the label and an annotation", request("UPDATE", TENANT), annotated({**SCHEDULED, "hami.io/vgpu-node": "n2"}, labels={"hami.io/vgpu-node": "n2"}),
     annotated(SCHEDULED, labels={"hami.io/vgpu-node": "n1"}), ["annotation hami.io/vgpu-node and label hami.io/vgpu-node may not"]),
    ("tenant writes the MIG allocation", request("UPDATE", TENANT), annotated({"hami.io/vgpu-mig-allocations": "x"}), annotated({}), ["annotation hami.io/vgpu-mig-allocations"]),
    ("HAMi's scheduler labels the pod it placed", request("UPDATE", SCHEDULER), annotated({}, labels={"hami.io/vgpu-node": "n1"}), annotated({}), []),
    ("tenant creates a pod with the scheduler's label", request("CREATE", TENANT), annotated({}, labels={"hami.io/vgpu-node": "n1"}), None, ["label hami.io/vgpu-node may not be set when a pod is created"]),
    ("tenant adds its own annotation beside the scheduler's", request("UPDATE", TENANT), annotated({**SCHEDULED, "owner": "a"}), annotated(SCHEDULED), []),
    ("HAMi's scheduler places the pod", request("UPDATE", SCHEDULER), annotated(SCHEDULED), annotated({}), []),
    ("our device plugin erases the entry and sets success", request("UPDATE", PLUGIN, node="n1"),
     annotated({**SCHEDULED, "hami.io/vgpu-devices-to-allocate": ";", "hami.io/bind-phase": "success"}), annotated(SCHEDULED), []),
    ("tenant creates a pod with forged scheduler annotations", request("CREATE", TENANT), annotated({"hami.io/bind-phase": "allocating", "hami.io/vgpu-node": "n1"}, node="n1"), None,
     ["pod team-a/p: annotation hami.io/vgpu-node, hami.io/bind-phase may not be set when a pod is created", "remove it from the pod"]),
    ("a controller creates a pod named by generateName", request("CREATE", "system:serviceaccount:kube-system:replicaset-controller"),
     {**annotated({"hami.io/bind-time": "1"}), "metadata": {"generateName": "train-", "annotations": {"hami.io/bind-time": "1"}}}, None,
     ["pod team-a/train-<generated>: annotation hami.io/bind-time may not be set when a pod is created"]),
    ("tenant creates a plain GPU pod", request("CREATE", TENANT), annotated({"gpu-memory": "3000"}), None, None),
    ("look-alike keys at creation", request("CREATE", TENANT), annotated({"x.hami.io/bind-phase": "allocating", "hami.io/bind-phase-x": "1"}), None, None),
    ("a pod in kube-system", request("CREATE", TENANT, namespace="kube-system"), annotated(SCHEDULED), None, None),
    ("limits file raised", request("UPDATE", TENANT), annotated({**MUTATED, "limits.hami.io/c": "CUDA_DEVICE_MEMORY_LIMIT=999999m\n"}), annotated(MUTATED),
     ["pod team-a/p: this update adds, changes or removes limits.hami.io/c", "create a new pod instead"]),
    ("limits file removed", request("UPDATE", TENANT), annotated({"gpu-fraction": "0.5"}), annotated(MUTATED), ["removes limits.hami.io/c"]),
    ("limits file added", request("UPDATE", TENANT), annotated({"limits.hami.io/c": LIMITS_FILE}), annotated({}), ["removes limits.hami.io/c"]),
    ("limits file changed by the scheduler's identity", request("UPDATE", SCHEDULER), annotated({**MUTATED, "limits.hami.io/c": "x"}), annotated(MUTATED),
     ["limits.hami.io/c"]),
    ("look-alike limits keys", request("UPDATE", TENANT), annotated({"x.limits.hami.io/c": "1", "limits.hami.io.x/c": "1"}), annotated({}), []),
    ("limit-delivery added after creation", request("UPDATE", TENANT), annotated({"hami.io/limit-delivery": "env"}), annotated({}),
     ['pod team-a/p: annotation hami.io/limit-delivery="env": the delivery mode is chosen when the pod is created (one of: env, file)']),
    ("limit-delivery changed", request("UPDATE", TENANT), annotated({"hami.io/limit-delivery": "env"}), annotated({"hami.io/limit-delivery": "file"}), ['"env"']),
    ("limit-delivery invalid", request("UPDATE", TENANT), annotated({"hami.io/limit-delivery": "FILE"}), annotated({"hami.io/limit-delivery": "file"}),
     ['"FILE"', "one of: env, file"]),
    ("limit-delivery removed", request("UPDATE", TENANT), annotated({}), annotated({"hami.io/limit-delivery": "file"}),
     ["pod team-a/p: annotation hami.io/limit-delivery: the delivery mode"]),
    ("limit-delivery kept while another annotation changes", request("UPDATE", TENANT), annotated({"hami.io/limit-delivery": "Env", "x": "1"}),
     annotated({"hami.io/limit-delivery": "Env"}), []),
]

# The same for the device plugin's node policy: (what, request, new, old, expected).
NODE_POLICY_CASES = [
    ("plugin sets bind-phase of a pod on its node", request("UPDATE", PLUGIN, node="n1"), annotated({**SCHEDULED, "hami.io/bind-phase": "success"}, "n1"),
     annotated(SCHEDULED, "n1"), []),
    ("plugin patches a pod on another node", request("UPDATE", PLUGIN, node="n1"), annotated({**SCHEDULED, "hami.io/bind-phase": "success"}, "n2"),
     annotated(SCHEDULED, "n2"), ["the device plugin of node n1 may patch only pods bound to its node: pod team-a/p is on node n2"]),
    ("plugin patches a pending pod", request("UPDATE", PLUGIN, node="n1"), annotated({"hami.io/bind-phase": "failed"}), annotated({}),
     ["pod team-a/p is on no node"]),
    ("plugin relabels a pod of its node", request("UPDATE", PLUGIN, node="n1"), annotated(SCHEDULED, "n1", labels={"x": "y"}), annotated(SCHEDULED, "n1"),
     ["may change only hami.io/* annotations of pod team-a/p"]),
    ("plugin writes a limits file annotation", request("UPDATE", PLUGIN, node="n1"), annotated({**SCHEDULED, "limits.hami.io/c": "x"}, "n1"),
     annotated(SCHEDULED, "n1"), ["may change only hami.io/* annotations"]),
    ("plugin removes a tenant annotation", request("UPDATE", PLUGIN, node="n1"), annotated(SCHEDULED, "n1"), annotated({**SCHEDULED, "owner": "a"}, "n1"),
     ["may change only hami.io/* annotations"]),
    ("plugin changes a pod's spec", request("UPDATE", PLUGIN, node="n1"),
     {**annotated(SCHEDULED, "n1"), "spec": {**annotated(SCHEDULED, "n1")["spec"], "activeDeadlineSeconds": 1}}, annotated(SCHEDULED, "n1"),
     ["may change only hami.io/* annotations"]),
    ("plugin without a node claim", request("UPDATE", PLUGIN), annotated(SCHEDULED, "n1"), annotated({}, "n1"),
     [f"{PLUGIN} presented no node-name claim ({NODE_CLAIM})", "pod team-a/p"]),
    ("plugin in kube-system too", request("UPDATE", PLUGIN, node="n1", namespace="kube-system"), annotated({"hami.io/bind-phase": "x"}, "n2"),
     annotated({}, "n2"), ["pod kube-system/p is on node n2"]),
    ("plugin registers its node", request("UPDATE", PLUGIN, resource="nodes", node="n1", namespace=None),
     node_object("n1", {"hami.io/node-nvidia-register": "[]", "other": "1"}), node_object("n1", {"other": "1"}), []),
    ("plugin releases its node lock", request("UPDATE", PLUGIN, resource="nodes", node="n1", namespace=None),
     node_object("n1", {}), node_object("n1", {"hami.io/mutex.lock": "2026-12-06T00:00:00Z,team-a,p"}), []),
    ("plugin patches another node", request("UPDATE", PLUGIN, resource="nodes", node="n1", namespace=None),
     node_object("n2", {"hami.io/node-nvidia-register": "[]"}), node_object("n2", {}), ["may patch only its own Node, not node n2"]),
    ("plugin labels its node", request("UPDATE", PLUGIN, resource="nodes", node="n1", namespace=None),
     node_object("n1", {}, labels={"gpu": "off"}), node_object("n1", {}), ["may change only hami.io/* annotations of node n1"]),
    ("plugin records an Event from its node", request("CREATE", PLUGIN, resource="events", group="events.k8s.io", node="n1"), event("n1", "Pod", "p"), None, []),
    ("plugin records an Event as another node", request("CREATE", PLUGIN, resource="events", group="events.k8s.io", node="n1"), event("n2", "Pod", "p"), None,
     ["may record only Events reported from its node (reportingInstance n1)"]),
    ("plugin records an Event about another Node", request("UPDATE", PLUGIN, resource="events", group="events.k8s.io", node="n1"), event("n1", "Node", "n2"),
     event("n1", "Node", "n2"), ["about its own Node"]),
    ("a tenant's update is not this policy's", request("UPDATE", TENANT), annotated({"x": "1"}, "n2"), annotated({}, "n2"), None),
]


def check_admission_policies(rendered: dict[str, str], scenario: str, overrides: dict) -> int:
    """The ValidatingAdmissionPolicies, evaluated with cel-python against sample requests: which
    are refused, with which message. Rendered exactly when the API server serves them and
    admissionPolicy.enabled; the node policy only with the device plugin."""
    objs = manifests(rendered)
    policies = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"}
    bindings = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"}
    on = scenario not in WITHOUT_VAP and overrides.get("admissionPolicy", {}).get("enabled", True)
    plugin = overrides.get("devicePlugin", {}).get("enabled", True)
    plugin_policies = [f"{PREFIX}-device-plugin-{kind}" for kind in ("pods", "node", "events")]
    wanted = {f"{PREFIX}-pod-annotations"} | (set(plugin_policies) if plugin else set()) if on else set()
    expect(set(policies) == wanted, f"{scenario}: policies {sorted(policies)}, expected {sorted(wanted)}")
    expect(set(bindings) == wanted, f"{scenario}: bindings {sorted(bindings)}, expected {sorted(wanted)}")
    for name, b in bindings.items():
        expect(b["spec"] == {"policyName": name, "validationActions": ["Deny"]}, f"{scenario}: binding {b['spec']}")
        expect(policies[name]["spec"]["failurePolicy"] == "Fail", f"{scenario}: {name} failurePolicy")
    webhook = next((d for d in objs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == f"{PREFIX}-webhook"), None)
    identities = overrides.get("admissionPolicy", {}).get("schedulerIdentities", [SCHEDULER])
    writers = identities + ([PLUGIN] if plugin else [])
    if webhook is not None:
        settings = helm.values_from_yaml(webhook["data"]["webhook.yaml"])
        expect(settings["tenancy"]["schedulerAnnotationWriters"] == writers, f"{scenario}: webhook writers {settings['tenancy']}")
    if not on:
        return 0
    pod_policy = policies[f"{PREFIX}-pod-annotations"]
    # Without the device plugin its ServiceAccount is nobody's, and HAMi's default scheduler
    # identity is nobody's where the operator named others: their cases do not apply.
    cases = [
        c for c in POD_POLICY_CASES
        if (plugin or c[1]["userInfo"]["username"] != PLUGIN) and (SCHEDULER in identities or c[1]["userInfo"]["username"] != SCHEDULER)
    ]
    if scenario == "scheduler-identities":
        other = identities[1]
        cases = [
            ("HAMi's own device plugin, named by the operator", request("UPDATE", other), annotated({"hami.io/bind-phase": "success"}), annotated({"hami.io/bind-phase": "allocating"}), []),
            ("the default scheduler identity, no longer named", request("UPDATE", SCHEDULER), annotated(SCHEDULED), annotated({}), [f"only by {identities[0]}, {other} ("]),
        ]
    count = 0
    for group, table in (([pod_policy], cases), ([policies[n] for n in plugin_policies] if plugin else [], NODE_POLICY_CASES if plugin else [])):
        for what, req, new, old, expected in table:
            # Every policy of the group decides; each request is matched by one of them.
            decisions = [d for d in (policy_decision(p, req, new, old) for p in group) if d is not None]
            expect(len(decisions) <= 1, f"{scenario}: {what}: matched by {len(decisions)} policies")
            got = decisions[0] if decisions else None
            if expected is None or expected == []:
                expect(got == expected, f"{scenario}: {what}: {got}, expected {expected}")
            else:
                expect(got is not None and len(got) == 1 and all(t in got[0] for t in expected),
                       f"{scenario}: {what}: {got}, expected one denial with {expected}")
            count += 1
    return count


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
