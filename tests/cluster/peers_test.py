#!/usr/bin/env python3
"""Pins each stand-in of peers.py against the facts the team reference records about the peers
(REFERENCE.md: "KAI v0.17 for real", "KAI-scheduler v0.17 `hamicore` plugin", "HAMi's device
plugin", "HAMi scheduler"). A stand-in that drifts from the reference fails here, before any
suite trusts it. Standard library only: `python3 tests/cluster/peers_test.py`.
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402


def pod(annotations, containers=("main",), init=(), scheduler="kai-scheduler", env=None):
    p = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train", "namespace": "t", "annotations": dict(annotations)},
        "spec": {"schedulerName": scheduler, "containers": [{"name": n, "image": "x"} for n in containers]},
    }
    if init:
        p["spec"]["initContainers"] = [{"name": n, "image": "x"} for n in init]
    if env is not None:
        p["spec"]["containers"][0]["env"] = env
    return p


def env(c, name):
    return [e for e in c.get("env") or [] if e["name"] == name]


class KaiAdmission(unittest.TestCase):
    """`gpusharing/gpu_sharing.go`, `hamicore/hamicore.go`, `runtime_enforcement.go`."""

    def test_gpusharing_adds_the_annotation_env_envfrom_volume(self):
        out = peers.kai_admission(pod({"gpu-fraction": "0.5"}), {"random": "abcdefg"})
        prefix = out["metadata"]["annotations"]["runai/shared-gpu-configmap"]
        self.assertEqual(prefix, "train-abcdefg-shared-gpu")
        c = out["spec"]["containers"][0]
        for key in ("NVIDIA_VISIBLE_DEVICES", "RUNAI_NUM_OF_GPUS", "GPU_PORTION"):
            (e,) = env(c, key)
            self.assertEqual(e["valueFrom"]["configMapKeyRef"], {"name": f"{prefix}-0", "key": key})
        self.assertEqual(c["envFrom"], [{"configMapRef": {"name": f"{prefix}-0-evar", "optional": False}}])
        # A ConfigMap volume that no container mounts.
        self.assertEqual(out["spec"]["volumes"], [{"name": f"{prefix}-0-vol", "configMap": {"name": f"{prefix}-0"}}])
        self.assertFalse(c.get("volumeMounts"))
        # runtimeenforcement (chart default `nvidia`), only when unset.
        self.assertEqual(out["spec"]["runtimeClassName"], "nvidia")
        mine = pod({"gpu-memory": "1000"})
        mine["spec"]["runtimeClassName"] = "mine"
        self.assertEqual(peers.kai_admission(mine)["spec"]["runtimeClassName"], "mine")

    def test_only_fraction_pods_and_the_fraction_container(self):
        self.assertEqual(peers.kai_admission(pod({})), pod({}))
        # Any value counts (RequestsGPUFraction looks at presence only).
        self.assertIn("runai/shared-gpu-configmap",
                      peers.kai_admission(pod({"gpu-memory": "junk"}))["metadata"]["annotations"])
        out = peers.kai_admission(pod({"gpu-memory": "1000"}, containers=("a", "b")), {"random": "r"})
        self.assertTrue(env(out["spec"]["containers"][0], "GPU_PORTION"))
        self.assertFalse(env(out["spec"]["containers"][1], "GPU_PORTION"))

    def test_fraction_container_name_init_containers_first(self):
        p = pod({"gpu-memory": "1000", "gpu-fraction-container-name": "x"}, containers=("x",), init=("x",))
        out = peers.kai_admission(p, {"random": "r"})
        prefix = out["metadata"]["annotations"]["runai/shared-gpu-configmap"]
        self.assertEqual(out["spec"]["initContainers"][0]["envFrom"][0]["configMapRef"]["name"],
                         f"{prefix}-i0-evar")
        self.assertFalse(out["spec"]["containers"][0].get("envFrom"))
        with self.assertRaises(ValueError):
            peers.kai_admission(pod({"gpu-memory": "1", "gpu-fraction-container-name": "nope"}))

    def test_hamicore_replaces_every_memory_limit_entry(self):
        p = pod({"gpu-memory": "1000"}, env=[
            {"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "1000m"},
            {"name": "OTHER", "value": "1"},
            {"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "9m"},
        ])
        off = peers.kai_admission(p, {"random": "r"})
        self.assertEqual(len(env(off["spec"]["containers"][0], "CUDA_DEVICE_MEMORY_LIMIT")), 2)
        on = peers.kai_admission(p, {"random": "r", "hamicore": True})
        c = on["spec"]["containers"][0]
        (e,) = env(c, "CUDA_DEVICE_MEMORY_LIMIT")
        prefix = on["metadata"]["annotations"]["runai/shared-gpu-configmap"]
        self.assertEqual(e["valueFrom"]["configMapKeyRef"],
                         {"name": f"{prefix}-0", "key": "CUDA_DEVICE_MEMORY_LIMIT", "optional": True})
        # Appended last, after the entries it kept.
        self.assertEqual(c["env"][-1], e)

    def test_reinvoked_it_keeps_its_prefix(self):
        once = peers.kai_admission(pod({"gpu-memory": "1000"}), {"random": "aaaaaaa"})
        twice = peers.kai_admission(once, {"random": "bbbbbbb"})
        self.assertEqual(once["metadata"]["annotations"], twice["metadata"]["annotations"])
        self.assertEqual(once["spec"]["volumes"], twice["spec"]["volumes"])


class KaiBinder(unittest.TestCase):
    """`binder/plugins/hamicore/hami_core.go`, `gpusharing/gpu_sharing.go`, `resource_reservation.go`."""

    def test_the_reference_example(self):
        # gpu-memory 4096 on a 15360 MiB GPU: 0.27, then 4147m, over what was asked.
        p = peers.kai_admission(pod({"gpu-memory": "4096"}), {"random": "r", "hamicore": True})
        portion = peers.kai_portion(p, 15360)
        self.assertEqual(portion, "0.27")
        self.assertEqual(peers.kai_memory_limit("15360", portion), "4147m")

    def test_fraction_portion_two_decimals_and_no_label_no_limit(self):
        p = pod({"gpu-fraction": "0.5"})
        self.assertEqual(peers.kai_portion(p, 0), "0.50")
        self.assertEqual(peers.kai_memory_limit("81920", "0.50"), "40960m")
        self.assertIsNone(peers.kai_memory_limit(None, "0.50"))
        self.assertIsNone(peers.kai_memory_limit("junk", "0.50"))
        self.assertIsNone(peers.kai_memory_limit("0", "0.50"))

    def test_configmaps(self):
        p = peers.kai_admission(pod({"gpu-fraction": "0.5"}), {"random": "r", "hamicore": True})
        prefix = p["metadata"]["annotations"]["runai/shared-gpu-configmap"]
        cms = peers.kai_binder_configmaps(p, "GPU-1", "0.50", "81920", True)
        self.assertEqual(cms, {
            f"{prefix}-0": {"NVIDIA_VISIBLE_DEVICES": "GPU-1", "RUNAI_NUM_OF_GPUS": "0.50",
                            "GPU_PORTION": "0.50", "CUDA_DEVICE_MEMORY_LIMIT": "40960m"},
            f"{prefix}-0-evar": {},
        })
        off = peers.kai_binder_configmaps(p, "GPU-1", "0.50", "81920", False)
        self.assertNotIn("CUDA_DEVICE_MEMORY_LIMIT", off[f"{prefix}-0"])

    def test_reservation_pod(self):
        r = peers.kai_reservation_pod("node-a", "g1", "img")
        self.assertEqual(r["metadata"]["namespace"], "kai-resource-reservation")
        self.assertRegex(r["metadata"]["name"], r"^gpu-reservation-[0-9a-f]{16}$")
        self.assertEqual(r["spec"]["nodeName"], "node-a")
        self.assertNotIn("schedulerName", r["spec"])
        self.assertEqual(r["spec"]["containers"][0]["resources"]["limits"], {"nvidia.com/gpu": "1"})


class HamiWebhook(unittest.TestCase):
    """HAMi v2.10 `pkg/scheduler/webhook.go`, `pkg/device/nvidia/device.go` `MutateAdmission`."""

    def gpu_pod(self, **spec):
        p = pod({}, scheduler="")
        p["spec"].pop("schedulerName")
        p["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1", "nvidia.com/priority": "1"}}
        p["spec"].update(spec)
        return p

    def test_appends_without_looking(self):
        p = self.gpu_pod()
        p["spec"]["containers"][0]["env"] = [{"name": "CUDA_TASK_PRIORITY", "value": "1"}]
        out = peers.hami_admission(p, {"gpuCorePolicy": "force"})
        c = out["spec"]["containers"][0]
        self.assertEqual(len(env(c, "CUDA_TASK_PRIORITY")), 2)
        self.assertEqual(env(c, "GPU_CORE_UTILIZATION_POLICY"), [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}])
        self.assertEqual(out["spec"]["schedulerName"], "hami-scheduler")
        self.assertFalse(env(peers.hami_admission(self.gpu_pod())["spec"]["containers"][0], "GPU_CORE_UTILIZATION_POLICY"))

    def test_other_schedulers_skipped_node_name_denied_overwrite_env(self):
        kai = self.gpu_pod(schedulerName="kai-scheduler")
        self.assertEqual(peers.hami_admission(kai), kai)
        with self.assertRaises(peers.Denied):
            peers.hami_admission(self.gpu_pod(nodeName="n"))
        p = self.gpu_pod()
        p["spec"]["containers"].append({"name": "plain", "image": "x"})
        out = peers.hami_admission(p, {"overwriteEnv": True})
        self.assertEqual(env(out["spec"]["containers"][1], "NVIDIA_VISIBLE_DEVICES"),
                         [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}])

    def test_configuration_names_sort_as_the_reference_says(self):
        # The chart's default release name sorts before both peers; KAI's after HAMi's.
        self.assertEqual(peers.KAI_WEBHOOK_CONFIGURATION, "mutating-kai-admission")
        self.assertEqual(peers.HAMI_WEBHOOK_CONFIGURATION, "hami-webhook")
        self.assertLess("hami-limits", peers.HAMI_WEBHOOK_CONFIGURATION)
        self.assertLess("hami-limits", peers.KAI_WEBHOOK_CONFIGURATION)


if __name__ == "__main__":
    unittest.main(verbosity=1)
