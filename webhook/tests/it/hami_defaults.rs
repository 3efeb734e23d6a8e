//! HAMi's `defaultGPUNum` and `overwriteEnv` (HAMi v2.10.0 `pkg/device/nvidia/device.go`
//! `mutateContainerResource` and `MutateAdmission`), and the `deviceConfigFile` setting (HAMi's own
//! `device-config.yaml` as the source of the `nvidia:` section). Every patch is applied to the
//! original object, must give a valid Pod, and reviewing the result again changes nothing.

use base64::Engine as _;
use hami_webhook::policy::basis::NoBasis;
use hami_webhook::{Outcome, Settings, review};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::support::offline_online;

const HAMI_POD: &str = include_str!("../fixtures/hami-pod.json");
const HAMI_DEVICE_CONFIG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/hami-v2.10.0-device-config.yaml"
);

fn fixture() -> Value {
    serde_json::from_str(HAMI_POD).unwrap()
}

fn object_mut<'a>(review: &'a mut Value, pointer: &str) -> &'a mut Value {
    review
        .pointer_mut(&format!("/request/object{pointer}"))
        .unwrap_or_else(|| panic!("no {pointer}"))
}

/// (outcome, patch ops, warnings, patched object).
fn run(review_json: &Value, settings: &Settings) -> (Outcome, Vec<Value>, Vec<String>, Value) {
    offline_online::check_review("hami_defaults", review_json, settings, &NoBasis);
    let body = serde_json::to_vec(review_json).unwrap();
    let reviewed = review(&body, settings, &NoBasis).unwrap();
    let out: Value = serde_json::from_slice(&reviewed.body).unwrap();
    let response = &out["response"];
    assert_eq!(response["allowed"], true, "{response}");
    let ops: Vec<Value> = response["patch"]
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
    let mut object = review_json["request"]["object"].clone();
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops.clone())).unwrap();
    json_patch::patch(&mut object, &patch).unwrap();
    let _: Pod = serde_json::from_value(object.clone()).unwrap();
    (reviewed.outcome, ops, warnings, object)
}

/// Reviewed twice: the second review of the patched pod is a no-op without warnings.
fn mutate(review_json: &Value, settings: &Settings) -> (Vec<Value>, Vec<String>, Value) {
    let (_, ops, warnings, object) = run(review_json, settings);
    let mut again = review_json.clone();
    again["request"]["object"] = object.clone();
    let (outcome, ops2, warnings2, _) = run(&again, settings);
    assert_eq!(outcome, Outcome::Allowed, "second review patched {ops2:?}");
    assert!(warnings2.is_empty(), "{warnings2:?}");
    (ops, warnings, object)
}

fn env_value(object: &Value, pointer: &str, name: &str) -> Option<String> {
    object
        .pointer(&format!("{pointer}/env"))?
        .as_array()?
        .iter()
        .rev()
        .find(|e| e["name"] == name)
        .map(|e| e["value"].as_str().unwrap_or("<valueFrom>").to_owned())
}

fn settings(default_gpu_num: u32, overwrite_env: bool) -> Settings {
    let mut s = Settings::default();
    s.nvidia.default_gpu_num = default_gpu_num;
    s.nvidia.overwrite_env = overwrite_env;
    s
}

/// The fixture with its init container asking for GPU memory (limits) but no GPU count.
fn memory_only_init() -> Value {
    let mut r = fixture();
    *object_mut(&mut r, "/spec/initContainers/0/resources") =
        json!({"limits": {"nvidia.com/gpumem": "1000"}});
    r
}

