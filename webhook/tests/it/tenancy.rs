//! What a tenant's pod may not do, through whole AdmissionReviews (`hami_webhook::review`): every
//! route by which a pod spec could set HAMi-core's variables (direct, `valueFrom`, `envFrom`,
//! init containers, the KAI target container, KAI's own entries after KAI's admission), each
//! escape hatch on and off, the HAMi scheduler's annotations removed on CREATE (idempotent on
//! reinvocation) and written on UPDATE only by the identities the operator names.

use base64::Engine as _;
use hami_shared::values::CorePolicy;
use hami_webhook::policy::basis::NoBasis;
use hami_webhook::{Outcome, Settings, review};
use serde_json::{Value, json};

use crate::support::offline_online;

const NS: &str = "tenant-a";
const SCHEDULER: &str = "system:serviceaccount:kube-system:hami-scheduler";

/// An AdmissionReview of `operation` on `object` (and `old` for UPDATE) sent by `user`.
fn review_of(operation: &str, object: &Value, old: Option<&Value>, user: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0f0e0d0c-0000-4000-8000-000000000031",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": NS,
            "operation": operation,
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old,
        }
    })
}

/// What one review answered.
#[derive(Debug)]
struct Answer {
    outcome: Outcome,
    patch: Vec<Value>,
    warnings: Vec<String>,
    message: String,
}

fn run(review_json: &Value, settings: &Settings) -> Answer {
    offline_online::check_review("tenancy", review_json, settings, &NoBasis);
    let body = serde_json::to_vec(review_json).unwrap();
    let reviewed = review(&body, settings, &NoBasis).unwrap();
    let out: Value = serde_json::from_slice(&reviewed.body).unwrap();
    let response = &out["response"];
    assert_eq!(response["uid"], review_json["request"]["uid"]);
    let patch = response["patch"]
        .as_str()
        .map(|b64| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap();
            serde_json::from_slice(&bytes).unwrap()
        })
        .unwrap_or_default();
    let warnings = response["warnings"]
        .as_array()
        .map(|w| w.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default();
    Answer {
        outcome: reviewed.outcome,
        patch,
        warnings,
        message: response["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    }
}

fn create(pod: &Value, settings: &Settings) -> Answer {
    run(&review_of("CREATE", pod, None, "alice"), settings)
}

/// CREATE, the patch applied, the patched pod reviewed again (a reinvocation): returns the first
/// answer and the patched pod; the second review must change nothing.
fn create_twice(pod: &Value, settings: &Settings) -> (Answer, Value) {
    let first = create(pod, settings);
    assert!(
        matches!(first.outcome, Outcome::Allowed | Outcome::Patched),
        "{first:?}"
    );
    let mut doc = pod.clone();
    let patch: json_patch::Patch =
        serde_json::from_value(Value::from(first.patch.clone())).unwrap();
    json_patch::patch(&mut doc, &patch).unwrap();
    let _: k8s_openapi::api::core::v1::Pod = serde_json::from_value(doc.clone()).unwrap();
    let second = create(&doc, settings);
    assert_eq!(second.outcome, Outcome::Allowed, "reinvocation: {second:?}");
    (first, doc)
}

fn denial(pod: &Value, settings: &Settings) -> String {
    let a = create(pod, settings);
    assert_eq!(a.outcome, Outcome::Denied, "not denied: {pod}");
    assert!(a.patch.is_empty());
    a.message
}

/// Namespace `tenant-a` in `tenancy.allowHamiCoreEnvNamespaces`.
fn allowing() -> Settings {
    let mut s = Settings::default();
    s.tenancy.allow_hami_core_env_namespaces = vec![NS.to_owned()];
    s
}

/// A HAMi pod: `main` gets a GPU (priority 0), `side` none; `init` gets a GPU too.
fn hami_pod(main: Value, init: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train-1", "namespace": NS},
        "spec": {
            "initContainers": [merge(json!({"name": "init", "image": "x",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}), init)],
            "containers": [
                merge(json!({"name": "main", "image": "x",
                    "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/priority": "0"}}}), main),
                {"name": "side", "image": "x",
                    "env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80g"}],
                    "envFrom": [{"configMapRef": {"name": "app"}}]}
            ]
        }
    })
}

fn merge(mut base: Value, extra: Value) -> Value {
    if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    base
}

fn env(entries: Value) -> Value {
    json!({"env": entries})
}

