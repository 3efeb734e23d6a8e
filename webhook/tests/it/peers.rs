//! The webhook beside the peers' real admission code, offline: each pod goes through this webhook
//! and the stand-ins of KAI v0.17's admission (`tests/cluster/peers.py`, `hamicore` off and on)
//! or HAMi v2.10's webhook, in both orders, with the API server's reinvocation rules
//! (`reinvocationPolicy: IfNeeded` for this webhook and KAI's, `Never` for HAMi's). The real
//! cluster and node suites register the same stand-ins with a real API server; this file covers
//! every shape of pod in milliseconds.
//!
//! What must hold in every order: the KAI fraction container keeps its limits file with the exact
//! cap (KAI's `configMapKeyRef` limit is KAI's, not the tenant's), no other container gets a cap or
//! a file, KAI's own entries survive, a further review changes nothing, the stored pod has one
//! entry per variable, and KAI's reservation pods are never touched.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::process::{Command, Stdio};

use base64::Engine as _;
use hami_shared::values::CorePolicy;
use hami_tests::pod_json::{containers as all_containers, env_entries};
use hami_webhook::policy::basis::NoBasis;
use hami_webhook::{Outcome, Settings, review};
use serde_json::{Value, json};

const NS: &str = "tenant";
/// `kai.perGpuVramMib` here: `gpu-fraction: 0.5` is 8192 MiB.
const VRAM_MIB: u64 = 16_384;

fn peers() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/cluster/peers.py")
}

/// A peer's mutation of `pod` (`kai` or `hami`), through the stand-in; `Err` when it denies.
fn peer(which: &str, options: &Value, pod: &Value) -> Result<Value, String> {
    let mut child = Command::new("python3")
        .arg(peers())
        .args(["admit", which, &options.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs tests/cluster/peers.py");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(pod.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "peers.py admit {which} failed");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    match v.get("denied") {
        Some(reason) => Err(reason.to_string()),
        None => Ok(v),
    }
}

/// This webhook's review of `pod` (CREATE): the patched pod and the warnings.
fn ours(pod: &Value, settings: &Settings) -> Result<(Value, Vec<String>), String> {
    let body = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0f0e0d0c-0000-4000-8000-000000000032",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod["metadata"]["namespace"].as_str().unwrap_or(NS),
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": pod,
        }
    }))
    .unwrap();
    let reviewed = review(&body, settings, &NoBasis).unwrap();
    let out: Value = serde_json::from_slice(&reviewed.body).unwrap();
    let response = &out["response"];
    if reviewed.outcome == Outcome::Denied {
        return Err(response["status"]["message"].to_string());
    }
    let warnings = response["warnings"]
        .as_array()
        .map(|w| w.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default();
    let mut doc = pod.clone();
    if let Some(b64) = response["patch"].as_str() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        json_patch::patch(&mut doc, &patch).unwrap();
    }
    Ok((doc, warnings))
}

/// One mutating webhook as the API server sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hook {
    Ours,
    Kai { hamicore: bool },
    Hami,
}

impl Hook {
    fn reinvocable(self) -> bool {
        !matches!(self, Self::Hami)
    }
}