#[test]
fn default_gpu_num_completes_a_memory_only_container() {
    for (n, expected) in [(1, "1"), (2, "2")] {
        let (ops, warnings, object) = mutate(&memory_only_init(), &settings(n, false));
        assert!(warnings.is_empty(), "{warnings:?}");
        assert!(
            ops.contains(&json!({"op": "add", "path": "/spec/initContainers/0/resources/limits/nvidia.com~1gpu", "value": expected})),
            "{ops:?}"
        );
        assert_eq!(
            object["spec"]["initContainers"][0]["resources"]["limits"],
            json!({"nvidia.com/gpumem": "1000", "nvidia.com/gpu": expected})
        );
        // The container that names the count keeps its own.
        assert_eq!(
            object["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            "1"
        );
    }
}

#[test]
fn default_gpu_num_follows_hamis_conditions() {
    // Cores or memory percentage in the limits also count; priority alone does not.
    for (limits, added) in [
        (json!({"nvidia.com/gpucores": "30"}), true),
        (json!({"nvidia.com/gpumem-percentage": "50"}), true),
        (json!({"nvidia.com/priority": "1"}), false),
    ] {
        let mut r = fixture();
        *object_mut(&mut r, "/spec/initContainers/0/resources") = json!({ "limits": limits });
        let (ops, _, _) = mutate(&r, &settings(1, false));
        let adds = ops
            .iter()
            .any(|op| op["path"] == "/spec/initContainers/0/resources/limits/nvidia.com~1gpu");
        assert_eq!(adds, added, "{limits}: {ops:?}");
    }
    // 0 adds nothing.
    let (ops, _, _) = mutate(&memory_only_init(), &settings(0, false));
    assert!(
        !ops.iter()
            .any(|op| op["path"].as_str().unwrap().contains("resources/limits")),
        "{ops:?}"
    );
    // Memory only in the requests: HAMi reads limits only.
    let mut r = fixture();
    *object_mut(&mut r, "/spec/initContainers/0/resources") =
        json!({"requests": {"nvidia.com/gpumem": "1000"}});
    let (ops, _, _) = mutate(&r, &settings(1, false));
    assert!(
        !ops.iter()
            .any(|op| op["path"].as_str().unwrap().contains("resources/limits")),
        "{ops:?}"
    );
    // The count already in the requests is left alone (a second value would not validate).
    let mut r = fixture();
    *object_mut(&mut r, "/spec/initContainers/0/resources") = json!({
        "limits": {"nvidia.com/gpumem": "1000"},
        "requests": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1000"}
    });
    let (ops, _, _) = mutate(&r, &settings(1, false));
    assert!(
        !ops.iter()
            .any(|op| op["path"].as_str().unwrap().contains("resources/limits")),
        "{ops:?}"
    );
}

#[test]
fn overwrite_env_hides_gpus_from_containers_that_get_none() {
    let (ops, warnings, object) = mutate(&fixture(), &settings(1, true));
    assert!(warnings.is_empty(), "{warnings:?}");
    // The GPU container: untouched by overwriteEnv; the sidecar and the init container: none.
    assert_eq!(
        env_value(&object, "/spec/containers/0", "NVIDIA_VISIBLE_DEVICES"),
        None
    );
    assert_eq!(
        env_value(&object, "/spec/containers/1", "NVIDIA_VISIBLE_DEVICES").as_deref(),
        Some("none")
    );
    assert_eq!(
        env_value(&object, "/spec/initContainers/0", "NVIDIA_VISIBLE_DEVICES").as_deref(),
        Some("none")
    );
    assert!(
        ops.iter().any(|op| op["path"] == "/spec/schedulerName"),
        "{ops:?}"
    );
    // Off by default.
    let (_, _, object) = mutate(&fixture(), &Settings::default());
    assert_eq!(
        env_value(&object, "/spec/containers/1", "NVIDIA_VISIBLE_DEVICES"),
        None
    );
    // With defaultGPUNum 0 a memory-only container gets no GPU, so it is hidden (as in HAMi).
    let (_, _, object) = mutate(&memory_only_init(), &settings(0, true));
    assert_eq!(
        env_value(&object, "/spec/initContainers/0", "NVIDIA_VISIBLE_DEVICES").as_deref(),
        Some("none")
    );
    let (_, _, object) = mutate(&memory_only_init(), &settings(1, true));
    assert_eq!(
        env_value(&object, "/spec/initContainers/0", "NVIDIA_VISIBLE_DEVICES"),
        None
    );
}

#[test]
fn overwrite_env_leaves_a_containers_own_value_kai_pods_and_other_schedulers() {
    // A container that sets the variable itself to another value that names no GPU keeps it,
    // with a warning (one that names GPUs is refused: `tenancy::visible_devices`).
    let mut r = fixture();
    object_mut(&mut r, "/spec/containers/1")
        .as_object_mut()
        .unwrap()
        .insert(
            "env".into(),
            json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]),
        );
    let (_, _, warnings, object) = run(&r, &settings(1, true));
    assert_eq!(
        env_value(&object, "/spec/containers/1", "NVIDIA_VISIBLE_DEVICES").as_deref(),
        Some("void")
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("NVIDIA_VISIBLE_DEVICES") && w.contains("\"none\"")),
        "{warnings:?}"
    );
    // A KAI pod's GPUs come from another device plugin: never hidden.
    let mut r = fixture();
    object_mut(&mut r, "/metadata/annotations")
        .as_object_mut()
        .unwrap()
        .insert("gpu-memory".into(), json!("4000"));
    let (_, _, object) = mutate(&r, &settings(1, true));
    assert_eq!(
        env_value(&object, "/spec/containers/1", "NVIDIA_VISIBLE_DEVICES"),
        None
    );
    // A pod for another scheduler is not a HAMi pod: nothing at all.
    let mut r = memory_only_init();
    object_mut(&mut r, "/spec")
        .as_object_mut()
        .unwrap()
        .insert("schedulerName".into(), json!("volcano"));
    let (outcome, ops, _, _) = run(&r, &settings(1, true));
    assert_eq!(outcome, Outcome::Allowed, "{ops:?}");
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn device_config_file_supplies_the_nvidia_section() {
    let dir = tempfile::tempdir().unwrap();
    // HAMi's own file, as its chart renders it (every vendor section, migProfileAllowlist, ...).
    let file = write(
        dir.path(),
        "webhook.yaml",
        &format!("deviceConfigFile: {HAMI_DEVICE_CONFIG}\nschedulerName: hami-scheduler\n"),
    );
    let (s, _) = Settings::load_from_env(Some(&file), std::iter::empty()).unwrap();
    assert_eq!(
        s.nvidia,
        Settings::default().nvidia,
        "HAMi's defaults are ours"
    );
    assert_eq!(
        s.device_config_file.as_deref(),
        Some(std::path::Path::new(HAMI_DEVICE_CONFIG))
    );
    // A customised HAMi file; the environment still wins over it.
    let device = write(
        dir.path(),
        "device-config.yaml",
        "nvidia:\n  resourceCountName: example.com/vgpu\n  defaultGPUNum: 2\n  overwriteEnv: true\n  gpuCorePolicy: force\n  migProfileAllowlist: []\nhygon:\n  memoryFactor: 1\n",
    );
    let file = write(
        dir.path(),
        "webhook.yaml",
        &format!("deviceConfigFile: {}\n", device.display()),
    );
    let env = [("HAMI_NVIDIA__DEFAULTGPUNUM".to_owned(), "3".to_owned())];
    let (s, _) = Settings::load_from_env(Some(&file), env).unwrap();
    assert_eq!(s.nvidia.resource_count_name, "example.com/vgpu");
    assert_eq!(s.nvidia.default_gpu_num, 3);
    assert!(s.nvidia.overwrite_env);
    assert_eq!(s.nvidia.gpu_core_policy.as_str(), "force");
}