#[test]
fn hami_gpu_containers_may_not_set_hami_core_variables() {
    let literal = |name: &str, value: &str| env(json!([{"name": name, "value": value}]));
    let from_cm = |name: &str| {
        env(json!([{"name": name, "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}]))
    };
    // (where, main's extra fields, init's extra fields, fragment of the denial)
    let cases: Vec<(&str, Value, Value, &str)> = vec![
        (
            "direct memory",
            literal("CUDA_DEVICE_MEMORY_LIMIT_0", "80g"),
            json!({}),
            r#"container "main": env CUDA_DEVICE_MEMORY_LIMIT_0 is set by the pod to "80g""#,
        ),
        (
            "direct global memory",
            literal("CUDA_DEVICE_MEMORY_LIMIT", "1000g"),
            json!({}),
            r#"env CUDA_DEVICE_MEMORY_LIMIT is set by the pod to "1000g""#,
        ),
        (
            "index HAMi-core does not read",
            literal("CUDA_DEVICE_MEMORY_LIMIT_99", "1m"),
            json!({}),
            "env CUDA_DEVICE_MEMORY_LIMIT_99",
        ),
        (
            "sm",
            literal("CUDA_DEVICE_SM_LIMIT", "100"),
            json!({}),
            "env CUDA_DEVICE_SM_LIMIT",
        ),
        (
            "sm per device",
            literal("CUDA_DEVICE_SM_LIMIT_0", "0"),
            json!({}),
            "env CUDA_DEVICE_SM_LIMIT_0",
        ),
        (
            "shared cache",
            literal("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/mine"),
            json!({}),
            "env CUDA_DEVICE_MEMORY_SHARED_CACHE",
        ),
        (
            "oversubscribe",
            literal("CUDA_OVERSUBSCRIBE", "true"),
            json!({}),
            "env CUDA_OVERSUBSCRIBE",
        ),
        (
            "log level",
            literal("LIBCUDA_LOG_LEVEL", "4"),
            json!({}),
            "env LIBCUDA_LOG_LEVEL",
        ),
        (
            "hostpid",
            literal("LIBVGPU_HOSTPID_BROKER", "1"),
            json!({}),
            "env LIBVGPU_HOSTPID_BROKER",
        ),
        (
            "disable control",
            literal("CUDA_DISABLE_CONTROL", "true"),
            json!({}),
            r#"env CUDA_DISABLE_CONTROL is set by the pod to "true""#,
        ),
        (
            "redirect",
            literal("CUDA_REDIRECT", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            json!({}),
            "env CUDA_REDIRECT",
        ),
        (
            "oom killer",
            literal("ACTIVE_OOM_KILLER", "false"),
            json!({}),
            "env ACTIVE_OOM_KILLER",
        ),
        (
            "kernel interval",
            literal("RECORD_KERNEL_INTERVAL", "100000"),
            json!({}),
            "env RECORD_KERNEL_INTERVAL",
        ),
        (
            "valueFrom",
            from_cm("CUDA_DEVICE_MEMORY_LIMIT_0"),
            json!({}),
            "env CUDA_DEVICE_MEMORY_LIMIT_0 is set by the pod with valueFrom",
        ),
        (
            "valueFrom disable",
            from_cm("CUDA_DISABLE_CONTROL"),
            json!({}),
            "env CUDA_DISABLE_CONTROL is set by the pod with valueFrom",
        ),
        (
            "empty name value (valueless entry)",
            env(json!([{"name": "CUDA_DEVICE_SM_LIMIT"}])),
            json!({}),
            r#"env CUDA_DEVICE_SM_LIMIT is set by the pod to """#,
        ),
        (
            "other priority",
            literal("CUDA_TASK_PRIORITY", "-5"),
            json!({}),
            r#"env CUDA_TASK_PRIORITY is set by the pod to "-5"; hami-limits sets "0" (from limit nvidia.com/priority=0)"#,
        ),
        (
            "priority from valueFrom",
            from_cm("CUDA_TASK_PRIORITY"),
            json!({}),
            "env CUDA_TASK_PRIORITY is set by the pod with valueFrom",
        ),
        (
            "policy with none set",
            literal("GPU_CORE_UTILIZATION_POLICY", "disable"),
            json!({}),
            r#"env GPU_CORE_UTILIZATION_POLICY is set by the pod to "disable"; hami-limits sets none here"#,
        ),
        (
            "the last of duplicates is ours, an earlier one is not",
            env(
                json!([{"name": "CUDA_TASK_PRIORITY", "value": "9"}, {"name": "CUDA_TASK_PRIORITY", "value": "0"}]),
            ),
            json!({}),
            r#"CUDA_TASK_PRIORITY is set by the pod to "9""#,
        ),
        (
            "envFrom configMap, no prefix",
            json!({"envFrom": [{"configMapRef": {"name": "app"}}]}),
            json!({}),
            r#"container "main": envFrom configMapRef "app" with prefix "" could set HAMi-core's variables (e.g. CUDA_DEVICE_MEMORY_LIMIT)"#,
        ),
        (
            "envFrom secret, empty prefix",
            json!({"envFrom": [{"prefix": "", "secretRef": {"name": "creds"}}]}),
            json!({}),
            r#"envFrom secretRef "creds" with prefix """#,
        ),
        (
            "envFrom prefix CUDA_",
            json!({"envFrom": [{"prefix": "CUDA_", "configMapRef": {"name": "app"}}]}),
            json!({}),
            r#"with prefix "CUDA_" could set"#,
        ),
        (
            "envFrom prefix inside a family",
            json!({"envFrom": [{"prefix": "CUDA_DEVICE_MEMORY_LIMIT_1", "configMapRef": {"name": "app"}}]}),
            json!({}),
            "(e.g. CUDA_DEVICE_MEMORY_LIMIT_0)",
        ),
        (
            "envFrom shaped like KAI's in a HAMi pod",
            json!({"envFrom": [{"configMapRef": {"name": "x-0-evar"}}]}),
            json!({}),
            r#"envFrom configMapRef "x-0-evar""#,
        ),
        (
            "init container",
            json!({}),
            literal("CUDA_DEVICE_MEMORY_LIMIT", "1000g"),
            r#"container "init": env CUDA_DEVICE_MEMORY_LIMIT is set by the pod"#,
        ),
        (
            "init container envFrom",
            json!({}),
            json!({"envFrom": [{"secretRef": {"name": "s"}}]}),
            r#"container "init": envFrom secretRef "s""#,
        ),
    ];
    for (what, main, init, fragment) in &cases {
        let pod = hami_pod(main.clone(), init.clone());
        let message = denial(&pod, &Settings::default());
        assert!(
            message.starts_with("pod tenant-a/train-1: "),
            "{what}: {message}"
        );
        assert!(message.contains(fragment), "{what}: {message}");
        assert!(
            message.ends_with("allow it in this namespace with tenancy.allowHamiCoreEnvNamespaces"),
            "{what}: {message}"
        );
        // The escape hatch: HAMi's behaviour in that namespace (left as is, at most a warning).
        let a = create(&pod, &allowing());
        assert_eq!(a.outcome, Outcome::Patched, "{what}: {a:?}");
        // Another namespace on the list does not help this one.
        let mut other = Settings::default();
        other.tenancy.allow_hami_core_env_namespaces = vec!["tenant-b".to_owned()];
        assert_eq!(create(&pod, &other).outcome, Outcome::Denied, "{what}");
    }
}

#[test]
fn what_gpu_containers_may_still_set() {
    let mut force = Settings::default();
    force.nvidia.gpu_core_policy = CorePolicy::Force;
    let cases: Vec<(&str, Value, &Settings)> = vec![
        ("nothing", json!({}), &force),
        (
            "the webhook's own priority",
            env(json!([{"name": "CUDA_TASK_PRIORITY", "value": "0"}])),
            &force,
        ),
        (
            "the webhook's own policy",
            env(json!([{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}])),
            &force,
        ),
        (
            "unrelated variables",
            env(json!([{"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
            {"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "cuda_device_memory_limit", "value": "1"}])),
            &force,
        ),
        (
            "envFrom with a safe prefix",
            json!({"envFrom": [{"prefix": "APP_", "configMapRef": {"name": "app"}},
            {"prefix": "CUDA_REDIRECT", "secretRef": {"name": "s"}}]}),
            &force,
        ),
    ];
    for (what, main, settings) in cases {
        // `side` (no GPU) sets a memory limit and an envFrom: none of our business.
        let pod = hami_pod(main, json!({}));
        let (first, doc) = create_twice(&pod, settings);
        assert!(first.warnings.is_empty(), "{what}: {:?}", first.warnings);
        assert_eq!(doc["spec"]["schedulerName"], "hami-scheduler", "{what}");
    }
}

/// A KAI `gpu-memory` pod; `train` is the fraction container (it gets HAMi-core), `side` not.
fn kai_pod(train: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "kai-1", "namespace": NS, "annotations": {"gpu-memory": "3000"}},
        "spec": {
            "schedulerName": "kai-scheduler",
            "containers": [
                merge(json!({"name": "train", "image": "x"}), train),
                {"name": "side", "image": "x", "env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "1000g"}]}
            ]
        }
    })
}

#[test]
fn kai_target_containers_may_not_set_hami_core_variables() {
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "own limit",
            env(json!([{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "1000g"}])),
            r#"container "train": env CUDA_DEVICE_MEMORY_LIMIT_0 is set by the pod to "1000g""#,
        ),
        (
            "another global limit",
            env(json!([{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "2999m"}])),
            r#"env CUDA_DEVICE_MEMORY_LIMIT is set by the pod to "2999m""#,
        ),
        (
            "limit from a ConfigMap that is not KAI's",
            env(
                json!([{"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"configMapKeyRef": {"name": "mine", "key": "k"}}}]),
            ),
            "env CUDA_DEVICE_MEMORY_LIMIT is set by the pod with valueFrom",
        ),
        (
            "priority",
            env(json!([{"name": "CUDA_TASK_PRIORITY", "value": "0"}])),
            r#"env CUDA_TASK_PRIORITY is set by the pod to "0"; hami-limits sets none here"#,
        ),
        (
            "policy",
            env(json!([{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "disable"}])),
            "env GPU_CORE_UTILIZATION_POLICY",
        ),
        (
            "disable control",
            env(json!([{"name": "CUDA_DISABLE_CONTROL", "value": "1"}])),
            "env CUDA_DISABLE_CONTROL",
        ),
        (
            "envFrom",
            json!({"envFrom": [{"configMapRef": {"name": "app"}}]}),
            r#"envFrom configMapRef "app""#,
        ),
    ];
    for (what, train, fragment) in &cases {
        let message = denial(&kai_pod(train.clone()), &Settings::default());
        assert!(
            message.starts_with("pod tenant-a/kai-1: "),
            "{what}: {message}"
        );
        assert!(message.contains(fragment), "{what}: {message}");
        assert!(
            message.contains("tenancy.allowHamiCoreEnvNamespaces"),
            "{what}: {message}"
        );
        assert_eq!(
            create(&kai_pod(train.clone()), &allowing()).outcome,
            Outcome::Patched,
            "{what}"
        );
    }
    // Every container is a target with `preloadContainers: all`: `side`'s own limit is refused too.
    let mut all = Settings::default();
    all.kai.preload_containers = hami_webhook::policy::kai::PreloadContainers::All;
    assert!(
        denial(&kai_pod(json!({})), &all)
            .contains(r#"container "side": env CUDA_DEVICE_MEMORY_LIMIT"#)
    );
    // A pod with nothing of its own in the target: capped, and the reinvocation is a no-op.
    let (first, doc) = create_twice(&kai_pod(json!({})), &Settings::default());
    assert_eq!(
        doc["spec"]["containers"][0]["env"][0],
        json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "3000m"})
    );
    // `side` is no target: KAI gives it no GPU and it gets no HAMi-core, so its own variable caps
    // nothing and is neither judged nor warned about.
    assert!(first.warnings.is_empty(), "{:?}", first.warnings);
    assert!(
        doc["spec"]["containers"][1]["env"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["value"] == "1000g")
    );
}

/// What KAI v0.17's admission does to the fraction container after our first review (REFERENCE.md,
/// "KAI v0.17 for real"): `runai/shared-gpu-configmap`, its env from ConfigMap `<prefix>-0`, the
/// `envFrom` `<prefix>-0-evar`, and (`hamicore` on) our `CUDA_DEVICE_MEMORY_LIMIT` replaced by its
/// own from `valueFrom.configMapKeyRef`.
fn as_kai_admission_leaves_it(mut doc: Value, hamicore: bool) -> Value {
    let prefix = "kai-1-abcdefg-shared-gpu";
    doc["metadata"]["annotations"]["runai/shared-gpu-configmap"] = json!(prefix);
    let c = &mut doc["spec"]["containers"][0];
    let mut env: Vec<Value> = c["env"].as_array().cloned().unwrap_or_default();
    if hamicore {
        env.retain(|e| e["name"] != "CUDA_DEVICE_MEMORY_LIMIT");
    }
    for name in ["NVIDIA_VISIBLE_DEVICES", "RUNAI_NUM_OF_GPUS", "GPU_PORTION"] {
        env.push(json!({"name": name, "valueFrom": {"configMapKeyRef": {"name": format!("{prefix}-0"), "key": name}}}));
    }
    if hamicore {
        env.push(
            json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"configMapKeyRef":
            {"name": format!("{prefix}-0"), "key": "CUDA_DEVICE_MEMORY_LIMIT", "optional": true}}}),
        );
    }
    c["env"] = Value::from(env);
    c["envFrom"] =
        json!([{"configMapRef": {"name": format!("{prefix}-0-evar"), "optional": false}}]);
    let mut volumes = doc["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    volumes.push(
        json!({"name": format!("{prefix}-0-vol"), "configMap": {"name": format!("{prefix}-0")}}),
    );
    doc["spec"]["volumes"] = Value::from(volumes);
    doc
}

#[test]
fn a_kai_mutated_pod_on_reinvocation_keeps_its_limits_file_and_changes_nothing() {
    for hamicore in [false, true] {
        let settings = Settings::default();
        let (first, doc) = create_twice(&kai_pod(json!({})), &settings);
        let file = doc["metadata"]["annotations"]["limits.hami.io/train"].clone();
        assert!(
            file.as_str()
                .unwrap()
                .contains("CUDA_DEVICE_MEMORY_LIMIT=3000m"),
            "{file}"
        );
        let after_kai = as_kai_admission_leaves_it(doc, hamicore);
        let again = run(&review_of("CREATE", &after_kai, None, "alice"), &settings);
        assert_eq!(
            again.outcome,
            Outcome::Allowed,
            "hamicore={hamicore}: {again:?}"
        );
        assert_eq!(again.warnings, first.warnings, "hamicore={hamicore}");
        // Shapes that only look like KAI's are the pod's own, and refused.
        let mut forged = as_kai_admission_leaves_it(kai_pod(json!({})), true);
        forged["spec"]["containers"][0]["envFrom"][0]["prefix"] = json!("");
        forged["spec"]["containers"][0]["envFrom"]
            .as_array_mut()
            .unwrap()
            .push(json!({"configMapRef": {"name": "kai-1-abcdefg-shared-gpu-1-evar"}}));
        assert!(
            denial(&forged, &settings)
                .contains(r#"envFrom configMapRef "kai-1-abcdefg-shared-gpu-1-evar""#)
        );
        let mut prefixed = as_kai_admission_leaves_it(kai_pod(json!({})), true);
        prefixed["spec"]["containers"][0]["envFrom"][0]["prefix"] = json!("CUDA_");
        assert!(denial(&prefixed, &settings).contains(r#"with prefix "CUDA_""#));
        let mut other_cm = as_kai_admission_leaves_it(kai_pod(json!({})), true);
        let last = other_cm["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .len()
            - 1;
        other_cm["spec"]["containers"][0]["env"][last]["valueFrom"]["configMapKeyRef"]["name"] =
            json!("kai-1-abcdefg-shared-gpu-1");
        assert!(
            denial(&other_cm, &settings)
                .contains("env CUDA_DEVICE_MEMORY_LIMIT is set by the pod with valueFrom")
        );
    }
}

#[test]
fn kai_opt_outs_by_the_pod_are_the_operators() {
    let mut pod = kai_pod(json!({}));
    pod["metadata"]["annotations"]["kai-resource-isolator.io/inject"] = json!("false");
    let a = create(&pod, &Settings::default());
    assert_eq!(a.outcome, Outcome::Patched);
    assert!(
        a.warnings
            .iter()
            .any(|w| w.contains("is ignored") && w.contains("tenancy.kaiOptOutNamespaces")),
        "{:?}",
        a.warnings
    );
    let mut honoured = Settings::default();
    honoured.tenancy.kai_opt_out_namespaces = vec![NS.to_owned()];
    let a = create(&pod, &honoured);
    assert_eq!(a.outcome, Outcome::Allowed, "{a:?}");
}

#[test]
fn env_delivery_is_refused_where_the_operator_forbids_it() {
    let mut forbid = Settings::default();
    forbid.tenancy.forbid_env_delivery_namespaces = vec![NS.to_owned()];
    for pod in [hami_pod(json!({}), json!({})), kai_pod(json!({}))] {
        let mut env_pod = pod.clone();
        env_pod["metadata"]["annotations"]["hami.io/limit-delivery"] = json!("env");
        assert_eq!(
            denial(&env_pod, &forbid),
            format!(
                "pod tenant-a/{}: annotation hami.io/limit-delivery=\"env\" is not allowed in namespace \"tenant-a\" (tenancy.forbidEnvDeliveryNamespaces): there every process of a GPU container is capped through the limits file; remove the annotation or set it to \"file\"",
                pod["metadata"]["name"].as_str().unwrap()
            )
        );
        // Honoured by default, and `file` everywhere.
        assert_ne!(
            create(&env_pod, &Settings::default()).outcome,
            Outcome::Denied
        );
        let mut file_pod = pod.clone();
        file_pod["metadata"]["annotations"]["hami.io/limit-delivery"] = json!("file");
        assert_ne!(create(&file_pod, &forbid).outcome, Outcome::Denied);
    }
    // UPDATE: a change to env is refused there; a pod admitted with env keeps it.
    let with = |v: Option<&str>| {
        let mut p = hami_pod(json!({}), json!({}));
        if let Some(v) = v {
            p["metadata"]["annotations"] = json!({"hami.io/limit-delivery": v});
        }
        p
    };
    let update = |old: Option<&str>, new: Option<&str>, s: &Settings| {
        run(
            &review_of("UPDATE", &with(new), Some(&with(old)), "alice"),
            s,
        )
    };
    assert_eq!(update(None, Some("env"), &forbid).outcome, Outcome::Denied);
    assert_eq!(
        update(Some("file"), Some("env"), &forbid).outcome,
        Outcome::Denied
    );
    assert_eq!(
        update(Some("env"), Some("env"), &forbid).outcome,
        Outcome::Allowed
    );
    assert_eq!(
        update(Some("env"), Some("file"), &forbid).outcome,
        Outcome::Allowed
    );
    assert_eq!(
        update(None, Some("env"), &Settings::default()).outcome,
        Outcome::Allowed
    );
}

/// The HAMi scheduler's annotations and label, as a restored pod (or a hostile one) carries them.
fn scheduled(mut pod: Value, node_name: bool) -> Value {
    pod["metadata"]["annotations"] = json!({
        "team": "a",
        "hami.io/vgpu-node": "gpu-0",
        "hami.io/vgpu-time": "1796114467",
        "hami.io/vgpu-devices-to-allocate": "GPU-0,NVIDIA,81920,100:;",
        "hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,81920,100:;",
        "hami.io/vgpu-mig-allocations": "[]",
        "hami.io/bind-phase": "allocating",
        "hami.io/bind-time": "1796114467",
    });
    pod["metadata"]["labels"] = json!({"app": "x", "hami.io/vgpu-node": "gpu-0"});
    if node_name {
        pod["spec"]["nodeName"] = json!("gpu-0");
    }
    pod
}

#[test]
fn scheduler_annotations_are_removed_on_create_whatever_the_pod() {
    let plain = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": NS},
        "spec": {"containers": [{"name": "c", "image": "x"}]}});
    for (what, pod) in [
        ("HAMi pod", hami_pod(json!({}), json!({}))),
        ("KAI pod", kai_pod(json!({}))),
        ("pod without GPUs", plain),
    ] {
        for node_name in [false, true] {
            let mut pod = scheduled(pod.clone(), node_name);
            if what == "KAI pod" {
                pod["metadata"]["annotations"]["gpu-memory"] = json!("3000");
            }
            let (first, doc) = create_twice(&pod, &Settings::default());
            let removes: Vec<&str> = first
                .patch
                .iter()
                .filter(|op| op["op"] == "remove")
                .map(|op| op["path"].as_str().unwrap())
                .collect();
            assert_eq!(
                removes,
                [
                    "/metadata/labels/hami.io~1vgpu-node",
                    "/metadata/annotations/hami.io~1vgpu-node",
                    "/metadata/annotations/hami.io~1vgpu-time",
                    "/metadata/annotations/hami.io~1vgpu-devices-to-allocate",
                    "/metadata/annotations/hami.io~1vgpu-devices-allocated",
                    "/metadata/annotations/hami.io~1vgpu-mig-allocations",
                    "/metadata/annotations/hami.io~1bind-phase",
                    "/metadata/annotations/hami.io~1bind-time",
                ],
                "{what}"
            );
            assert_eq!(
                first.warnings[0],
                "removed the HAMi scheduler's annotations hami.io/vgpu-node, hami.io/vgpu-time, hami.io/vgpu-devices-to-allocate, hami.io/vgpu-devices-allocated, hami.io/vgpu-mig-allocations, hami.io/bind-phase, hami.io/bind-time and label hami.io/vgpu-node: only HAMi's scheduler writes them, when it places the pod (the device plugin trusts them to hand out GPUs); the pod is scheduled like any new pod",
                "{what}"
            );
            let annotations = doc["metadata"]["annotations"].as_object().unwrap();
            assert!(
                annotations
                    .keys()
                    .all(|k| !k.starts_with("hami.io/") || k == "hami.io/limit-delivery"),
                "{what}: {annotations:?}"
            );
            assert_eq!(annotations["team"], "a");
            assert_eq!(doc["metadata"]["labels"], json!({"app": "x"}), "{what}");
            assert_eq!(doc["spec"].get("nodeName").is_some(), node_name, "{what}");
        }
    }
    // One key alone, on a pod whose other annotations are absent: just that one.
    let mut pod = hami_pod(json!({}), json!({}));
    pod["metadata"]["annotations"] = json!({"hami.io/bind-phase": "allocating"});
    let (first, _) = create_twice(&pod, &Settings::default());
    assert!(
        first.patch.contains(
            &json!({"op": "remove", "path": "/metadata/annotations/hami.io~1bind-phase"})
        )
    );
    assert_eq!(first.warnings.len(), 1);
    // Removed even where the pod is refused for something else? No: a denial carries no patch.
    let mut denied_pod = scheduled(
        hami_pod(
            env(json!([{"name": "CUDA_DISABLE_CONTROL", "value": "true"}])),
            json!({}),
        ),
        true,
    );
    denied_pod["metadata"]["name"] = json!("train-1");
    assert!(denial(&denied_pod, &Settings::default()).contains("CUDA_DISABLE_CONTROL"));
}

#[test]
fn scheduler_annotations_are_written_on_update_only_by_the_named_identities() {
    let base = hami_pod(json!({}), json!({}));
    let placed = scheduled(base.clone(), true);
    let mut erased = placed.clone();
    erased["metadata"]["annotations"]["hami.io/vgpu-devices-to-allocate"] = json!(";");
    erased["metadata"]["annotations"]["hami.io/bind-phase"] = json!("success");
    let mut relabelled = placed.clone();
    relabelled["metadata"]["labels"]["hami.io/vgpu-node"] = json!("gpu-9");
    let mut unrelated = placed.clone();
    unrelated["metadata"]["annotations"]["team"] = json!("b");
    let mut stripped = placed.clone();
    stripped["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("hami.io/bind-time");
    let plugin = "system:serviceaccount:hami-limits:hami-limits-device-plugin";
    let mut settings = Settings::default();
    settings
        .tenancy
        .scheduler_annotation_writers
        .push(plugin.to_owned());
    // (what, old, new, user, refused with)
    let cases: Vec<(&str, &Value, &Value, &str, Option<&str>)> = vec![
        ("scheduler places", &base, &placed, SCHEDULER, None),
        ("plugin erases its entry", &placed, &erased, plugin, None),
        (
            "tenant places itself",
            &base,
            &placed,
            "alice",
            Some(
                r#"this update by user "alice" adds annotation "hami.io/bind-phase", adds annotation "hami.io/bind-time", adds annotation "hami.io/vgpu-devices-allocated", adds annotation "hami.io/vgpu-devices-to-allocate", adds annotation "hami.io/vgpu-mig-allocations" and 3 more"#,
            ),
        ),
        (
            "tenant changes a pending pod's devices",
            &placed,
            &erased,
            "alice",
            Some(
                r#"this update by user "alice" changes annotation "hami.io/bind-phase", changes annotation "hami.io/vgpu-devices-to-allocate""#,
            ),
        ),
        (
            "tenant removes one",
            &placed,
            &stripped,
            "system:serviceaccount:tenant-a:default",
            Some(
                r#"user "system:serviceaccount:tenant-a:default" removes annotation "hami.io/bind-time""#,
            ),
        ),
        (
            "tenant relabels",
            &placed,
            &relabelled,
            "alice",
            Some(r#"changes label "hami.io/vgpu-node""#),
        ),
        (
            "tenant's unrelated change",
            &placed,
            &unrelated,
            "alice",
            None,
        ),
        ("no change at all", &placed, &placed, "alice", None),
    ];
    for (what, old, new, user, refused) in cases {
        let a = run(&review_of("UPDATE", new, Some(old), user), &settings);
        assert!(a.patch.is_empty(), "{what}: an UPDATE is never patched");
        match refused {
            None => assert_eq!(a.outcome, Outcome::Allowed, "{what}: {a:?}"),
            Some(fragment) => {
                assert_eq!(a.outcome, Outcome::Denied, "{what}");
                assert!(
                    a.message.starts_with("pod tenant-a/train-1: "),
                    "{what}: {}",
                    a.message
                );
                assert!(a.message.contains(fragment), "{what}: {}", a.message);
                assert!(
                    a.message.contains(&format!("only the users in tenancy.schedulerAnnotationWriters ({SCHEDULER}, {plugin}) may write them")),
                    "{what}: {}",
                    a.message
                );
            }
        }
    }
    // A review without userInfo is nobody's.
    let mut anonymous = review_of("UPDATE", &placed, Some(&base), "x");
    anonymous["request"]
        .as_object_mut()
        .unwrap()
        .remove("userInfo");
    let a = run(&anonymous, &settings);
    assert_eq!(a.outcome, Outcome::Denied);
    assert!(
        a.message.contains("this update by an unknown user adds"),
        "{}",
        a.message
    );
    // The default list is HAMi's scheduler alone.
    assert_eq!(
        run(
            &review_of("UPDATE", &erased, Some(&placed), plugin),
            &Settings::default()
        )
        .outcome,
        Outcome::Denied
    );
}

/// Namespace `tenant-a` in `tenancy.allowVisibleDevicesNamespaces`.
fn allowing_devices() -> Settings {
    let mut s = Settings::default();
    s.tenancy.allow_visible_devices_namespaces = vec![NS.to_owned()];
    s
}

/// A pod for the default scheduler with no GPU request at all: `web`, and an init container.
fn cpu_pod(web: Value, init: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-1", "namespace": NS},
        "spec": {
            "initContainers": [merge(json!({"name": "setup", "image": "x"}), init)],
            "containers": [merge(json!({"name": "web", "image": "x"}), web)]
        }
    })
}

fn mount(path: &str) -> Value {
    json!({"volumeMounts": [{"name": "devs", "mountPath": path}]})
}

#[test]
fn no_container_of_any_pod_names_its_own_gpus() {
    let visible = |value: &str| env(json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]));
    let from =
        |source: Value| env(json!([{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": source}]));
    // (what, the container's extra fields, fragment of the denial)
    let routes: Vec<(&str, Value, &str)> = vec![
        (
            "all",
            visible("all"),
            r#"env NVIDIA_VISIBLE_DEVICES is set by the pod to "all""#,
        ),
        (
            "a UUID",
            visible("GPU-3b1c5f0e-0000-4000-8000-000000000001"),
            r#"to "GPU-3b1c5f0e"#,
        ),
        ("indices", visible("0,1"), r#"to "0,1""#),
        ("none beside a GPU", visible("none,all"), r#"to "none,all""#),
        ("another case", visible("NONE"), r#"to "NONE""#),
        ("spaces", visible(" void"), r#"to " void""#),
        (
            "a ConfigMap",
            from(json!({"configMapKeyRef": {"name": "mine", "key": "NVIDIA_VISIBLE_DEVICES"}})),
            "env NVIDIA_VISIBLE_DEVICES is set by the pod with valueFrom",
        ),
        (
            "a Secret",
            from(json!({"secretKeyRef": {"name": "mine", "key": "devices"}})),
            "with valueFrom",
        ),
        (
            "a field",
            from(json!({"fieldRef": {"fieldPath": "metadata.annotations['devs']"}})),
            "with valueFrom",
        ),
        (
            "the last of two entries",
            env(json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"},
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])),
            r#"to "all""#,
        ),
        (
            "a device-list mount",
            mount("/var/run/nvidia-container-devices/all"),
            r#"mounts volume "devs" at "/var/run/nvidia-container-devices/all""#,
        ),
        (
            "a device-list mount spelt otherwise",
            mount("//var/run/./x/../nvidia-container-devices/GPU-0/"),
            "(/var/run/nvidia-container-devices/GPU-0)",
        ),
        (
            "a relative device-list mount",
            mount("var/run/nvidia-container-devices/all"),
            "(/var/run/nvidia-container-devices/all)",
        ),
        (
            "the folder itself",
            mount("/var/run/nvidia-container-devices"),
            "under /var/run/nvidia-container-devices",
        ),
        (
            "a string prefix, as the runtime compares",
            mount("/var/run/nvidia-container-devices-x/all"),
            "under /var/run/nvidia-container-devices",
        ),
    ];
    // (where, the pod with the route in one container, that container's name)
    type Place = (&'static str, fn(Value) -> Value, &'static str);
    let places: Vec<Place> = vec![
        ("a CPU pod's container", |r| cpu_pod(r, json!({})), "web"),
        (
            "a CPU pod's init container",
            |r| cpu_pod(json!({}), r),
            "setup",
        ),
        ("a HAMi GPU container", |r| hami_pod(r, json!({})), "main"),
        (
            "a HAMi GPU init container",
            |r| hami_pod(json!({}), r),
            "init",
        ),
        ("a KAI fraction container", kai_pod, "train"),
        (
            "a KAI pod's other container",
            |r| {
                let mut p = kai_pod(json!({}));
                for (k, v) in r.as_object().unwrap() {
                    p["spec"]["containers"][1][k] = v.clone();
                }
                p
            },
            "side",
        ),
    ];
    let hami_core_allowed = allowing();
    for (what, route, fragment) in &routes {
        for (place, build, container) in &places {
            let pod = build(route.clone());
            let message = denial(&pod, &Settings::default());
            let case = format!("{what} in {place}: {message}");
            assert!(message.starts_with("pod tenant-a/"), "{case}");
            assert!(
                message.contains(&format!("container {container:?}")),
                "{case}"
            );
            assert!(message.contains(fragment), "{case}");
            assert!(
                message.contains("tenancy.allowVisibleDevicesNamespaces"),
                "{case}"
            );
            // HAMi-core's escape hatch does not open this one.
            let other = denial(&pod, &hami_core_allowed);
            assert!(
                other.contains("tenancy.allowVisibleDevicesNamespaces"),
                "{case}"
            );
            // Where the operator allows it, the route is not what refuses the pod.
            let a = create(&pod, &allowing_devices());
            assert!(
                !a.message.contains("NVIDIA_VISIBLE_DEVICES")
                    && !a.message.contains("nvidia-container-devices"),
                "{case}: {a:?}"
            );
        }
    }
}

#[test]
fn what_any_container_may_still_set_about_devices() {
    let cases: Vec<(&str, Value)> = vec![
        (
            "none",
            env(json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}])),
        ),
        (
            "void",
            env(json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}])),
        ),
        (
            "empty",
            env(json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": ""}])),
        ),
        ("no value", env(json!([{"name": "NVIDIA_VISIBLE_DEVICES"}]))),
        (
            "driver capabilities",
            env(json!([{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}])),
        ),
        (
            "look-alike names",
            env(json!([{"name": "NVIDIA_VISIBLE_DEVICES_X", "value": "all"},
            {"name": "nvidia_visible_devices", "value": "all"}, {"name": "CUDA_VISIBLE_DEVICES", "value": "1"}])),
        ),
        ("a mount above the folder", mount("/var/run")),
        (
            "a mount beside it under /run",
            mount("/run/nvidia-container-devices/all"),
        ),
        ("a mount elsewhere", mount("/data/nvidia-container-devices")),
    ];
    for (what, extra) in cases {
        let a = create(&cpu_pod(extra.clone(), extra.clone()), &Settings::default());
        assert_eq!(a.outcome, Outcome::Allowed, "{what}: {a:?}");
        let (_, doc) = create_twice(&hami_pod(extra.clone(), json!({})), &Settings::default());
        assert_eq!(doc["spec"]["schedulerName"], "hami-scheduler", "{what}");
        create_twice(&kai_pod(extra), &Settings::default());
    }
    // HAMi's overwriteEnv sets `none` in the containers without a GPU: its own value is admitted
    // when reviewed again.
    let mut overwrite = Settings::default();
    overwrite.nvidia.overwrite_env = true;
    let (_, doc) = create_twice(&hami_pod(json!({}), json!({})), &overwrite);
    assert!(
        doc["spec"]["containers"][1]["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"})),
        "{doc}"
    );
}

#[test]
fn only_kais_own_entry_in_the_fraction_container_names_a_gpu() {
    let prefix = "kai-1-abcdefg-shared-gpu";
    for hamicore in [false, true] {
        // KAI's admission as v0.17 leaves the pod, reviewed again: admitted, nothing changed.
        let (_, doc) = create_twice(&kai_pod(json!({})), &Settings::default());
        let after_kai = as_kai_admission_leaves_it(doc, hamicore);
        let again = create(&after_kai, &Settings::default());
        assert_eq!(again.outcome, Outcome::Allowed, "{again:?}");
        // KAI's admission first, ours next: admitted too.
        let kai_first = as_kai_admission_leaves_it(kai_pod(json!({})), hamicore);
        assert_ne!(
            create(&kai_first, &Settings::default()).outcome,
            Outcome::Denied
        );
    }
    let entry = |cm: &str, key: &str| json!({"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": cm, "key": key}}});
    let with_entry_in = |container: usize, e: Value| {
        let mut p = as_kai_admission_leaves_it(kai_pod(json!({})), false);
        let list = p["spec"]["containers"][container]["env"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut list: Vec<Value> = list
            .into_iter()
            .filter(|v| v["name"] != "NVIDIA_VISIBLE_DEVICES")
            .collect();
        list.push(e);
        p["spec"]["containers"][container]["env"] = Value::from(list);
        p
    };
    let cm0 = format!("{prefix}-0");
    let forged: Vec<(&str, Value, &str)> = vec![
        (
            "another index's ConfigMap",
            with_entry_in(0, entry(&format!("{prefix}-1"), "NVIDIA_VISIBLE_DEVICES")),
            "\"train\"",
        ),
        (
            "the evar ConfigMap",
            with_entry_in(0, entry(&format!("{cm0}-evar"), "NVIDIA_VISIBLE_DEVICES")),
            "\"train\"",
        ),
        (
            "another key",
            with_entry_in(0, entry(&cm0, "GPU_PORTION")),
            "\"train\"",
        ),
        (
            "no key",
            with_entry_in(
                0,
                json!({"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": cm0}}}),
            ),
            "\"train\"",
        ),
        (
            "KAI's entry in another container",
            with_entry_in(1, entry(&cm0, "NVIDIA_VISIBLE_DEVICES")),
            "\"side\"",
        ),
        (
            "a literal beside KAI's entry",
            {
                let mut p = as_kai_admission_leaves_it(kai_pod(json!({})), false);
                p["spec"]["containers"][0]["env"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}));
                p
            },
            "\"train\"",
        ),
        (
            "not a KAI pod (another scheduler)",
            {
                let mut p = as_kai_admission_leaves_it(kai_pod(json!({})), false);
                p["spec"]["schedulerName"] = json!("my-scheduler");
                p
            },
            "\"train\"",
        ),
        (
            "no KAI ConfigMap annotation",
            {
                let mut p = as_kai_admission_leaves_it(kai_pod(json!({})), false);
                p["metadata"]["annotations"]
                    .as_object_mut()
                    .unwrap()
                    .remove("runai/shared-gpu-configmap");
                p
            },
            "\"train\"",
        ),
    ];
    for (what, pod, container) in forged {
        let message = denial(&pod, &Settings::default());
        assert!(
            message.contains(&format!(
                "container {container}: env NVIDIA_VISIBLE_DEVICES is set by the pod"
            )),
            "{what}: {message}"
        );
    }
}

