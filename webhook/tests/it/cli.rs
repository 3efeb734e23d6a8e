//! The `hami-webhook` binary's offline commands: `review` and `mutate`, and `--help`.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::support::offline_online;

const BIN: &str = env!("CARGO_BIN_EXE_hami-webhook");
const HAMI_POD_REVIEW: &str = include_str!("../fixtures/hami-pod.json");
const PLAIN_POD_REVIEW: &str = include_str!("../fixtures/plain-pod.json");

fn run(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8(b.to_vec()).unwrap()
}

const POD_YAML: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: train-0
  namespace: ml
spec:
  containers:
    - name: train
      image: nvcr.io/nvidia/pytorch:24.05-py3
      env:
        - name: CUDA_TASK_PRIORITY
          value: "3"
      resources:
        limits:
          nvidia.com/gpu: "1"
          nvidia.com/priority: "0"
    - name: sidecar
      image: busybox
"#;

#[test]
fn review_reads_stdin_or_a_file_and_answers_whatever_the_decision() {
    let out = run(&["review"], PLAIN_POD_REVIEW);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["response"]["allowed"], true);
    assert_eq!(v["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("review.json");
    std::fs::write(&file, HAMI_POD_REVIEW).unwrap();
    let out = run(&["review", "-f", file.to_str().unwrap()], "");
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["response"]["patchType"], "JSONPatch");

    // A denial is still exit 0: the answer is the output.
    let denied = PLAIN_POD_REVIEW.replace(
        r#""annotations":{}"#,
        r#""annotations":{"hami.io/limit-delivery":"FILE"}"#,
    );
    let out = run(&["review", "-f", "-"], &denied);
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["response"]["allowed"], false);
    assert_eq!(
        v["response"]["status"]["message"],
        r#"pod ml-team/train-: annotation hami.io/limit-delivery="FILE" is not one of: env, file"#
    );
}

#[test]
fn review_of_non_json_exits_2_with_a_message() {
    let out = run(&["review"], "{\"apiVersion\": ");
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(
        text(&out.stderr).contains("not JSON"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["review", "-f", "/nonexistent/review.json"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("/nonexistent/review.json"));
}

/// Settings that let namespace `ml` set HAMi-core's variables (HAMi's behaviour).
const ALLOW_ML: &str = "tenancy:\n  allowHamiCoreEnvNamespaces: [ml]\n";

#[test]
fn mutate_prints_the_mutated_pod_and_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pod.yaml");
    std::fs::write(&file, POD_YAML).unwrap();
    let config = dir.path().join("webhook.yaml");
    std::fs::write(&config, ALLOW_ML).unwrap();
    let out = run(
        &[
            "mutate",
            "-f",
            file.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let pod: Value = serde_yaml_ng::from_slice(&out.stdout).unwrap();
    assert_eq!(pod["spec"]["schedulerName"], "hami-scheduler");
    assert_eq!(
        pod["spec"]["containers"][0]["env"][0]["value"], "3",
        "left alone"
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(r#"warning: container "train" already sets CUDA_TASK_PRIORITY to "3""#),
        "{stderr}"
    );
}

#[test]
fn mutate_patch_and_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("webhook.yaml");
    std::fs::write(
        &config,
        format!("nvidia:\n  gpuCorePolicy: force\nschedulerName: gpu-sched\n{ALLOW_ML}"),
    )
    .unwrap();
    let out = run(
        &[
            "mutate",
            "-f",
            "-",
            "--patch",
            "--config",
            config.to_str().unwrap(),
        ],
        POD_YAML,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let patch: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        patch,
        serde_json::json!([
            {"op":"add","path":"/spec/schedulerName","value":"gpu-sched"},
            {"op":"add","path":"/spec/containers/0/env/-","value":{"name":"GPU_CORE_UTILIZATION_POLICY","value":"force"}}
        ])
    );
}

/// By default a GPU container may not set HAMi-core's variables: the offline command says so as
/// the webhook would, naming the pod, container, variable and the setting that allows it.
#[test]
fn mutate_refuses_hami_core_variables_set_by_the_pod() {
    let out = run(&["mutate", "-f", "-"], POD_YAML);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr).trim_end(),
        r#"denied: pod ml/train-0: container "train": env CUDA_TASK_PRIORITY is set by the pod to "3"; hami-limits sets "0" (from limit nvidia.com/priority=0), and a GPU container may not set another value; remove it, or allow it in this namespace with tenancy.allowHamiCoreEnvNamespaces"#
    );
    let same = POD_YAML.replace("value: \"3\"", "value: \"0\"");
    let out = run(&["mutate", "-f", "-"], &same);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stderr).is_empty(), "{}", text(&out.stderr));
}

