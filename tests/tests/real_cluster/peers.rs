//! The webhook beside the peers' admission, on the real API server: the stand-ins of
//! `tests/cluster/peers.py` (KAI v0.17's admission and binder, HAMi v2.10's webhook) served over
//! HTTPS and registered under the peers' own configuration names, with their `failurePolicy` and
//! `reinvocationPolicy`, so that the API server orders and reinvokes them as it would the peers.
//! The other order comes from registering the peer under a name that sorts on the other side of
//! this chart's (`hl-hami-limits` here): the order a release of ours named otherwise would get (the
//! API server calls configurations sorted by name). This chart's own configuration stays Helm's.

use super::*;
use hami_tests::pod_json::{containers as containers_of, env_entries as entries};
use hami_tests::real::{StandIn, StandInSpec, https_stand_in, kai_admission_configuration};

/// KAI v0.17's configuration name (`pkg/apis/kai/v1/admission/admission.go`): after this chart's.
const KAI_CONFIG: &str = "mutating-kai-admission";
/// KAI's configuration sorted before this chart's.
const KAI_CONFIG_FIRST: &str = "a-mutating-kai-admission";
/// HAMi v2.10's, for release `hami` (`charts/hami/templates/_helpers.tpl`): before `hl-…`.
const HAMI_CONFIG: &str = "hami-webhook";
/// HAMi's configuration sorted after this chart's (as after the default `hami-limits`).
const HAMI_CONFIG_LAST: &str = "zz-hami-webhook";
const RESERVATION_NS: &str = "kai-resource-reservation";

/// The stand-ins' HTTPS server and its options file (re-read on every request).
struct Peers {
    child: Child,
    options: PathBuf,
    url: String,
    ca_bundle: String,
}

impl Peers {
    fn start(c: &Cluster) -> Self {
        let dir = c.work.path().join("peers");
        std::fs::create_dir_all(&dir).unwrap();
        let options = dir.join("options.json");
        std::fs::write(&options, "{}").unwrap();
        let StandIn {
            child,
            port,
            ca_bundle,
        } = https_stand_in(&StandInSpec {
            dir: &dir,
            common_name: "peers",
            ip: &c.host_ip,
            script: &repo().join("tests/cluster/peers.py"),
            before: &["serve"],
            after: &[&options],
            log: &c.dir.join("logs/peers.log"),
            pid_file: &c.dir.join("pids/peers"),
        })
        .unwrap();
        Self {
            child,
            options,
            url: format!("https://{}:{port}", c.host_ip),
            ca_bundle,
        }
    }

    fn set(&self, options: &Value) {
        std::fs::write(&self.options, options.to_string()).unwrap();
    }

    /// KAI's MutatingWebhookConfiguration, as its operator writes it.
    fn register_kai(&self, c: &Cluster, name: &str) {
        for other in [KAI_CONFIG, KAI_CONFIG_FIRST] {
            c.ok(
                &[
                    "delete",
                    "mutatingwebhookconfiguration",
                    other,
                    "--ignore-not-found",
                ],
                None,
            );
        }
        c.apply(&kai_admission_configuration(
            name,
            &format!("{}/kai", self.url),
            &self.ca_bundle,
        ));
    }

    /// HAMi's, as its chart renders it (`charts/hami/templates/scheduler/webhook.yaml`, defaults).
    fn register_hami(&self, c: &Cluster, name: &str) {
        for other in [HAMI_CONFIG, HAMI_CONFIG_LAST] {
            c.ok(
                &[
                    "delete",
                    "mutatingwebhookconfiguration",
                    other,
                    "--ignore-not-found",
                ],
                None,
            );
        }
        c.apply(&json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{
                "name": "vgpu.hami.io", "admissionReviewVersions": ["v1beta1"], "sideEffects": "None",
                "failurePolicy": "Ignore", "reinvocationPolicy": "Never", "matchPolicy": "Equivalent",
                "timeoutSeconds": 10,
                "clientConfig": {"url": format!("{}/hami", self.url), "caBundle": self.ca_bundle},
                "namespaceSelector": {"matchExpressions": [
                    {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]},
                "objectSelector": {"matchExpressions": [
                    {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                           "resources": ["pods"], "scope": "*"}],
            }],
        }));
    }

    fn stop(self, c: &Cluster) {
        for name in [KAI_CONFIG, KAI_CONFIG_FIRST, HAMI_CONFIG, HAMI_CONFIG_LAST] {
            c.ok(
                &[
                    "delete",
                    "mutatingwebhookconfiguration",
                    name,
                    "--ignore-not-found",
                ],
                None,
            );
        }
        stop_child(self.child, &c.dir.join("pids/peers"));
    }
}

