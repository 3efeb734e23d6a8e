//! KAI fraction pods beside KAI v0.17's admission and binder, run on the real node: the stand-ins
//! of `tests/cluster/peers.py` are registered under KAI's configuration name with its policies
//! (as `tests/tests/real_cluster/peers.rs` does on the control plane), the binder stand-in fills
//! KAI's ConfigMaps and binds, and every process of the GPU container runs under this project's
//! cap while the other containers get none.

use super::*;
use hami_tests::real::{StandIn, StandInSpec, https_stand_in, kai_admission_configuration};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// KAI v0.17's configuration name: after this chart's `hami-hami-limits`.
const KAI_CONFIG: &str = "mutating-kai-admission";
/// KAI's configuration sorted before this chart's: the order a release of ours named to sort after
/// KAI's would get.
const KAI_CONFIG_FIRST: &str = "a-mutating-kai-admission";

/// The stand-in server and its options file (re-read on every request).
struct Peers {
    child: std::process::Child,
    options: PathBuf,
    config: String,
}

impl Peers {
    fn start(n: &Node) -> Self {
        Self::start_as(n, KAI_CONFIG)
    }

    fn start_as(n: &Node, config: &str) -> Self {
        let dir = n.dir.join("peers");
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
            ip: "127.0.0.1",
            script: &repo().join("tests/cluster/peers.py"),
            before: &["serve"],
            after: &[&options],
            log: &n.dir.join("logs/peers.log"),
            pid_file: &n.dir.join("pids/peers"),
        })
        .unwrap();
        n.ok(
            &["apply", "-f", "-"],
            Some(
                &kai_admission_configuration(
                    config,
                    &format!("https://127.0.0.1:{port}/kai"),
                    &ca_bundle,
                )
                .to_string(),
            ),
        );
        Self {
            child,
            options,
            config: config.to_owned(),
        }
    }

    fn stop(mut self, n: &Node) {
        n.ok(
            &[
                "delete",
                "mutatingwebhookconfiguration",
                &self.config,
                "--ignore-not-found",
            ],
            None,
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(n.dir.join("pids/peers"));
    }
}

/// `kubectl exec -c <container>`: stdout, asserting success.
fn exec_in(n: &Node, pod: &str, container: &str, cmd: &[&str]) -> String {
    let mut args = vec!["exec", "-n", TENANT, pod, "-c", container, "--"];
    args.extend(cmd);
    n.ok(&args, None)
}

/// One pod on the node: (name, annotations, an init container first, a sidecar after the GPU
/// container, KAI's webhook first, `hamicore`, the cap).
struct NodeCase {
    name: &'static str,
    annotations: Value,
    init: bool,
    sidecar: bool,
    kai_first: bool,
    hamicore: bool,
    cap: String,
}

fn pod_of(case: &NodeCase) -> Value {
    let mut p = kai_pod(case.name, case.annotations.clone());
    p["metadata"]["labels"] = json!({"kai.scheduler/queue": "default-queue"});
    if case.init {
        p["spec"]["initContainers"] = json!([{
            "name": "setup", "image": WORKLOAD, "imagePullPolicy": "Never",
            "command": ["sh", "-c", "printenv; test -e /overrideEnv && echo HAS-OVERRIDE-ENV; true"],
        }]);
    }
    if case.sidecar {
        p["spec"]["containers"].as_array_mut().unwrap().push(json!({
            "name": "sidecar", "image": WORKLOAD, "imagePullPolicy": "Never",
            "command": ["sh", "-c", "printenv > /tmp/entry-env; exec sleep infinity"],
        }));
    }
    p
}