#[test]
fn mutate_denied_exits_1_and_bad_input_exits_2() {
    let privileged = POD_YAML.replace(
        "      resources:",
        "      securityContext:\n        privileged: true\n      resources:",
    );
    let out = run(&["mutate", "-f", "-"], &privileged);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(
        text(&out.stderr).starts_with(r#"denied: pod ml/train-0: container "train" is privileged"#),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["mutate", "-f", "-"], "kind: Deployment\n");
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("not a Pod"));
}

#[test]
fn help_on_every_command() {
    for args in [
        &["--help"][..],
        &["serve", "--help"],
        &["review", "--help"],
        &["mutate", "--help"],
    ] {
        let out = run(args, "");
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(text(&out.stdout).contains("Usage"), "{args:?}");
    }
    let out = run(&["serve", "--help"], "");
    let help = text(&out.stdout);
    for flag in [
        "--dev",
        "--tls-cert",
        "--tls-key",
        "--listen",
        "--metrics-listen",
        "--config",
    ] {
        assert!(help.contains(flag), "{flag} in {help}");
    }
}

/// kubectl-style YAML: integer quantities are accepted (as kubectl and the API server accept
/// them), and a real error names the line and column of the user's file, not of an internal JSON
/// form.
#[test]
fn mutate_reads_kubectl_yaml_and_locates_errors_in_it() {
    let pod = POD_YAML.replace("value: \"3\"", "value: \"0\"");
    let integers = pod
        .replace("nvidia.com/gpu: \"1\"", "nvidia.com/gpu: 1")
        .replace("nvidia.com/priority: \"0\"", "nvidia.com/priority: 0");
    let out = run(&["mutate", "-f", "-"], &integers);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let as_strings = run(&["mutate", "-f", "-"], &pod);
    assert_eq!(text(&out.stdout), text(&as_strings.stdout));

    // `env` written as a map instead of a list: the error names the user's line.
    let bad = integers.replace(
        "        - name: CUDA_TASK_PRIORITY\n          value: \"0\"\n",
        "        name: CUDA_TASK_PRIORITY\n",
    );
    let line = 1 + bad
        .lines()
        .position(|l| l == "        name: CUDA_TASK_PRIORITY")
        .unwrap();
    let out = run(&["mutate", "-f", "-"], &bad);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("at line {line} column")), "{err}");
    assert!(err.contains("spec.containers[0].env"), "{err}");
}