#[test]
fn a_gpu_containers_env_from_may_not_replace_the_plugins_device_list() {
    for prefix in ["N", "NVIDIA_", "NVIDIA_VISIBLE_", "NVIDIA_VISIBLE_DEVICE"] {
        let from = json!({"envFrom": [{"prefix": prefix, "configMapRef": {"name": "devs"}}]});
        for (what, pod) in [
            ("HAMi GPU container", hami_pod(from.clone(), json!({}))),
            ("HAMi GPU init container", hami_pod(json!({}), from.clone())),
            ("KAI fraction container", kai_pod(from.clone())),
        ] {
            let message = denial(&pod, &Settings::default());
            assert!(
                message.contains(&format!(r#"envFrom configMapRef "devs" with prefix {prefix:?} could set NVIDIA_VISIBLE_DEVICES"#))
                    && message.contains("tenancy.allowVisibleDevicesNamespaces"),
                "{prefix} in {what}: {message}"
            );
            assert_ne!(
                create(&pod, &allowing_devices()).outcome,
                Outcome::Denied,
                "{prefix} in {what}"
            );
        }
        // A container without a GPU: left to the node's runtime setting.
        let a = create(&cpu_pod(from.clone(), from), &Settings::default());
        assert_eq!(a.outcome, Outcome::Allowed, "{prefix}: {a:?}");
    }
    // Prefixes that cannot produce it.
    for prefix in [
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_",
        "nvidia_",
        "APP_",
    ] {
        let from = json!({"envFrom": [{"prefix": prefix, "configMapRef": {"name": "devs"}}]});
        create_twice(&hami_pod(from, json!({})), &Settings::default());
    }
}

/// A HAMi GPU container's own mount at, above or inside what `Allocate` mounts is refused, the
/// message naming the mount and what it would hide; the hook folder follows
/// `devicePluginHookPath`; ordinary mounts (and `/tmp` above the lock folder) stay allowed.
#[test]
fn gpu_containers_may_not_mount_over_what_allocate_mounts() {
    let mounted = |path: &str| {
        hami_pod(
            json!({"volumeMounts": [{"name": "mine", "mountPath": path}]}),
            json!({}),
        )
    };
    let hooked = Settings {
        device_plugin_hook_path: "/opt/hami".into(),
        ..Settings::default()
    };
    for (path, settings, names) in [
        ("/overrideEnv", Settings::default(), "the limits file"),
        ("/overrideEnv/", Settings::default(), "the limits file"),
        ("//etc/./ld.so.preload", Settings::default(), "preload list"),
        ("/etc", Settings::default(), "above /etc/ld.so.preload"),
        ("/", Settings::default(), "above"),
        ("/usr/local/vgpu", Settings::default(), "HAMi-core"),
        ("/usr/local", Settings::default(), "above /usr/local/vgpu"),
        (
            "/usr/local/vgpu/usage.cache",
            Settings::default(),
            "inside /usr/local/vgpu",
        ),
        ("usr/local/vgpu/libvgpu.so", Settings::default(), "inside"),
        ("/tmp/vgpulock", Settings::default(), "lock folder"),
        ("/tmp/vgpulock/lock", Settings::default(), "lock folder"),
        ("/opt/hami/vgpu", hooked.clone(), "/opt/hami/vgpu"),
        ("/opt", hooked.clone(), "above /opt/hami/vgpu"),
    ] {
        let message = denial(&mounted(path), &settings);
        assert!(
            message.contains(names) && message.contains(&format!("{path:?}")),
            "{path}: {message}"
        );
    }
    for (path, settings) in [
        ("/tmp", Settings::default()),
        ("/data", Settings::default()),
        ("/usr/local/vgpu2", Settings::default()),
        ("/etc/ld.so.preload.d", Settings::default()),
        ("/usr/local/vgpu", hooked.clone()),
    ] {
        let a = create(&mounted(path), &settings);
        assert_ne!(a.outcome, Outcome::Denied, "{path}: {}", a.message);
    }
}