/// The API server's mutating chain (`mutating/dispatcher.go` of k8s.io/apiserver): the webhooks in
/// configuration-name order; a webhook that changes the object marks every earlier-invoked
/// `IfNeeded` webhook for one reinvocation pass, which runs the marked ones in the same order.
/// Returns the stored pod and how many times this webhook was called.
fn admit(pod: &Value, order: &[Hook], settings: &Settings) -> Result<(Value, usize), String> {
    let mut pod = pod.clone();
    let mut invoked: Vec<Hook> = Vec::new();
    let mut marked: BTreeSet<usize> = BTreeSet::new();
    let mut ours_calls = 0;
    for pass in 0..2 {
        for (i, &hook) in order.iter().enumerate() {
            if pass == 1 && !marked.remove(&i) {
                continue;
            }
            let after = match hook {
                Hook::Ours => {
                    ours_calls += 1;
                    ours(&pod, settings)?.0
                }
                Hook::Kai { hamicore } => peer(
                    "kai",
                    &json!({"hamicore": hamicore, "random": "x7k2p9q"}),
                    &pod,
                )?,
                Hook::Hami => peer(
                    "hami",
                    &json!({"gpuCorePolicy": settings.nvidia.gpu_core_policy.to_string(),
                            "overwriteEnv": settings.nvidia.overwrite_env}),
                    &pod,
                )?,
            };
            if after != pod {
                for (j, h) in order.iter().enumerate() {
                    if invoked.contains(h) && h.reinvocable() {
                        marked.insert(j);
                    }
                }
                pod = after;
            }
            if hook.reinvocable() && !invoked.contains(&hook) {
                invoked.push(hook);
            }
        }
        if marked.is_empty() {
            break;
        }
    }
    // The API server validates the result: a Pod it would store.
    let _: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod.clone()).unwrap();
    Ok((pod, ours_calls))
}

fn kai_settings() -> Settings {
    let mut s = Settings::default();
    s.kai.per_gpu_vram_mib = Some(VRAM_MIB);
    s
}

/// A KAI pod: `containers` are (name, kind) with kind `init` or `main`.
fn kai_pod(name: &str, annotations: Value, containers: &[(&str, &str)]) -> Value {
    let c = |n: &str| json!({"name": n, "image": "localhost/hami-limits/workload:test", "command": ["sleep", "1"]});
    let init: Vec<Value> = containers
        .iter()
        .filter(|(_, k)| *k == "init")
        .map(|(n, _)| c(n))
        .collect();
    let main: Vec<Value> = containers
        .iter()
        .filter(|(_, k)| *k == "main")
        .map(|(n, _)| c(n))
        .collect();
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations,
                     "labels": {"kai.scheduler/queue": "default-queue"}},
        "spec": {"schedulerName": "kai-scheduler", "containers": main},
    });
    if !init.is_empty() {
        p["spec"]["initContainers"] = Value::from(init);
    }
    p
}

fn named<'p>(pod: &'p Value, name: &str) -> &'p Value {
    all_containers(pod)
        .into_iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name} in {pod:#}"))
}

/// One shape of KAI fraction pod: (label, annotations, containers as (name, `init`|`main`), the
/// GPU container, its cap).
type Shape = (
    &'static str,
    Value,
    Vec<(&'static str, &'static str)>,
    &'static str,
    &'static str,
);

/// Every shape of KAI fraction pod.
fn kai_shapes() -> Vec<Shape> {
    vec![
        (
            "gpu-memory, one container",
            json!({"gpu-memory": "3000"}),
            vec![("main", "main")],
            "main",
            "3000m",
        ),
        (
            "gpu-fraction, one container",
            json!({"gpu-fraction": "0.5"}),
            vec![("main", "main")],
            "main",
            "8192m",
        ),
        (
            "gpu-fraction, init container and main",
            json!({"gpu-fraction": "0.5"}),
            vec![("setup", "init"), ("main", "main")],
            "main",
            "8192m",
        ),
        (
            "gpu-fraction, the init container has the GPU",
            json!({"gpu-fraction": "0.25", "gpu-fraction-container-name": "setup"}),
            vec![("setup", "init"), ("main", "main")],
            "setup",
            "4096m",
        ),
        (
            "gpu-memory, two containers, the second has the GPU",
            json!({"gpu-memory": "3000", "gpu-fraction-container-name": "trainer"}),
            vec![("sidecar", "main"), ("trainer", "main")],
            "trainer",
            "3000m",
        ),
        (
            "gpu-fraction with per-node keys, init and two containers",
            json!({"gpu-fraction": "0.5"}),
            vec![("setup", "init"), ("main", "main"), ("logger", "main")],
            "main",
            "8192m",
        ),
    ]
}