#[test]
fn device_config_file_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let load = |webhook: &str| {
        let file = write(dir.path(), "webhook.yaml", webhook);
        Settings::load_from_env(Some(&file), std::iter::empty())
            .unwrap_err()
            .to_string()
    };
    let err = load(&format!(
        "deviceConfigFile: {HAMI_DEVICE_CONFIG}\nnvidia:\n  gpuCorePolicy: force\n"
    ));
    assert!(
        err.contains("both an nvidia: section and deviceConfigFile"),
        "{err}"
    );
    let missing = dir.path().join("absent.yaml");
    let err = load(&format!("deviceConfigFile: {}\n", missing.display()));
    assert!(err.contains(&missing.display().to_string()), "{err}");
    let other = write(dir.path(), "other.yaml", "hygon:\n  memoryFactor: 1\n");
    let err = load(&format!("deviceConfigFile: {}\n", other.display()));
    assert!(err.contains("has no nvidia: section"), "{err}");
    let bad = write(dir.path(), "bad.yaml", "nvidia:\n  defaultGPUNum: -1\n");
    let err = load(&format!("deviceConfigFile: {}\n", bad.display()));
    assert!(
        err.contains(&bad.display().to_string()) && err.contains("nvidia"),
        "{err}"
    );
    let err = load("deviceConfigFile: [a]\n");
    assert!(err.contains("deviceConfigFile"), "{err}");
}