/// The cases on the node: every shape whose GPU container can be entered (an init container with
/// the GPU ends before it could be; the offline and control-plane suites cover that shape), both
/// orders, `hamicore` off and on.
pub(super) fn kai_pods_beside_kai_admission_and_binder(n: &mut Node) {
    n.ok(
        &["apply", "-f", "-"],
        Some(
            &json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                    "metadata": {"name": "nvidia"}, "handler": "nvidia"})
            .to_string(),
        ),
    );
    let half = format!("{}m", VRAM_MIB / 2);
    let cases = [
        NodeCase {
            name: "kai-peer-mem",
            annotations: json!({"gpu-memory": "3000"}),
            init: false,
            sidecar: false,
            kai_first: false,
            hamicore: true,
            cap: "3000m".to_owned(),
        },
        NodeCase {
            name: "kai-peer-init",
            annotations: json!({"gpu-fraction": "0.5"}),
            init: true,
            sidecar: false,
            kai_first: true,
            hamicore: true,
            cap: half.clone(),
        },
        NodeCase {
            name: "kai-peer-side",
            annotations: json!({"gpu-memory": "3000"}),
            init: false,
            sidecar: true,
            kai_first: false,
            hamicore: false,
            cap: "3000m".to_owned(),
        },
        NodeCase {
            name: "kai-peer-both",
            annotations: json!({"gpu-fraction": "0.5"}),
            init: true,
            sidecar: true,
            kai_first: true,
            hamicore: false,
            cap: half,
        },
    ];
    let result = catch_unwind(AssertUnwindSafe(|| {
        for case in &cases {
            let peers = if case.kai_first {
                Peers::start_as(n, KAI_CONFIG_FIRST)
            } else {
                Peers::start(n)
            };
            let what = format!(
                "{} (KAI first {}, hamicore {})",
                case.name, case.kai_first, case.hamicore
            );
            std::fs::write(
                &peers.options,
                json!({"kai": {"hamicore": case.hamicore}}).to_string(),
            )
            .unwrap();
            let out = n.create(&pod_of(case));
            peers.stop(n);
            assert!(out.status.success(), "{what}: {}", text(&out.stderr));
            let stored = n.get("pod", Some(TENANT), case.name);
            assert!(
                stored["metadata"]["annotations"]["runai/shared-gpu-configmap"].is_string(),
                "{what}: KAI's admission did not run"
            );
            // KAI's binder: ConfigMaps (the GPU's UUID, the portion, with hamicore KAI's own
            // limit), the GPU-group label, the Binding.
            let kubectl = json!([
                n.bin.join("kubectl").display().to_string(),
                "--kubeconfig",
                n.dir.join("admin.kubeconfig").display().to_string()
            ]);
            let bound = Command::new("python3")
                .arg(repo().join("tests/cluster/peers.py"))
                .arg("kai-bind")
                .arg(
                    json!({"kubectl": kubectl, "namespace": TENANT, "pod": case.name, "node": NODE,
                           "uuid": GPU_0, "hamicore": case.hamicore})
                    .to_string(),
                )
                .output()
                .unwrap();
            assert!(bound.status.success(), "{what}: {}", text(&bound.stderr));
            wait_running(n, case.name);
            // Every process of the GPU container: the file's cap, not KAI's (hamicore) value.
            assert_capped_inside(n, case.name, &[("CUDA_DEVICE_MEMORY_LIMIT", &case.cap)]);
            let visible = exec_in(
                n,
                case.name,
                "cuda",
                &["printenv", "NVIDIA_VISIBLE_DEVICES"],
            );
            assert_eq!(
                visible.trim(),
                GPU_0,
                "{what}: KAI's ConfigMap reached the container"
            );
            if case.sidecar {
                let entry = exec_in(n, case.name, "sidecar", &["cat", "/tmp/entry-env"]);
                let envless = exec_in(
                    n,
                    case.name,
                    "sidecar",
                    &["env", "-i", "/usr/bin/cat", "/proc/self/maps"],
                );
                assert!(
                    !entry.contains("CUDA_DEVICE_MEMORY_LIMIT"),
                    "{what}: sidecar: {entry}"
                );
                assert!(
                    !envless.contains("libvgpu.so"),
                    "{what}: sidecar has HAMi-core"
                );
                let mounted = n.kubectl(
                    &[
                        "exec",
                        "-n",
                        TENANT,
                        case.name,
                        "-c",
                        "sidecar",
                        "--",
                        "test",
                        "-e",
                        "/overrideEnv",
                    ],
                    None,
                );
                assert!(
                    !mounted.status.success(),
                    "{what}: sidecar has /overrideEnv"
                );
            }
            if case.init {
                let log = n.ok(&["logs", "-n", TENANT, case.name, "-c", "setup"], None);
                assert!(
                    !log.contains("CUDA_DEVICE_MEMORY_LIMIT"),
                    "{what}: init: {log}"
                );
                assert!(!log.contains("HAS-OVERRIDE-ENV"), "{what}: init: {log}");
            }
            delete_pod(n, case.name);
        }
    }));
    let _ = n.kubectl(
        &[
            "delete",
            "mutatingwebhookconfiguration",
            KAI_CONFIG,
            KAI_CONFIG_FIRST,
            "--ignore-not-found",
        ],
        None,
    );
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