/// End to end through `hami-webhook review` (the server's decision code, the real binary): a
/// CREATE carrying the HAMi scheduler's annotations is answered with `remove` operations and a
/// warning; an UPDATE by a tenant that writes them is refused naming the key, the user and the
/// setting; the same UPDATE by HAMi's scheduler (and by a writer the settings add, through the
/// environment) is allowed.
#[test]
fn review_strips_scheduler_annotations_and_guards_their_updates() {
    use base64::Engine as _;
    let mut create: Value = serde_json::from_str(HAMI_POD_REVIEW).unwrap();
    let object = &mut create["request"]["object"];
    object["metadata"]["annotations"] = serde_json::json!({
        "hami.io/bind-phase": "allocating",
        "hami.io/vgpu-devices-to-allocate": "GPU-0,NVIDIA,81920,100:;"
    });
    object["spec"]["nodeName"] = serde_json::json!("gpu-0");
    let out = run(&["review"], &create.to_string());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["response"]["allowed"], true);
    let patch: Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(v["response"]["patch"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    let removes: Vec<&Value> = patch
        .as_array()
        .unwrap()
        .iter()
        .filter(|op| op["op"] == "remove")
        .collect();
    assert_eq!(
        removes,
        [
            &serde_json::json!({"op": "remove", "path": "/metadata/annotations/hami.io~1vgpu-devices-to-allocate"}),
            &serde_json::json!({"op": "remove", "path": "/metadata/annotations/hami.io~1bind-phase"}),
        ]
    );
    assert!(
        v["response"]["warnings"][0]
            .as_str()
            .unwrap()
            .starts_with("removed the HAMi scheduler's annotations hami.io/vgpu-devices-to-allocate, hami.io/bind-phase:")
    );

    let mut update = create.clone();
    update["request"]["operation"] = serde_json::json!("UPDATE");
    update["request"]["oldObject"] = HAMI_POD_REVIEW
        .parse::<Value>()
        .unwrap()
        .pointer("/request/object")
        .unwrap()
        .clone();
    let tenant = run(&["review"], &update.to_string());
    let v: Value = serde_json::from_slice(&tenant.stdout).unwrap();
    assert_eq!(v["response"]["allowed"], false);
    let message = v["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains(
            r#"this update by user "alice@example.com" adds annotation "hami.io/bind-phase""#
        ) && message.contains(
            "tenancy.schedulerAnnotationWriters (system:serviceaccount:kube-system:hami-scheduler)"
        ),
        "{message}"
    );
    update["request"]["userInfo"]["username"] =
        serde_json::json!("system:serviceaccount:kube-system:hami-scheduler");
    let v: Value = serde_json::from_slice(&run(&["review"], &update.to_string()).stdout).unwrap();
    assert_eq!(v["response"]["allowed"], true, "{v}");
    update["request"]["userInfo"]["username"] =
        serde_json::json!("system:serviceaccount:hami:plugin");
    let v: Value = serde_json::from_slice(&run(&["review"], &update.to_string()).stdout).unwrap();
    assert_eq!(v["response"]["allowed"], false, "not a writer by default");
    let out = Command::new(BIN)
        .arg("review")
        .env(
            "HAMI_TENANCY__SCHEDULERANNOTATIONWRITERS",
            "system:serviceaccount:kube-system:hami-scheduler,system:serviceaccount:hami:plugin",
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(update.to_string().as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["response"]["allowed"], true, "{v}");
}

/// Through the binary: a pod with `affinity`, a `hostPath` volume and a `downwardAPI` volume is
/// mutated, and mutate's own output read back changes nothing (a reinvoked webhook must be a no-op).
#[test]
fn mutate_reads_affinity_host_path_downward_api_and_its_own_output() {
    let pod = r#"apiVersion: v1
kind: Pod
metadata:
  name: cuda-job
  namespace: default
spec:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions:
              - {key: nvidia.com/gpu.product, operator: In, values: [NVIDIA-H100-80GB-HBM3]}
  containers:
    - name: cuda
      image: nvidia/cuda:12.4.1-base-ubuntu22.04
      resources:
        limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 3000}
      volumeMounts:
        - {name: data, mountPath: /data}
        - {name: podinfo, mountPath: /etc/podinfo}
  volumes:
    - name: data
      hostPath: {path: /srv/data, type: Directory}
    - name: podinfo
      downwardAPI:
        items:
          - {path: labels, fieldRef: {fieldPath: metadata.labels}}
"#;
    let out = run(&["mutate", "-f", "-"], pod);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let mutated: Value = serde_yaml_ng::from_slice(&out.stdout).unwrap();
    assert_eq!(mutated["spec"]["schedulerName"], "hami-scheduler");
    assert_eq!(
        mutated["spec"]["volumes"][0]["hostPath"]["path"], "/srv/data",
        "left as it was"
    );
    let again = run(&["mutate", "-f", "-"], &text(&out.stdout));
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    assert_eq!(text(&again.stdout), text(&out.stdout));
    assert!(
        text(&again.stderr).contains("unchanged: the webhook would admit this pod as is"),
        "{}",
        text(&again.stderr)
    );
    // The same pod as JSON (`kubectl get pod -o json`) reads the same.
    let json = serde_json::to_string(&mutated).unwrap();
    let from_json = run(&["mutate", "-f", "-"], &json);
    assert_eq!(text(&from_json.stdout), text(&out.stdout));
}

