//! The `hami-webhook` binary's offline commands: `review` and `mutate`, and `--help`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_hami-webhook");
const HAMI_POD_REVIEW: &str = include_str!("fixtures/hami-pod.json");
const PLAIN_POD_REVIEW: &str = include_str!("fixtures/plain-pod.json");

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
