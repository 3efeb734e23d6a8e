#!/usr/bin/env python3
"""Lint and render the hami-limits chart with real Helm (PyPI helm-python-sdk, Helm v4 inside).

Usage: render.py OUT_DIR

Writes OUT_DIR/<scenario>/<template file name> for every scenario below (the Rust test
certs/tests/chart.rs parses every manifest into k8s-openapi types and asserts the key fields), and
checks here what only Helm can tell: lint is clean, each scenario passes the values schema, and the
schema rejects bad values. Exits non-zero, naming the failure, on any problem.
"""

from __future__ import annotations

import copy
import json
import os
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
            }
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
        notes = next((t for k, t in rendered.items() if k.endswith("NOTES.txt")), "")
        if "/overrideEnv" not in notes:
            raise Failure(f"render ({name}): NOTES.txt does not explain the /overrideEnv check")
        (target / "values.json").write_text(json.dumps(chart.merge_values(overrides), indent=1))
        cel = f", matchConditions right for {cel_cases} pods" if cel_cases else ""
        print(f"render: {name}: {count} template files{cel}")


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


def check_match_conditions(rendered: dict[str, str], scenario: str) -> int:
    """Evaluates the rendered CEL matchConditions (cel-python) against pods: which are sent."""
    text = next((t for k, t in rendered.items() if k.endswith("mutatingwebhook.yaml")), "")
    if not text.strip():
        return 0
    config = helm.values_from_yaml(text)
    conditions = config["webhooks"][0].get("matchConditions")
    if not conditions:
        return 0
    env = celpy.Environment()
    programs = [(c["name"], env.program(env.compile(c["expression"]))) for c in conditions]
    cases = CUSTOM_MATCH_CASES if scenario == "custom-names" else MATCH_CASES
    for what, candidate, expected in cases:
        # The webhook is called only when every condition is true.
        sent = all(bool(p.evaluate({"object": celpy.json_to_cel(candidate)})) for _, p in programs)
        if sent != expected:
            raise Failure(f"matchConditions ({scenario}): {what}: sent={sent}, expected {expected}")
    return len(cases)


# Maps whose keys are data (labels, quantities), not chart values.
LEAF_MAPS = {"nodeSelector", "requests", "limits", "issuerRef", "affinity", "commonLabels"}


def value_keys(prefix: str, node: object) -> list[str]:
    if isinstance(node, dict) and node and prefix.rsplit(".", 1)[-1] not in LEAF_MAPS:
        keys: list[str] = []
        for k, v in node.items():
            keys += value_keys(f"{prefix}.{k}" if prefix else k, v)
        return keys
    return [prefix]


def check_readme_lists_every_value(chart: "helm.Chart") -> None:
    readme = (CHART.parent.parent / "README.md").read_text()
    begin, end = "<!-- section:install:begin -->", "<!-- section:install:end -->"
    if begin not in readme or end not in readme:
        raise Failure("README.md has no install section")
    section = readme[readme.index(begin) : readme.index(end)]
    keys = value_keys("", chart.values)
    missing = [k for k in keys if f"| `{k}` |" not in section]
    if missing:
        raise Failure(f"README install section's value table misses: {', '.join(missing)}")
    print(f"readme: all {len(keys)} values listed with their defaults")


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
            check_readme_lists_every_value(chart)
    except (Failure, helm.HelmError) as e:
        print(f"chart test FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