/// What is not one pod is refused by the binary with what was found.
#[test]
fn mutate_names_what_it_found_instead_of_one_pod() {
    let pod = POD_YAML.replace("value: \"3\"", "value: \"0\"");
    for (input, expected) in [
        (String::new(), "the input is empty"),
        (
            format!("{pod}---\n{pod}"),
            "holds 2 YAML documents (Pod, Pod)",
        ),
        (
            "apiVersion: v1\nkind: List\nitems: []\n".to_owned(),
            "is a List of 0 item(s), not a Pod",
        ),
        (
            pod.replace("apiVersion: v1", "apiVersion: v2"),
            r#"apiVersion "v2""#,
        ),
        (
            format!("{pod}metadata: {{}}\n"),
            "duplicate entry with key \"metadata\"",
        ),
    ] {
        let out = run(&["mutate", "-f", "-"], &input);
        assert_eq!(out.status.code(), Some(2), "{input}");
        let err = text(&out.stderr);
        assert!(err.starts_with("hami-webhook mutate: "), "{err}");
        assert!(err.contains(expected), "{expected} in {err}");
    }
}

/// Every pod of the tests' corpus: recorded AdmissionReviews (the webhook's and the benchmarks'
/// fixtures), the workspace tests' pods, the examples, YAML pods in the docs, this file's pod.
fn corpus() -> Vec<(String, Value)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut pods: Vec<(String, Value)> = Vec::new();
    let mut add = |label: String, value: Value| {
        let pod = if value["kind"] == "AdmissionReview" {
            value["request"]["object"].clone()
        } else {
            value
        };
        if pod["kind"] == "Pod" && !pods.iter().any(|(_, p)| *p == pod) {
            pods.push((label, pod));
        }
    };
    let mut sources = 0;
    for dir in [
        "webhook/tests/fixtures",
        "tests/fixtures",
        "bench/webhook/fixtures",
        "examples",
    ] {
        let mut files: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        for file in files {
            let name = file.strip_prefix(&root).unwrap().display().to_string();
            if name.ends_with(".json") {
                add(
                    name,
                    serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap(),
                );
                sources += 1;
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                let text = std::fs::read_to_string(&file).unwrap();
                for (i, doc) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
                    use serde::Deserialize as _;
                    add(format!("{name}#{i}"), Value::deserialize(doc).unwrap());
                }
                sources += 1;
            }
        }
    }
    // YAML pods in the docs: fenced blocks with `kind: Pod` at the top level.
    for dir in ["docs", "."] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let file = entry.unwrap().path();
            if file.extension().is_none_or(|e| e != "md") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let file = file.strip_prefix(&root).unwrap();
            for (i, block) in text.split("```yaml\n").skip(1).enumerate() {
                let block = block.split("```").next().unwrap();
                if block.lines().any(|l| l == "kind: Pod") {
                    let value: Value = serde_yaml_ng::from_str(block).unwrap_or_else(|e| {
                        panic!("{}: YAML block {i} with kind: Pod: {e}", file.display())
                    });
                    add(format!("{}#{i}", file.display()), value);
                }
            }
        }
    }
    add(
        "cli.rs POD_YAML".to_owned(),
        serde_yaml_ng::from_str(POD_YAML).unwrap(),
    );
    assert!(sources >= 10, "corpus files found: {sources}");
    pods
}

/// A small deterministic generator (splitmix64): the same cases on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap()
    }
}