fn runtime_class(c: &Cluster) {
    // KAI's runtimeenforcement sets `runtimeClassName: nvidia`; the API server refuses a pod whose
    // RuntimeClass does not exist.
    c.apply(
        &json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                    "metadata": {"name": "nvidia"}, "handler": "nvidia"}),
    );
}

fn kai_pod_of(name: &str, annotations: Value, containers: &[(&str, bool)]) -> Value {
    let c = |n: &str| json!({"name": n, "image": "localhost/hami-limits/workload:test", "command": ["sleep", "infinity"]});
    let init: Vec<Value> = containers
        .iter()
        .filter(|(_, i)| *i)
        .map(|(n, _)| c(n))
        .collect();
    let main: Vec<Value> = containers
        .iter()
        .filter(|(_, i)| !*i)
        .map(|(n, _)| c(n))
        .collect();
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations,
                     "labels": {"kai.scheduler/queue": "default-queue"}},
        "spec": {"schedulerName": "kai-scheduler", "containers": main},
    });
    if !init.is_empty() {
        p["spec"]["initContainers"] = Value::from(init);
    }
    p
}

fn limits_files(pod: &Value) -> BTreeMap<String, String> {
    pod["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("limits.hami.io/"))
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect()
}

/// One shape of KAI fraction pod: (name, annotations, containers (name, is init), GPU container).
type Shape = (&'static str, Value, Vec<(&'static str, bool)>, &'static str);

/// Every shape of KAI fraction pod.
fn shapes() -> Vec<Shape> {
    vec![
        (
            "mem-one",
            json!({"gpu-memory": "3000"}),
            vec![("main", false)],
            "main",
        ),
        (
            "frac-one",
            json!({"gpu-fraction": "0.5"}),
            vec![("main", false)],
            "main",
        ),
        (
            "frac-init-main",
            json!({"gpu-fraction": "0.5"}),
            vec![("setup", true), ("main", false)],
            "main",
        ),
        (
            "frac-init-gpu",
            json!({"gpu-fraction": "0.25", "gpu-fraction-container-name": "setup"}),
            vec![("setup", true), ("main", false)],
            "setup",
        ),
        (
            "mem-two",
            json!({"gpu-memory": "3000", "gpu-fraction-container-name": "trainer"}),
            vec![("sidecar", false), ("trainer", false)],
            "trainer",
        ),
    ]
}

/// KAI fraction pods of every shape, through KAI's admission (`hamicore` off and on) and this
/// webhook in both orders: the limits file is the one this webhook gives without KAI, in the GPU
/// container only, KAI's entries are kept, and the stored pod is valid.
pub(super) fn kai_fraction_pods_beside_kai_admission(c: &mut Cluster) {
    runtime_class(c);
    // A GPU node with GFD's memory label: the basis of the gpu-fraction shapes.
    c.apply(&json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "kai-basis", "labels": {"nvidia.com/gpu.memory": "16384"}}}));
    let probe = kai_pod_of("probe", json!({"gpu-fraction": "0.5"}), &[("main", false)]);
    wait_for(
        "the webhook to learn the node's nvidia.com/gpu.memory",
        Duration::from_secs(30),
        || {
            c.kubectl(
                &[
                    "create",
                    "-n",
                    TENANT,
                    "--dry-run=server",
                    "-o",
                    "json",
                    "-f",
                    "-",
                ],
                Some(&probe.to_string()),
            )
            .status
            .success()
        },
    );
    // What this webhook alone gives each shape (server-side dry run, KAI not yet registered).
    let mut alone = BTreeMap::new();
    for (name, annotations, containers, _) in shapes() {
        let p = kai_pod_of(name, annotations, &containers);
        let out = c.ok(
            &[
                "create",
                "-n",
                TENANT,
                "--dry-run=server",
                "-o",
                "json",
                "-f",
                "-",
            ],
            Some(&p.to_string()),
        );
        let stored: Value = serde_json::from_str(&out).unwrap();
        alone.insert(name, limits_files(&stored));
    }
    let peers = Peers::start(c);
    let result = catch_unwind(AssertUnwindSafe(|| {
        let mut checked = 0;
        for kai_first in [false, true] {
            peers.register_kai(
                c,
                if kai_first {
                    KAI_CONFIG_FIRST
                } else {
                    KAI_CONFIG
                },
            );
            for hamicore in [false, true] {
                peers.set(&json!({"kai": {"hamicore": hamicore}}));
                for (name, annotations, containers, gpu) in shapes() {
                    let what = format!("{name}, hamicore {hamicore}, KAI first {kai_first}");
                    let pod_name = format!("{name}-{}{}", u8::from(kai_first), u8::from(hamicore));
                    let p = kai_pod_of(&pod_name, annotations, &containers);
                    let (stored, warnings) = c
                        .create_pod(TENANT, &p)
                        .unwrap_or_else(|e| panic!("{what}: refused: {e}"));
                    assert!(
                        !warnings.contains("hides previous definition"),
                        "{what}: {warnings}"
                    );
                    let prefix = stored["metadata"]["annotations"]["runai/shared-gpu-configmap"]
                        .as_str()
                        .unwrap_or_else(|| panic!("{what}: KAI's admission did not run: {stored}"));
                    assert!(prefix.ends_with("-shared-gpu"), "{what}");
                    assert_eq!(stored["spec"]["runtimeClassName"], "nvidia", "{what}");
                    let files = limits_files(&stored);
                    let want = &alone[name];
                    assert_eq!(
                        &files, want,
                        "{what}: the limits files differ from ours alone"
                    );
                    assert_eq!(
                        files.keys().collect::<Vec<_>>(),
                        [&format!("limits.hami.io/{gpu}")],
                        "{what}"
                    );
                    for cont in containers_of(&stored) {
                        let is_gpu = cont["name"] == gpu;
                        let mounts: Vec<&str> = cont["volumeMounts"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|m| m["mountPath"].as_str())
                            .filter(|m| !m.starts_with("/var/run/secrets"))
                            .collect();
                        let limit = entries(cont, "CUDA_DEVICE_MEMORY_LIMIT");
                        if !is_gpu {
                            assert!(limit.is_empty(), "{what}: {cont}");
                            assert!(mounts.is_empty(), "{what}: {cont}");
                            continue;
                        }
                        assert_eq!(mounts, ["/overrideEnv"], "{what}");
                        assert_eq!(limit.len(), 1, "{what}: {cont}");
                        assert_eq!(
                            limit[0]["valueFrom"]["configMapKeyRef"].is_object(),
                            hamicore,
                            "{what}: {cont}"
                        );
                        for key in ["NVIDIA_VISIBLE_DEVICES", "GPU_PORTION", "RUNAI_NUM_OF_GPUS"] {
                            assert_eq!(entries(cont, key).len(), 1, "{what}: {key}");
                        }
                        assert_eq!(
                            cont["envFrom"][0]["configMapRef"]["name"],
                            format!("{}-evar", limit_cm(prefix, &stored, gpu)),
                            "{what}"
                        );
                    }
                    c.ok(
                        &["delete", "pod", "-n", TENANT, &pod_name, "--wait=false"],
                        None,
                    );
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 4 * shapes().len());
    }));
    peers.stop(c);
    c.ok(&["delete", "node", "kai-basis"], None);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// KAI's capabilities ConfigMap of the container named `gpu`: `<prefix>-<index>` (`i<index>` for
/// an init container).
fn limit_cm(prefix: &str, pod: &Value, gpu: &str) -> String {
    let init = pod["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten();
    if let Some(i) = init.clone().position(|c| c["name"] == gpu) {
        return format!("{prefix}-i{i}");
    }
    let i = pod["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .position(|c| c["name"] == gpu)
        .unwrap();
    format!("{prefix}-{i}")
}

/// KAI's binder with this webhook down: its reservation pod (in `kai-resource-reservation`),
/// the ConfigMaps, the fraction pod's label (an UPDATE) and the Binding all go through, and the
/// reservation pod is stored as KAI made it.
pub(super) fn kai_binding_never_waits_for_the_webhook(c: &mut Cluster) {
    runtime_class(c);
    c.apply(
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RESERVATION_NS}}),
    );
    c.apply(&json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "kai-node", "labels": {"nvidia.com/gpu.memory": "15360"}}}));
    let peers = Peers::start(c);
    peers.register_kai(c, KAI_CONFIG);
    peers.set(&json!({"kai": {"hamicore": true}}));
    let result = catch_unwind(AssertUnwindSafe(|| {
        let p = kai_pod_of(
            "kai-bound",
            json!({"gpu-memory": "4096"}),
            &[("main", false)],
        );
        c.create_pod(TENANT, &p).unwrap();
        c.stop_webhook();
        let kubectl: Vec<String> = vec![
            c.bin.join("kubectl").display().to_string(),
            "--kubeconfig".to_owned(),
            c.admin().display().to_string(),
        ];
        let out = Command::new("python3")
            .arg(repo().join("tests/cluster/peers.py"))
            .arg("kai-bind")
            .arg(
                json!({"kubectl": kubectl, "namespace": TENANT, "pod": "kai-bound", "node": "kai-node",
                       "uuid": "GPU-11111111-aaaa-4000-8000-00000000000b", "hamicore": true,
                       "image": "localhost/hami-limits/workload:test", "reserve": true})
                .to_string(),
            )
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "KAI's binder failed with the webhook down: {}",
            text(&out.stderr)
        );
        let bound = c.get("pod", Some(TENANT), "kai-bound");
        assert_eq!(bound["spec"]["nodeName"], "kai-node");
        assert!(bound["metadata"]["labels"]["runai-gpu-group"].is_string());
        let prefix = bound["metadata"]["annotations"]["runai/shared-gpu-configmap"]
            .as_str()
            .unwrap();
        let cm = c.get("configmap", Some(TENANT), &format!("{prefix}-0"));
        // gpu-memory 4096 on a 15360 MiB GPU: portion ceil(4096 / 15300 × 100) / 100 = 0.27, and
        // KAI's limit int64(15360 × 0.27) = 4147 MiB, over what was asked; the limits file keeps
        // 4096.
        assert_eq!(cm["data"]["GPU_PORTION"], "0.27");
        assert_eq!(cm["data"]["CUDA_DEVICE_MEMORY_LIMIT"], "4147m");
        assert!(
            bound["metadata"]["annotations"]["limits.hami.io/main"]
                .as_str()
                .unwrap()
                .contains("CUDA_DEVICE_MEMORY_LIMIT=4096m")
        );
        let reservations = c.ok(&["get", "pods", "-n", RESERVATION_NS, "-o", "json"], None);
        let reservations: Value = serde_json::from_str(&reservations).unwrap();
        let r = &reservations["items"][0];
        assert!(
            r["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("gpu-reservation-")
        );
        assert_eq!(r["spec"]["schedulerName"], "default-scheduler", "{r}");
        assert!(
            r["metadata"]["annotations"]
                .as_object()
                .is_none_or(|a| !a.keys().any(|k| k.contains("hami")))
        );
    }));
    if c.webhook.is_none() {
        c.start_webhook();
    }
    c.ok(
        &["delete", "pod", "-n", TENANT, "kai-bound", "--wait=false"],
        None,
    );
    c.ok(
        &["delete", "namespace", RESERVATION_NS, "--wait=false"],
        None,
    );
    c.ok(&["delete", "node", "kai-node"], None);
    peers.stop(c);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// A HAMi pod through HAMi's webhook and this one, in both orders (`hami-webhook` sorts before this
