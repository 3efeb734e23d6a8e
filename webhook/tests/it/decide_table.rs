//! Table tests of the decision over recorded AdmissionReviews (defaulted pods as kube-apiserver
//! sends them). Every patch is applied with `json-patch` to the original object and the result must
//! deserialize into k8s-openapi's `Pod` with the expected environment; reviewing the patched pod
//! again must change nothing and warn about nothing.

use base64::Engine as _;
use hami_shared::values::CorePolicy;
use hami_webhook::policy::basis::NoBasis;
use hami_webhook::{Outcome, Settings, review};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::support::offline_online;

const HAMI_POD: &str = include_str!("../fixtures/hami-pod.json");
const PLAIN_POD: &str = include_str!("../fixtures/plain-pod.json");

fn fixture(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

/// Set `pointer` (under `request.object`) to `value`, creating nothing: the parent must exist.
fn set(review: &mut Value, pointer: &str, value: Value) {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let parent = review
        .pointer_mut(&format!("/request/object{parent}"))
        .unwrap_or_else(|| panic!("no {parent}"));
    match parent {
        Value::Object(map) => {
            map.insert(key.replace("~1", "/"), value);
        }
        Value::Array(items) => items[key.parse::<usize>().unwrap()] = value,
        _ => panic!("{parent} is not a container"),
    }
}

fn remove(review: &mut Value, pointer: &str) {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    review
        .pointer_mut(&format!("/request/object{parent}"))
        .unwrap()
        .as_object_mut()
        .unwrap()
        .remove(&key.replace("~1", "/"));
}

/// What one review answered, decoded.
#[derive(Debug)]
struct Answer {
    outcome: Outcome,
    response: Value,
    patch: Option<Value>,
    warnings: Vec<String>,
    message: Option<String>,
}

fn run(review_json: &Value, settings: &Settings) -> Answer {
    offline_online::check_review("decide_table", review_json, settings, &NoBasis);
    let body = serde_json::to_vec(review_json).unwrap();
    let reviewed = review(&body, settings, &NoBasis).unwrap();
    let out: Value = serde_json::from_slice(&reviewed.body).unwrap();
    let response = out["response"].clone();
    let patch = response["patch"].as_str().map(|b64| {
        assert_eq!(response["patchType"], "JSONPatch");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    });
    let warnings = response["warnings"]
        .as_array()
        .map(|w| w.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default();
    let message = response["status"]["message"].as_str().map(str::to_owned);
    Answer {
        outcome: reviewed.outcome,
        response,
        patch,
        warnings,
        message,
    }
}

/// Apply the answer's patch to the review's object; the result must be a valid Pod.
fn patched_pod(review_json: &Value, answer: &Answer) -> (Value, Pod) {
    let mut object = review_json["request"]["object"].clone();
    if let Some(patch) = &answer.patch {
        let patch: json_patch::Patch = serde_json::from_value(patch.clone()).unwrap();
        json_patch::patch(&mut object, &patch).unwrap();
    }
    let pod: Pod = serde_json::from_value(object.clone()).unwrap();
    (object, pod)
}

/// `name=value` pairs of a container's literal env.
fn env_of(pod: &Pod, init: bool, index: usize) -> Vec<(String, String)> {
    let spec = pod.spec.as_ref().unwrap();
    let c = if init {
        &spec.init_containers.as_ref().unwrap()[index]
    } else {
        &spec.containers[index]
    };
    c.env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

fn pair(k: &str, v: &str) -> (String, String) {
    (k.to_owned(), v.to_owned())
}

/// Allowed; the patched pod is valid; reviewing it again is a no-op without warnings.
fn allowed_and_idempotent(review_json: &Value, settings: &Settings) -> (Answer, Pod) {
    let answer = run(review_json, settings);
    assert!(
        matches!(answer.outcome, Outcome::Allowed | Outcome::Patched),
        "{answer:?}"
    );
    assert_eq!(answer.response["allowed"], true);
    assert_eq!(
        answer.response["uid"], review_json["request"]["uid"],
        "uid echoed"
    );
    let (object, pod) = patched_pod(review_json, &answer);
    let mut again = review_json.clone();
    again["request"]["object"] = object;
    let second = run(&again, settings);
    assert_eq!(
        second.outcome,
        Outcome::Allowed,
        "second review: {second:?}"
    );
    assert!(second.patch.is_none());
    assert!(second.warnings.is_empty(), "{:?}", second.warnings);
    (answer, pod)
}

fn denied(review_json: &Value, settings: &Settings) -> String {
    let answer = run(review_json, settings);
    assert_eq!(answer.outcome, Outcome::Denied, "{answer:?}");
    assert_eq!(answer.response["allowed"], false);
    assert_eq!(answer.response["status"]["code"], 403);
    assert!(answer.patch.is_none());
    answer.message.unwrap()
}

#[test]
fn plain_pod_needs_nothing() {
    let r = fixture(PLAIN_POD);
    let (answer, _) = allowed_and_idempotent(&r, &Settings::default());
    assert_eq!(answer.outcome, Outcome::Allowed);
    assert!(answer.patch.is_none() && answer.warnings.is_empty());
    assert!(answer.response.get("status").is_none());
}

#[test]
fn hami_pod_gets_priority_and_hami_scheduler() {
    let r = fixture(HAMI_POD);
    let (answer, pod) = allowed_and_idempotent(&r, &Settings::default());
    assert_eq!(answer.outcome, Outcome::Patched);
    assert_eq!(
        answer.patch.unwrap(),
        json!([
            {"op":"add","path":"/spec/schedulerName","value":"hami-scheduler"},
            {"op":"add","path":"/spec/containers/0/env/-","value":{"name":"CUDA_TASK_PRIORITY","value":"0"}}
        ])
    );
    assert_eq!(
        pod.spec.as_ref().unwrap().scheduler_name.as_deref(),
        Some("hami-scheduler")
    );
    assert_eq!(
        env_of(&pod, false, 0),
        vec![
            pair("PYTHONUNBUFFERED", "1"),
            pair("POD_NAME", ""),
            pair("CUDA_TASK_PRIORITY", "0")
        ]
    );
    assert!(
        env_of(&pod, false, 1).is_empty(),
        "non-GPU container untouched"
    );
    assert!(
        env_of(&pod, true, 0).is_empty(),
        "non-GPU init container untouched"
    );
}

#[test]
fn core_policy_goes_to_gpu_containers_only_and_creates_missing_env_arrays() {
    for policy in [CorePolicy::Force, CorePolicy::Disable] {
        let mut settings = Settings::default();
        settings.nvidia.gpu_core_policy = policy;
        let mut r = fixture(HAMI_POD);
        // A GPU init container without env, requesting only memory.
        set(
            &mut r,
            "/spec/initContainers/0/resources",
            json!({"limits":{"nvidia.com/gpumem":"1000"}}),
        );
        let (answer, pod) = allowed_and_idempotent(&r, &settings);
        let patch = answer.patch.unwrap();
        assert!(
            patch
                .as_array()
                .unwrap()
                .iter()
                .any(|op| op["path"] == "/spec/initContainers/0/env"),
            "{patch}"
        );
        assert_eq!(
            env_of(&pod, true, 0),
            vec![pair("GPU_CORE_UTILIZATION_POLICY", policy.as_str())]
        );
        assert_eq!(
            env_of(&pod, false, 0)[2..],
            [
                pair("CUDA_TASK_PRIORITY", "0"),
                pair("GPU_CORE_UTILIZATION_POLICY", policy.as_str())
            ]
        );
        assert!(env_of(&pod, false, 1).is_empty());
    }
}

#[test]
fn default_core_policy_sets_nothing() {
    let mut r = fixture(HAMI_POD);
    remove(
        &mut r,
        "/spec/containers/0/resources/limits/nvidia.com~1priority",
    );
    remove(
        &mut r,
        "/spec/containers/0/resources/requests/nvidia.com~1priority",
    );
    let (answer, pod) = allowed_and_idempotent(&r, &Settings::default());
    assert_eq!(
        answer.patch.unwrap(),
        json!([{"op":"add","path":"/spec/schedulerName","value":"hami-scheduler"}])
    );
    assert_eq!(env_of(&pod, false, 0).len(), 2);
}

/// Settings that let namespace `ml-team` set HAMi-core's variables (HAMi's behaviour).
fn allow_ml_team() -> Settings {
    let mut settings = Settings::default();
    settings.tenancy.allow_hami_core_env_namespaces = vec!["ml-team".to_owned()];
    settings
}

/// In a namespace of `tenancy.allowHamiCoreEnvNamespaces`, HAMi's behaviour: left as is.
#[test]
fn variables_the_container_sets_are_left_alone_with_a_warning() {
    let mut settings = allow_ml_team();
    settings.nvidia.gpu_core_policy = CorePolicy::Force;
    let mut r = fixture(HAMI_POD);
    set(
        &mut r,
        "/spec/containers/0/env",
        json!([
            {"name":"CUDA_TASK_PRIORITY","value":"5"},
            {"name":"GPU_CORE_UTILIZATION_POLICY","valueFrom":{"configMapKeyRef":{"name":"gpu","key":"policy"}}}
        ]),
    );
    let answer = run(&r, &settings);
    assert_eq!(
        answer.patch.unwrap(),
        json!([{"op":"add","path":"/spec/schedulerName","value":"hami-scheduler"}])
    );
    assert_eq!(
        answer.warnings,
        vec![
            r#"container "infer" already sets CUDA_TASK_PRIORITY to "5"; left as is (HAMi would set "0")"#,
            r#"container "infer" already sets GPU_CORE_UTILIZATION_POLICY from valueFrom; left as is (HAMi would set "force")"#,
        ]
    );
}

#[test]
fn same_value_already_set_is_silent() {
    let mut r = fixture(HAMI_POD);
    set(
        &mut r,
        "/spec/containers/0/env",
        json!([{"name":"CUDA_TASK_PRIORITY","value":"0"}]),
    );
    set(&mut r, "/spec/schedulerName", json!("hami-scheduler"));
    let answer = run(&r, &Settings::default());
    assert_eq!(answer.outcome, Outcome::Allowed);
    assert!(answer.warnings.is_empty());
}

#[test]
fn scheduler_rules() {
    // Empty or absent scheduler: retargeted.
    for name in [Some(""), None] {
        let mut r = fixture(HAMI_POD);
        match name {
            Some(n) => set(&mut r, "/spec/schedulerName", json!(n)),
            None => remove(&mut r, "/spec/schedulerName"),
        }
        let (_, pod) = allowed_and_idempotent(&r, &Settings::default());
        assert_eq!(
            pod.spec.unwrap().scheduler_name.as_deref(),
            Some("hami-scheduler")
        );
    }
    // Already the HAMi scheduler: env only.
    let mut r = fixture(HAMI_POD);
    set(&mut r, "/spec/schedulerName", json!("hami-scheduler"));
    let (answer, _) = allowed_and_idempotent(&r, &Settings::default());
    assert_eq!(answer.patch.unwrap().as_array().unwrap().len(), 1);
    // Another scheduler: not a HAMi pod, nothing at all (not even the privileged check).
    let mut r = fixture(HAMI_POD);
    set(&mut r, "/spec/schedulerName", json!("kai-scheduler"));
    set(
        &mut r,
        "/spec/containers/0/securityContext",
        json!({"privileged": true}),
    );
    let (answer, _) = allowed_and_idempotent(&r, &Settings::default());
    assert_eq!(answer.outcome, Outcome::Allowed);
    // A configured scheduler name.
    let settings = Settings {
        scheduler_name: "gpu-sched".to_owned(),
        ..Settings::default()
    };
    let (_, pod) = allowed_and_idempotent(&fixture(HAMI_POD), &settings);
    assert_eq!(
        pod.spec.unwrap().scheduler_name.as_deref(),
        Some("gpu-sched")
    );
}

#[test]
fn privileged_gpu_container_is_denied_or_warned() {
    let mut r = fixture(HAMI_POD);
    set(
        &mut r,
        "/spec/containers/0/securityContext",
        json!({"privileged": true}),
    );
    assert_eq!(
        denied(&r, &Settings::default()),
        r#"pod ml-team/infer-: container "infer" is privileged and requests nvidia.com/gpu: a privileged container sees every GPU on the node"#
    );
    let settings = Settings {
        deny_privileged_gpu_containers: false,
        ..Settings::default()
    };
    let answer = run(&r, &settings);
    assert_eq!(answer.outcome, Outcome::Patched);
    assert_eq!(answer.warnings.len(), 1);
    assert!(answer.warnings[0].ends_with("its GPU limits cannot be enforced"));
    // A privileged container without GPUs is none of our business.
    let mut r = fixture(HAMI_POD);
    set(
        &mut r,
        "/spec/containers/1/securityContext",
        json!({"privileged": true}),
    );
    assert_eq!(run(&r, &Settings::default()).outcome, Outcome::Patched);
}

/// Where the device plugin mounts the limits file and the preload list, a GPU container's own
/// mount would win (seen on a real node: `tests/tests/real_node/main.rs`): denied, paths cleaned.
#[test]
fn gpu_container_mounts_where_the_device_plugin_mounts_are_denied() {
    let mount = |path: &str| {
        let mut r = fixture(HAMI_POD);
        set(
            &mut r,
            "/spec/volumes",
            json!([{"name": "mine", "configMap": {"name": "mine"}}]),
        );
        set(
            &mut r,
            "/spec/containers/0/volumeMounts",
            json!([{"name": "mine", "mountPath": path, "subPath": "f"}]),
        );
        r
    };
    for (path, what) in [
        ("/overrideEnv", "the limits file"),
        ("/overrideEnv/", "the limits file"),
        ("/tmp/../overrideEnv", "the limits file"),
        (
            "/etc/ld.so.preload",
            "the preload list that loads HAMi-core",
        ),
        (
            "//etc/./ld.so.preload",
            "the preload list that loads HAMi-core",
        ),
    ] {
        let clean = if what == "the limits file" {
            "/overrideEnv"
        } else {
            "/etc/ld.so.preload"
        };
        assert_eq!(
            denied(&mount(path), &Settings::default()),
            format!(
                r#"pod ml-team/infer-: container "infer" mounts volume "mine" at {path:?} ({clean}), where the device plugin mounts {what} on allocation (at the same path as {clean}): the container's mount would replace or hide it; remove or move that mount"#
            )
        );
    }
    // A mount above a protected path hides it as surely as one at or below it: refused, naming it.
    assert!(denied(&mount("/etc"), &Settings::default()).contains("(above /etc/ld.so.preload)"));
    // Elsewhere.
    for path in ["/etc/config", "/overrideEnv.d", "/data/overrideEnv"] {
        assert_eq!(
            run(&mount(path), &Settings::default()).outcome,
            Outcome::Patched,
            "{path}"
        );
    }
    // CUDA_DISABLE_CONTROL=true turns the preload-list mount off: where the operator lets a
    // namespace set it, the container may bring its own; elsewhere the variable is refused.
    let mut r = mount("/etc/ld.so.preload");
    set(
        &mut r,
        "/spec/containers/0/env",
        json!([{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]),
    );
    assert_eq!(run(&r, &allow_ml_team()).outcome, Outcome::Patched);
    assert!(
        denied(&r, &Settings::default())
            .contains(r#"container "infer": env CUDA_DISABLE_CONTROL is set by the pod to "true""#)
    );
    // A container without GPUs is none of our business.
    let mut r = fixture(HAMI_POD);
    set(
        &mut r,
        "/spec/volumes",
        json!([{"name": "mine", "emptyDir": {}}]),
    );
    set(
        &mut r,
        "/spec/containers/1/volumeMounts",
        json!([{"name": "mine", "mountPath": "/overrideEnv"}]),
    );
    assert_eq!(run(&r, &Settings::default()).outcome, Outcome::Patched);
}

#[test]
fn priority_must_be_an_integer() {
    for bad in ["high", "1.5", "1k", "", " 1"] {
        let mut r = fixture(HAMI_POD);
        set(
            &mut r,
            "/spec/containers/0/resources/limits/nvidia.com~1priority",
            json!(bad),
        );
        assert_eq!(
            denied(&r, &Settings::default()),
            format!(
                "pod ml-team/infer-: container \"infer\": limit nvidia.com/priority={bad:?} is not an integer"
            )
        );
    }
}

#[test]
fn limit_delivery_annotation() {
    for ok in ["env", "file"] {
        let mut r = fixture(PLAIN_POD);
        set(
            &mut r,
            "/metadata/annotations",
            json!({"hami.io/limit-delivery": ok}),
        );
        let (answer, _) = allowed_and_idempotent(&r, &Settings::default());
        assert_eq!(answer.outcome, Outcome::Allowed);
    }
    for bad in ["FILE", "Env", " env", "file ", "", "files", "env,file"] {
        let mut r = fixture(PLAIN_POD);
        set(
            &mut r,
            "/metadata/annotations",
            json!({"hami.io/limit-delivery": bad}),
        );
        assert_eq!(
            denied(&r, &Settings::default()),
            format!(
                "pod ml-team/train-: annotation hami.io/limit-delivery={bad:?} is not one of: env, file"
            )
        );
    }
    // A named pod is named; the HAMi pod is denied before any mutation.
    let mut r = fixture(HAMI_POD);
    set(&mut r, "/metadata/name", json!("infer-0"));
    set(
        &mut r,
        "/metadata/annotations",
        json!({"hami.io/limit-delivery": "FILE"}),
    );
    assert_eq!(
        denied(&r, &Settings::default()),
        r#"pod ml-team/infer-0: annotation hami.io/limit-delivery="FILE" is not one of: env, file"#
    );
}

#[test]
fn configured_resource_names_select_gpu_containers() {
    let mut settings = Settings::default();
    settings.nvidia.resource_count_name = "example.com/vgpu".to_owned();
    settings.nvidia.resource_priority_name = "example.com/prio".to_owned();
    // The default names no longer count.
    let (answer, _) = allowed_and_idempotent(&fixture(HAMI_POD), &settings);
    assert_eq!(answer.outcome, Outcome::Patched, "gpumem still counts");
    let mut r = fixture(PLAIN_POD);
    set(
        &mut r,
        "/spec/containers/0/resources/limits",
        json!({"example.com/vgpu":"1","example.com/prio":"1"}),
    );
    let (_, pod) = allowed_and_idempotent(&r, &settings);
    assert_eq!(
        env_of(&pod, false, 0)[2..],
        [pair("CUDA_TASK_PRIORITY", "1")]
    );
}

#[test]
fn pods_without_annotations_volumes_or_env_arrays() {
    let mut settings = Settings::default();
    settings.nvidia.gpu_core_policy = CorePolicy::Disable;
    let mut r = fixture(HAMI_POD);
    remove(&mut r, "/metadata/annotations");
    remove(&mut r, "/spec/volumes");
    remove(&mut r, "/spec/containers/0/env");
    remove(&mut r, "/spec/containers/0/volumeMounts");
    remove(&mut r, "/spec/initContainers/0/volumeMounts");
    remove(&mut r, "/spec/containers/1/volumeMounts");
    let (_, pod) = allowed_and_idempotent(&r, &settings);
    assert_eq!(
        env_of(&pod, false, 0),
        vec![
            pair("CUDA_TASK_PRIORITY", "0"),
            pair("GPU_CORE_UTILIZATION_POLICY", "disable")
        ]
    );
}

#[test]
fn operations_and_kinds_other_than_pod_create_are_allowed_unchanged() {
    for op in ["UPDATE", "DELETE", "CONNECT"] {
        let mut r = fixture(HAMI_POD);
        r["request"]["operation"] = json!(op);
        match op {
            "DELETE" => r["request"]["oldObject"] = r["request"]["object"].take(),
            // An UPDATE that does not touch the owned annotations: allowed, never patched.
            "UPDATE" => r["request"]["oldObject"] = r["request"]["object"].clone(),
            _ => {}
        }
        let answer = run(&r, &Settings::default());
        assert_eq!(answer.outcome, Outcome::Allowed, "{op}");
    }
    let mut r = fixture(HAMI_POD);
    r["request"]["kind"] = json!({"group":"apps","version":"v1","kind":"Deployment"});
    assert_eq!(run(&r, &Settings::default()).outcome, Outcome::Allowed);
}

#[test]
fn update_without_both_objects_is_invalid() {
    for missing in ["object", "oldObject"] {
        let mut r = fixture(HAMI_POD);
        r["request"]["operation"] = json!("UPDATE");
        r["request"]["oldObject"] = r["request"]["object"].clone();
        r["request"][missing] = Value::Null;
        let answer = run(&r, &Settings::default());
        assert_eq!(answer.outcome, Outcome::Invalid, "{missing}");
        assert!(answer.message.unwrap().contains("required for UPDATE"));
    }
}

#[test]
fn create_without_object_is_invalid() {
    let mut r = fixture(PLAIN_POD);
    r["request"]["object"] = Value::Null;
    let answer = run(&r, &Settings::default());
    assert_eq!(answer.outcome, Outcome::Invalid);
    assert_eq!(answer.response["allowed"], false);
    assert_eq!(answer.response["status"]["code"], 400);
    assert_eq!(
        answer.response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002",
        "invalid answers still carry the uid"
    );
    assert!(
        answer
            .message
            .unwrap()
            .contains("request.object is missing")
    );
}

#[test]
fn v1beta1_is_answered_in_v1beta1() {
    let mut r = fixture(HAMI_POD);
    r["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let body = serde_json::to_vec(&r).unwrap();
    let out: Value =
        serde_json::from_slice(&review(&body, &Settings::default(), &NoBasis).unwrap().body)
            .unwrap();
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(out["kind"], "AdmissionReview");
    assert_eq!(out["response"]["allowed"], true);
}

#[test]
fn malformed_reviews() {
    let s = Settings::default();
    // Not JSON: a body error (HTTP 400), not a review.
    for body in [&b""[..], b"   ", b"not json", b"{\"kind\":", b"{\"a\":1}}"] {
        assert!(
            review(body, &s, &NoBasis).is_err(),
            "{:?}",
            String::from_utf8_lossy(body)
        );
    }
    // JSON without a usable request: an invalid review.
    let cases: [(&str, &str); 6] = [
        ("{}", "kind"),
        ("[1,2]", "invalid AdmissionReview"),
        (
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
            "no request",
        ),
        (
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE","object":{}}}"#,
            "request.uid is missing",
        ),
        (
            r#"{"apiVersion":"admission.k8s.io/v2","kind":"AdmissionReview","request":{"uid":"u"}}"#,
            "apiVersion",
        ),
        (
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE","object":{"spec":{"containers":"x"}}}}"#,
            "invalid AdmissionReview",
        ),
    ];
    for (body, needle) in cases {
        let reviewed = review(body.as_bytes(), &s, &NoBasis).unwrap();
        assert_eq!(reviewed.outcome, Outcome::Invalid, "{body}");
        let out: Value = serde_json::from_slice(&reviewed.body).unwrap();
        assert_eq!(out["response"]["allowed"], false);
        let message = out["response"]["status"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{body}: {message}");
    }
    // The uid survives an object of the wrong shape.
    let body = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","operation":"CREATE","object":{"spec":{"containers":"x"}}}}"#;
    let out: Value =
        serde_json::from_slice(&review(body.as_bytes(), &s, &NoBasis).unwrap().body).unwrap();
    assert_eq!(out["response"]["uid"], "u-1");
}