/// `list` (an array under `parent`), created when absent.
fn push(parent: &mut Value, list: &str, item: Value) {
    if !parent[list].is_array() {
        parent[list] = serde_json::json!([]);
    }
    parent[list].as_array_mut().unwrap().push(item);
}

/// The first container, or the pod when it has none.
fn first_container(pod: &mut Value) -> &mut Value {
    if pod["spec"]["containers"][0].is_object() {
        &mut pod["spec"]["containers"][0]
    } else {
        push(
            &mut pod["spec"],
            "containers",
            serde_json::json!({"name": "added", "image": "busybox"}),
        );
        &mut pod["spec"]["containers"][0]
    }
}

/// One way a valid pod may differ from the corpus's: what the admission view keeps raw or
/// skips, what an API server adds, what a tenant may write. Each one is a pod the API server
/// accepts (ephemeral containers aside: those come by UPDATE of their subresource, and are here
/// because a reader must still skip them).
type Variation = fn(&mut Value, &mut Rng);

fn variations() -> Vec<(&'static str, Variation)> {
    use serde_json::json;
    vec![
        ("affinity", |pod, rng| {
            let values: Vec<String> = (0..=rng.below(4)).map(|i| format!("gpu-{i}")).collect();
            pod["spec"]["affinity"] = json!({
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": values}]},
                        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["cpu-0"]}]}
                    ]},
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}}
                    ]
                },
                "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "x"}}}}
                ]}
            });
        }),
        ("hostPath volume", |pod, _| {
            push(
                &mut pod["spec"],
                "volumes",
                json!({"name": "scratch-host", "hostPath": {"path": "/srv/scratch", "type": "DirectoryOrCreate"}}),
            );
            push(
                first_container(pod),
                "volumeMounts",
                json!({"name": "scratch-host", "mountPath": "/scratch", "readOnly": true}),
            );
        }),
        ("downwardAPI volume", |pod, _| {
            push(
                &mut pod["spec"],
                "volumes",
                json!({"name": "podinfo", "downwardAPI": {"defaultMode": 420, "items": [
                    {"path": "labels", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.labels"}},
                    {"path": "cpu", "resourceFieldRef": {"containerName": "x", "resource": "limits.cpu", "divisor": "1m"}}
                ]}}),
            );
            push(
                first_container(pod),
                "volumeMounts",
                json!({"name": "podinfo", "mountPath": "/etc/podinfo"}),
            );
        }),
        ("projected volume", |pod, _| {
            push(
                &mut pod["spec"],
                "volumes",
                json!({"name": "kube-api-access-x1", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
                ]}}),
            );
            push(
                first_container(pod),
                "volumeMounts",
                json!({"name": "kube-api-access-x1", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}),
            );
        }),
        ("other volumes", |pod, _| {
            for v in [
                json!({"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}),
                json!({"name": "claim", "persistentVolumeClaim": {"claimName": "data"}}),
                json!({"name": "eph", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}}),
                json!({"name": "csi", "csi": {"driver": "x.csi.k8s.io", "volumeAttributes": {"a": "b"}}}),
            ] {
                push(&mut pod["spec"], "volumes", v);
            }
        }),
        ("ephemeral container", |pod, _| {
            push(
                &mut pod["spec"],
                "ephemeralContainers",
                json!({"name": "debugger", "image": "busybox", "targetContainerName": "x", "resources": {"limits": {"cpu": 1}}}),
            );
        }),
        ("pod-level fields", |pod, _| {
            let spec = &mut pod["spec"];
            spec["tolerations"] =
                json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]);
            spec["topologySpreadConstraints"] = json!([{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"a": "b"}}}]);
            spec["securityContext"] = json!({"runAsUser": 1000, "fsGroup": 2000, "seccompProfile": {"type": "RuntimeDefault"}});
            spec["dnsConfig"] = json!({"options": [{"name": "ndots", "value": "2"}]});
            spec["hostAliases"] = json!([{"ip": "10.0.0.1", "hostnames": ["a", "b"]}]);
            spec["readinessGates"] = json!([{"conditionType": "x/ready"}]);
            spec["overhead"] = json!({"cpu": 0.25, "memory": "64Mi"});
            spec["priority"] = json!(0);
            spec["enableServiceLinks"] = json!(true);
            spec["os"] = json!({"name": "linux"});
            spec["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": "t"}]);
        }),
        ("container fields", |pod, _| {
            let c = first_container(pod);
            push(
                c,
                "env",
                json!({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}),
            );
            push(
                c,
                "env",
                json!({"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": 1}}}),
            );
            push(
                c,
                "env",
                json!({"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", "optional": true}}}),
            );
            push(
                c,
                "envFrom",
                json!({"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}),
            );
            c["ports"] = json!([{"containerPort": 8080, "protocol": "TCP", "name": "http"}]);
            c["livenessProbe"] =
                json!({"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 10});
            c["lifecycle"] = json!({"preStop": {"exec": {"command": ["sh", "-c", "sleep 1"]}}});
            c["securityContext"] =
                json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}});
            c["resizePolicy"] = json!([{"resourceName": "cpu", "restartPolicy": "NotRequired"}]);
        }),
        ("metadata and status", |pod, rng| {
            let meta = &mut pod["metadata"];
            if !meta["labels"].is_object() {
                meta["labels"] = json!({});
            }
            meta["labels"][format!("app.kubernetes.io/n{}", rng.below(100))] = json!("x");
            if !meta["annotations"].is_object() {
                meta["annotations"] = json!({});
            }
            meta["annotations"]["example.com/text"] =
                json!("\"quoted\" \\ ü 日本\nsecond line\ttab");
            meta["annotations"]["example.com/empty"] = json!("");
            meta["annotations"]["example.com/number-like"] = json!("0x1F");
            meta["ownerReferences"] = json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u", "controller": true}]);
            meta["finalizers"] = json!(["example.com/keep"]);
            meta["managedFields"] = json!([{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}]);
            meta["creationTimestamp"] = Value::Null;
            pod["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
        }),
        ("integer quantities", |pod, _| {
            for list in ["containers", "initContainers"] {
                if let Some(cs) = pod["spec"][list].as_array_mut() {
                    for c in cs {
                        for kind in ["limits", "requests"] {
                            if let Some(map) = c["resources"][kind].as_object_mut() {
                                for v in map.values_mut() {
                                    if let Some(n) = v.as_str().and_then(|s| s.parse::<u64>().ok())
                                    {
                                        *v = json!(n);
                                    }
                                }
                            }
                        }
                    }
                }
            }
            let c = first_container(pod);
            if !c["resources"].is_object() {
                c["resources"] = json!({});
            }
            if !c["resources"]["requests"].is_object() {
                c["resources"]["requests"] = json!({});
            }
            c["resources"]["requests"]["cpu"] = json!(0.5);
        }),
        ("CPU init container", |pod, _| {
            push(
                &mut pod["spec"],
                "initContainers",
                json!({
                    "name": "fetch", "image": "busybox", "command": ["true"],
                    "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
                    "volumeMounts": [{"name": "fetch-host", "mountPath": "/in"}]
                }),
            );
            push(
                &mut pod["spec"],
                "volumes",
                json!({"name": "fetch-host", "hostPath": {"path": "/srv/in"}}),
            );
        }),
        ("node selector", |pod, rng| {
            if !pod["spec"]["nodeSelector"].is_object() {
                pod["spec"]["nodeSelector"] = json!({});
            }
            pod["spec"]["nodeSelector"]["pool"] = json!(format!("gpu-{}", rng.below(3)));
        }),
        (
            "privileged first container (denied when it has a GPU)",
            |pod, _| {
                first_container(pod)["securityContext"] = json!({"privileged": true});
            },
        ),
        ("HAMi-core variable set by the pod", |pod, _| {
            push(
                first_container(pod),
                "env",
                json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "80g"}),
            );
        }),
        ("a field of the wrong shape (invalid for both)", |pod, _| {
            first_container(pod)["env"] = json!({"name": "X"});
        }),
    ]
}