#[test]
fn kai_fraction_pods_in_both_orders_hamicore_off_and_on() {
    let settings = kai_settings();
    let mut checked = 0;
    for (label, annotations, containers, gpu, cap) in kai_shapes() {
        for hamicore in [false, true] {
            let kai = Hook::Kai { hamicore };
            for order in [[Hook::Ours, kai], [kai, Hook::Ours]] {
                let what = format!("{label}, hamicore {hamicore}, order {order:?}");
                let pod = kai_pod("train", annotations.clone(), &containers);
                let (stored, calls) = admit(&pod, &order, &settings)
                    .unwrap_or_else(|e| panic!("{what}: denied: {e}"));
                assert!(calls >= 2 || order[0] == kai, "{what}: not reinvoked");
                // The limits file of the GPU container, with the exact cap; no other file.
                let files: Vec<(&String, &Value)> = stored["metadata"]["annotations"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .filter(|(k, _)| k.starts_with("limits.hami.io/"))
                    .collect();
                assert_eq!(files.len(), 1, "{what}: {files:?}");
                assert_eq!(files[0].0, &format!("limits.hami.io/{gpu}"), "{what}");
                let file = files[0].1.as_str().unwrap();
                assert!(
                    file.lines()
                        .any(|l| l == format!("CUDA_DEVICE_MEMORY_LIMIT={cap}")),
                    "{what}: {file}"
                );
                let c = named(&stored, gpu);
                let mounts: Vec<&str> = c["volumeMounts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|m| m["mountPath"].as_str())
                    .collect();
                assert_eq!(mounts, ["/overrideEnv"], "{what}");
                assert_eq!(c["resources"]["limits"]["hami.io/preload"], "1", "{what}");
                // KAI's entries stay KAI's: its ConfigMap-backed variables and envFrom.
                for key in ["NVIDIA_VISIBLE_DEVICES", "GPU_PORTION", "RUNAI_NUM_OF_GPUS"] {
                    let e = env_entries(c, key);
                    assert_eq!(e.len(), 1, "{what}: {key}");
                    assert!(
                        e[0]["valueFrom"]["configMapKeyRef"].is_object(),
                        "{what}: {key}"
                    );
                }
                let limit = env_entries(c, "CUDA_DEVICE_MEMORY_LIMIT");
                assert_eq!(limit.len(), 1, "{what}: one memory limit entry: {limit:?}");
                if hamicore {
                    assert_eq!(
                        limit[0]["valueFrom"]["configMapKeyRef"]["optional"], true,
                        "{what}: KAI's entry, recognised as KAI's"
                    );
                } else {
                    assert_eq!(limit[0]["value"], cap, "{what}");
                }
                assert_eq!(stored["spec"]["runtimeClassName"], "nvidia", "{what}");
                // No other container gets a cap, a file or HAMi-core.
                for other in all_containers(&stored) {
                    if other["name"] == gpu {
                        continue;
                    }
                    assert!(
                        env_entries(other, "CUDA_DEVICE_MEMORY_LIMIT").is_empty(),
                        "{what}: {other}"
                    );
                    assert!(other["volumeMounts"].is_null(), "{what}: {other}");
                    assert!(
                        other["resources"]["limits"]["hami.io/preload"].is_null(),
                        "{what}: {other}"
                    );
                }
                // Idempotent: one more review of the stored pod changes nothing.
                let (again, _) = ours(&stored, &settings).unwrap();
                assert_eq!(again, stored, "{what}: a further review changed the pod");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, kai_shapes().len() * 4);
}

/// A HAMi pod through HAMi v2.10's webhook and this one, in both orders: one entry per variable in
/// the stored pod (HAMi appends `CUDA_TASK_PRIORITY`, `GPU_CORE_UTILIZATION_POLICY` and, with
/// `overwriteEnv`, `NVIDIA_VISIBLE_DEVICES=none` without looking for an existing entry).
#[test]
fn hami_pods_in_both_orders_one_entry_per_variable() {
    for (policy, overwrite) in [
        (CorePolicy::Default, false),
        (CorePolicy::Force, false),
        (CorePolicy::Force, true),
    ] {
        let mut settings = Settings::default();
        settings.nvidia.gpu_core_policy = policy;
        settings.nvidia.overwrite_env = overwrite;
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "hami", "namespace": NS},
            "spec": {
                "initContainers": [{"name": "setup", "image": "x", "command": ["true"]}],
                "containers": [
                    {"name": "cuda", "image": "x", "resources": {"limits": {
                        "nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/priority": "1"}}},
                    {"name": "plain", "image": "x"},
                ],
            },
        });
        for order in [[Hook::Ours, Hook::Hami], [Hook::Hami, Hook::Ours]] {
            let what = format!("policy {policy}, overwriteEnv {overwrite}, order {order:?}");
            let (stored, _) = admit(&pod, &order, &settings).unwrap();
            for c in all_containers(&stored) {
                let mut names: Vec<&str> = c["env"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e["name"].as_str())
                    .collect();
                let all = names.len();
                names.sort_unstable();
                names.dedup();
                assert_eq!(names.len(), all, "{what}: {c}");
            }
            let cuda = named(&stored, "cuda");
            assert_eq!(
                env_entries(cuda, "CUDA_TASK_PRIORITY")[0]["value"],
                "1",
                "{what}"
            );
            assert_eq!(
                env_entries(cuda, "GPU_CORE_UTILIZATION_POLICY").len(),
                usize::from(policy != CorePolicy::Default),
                "{what}"
            );
            for plain in ["setup", "plain"] {
                assert_eq!(
                    env_entries(named(&stored, plain), "NVIDIA_VISIBLE_DEVICES").len(),
                    usize::from(overwrite),
                    "{what}: {plain}"
                );
            }
            assert_eq!(stored["spec"]["schedulerName"], "hami-scheduler", "{what}");
            let (again, _) = ours(&stored, &settings).unwrap();
            assert_eq!(again, stored, "{what}: a further review changed the pod");
        }
    }
}

/// KAI's binder creates its reservation pods (`nvidia.com/gpu: 1`, `nodeName` preset) in
/// `kai-resource-reservation`; they are KAI's and never changed, whatever they request.
#[test]
fn kai_reservation_pods_are_never_touched() {
    let reservation = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "gpu-reservation-0123456789abcdef", "namespace": "kai-resource-reservation",
                     "labels": {"app": "kai-resource-reservation", "runai-gpu-group": "g"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "resource-reservation", "image": "x",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}]},
    });
    let (stored, warnings) = ours(&reservation, &kai_settings()).unwrap();
    assert_eq!(stored, reservation);
    assert!(warnings.is_empty(), "{warnings:?}");
    // The same pod in a tenant namespace is a HAMi pod like any other.
    let mut elsewhere = reservation.clone();
    elsewhere["metadata"]["namespace"] = json!(NS);
    let (stored, _) = ours(&elsewhere, &kai_settings()).unwrap();
    assert_eq!(stored["spec"]["schedulerName"], "hami-scheduler");
    // An operator who moved KAI's reservation namespace says so; empty turns the exception off.
    let mut moved = kai_settings();
    moved.kai.reservation_namespace = String::new();
    let (stored, _) = ours(&reservation, &moved).unwrap();
    assert_ne!(stored, reservation);
}

/// The stand-ins themselves, pinned against the reference's facts about the peers
/// (`tests/cluster/peers_test.py`): a stand-in that drifted would make every test above meaningless.
#[test]
fn the_stand_ins_match_the_reference() {
    let out = Command::new("python3")
        .arg(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/cluster/peers_test.py"),
        )
        .output()
        .expect("python3 runs tests/cluster/peers_test.py");
    assert!(
        out.status.success(),
        "tests/cluster/peers_test.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