/// release's `hl-hami-limits`; the default release's `hami-limits` sorts before `hami-webhook`, as
/// ours before `zz-hami-webhook`): one entry per variable in the stored pod, and no "hides previous
/// definition" warning.
pub(super) fn hami_pods_beside_hamis_webhook(c: &mut Cluster) {
    let settings: Value =
        serde_yaml_ng::from_slice(&std::fs::read(c.work.path().join("webhook.yaml")).unwrap())
            .unwrap();
    let nvidia = &settings["nvidia"];
    let peers = Peers::start(c);
    peers.set(&json!({"hami": {
        "gpuCorePolicy": nvidia["gpuCorePolicy"].as_str().unwrap_or("default"),
        "overwriteEnv": nvidia["overwriteEnv"].as_bool().unwrap_or(false),
    }}));
    let result = catch_unwind(AssertUnwindSafe(|| {
        for ours_first in [false, true] {
            peers.register_hami(
                c,
                if ours_first {
                    HAMI_CONFIG_LAST
                } else {
                    HAMI_CONFIG
                },
            );
            let name = format!("hami-beside-{}", u8::from(ours_first));
            let p = pod(
                &name,
                json!({}),
                json!([
                    container(
                        "cuda",
                        json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/priority": 1})
                    ),
                    container("plain", json!({})),
                ]),
            );
            let (stored, warnings) = c
                .create_pod(TENANT, &p)
                .unwrap_or_else(|e| panic!("ours first {ours_first}: {e}"));
            assert!(
                !warnings.contains("hides previous definition"),
                "ours first {ours_first}: {warnings}"
            );
            for cont in containers_of(&stored) {
                let mut names: Vec<&str> = cont["env"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e["name"].as_str())
                    .collect();
                let all = names.len();
                names.sort_unstable();
                names.dedup();
                assert_eq!(names.len(), all, "ours first {ours_first}: {cont}");
            }
            let cuda = &stored["spec"]["containers"][0];
            assert_eq!(entries(cuda, "CUDA_TASK_PRIORITY")[0]["value"], "1");
            c.ok(
                &["delete", "pod", "-n", TENANT, &name, "--wait=false"],
                None,
            );
        }
    }));
    peers.stop(c);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