/// Settings the corpus runs under: the defaults; a known per-GPU VRAM with the hostPath hook,
/// HAMi-core variables allowed in every corpus namespace; env delivery with `missingBasis: warn`.
fn corpus_settings() -> Vec<(&'static str, hami_webhook::Settings)> {
    use hami_webhook::policy::kai::{HookDelivery, KaiSettings, MissingBasis};
    let defaults = hami_webhook::Settings::default();
    let mut known = hami_webhook::Settings {
        kai: KaiSettings {
            per_gpu_vram_mib: Some(81_559),
            hook_delivery: HookDelivery::HostPath,
            ..KaiSettings::default()
        },
        ..hami_webhook::Settings::default()
    };
    known.tenancy.allow_hami_core_env_namespaces =
        ["default", "ml", "ml-team"].map(str::to_owned).to_vec();
    let env = hami_webhook::Settings {
        kai: KaiSettings {
            limit_delivery: hami_shared::values::LimitDelivery::Env,
            missing_basis: MissingBasis::Warn,
            ..KaiSettings::default()
        },
        ..hami_webhook::Settings::default()
    };
    vec![
        ("defaults", defaults),
        ("known VRAM", known),
        ("env delivery", env),
    ]
}

/// Offline equals online over the corpus: each pod as it is, with each variation, and with
/// generated combinations of them; under each of the corpus settings. The recorded reviews are
/// also answered from their own bytes, as the API server sent them.
#[test]
fn mutate_equals_review_for_every_corpus_pod_and_variation() {
    use hami_webhook::policy::basis::NoBasis;
    use offline_online::{Verdict, check_pod, online};
    let pods = corpus();
    assert!(pods.len() >= 9, "{} corpus pods", pods.len());
    let settings = corpus_settings();
    let variations = variations();
    let mut rng = Rng(0x5eed_0ff1_1e0e_0001);
    let (mut admitted, mut denied, mut invalid, mut recorded) = (0usize, 0usize, 0usize, 0usize);
    for (label, pod) in &pods {
        for (name, s) in &settings {
            // A recorded review's own bytes get the answer the rewrapped pod gets.
            let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(label);
            if label.ends_with(".json")
                && std::fs::read_to_string(&file).is_ok_and(|t| t.contains("\"AdmissionReview\""))
            {
                let body = std::fs::read(&file).unwrap();
                let object = offline_online::as_admitted(pod, None);
                assert_eq!(
                    online(&body, &object, s, &NoBasis),
                    check_pod(label, pod, s, &NoBasis),
                    "{label} under {name}: the recorded review and the rewrapped pod disagree"
                );
                recorded += 1;
            }
            // As it is, each variation alone, all the valid ones together, eight random sets.
            let mut cases: Vec<Vec<usize>> = vec![vec![]];
            cases.extend((0..variations.len()).map(|i| vec![i]));
            cases.push((0..variations.len() - 3).collect());
            for _ in 0..8 {
                cases.push(
                    (0..variations.len())
                        .filter(|_| rng.below(3) == 0)
                        .collect(),
                );
            }
            for picked in cases {
                let mut varied = pod.clone();
                let names: Vec<&str> = picked.iter().map(|&i| variations[i].0).collect();
                for &i in &picked {
                    (variations[i].1)(&mut varied, &mut rng);
                }
                let case = format!("{label} under {name} with {names:?}");
                match check_pod(&case, &varied, s, &NoBasis) {
                    Verdict::Admitted { .. } => admitted += 1,
                    Verdict::Denied(_) => denied += 1,
                    Verdict::Invalid => invalid += 1,
                }
            }
        }
    }
    // Each outcome is exercised, so that agreement on each is checked.
    eprintln!(
        "{} pods: {admitted} admitted, {denied} denied, {invalid} invalid",
        pods.len()
    );
    assert!(
        recorded >= 4 * 3,
        "{recorded} recorded reviews answered from their bytes"
    );
    assert!(
        admitted > 100 && denied > 20 && invalid > 20,
        "{admitted} admitted, {denied} denied, {invalid} invalid"
    );
}
