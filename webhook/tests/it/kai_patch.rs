//! KAI pods end to end through `decide_pod`: every patch is applied with `json-patch` to the
//! original pod and the result must deserialize into k8s-openapi's `Pod` with the expected env,
//! volumes and mounts; the projected limits files must parse with no diagnostic (what
//! `hami-limits check` runs); reviewing the patched pod again must change nothing and warn about
//! nothing.
//!
//! These tests check the volume layout of `kai.hookDelivery: hostPath` (the layout of earlier
//! releases, still selectable); `kai_hook_delivery.rs` checks the default, `device-plugin`.

use hami_shared::limits_file::parse;
use hami_webhook::policy::basis::{NoBasis, NotSynced, VramBasis};
use hami_webhook::policy::kai::{HookDelivery, KaiSettings, MissingBasis, PreloadContainers};
use hami_webhook::policy::settings::Settings;
use hami_webhook::shell::vram::{KaiMetrics, VramIndex};
use hami_webhook::{Decision, Observation, decide_pod};
use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::{Value, json};

use crate::support::offline_online;

const SMALL: &str = include_str!("../fixtures/kai-fraction-small.json");
const LARGE: &str = include_str!("../fixtures/kai-fraction-large.json");

fn object(review: &str) -> Value {
    let v: Value = serde_json::from_str(review).unwrap();
    v["request"]["object"].clone()
}

/// The default `kai:` section with `hookDelivery: hostPath`.
fn host_path_kai() -> KaiSettings {
    KaiSettings {
        hook_delivery: HookDelivery::HostPath,
        ..KaiSettings::default()
    }
}

/// The default settings with `kai.hookDelivery: hostPath`.
fn host_path() -> Settings {
    Settings {
        kai: host_path_kai(),
        ..Settings::default()
    }
}

fn settings(vram: u64) -> Settings {
    Settings {
        kai: KaiSettings {
            per_gpu_vram_mib: Some(vram),
            ..host_path_kai()
        },
        ..Settings::default()
    }
}

/// `s` with the namespaces of these tests (`ml-team` the request's, `ml` some objects') in
/// `tenancy.allowHamiCoreEnvNamespaces`: HAMi's behaviour, a container's own variables left as is.
fn allow(mut s: Settings) -> Settings {
    s.tenancy.allow_hami_core_env_namespaces = vec!["ml-team".to_owned(), "ml".to_owned()];
    s
}

/// The default settings with the opt-out `kai.missingBasis: warn`.
fn warn() -> Settings {
    Settings {
        kai: KaiSettings {
            missing_basis: MissingBasis::Warn,
            ..host_path_kai()
        },
        ..Settings::default()
    }
}

/// The outcome of one review.
struct Mutated {
    pod: Pod,
    warnings: Vec<String>,
    ops: Vec<Value>,
    /// (container, text) of each projected limits file.
    files: Vec<(String, String)>,
    observations: Vec<Observation>,
}

fn decide(pod: &Value, settings: &Settings) -> Decision {
    decide_with(pod, settings, &NoBasis)
}

fn decide_with(pod: &Value, settings: &Settings, vram: &dyn VramBasis) -> Decision {
    offline_online::check_in("kai_patch", pod, "ml-team", settings, vram);
    let bytes = serde_json::to_vec(pod).unwrap();
    let view: hami_webhook::wire::pod::Pod<'_> = serde_json::from_slice(&bytes).unwrap();
    decide_pod(&view, Some("ml-team"), settings, vram)
}

fn denial(pod: &Value, settings: &Settings) -> String {
    match decide(pod, settings) {
        Decision::Deny { message } => message,
        other => panic!("expected a denial, got {other:?}"),
    }
}

/// Decide, apply, deserialize, and check that a second review is a no-op.
fn mutate(pod: &Value, settings: &Settings) -> Mutated {
    mutate_with(pod, settings, &NoBasis)
}

fn mutate_with(pod: &Value, settings: &Settings, vram: &dyn VramBasis) -> Mutated {
    let Decision::Allow {
        patch,
        warnings,
        limits_files,
        observations,
    } = decide_with(pod, settings, vram)
    else {
        panic!("denied: {:?}", decide_with(pod, settings, vram));
    };
    let ops = serde_json::to_value(&patch).unwrap();
    let parsed: json_patch::Patch = serde_json::from_value(ops.clone()).unwrap();
    let mut doc = pod.clone();
    json_patch::patch(&mut doc, &parsed).unwrap_or_else(|e| panic!("{e}: {ops:#}"));
    let k8s: Pod = serde_json::from_value(doc.clone()).unwrap();
    // Idempotent: a reinvocation on the mutated pod changes nothing and warns about nothing new.
    match decide_with(&doc, settings, vram) {
        Decision::Allow {
            patch: again,
            warnings: again_warnings,
            limits_files: again_files,
            observations: again_observations,
        } => {
            assert!(again.is_empty(), "second review patched: {again:?}");
            assert_eq!(again_warnings, warnings, "second review warned differently");
            assert_eq!(
                again_files, limits_files,
                "second review projected other files"
            );
            assert_eq!(again_observations, observations);
        }
        other => panic!("second review: {other:?}"),
    }
    // The files the decision reports are the annotations the patched pod carries.
    for f in &limits_files {
        let key = format!("limits.hami.io/{}", f.container);
        assert_eq!(
            doc["metadata"]["annotations"][&key],
            Value::from(f.text.as_str())
        );
    }
    Mutated {
        pod: k8s,
        warnings,
        ops: ops.as_array().cloned().unwrap_or_default(),
        files: limits_files
            .into_iter()
            .map(|f| (f.container, f.text))
            .collect(),
        observations,
    }
}

fn all_containers(pod: &Pod) -> Vec<&Container> {
    let spec = pod.spec.as_ref().unwrap();
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .collect()
}

fn env<'a>(c: &'a Container, name: &str) -> Vec<&'a str> {
    c.env
        .iter()
        .flatten()
        .filter(|e| e.name == name)
        .map(|e| e.value.as_deref().unwrap_or("<valueFrom>"))
        .collect()
}

fn mounts(c: &Container) -> Vec<(String, String, Option<String>, bool)> {
    c.volume_mounts
        .iter()
        .flatten()
        .map(|m| {
            (
                m.name.clone(),
                m.mount_path.clone(),
                m.sub_path.clone(),
                m.read_only.unwrap_or(false),
            )
        })
        .collect()
}

fn preload_mounts() -> Vec<(String, String, Option<String>, bool)> {
    vec![
        (
            "kai-resource-isolator-vgpu".into(),
            "/usr/local/vgpu".into(),
            None,
            true,
        ),
        (
            "kai-resource-isolator-vgpu".into(),
            "/etc/ld.so.preload".into(),
            Some("ld.so.preload".into()),
            true,
        ),
    ]
}

fn limits_mount(container: &str) -> (String, String, Option<String>, bool) {
    (
        "hami-limits".into(),
        "/overrideEnv".into(),
        Some(container.into()),
        true,
    )
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Every projected file parses cleanly, and holds the limit and the format line.
fn assert_clean_file(text: &str, limit: &str) {
    let parsed = parse(text);
    assert!(parsed.is_clean(), "{text:?}: {:?}", parsed.diagnostics);
    assert_eq!(parsed.format, Some(1));
    assert_eq!(
        parsed
            .entries
            .get("CUDA_DEVICE_MEMORY_LIMIT")
            .map(String::as_str),
        Some(limit)
    );
}

#[test]
fn small_fraction_pod_gets_preload_env_and_file() {
    let out = mutate(&object(SMALL), &settings(16384));
    assert!(out.warnings.is_empty(), "{:?}", out.warnings);
    let spec = out.pod.spec.as_ref().unwrap();
    let c = &spec.containers[0];
    assert_eq!(env(c, "CUDA_DEVICE_MEMORY_LIMIT"), ["4096m"]);
    let mut expected = vec![(
        "kube-api-access-x7k2p".to_owned(),
        "/var/run/secrets/kubernetes.io/serviceaccount".to_owned(),
        None,
        true,
    )];
    expected.extend(preload_mounts());
    expected.push(limits_mount("train"));
    assert_eq!(mounts(c), expected);
    let volumes = spec.volumes.as_ref().unwrap();
    let hook = volumes
        .iter()
        .find(|v| v.name == "kai-resource-isolator-vgpu")
        .unwrap();
    let hp = hook.host_path.as_ref().unwrap();
    assert_eq!(
        (hp.path.as_str(), hp.type_.as_deref()),
        ("/usr/local/vgpu", Some("DirectoryOrCreate"))
    );
    let dv = volumes.iter().find(|v| v.name == "hami-limits").unwrap();
    let da = dv.downward_api.as_ref().unwrap();
    assert_eq!(da.default_mode, Some(0o444));
    let items = da.items.as_ref().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].path, "train");
    assert_eq!(
        items[0].field_ref.as_ref().unwrap().field_path,
        "metadata.annotations['limits.hami.io/train']"
    );
    let file = annotation(&out.pod, "limits.hami.io/train").unwrap();
    // The admission-time cap, and what the preload library needs for the exact one of the GPU the
    // container gets: the fraction, and the node GPU file in the hook folder mounted above.
    assert_eq!(
        file,
        "CUDA_DEVICE_MEMORY_LIMIT=4096m\nHAMI_GPU_FRACTION=0.25\nHAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/usr/local/vgpu/node-gpus\n"
    );
    assert_clean_file(file, "4096m");
    // The original annotations are kept.
    assert_eq!(annotation(&out.pod, "gpu-fraction"), Some("0.25"));
}

#[test]
fn large_pod_env_everywhere_preload_where_configured() {
    for mode in [PreloadContainers::Fraction, PreloadContainers::All] {
        let mut s = settings(16384);
        s.kai.preload_containers = mode;
        let out = mutate(&object(LARGE), &s);
        let all = all_containers(&out.pod);
        assert_eq!(all.len(), 44);
        let first_regular = out.pod.spec.as_ref().unwrap().containers[0].name.clone();
        for c in &all {
            // Only a preloaded container gets a GPU from KAI and HAMi-core: only it is capped.
            if mode == PreloadContainers::Fraction && c.name != first_regular {
                assert!(env(c, "CUDA_DEVICE_MEMORY_LIMIT").is_empty(), "{}", c.name);
                assert!(
                    !mounts(c)
                        .iter()
                        .any(|m| m.1 == "/overrideEnv" || m.0 == "kai-resource-isolator-vgpu"),
                    "{}",
                    c.name
                );
                assert!(annotation(&out.pod, &format!("limits.hami.io/{}", c.name)).is_none());
                continue;
            }
            assert_eq!(env(c, "CUDA_DEVICE_MEMORY_LIMIT"), ["8192m"], "{}", c.name);
            let m = mounts(c);
            let preloaded = m
                .iter()
                .filter(|x| x.0 == "kai-resource-isolator-vgpu")
                .count();
            let expect = match mode {
                PreloadContainers::All => 2,
                PreloadContainers::Fraction if c.name == first_regular => 2,
                PreloadContainers::Fraction => 0,
            };
            assert_eq!(preloaded, expect, "{} {mode:?}", c.name);
            assert!(m.contains(&limits_mount(&c.name)), "{}", c.name);
            let file = annotation(&out.pod, &format!("limits.hami.io/{}", c.name)).unwrap();
            assert_clean_file(file, "8192m");
            // The node GPU file is in the hook folder: only a container that mounts it is told
            // where it is (the others have no preload library to read it).
            let entries = parse(file).entries;
            let per_node = (
                entries.get("HAMI_GPU_FRACTION").map(String::as_str),
                entries.get("HAMI_NODE_GPUS").map(String::as_str),
            );
            if expect == 2 {
                assert_eq!(
                    per_node,
                    (Some("0.5"), Some("/usr/local/vgpu/node-gpus")),
                    "{} {mode:?}",
                    c.name
                );
            } else {
                assert_eq!(per_node, (None, None), "{} {mode:?}", c.name);
            }
        }
        let spec = out.pod.spec.as_ref().unwrap();
        let items = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "hami-limits")
            .and_then(|v| v.downward_api.as_ref())
            .and_then(|d| d.items.as_ref())
            .unwrap();
        let capped = if mode == PreloadContainers::All {
            44
        } else {
            1
        };
        assert_eq!(items.len(), capped);
        // One volume each, never duplicated.
        let names: Vec<&str> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(
            names
                .iter()
                .filter(|n| **n == "kai-resource-isolator-vgpu")
                .count(),
            1
        );
        assert_eq!(names.iter().filter(|n| **n == "hami-limits").count(), 1);
    }
}

#[test]
fn bare_pod_gets_whole_arrays() {
    // No annotations map besides KAI's, no volumes, no env, no volumeMounts, an init container.
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "bare", "annotations": {"gpu-memory": "04000", "gpu-fraction-container-name": "init"}},
        "spec": {"schedulerName": "kai-scheduler",
                 "initContainers": [{"name": "init", "image": "x"}],
                 "containers": [{"name": "main", "image": "x"}]}
    });
    let out = mutate(&pod, &settings(16384));
    let spec = out.pod.spec.as_ref().unwrap();
    let init = &spec.init_containers.as_ref().unwrap()[0];
    let main = &spec.containers[0];
    // 04000 is 4000 MiB, never the octal 2048 of `04000m`.
    assert_eq!(env(init, "CUDA_DEVICE_MEMORY_LIMIT"), ["4000m"]);
    // The main container gets no GPU from KAI and no HAMi-core: no cap, no file.
    assert!(env(main, "CUDA_DEVICE_MEMORY_LIMIT").is_empty());
    let mut init_expected = preload_mounts();
    init_expected.push(limits_mount("init"));
    assert_eq!(mounts(init), init_expected);
    assert!(mounts(main).is_empty());
    assert_eq!(spec.volumes.as_ref().unwrap().len(), 2);
    // Whole arrays were added, never `…/-` on a missing array.
    for op in &out.ops {
        let path = op["path"].as_str().unwrap();
        assert!(!path.ends_with("/-"), "{path}");
    }
}

#[test]
fn pod_without_annotations_object_is_not_kai_and_empty_arrays_are_replaced() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "c"}]}});
    assert_eq!(decide(&pod, &settings(16384)), Decision::allow());
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "annotations": {"gpu-fraction": "0.5"}},
        "spec": {"schedulerName": "kai-scheduler", "volumes": [],
                 "containers": [{"name": "c", "env": [], "volumeMounts": []}]}});
    let out = mutate(&pod, &settings(1000));
    let c = &out.pod.spec.as_ref().unwrap().containers[0];
    assert_eq!(env(c, "CUDA_DEVICE_MEMORY_LIMIT"), ["500m"]);
    assert_eq!(mounts(c).len(), 3);
}

#[test]
fn env_mode_adds_no_file() {
    for how in ["annotation", "setting"] {
        let mut pod = object(SMALL);
        let mut s = settings(16384);
        if how == "annotation" {
            pod["metadata"]["annotations"]["hami.io/limit-delivery"] = json!("env");
        } else {
            s.kai.limit_delivery = hami_shared::values::LimitDelivery::Env;
        }
        let out = mutate(&pod, &s);
        let c = &out.pod.spec.as_ref().unwrap().containers[0];
        assert_eq!(env(c, "CUDA_DEVICE_MEMORY_LIMIT"), ["4096m"], "{how}");
        assert!(!mounts(c).iter().any(|m| m.1 == "/overrideEnv"), "{how}");
        assert!(
            !out.pod
                .spec
                .as_ref()
                .unwrap()
                .volumes
                .iter()
                .flatten()
                .any(|v| v.name == "hami-limits")
        );
        assert!(annotation(&out.pod, "limits.hami.io/train").is_none());
    }
    // The pod annotation wins over the setting.
    let mut pod = object(SMALL);
    pod["metadata"]["annotations"]["hami.io/limit-delivery"] = json!("file");
    let mut s = settings(16384);
    s.kai.limit_delivery = hami_shared::values::LimitDelivery::Env;
    let out = mutate(&pod, &s);
    assert!(annotation(&out.pod, "limits.hami.io/train").is_some());
}

#[test]
fn containers_that_set_their_own_limit_get_no_env_and_no_file() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "p", "annotations": {"gpu-memory": "2000"}},
    "spec": {"schedulerName": "kai-scheduler", "containers": [
        {"name": "own", "env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "1000m"}]},
        {"name": "per-device", "env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "1000m"}]},
        {"name": "from-ref", "env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}]},
        {"name": "plain"}
    ]}});
    // Every container preloaded, so that each is capped unless it sets its own limit.
    let mut s = allow(settings(16384));
    s.kai.preload_containers = PreloadContainers::All;
    let out = mutate(&pod, &s);
    let spec = out.pod.spec.as_ref().unwrap();
    assert_eq!(
        env(&spec.containers[0], "CUDA_DEVICE_MEMORY_LIMIT"),
        ["1000m"]
    );
    assert_eq!(
        env(&spec.containers[1], "CUDA_DEVICE_MEMORY_LIMIT"),
        Vec::<&str>::new()
    );
    assert_eq!(
        env(&spec.containers[2], "CUDA_DEVICE_MEMORY_LIMIT"),
        ["<valueFrom>"]
    );
    assert_eq!(
        env(&spec.containers[3], "CUDA_DEVICE_MEMORY_LIMIT"),
        ["2000m"]
    );
    for name in ["own", "per-device", "from-ref"] {
        assert!(
            annotation(&out.pod, &format!("limits.hami.io/{name}")).is_none(),
            "{name}"
        );
    }
    assert_eq!(
        mounts(&spec.containers[1])
            .iter()
            .filter(|m| m.1 == "/overrideEnv")
            .count(),
        0
    );
    assert_eq!(
        mounts(&spec.containers[3]).last(),
        Some(&limits_mount("plain"))
    );
    assert_eq!(out.warnings.len(), 3, "{:?}", out.warnings);
    assert!(
        out.warnings[0].contains("\"own\" sets CUDA_DEVICE_MEMORY_LIMIT to \"1000m\""),
        "{:?}",
        out.warnings
    );
}

#[test]
fn spoofed_limits_annotations_are_overwritten_or_removed() {
    let mut pod = object(SMALL);
    let a = &mut pod["metadata"]["annotations"];
    a["limits.hami.io/train"] = json!("CUDA_DEVICE_MEMORY_LIMIT=999999m\nHAMI_LIMITS_FORMAT=1\n");
    a["limits.hami.io/ghost"] = json!("CUDA_DEVICE_MEMORY_LIMIT=999999m\n");
    let out = mutate(&pod, &settings(16384));
    assert_eq!(
        annotation(&out.pod, "limits.hami.io/train"),
        Some(
            "CUDA_DEVICE_MEMORY_LIMIT=4096m\nHAMI_GPU_FRACTION=0.25\nHAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/usr/local/vgpu/node-gpus\n"
        )
    );
    assert_eq!(annotation(&out.pod, "limits.hami.io/ghost"), None);
    // In env mode too: the webhook owns the prefix.
    let mut pod = object(SMALL);
    pod["metadata"]["annotations"]["hami.io/limit-delivery"] = json!("env");
    pod["metadata"]["annotations"]["limits.hami.io/train"] =
        json!("CUDA_DEVICE_MEMORY_LIMIT=999999m\n");
    let out = mutate(&pod, &settings(16384));
    assert_eq!(annotation(&out.pod, "limits.hami.io/train"), None);
}

#[test]
fn copied_variables_land_in_the_file_when_harmless() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "p", "annotations": {"gpu-memory": "3000"}},
    "spec": {"schedulerName": "kai-scheduler", "containers": [
        {"name": "a", "env": [
            {"name": "CUDA_TASK_PRIORITY", "value": "0"},
            {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"},
            {"name": "CUDA_DEVICE_MEMORY_SHARED_CACHE", "value": "/tmp/a.cache"},
            {"name": "LIBVGPU_HOSTPID_BROKER", "value": "1"}]},
        {"name": "b", "env": [
            {"name": "CUDA_TASK_PRIORITY", "value": "high"},
            {"name": "GPU_CORE_UTILIZATION_POLICY", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}
    ]}});
    let mut s = allow(settings(16384));
    s.kai.preload_containers = PreloadContainers::All;
    let out = mutate(&pod, &s);
    let a = annotation(&out.pod, "limits.hami.io/a").unwrap();
    assert_eq!(
        a,
        "CUDA_DEVICE_MEMORY_LIMIT=3000m\nCUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/a.cache\nCUDA_TASK_PRIORITY=0\nGPU_CORE_UTILIZATION_POLICY=force\nHAMI_LIMITS_FORMAT=1\nLIBVGPU_HOSTPID_BROKER=1\n"
    );
    assert_clean_file(a, "3000m");
    let b = annotation(&out.pod, "limits.hami.io/b").unwrap();
    assert_eq!(b, "CUDA_DEVICE_MEMORY_LIMIT=3000m\nHAMI_LIMITS_FORMAT=1\n");
    assert_clean_file(b, "3000m");
    // The shared builder's warnings (typed PlanWarning, shown as text): a value HAMi-core would
    // not read as meant, and a valueFrom whose value is unknown at admission.
    assert_eq!(out.warnings.len(), 2, "{:?}", out.warnings);
    assert!(
        out.warnings[0].contains("CUDA_TASK_PRIORITY=\"high\" left out"),
        "{:?}",
        out.warnings
    );
    assert!(
        out.warnings[1].contains("GPU_CORE_UTILIZATION_POLICY is set with valueFrom"),
        "{:?}",
        out.warnings
    );
}

#[test]
fn denials() {
    let s = settings(16384);
    let base = || object(SMALL);
    let mut foreign = base();
    foreign["spec"]["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "mine", "mountPath": "/overrideEnv"}));
    foreign["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "mine", "emptyDir": {}}));
    assert_eq!(
        denial(&foreign, &s),
        "pod ml-team/train-: container \"train\" mounts volume \"mine\" at \"/overrideEnv\" (/overrideEnv), at the same path as the mount hami-limits adds: volume \"hami-limits\" at /overrideEnv (the limits file HAMi-core reads; the path is reserved for hami-limits); remove or move that mount"
    );
    let mut reserved = base();
    reserved["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "hami-limits", "configMap": {"name": "x"}}));
    assert!(denial(&reserved, &s).contains("volume \"hami-limits\" is reserved"));
    let mut hook = base();
    hook["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "kai-resource-isolator-vgpu", "emptyDir": {}}));
    assert!(denial(&hook, &s).contains("volume \"kai-resource-isolator-vgpu\" is reserved"));
    let mut tiny = base();
    tiny["metadata"]["annotations"]["gpu-fraction"] = json!("0.0001");
    assert_eq!(
        denial(&tiny, &settings(8000)),
        "pod ml-team/train-: annotation gpu-fraction=\"0.0001\" of the per-GPU VRAM (8000 MiB) is below 1 MiB; a limit of 0 would mean unlimited to HAMi-core"
    );
    let mut nobody = base();
    nobody["metadata"]["annotations"]["gpu-fraction-container-name"] = json!("nobody");
    assert!(
        denial(&nobody, &s).contains("gpu-fraction-container-name=\"nobody\" names no container")
    );
    let mut bad = base();
    bad["metadata"]["annotations"]["gpu-fraction"] = json!("0x1p-2");
    assert!(denial(&bad, &s).contains("gpu-fraction=\"0x1p-2\" is not a decimal number"));
}

#[test]
fn mount_paths_are_compared_cleaned_and_mounts_above_or_inside_ours_are_denied() {
    let s = settings(16384);
    let with_mount = |path: &str| {
        let mut pod = object(SMALL);
        pod["spec"]["containers"][0]["volumeMounts"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "mine", "mountPath": path}));
        pod["spec"]["volumes"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "mine", "emptyDir": {}}));
        pod
    };
    let limits = "volume \"hami-limits\" at /overrideEnv";
    let preload = "volume \"kai-resource-isolator-vgpu\" at /etc/ld.so.preload";
    let hook = "volume \"kai-resource-isolator-vgpu\" at /usr/local/vgpu";
    // (their mountPath, how it stands to ours, our mount)
    let cases: &[(&str, &str, &str)] = &[
        ("/overrideEnv/", "at the same path as", limits),
        ("//overrideEnv", "at the same path as", limits),
        ("/./overrideEnv", "at the same path as", limits),
        ("/tmp/../overrideEnv", "at the same path as", limits),
        ("/../overrideEnv", "at the same path as", limits),
        ("overrideEnv", "at the same path as", limits),
        ("/etc/ld.so.preload/", "at the same path as", preload),
        ("//etc//ld.so.preload", "at the same path as", preload),
        ("/etc/./ld.so.preload", "at the same path as", preload),
        ("/var/../etc/ld.so.preload", "at the same path as", preload),
        ("/usr/local/vgpu/", "at the same path as", hook),
        ("/usr//local/./vgpu", "at the same path as", hook),
        ("/usr/local/vgpu/libvgpu.so", "inside", hook),
        ("/etc", "above", preload),
        ("/etc/", "above", preload),
        ("/usr/local", "above", hook),
        ("/", "above", hook),
        ("//", "above", hook),
    ];
    for &(path, how, ours) in cases {
        let message = denial(&with_mount(path), &s);
        let theirs = format!("container \"train\" mounts volume \"mine\" at {path:?}");
        assert!(
            message.contains(&theirs) && message.contains(how) && message.contains(ours),
            "{path}: {message}"
        );
    }
    // Neighbours that share only a prefix are not ours.
    for path in [
        "/overrideEnvX",
        "/overrideEn",
        "/etc/ld.so.preload.d",
        "/usr/local/vgpu2",
        "/et",
    ] {
        let out = mutate(&with_mount(path), &s);
        assert!(
            out.pod.spec.as_ref().unwrap().containers[0]
                .volume_mounts
                .as_ref()
                .unwrap()
                .iter()
                .any(|m| m.mount_path == "/overrideEnv"),
            "{path}"
        );
    }
    // Our own mounts, spelled unclean by an earlier writer, are recognised (nothing added twice).
    let mut pod = with_mount("/data");
    pod["spec"]["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "kai-resource-isolator-vgpu", "mountPath": "/etc//ld.so.preload", "subPath": "ld.so.preload", "readOnly": true}));
    let out = mutate(&pod, &s);
    let preload_mounts = out.pod.spec.as_ref().unwrap().containers[0]
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .filter(|m| m.mount_path.contains("ld.so.preload"))
        .count();
    assert_eq!(preload_mounts, 1);
    // Our volume at our path with another subPath (a folder where the loader wants a file) is not
    // ours.
    let mut pod = with_mount("/data");
    pod["spec"]["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "kai-resource-isolator-vgpu", "mountPath": "/etc/ld.so.preload"}));
    assert!(denial(&pod, &s).contains("at the same path as"));
}

#[test]
fn missing_basis_deny_is_the_default_and_refuses_fraction_pods_without_a_basis_only() {
    let deny = host_path();
    assert_eq!(deny.kai.missing_basis, MissingBasis::Deny);
    let pod = object(SMALL);
    for (basis, reason) in [
        (
            &NoBasis as &dyn VramBasis,
            "no per-GPU VRAM basis is configured",
        ),
        (&NotSynced, "the GPU node list has not been read yet"),
    ] {
        let Decision::Deny { message } = decide_with(&pod, &deny, basis) else {
            panic!("not denied");
        };
        for needle in [
            "annotation gpu-fraction=\"0.25\" needs the per-GPU VRAM",
            reason,
            "kai.missingBasis is deny",
            "nvidia.com/gpu.memory",
            "kai.perGpuVramMib (HAMI_KAI__PER_GPU_VRAM_MIB)",
            "gpu-memory=<MiB>",
        ] {
            assert!(message.contains(needle), "{needle}: {message}");
        }
    }
    // No labelled node the pod can land on: refused too.
    let index = node_index(json!({"kind": "NodeList", "items": [
        {"metadata": {"name": "t4", "labels": {"nvidia.com/gpu.memory": "15360", "pool": "infer"}}}]}));
    let mut nowhere = object(SMALL);
    nowhere["spec"]["nodeSelector"] = json!({"pool": "cpu"});
    let Decision::Deny { message } = decide_with(&nowhere, &deny, &index) else {
        panic!("not denied");
    };
    assert!(
        message.contains("no GPU node this pod can be placed on"),
        "{message}"
    );
    // With a basis it is capped as usual; gpu-memory needs none; the opt-out admits uncapped.
    assert!(matches!(
        decide_with(&object(SMALL), &deny, &index),
        Decision::Allow { .. }
    ));
    let mut memory = object(SMALL);
    memory["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("gpu-fraction");
    memory["metadata"]["annotations"]["gpu-memory"] = json!("4000");
    assert!(matches!(
        decide_with(&memory, &deny, &NoBasis),
        Decision::Allow { .. }
    ));
    assert!(matches!(
        decide_with(&object(SMALL), &warn(), &NoBasis),
        Decision::Allow { .. }
    ));
    // Denied, not admitted: nothing to count as a skipped cap.
    let Decision::Deny { .. } = decide_with(&object(SMALL), &deny, &NoBasis) else {
        panic!("not denied");
    };
}

/// A KAI gpu-fraction pod with `n` tiny containers, as the tester's.
fn many_containers(n: usize) -> Value {
    let containers: Vec<Value> = (0..n)
        .map(|i| json!({"name": format!("c{i}"), "image": "x"}))
        .collect();
    json!({"metadata": {"name": "wide", "namespace": "ml", "annotations": {"gpu-fraction": "0.5"}},
        "spec": {"schedulerName": "kai-scheduler", "containers": containers}})
}

#[test]
fn wide_pods_are_denied_before_their_patch_outgrows_what_can_be_stored() {
    // Every container preloaded (and so capped): the widest patch the webhook can be asked for.
    let mut s = settings(16384);
    s.kai.preload_containers = PreloadContainers::All;
    s.kai.hook_delivery = hami_webhook::policy::kai::HookDelivery::DevicePlugin;
    // A few hundred containers: fine.
    let out = mutate(&many_containers(300), &s);
    assert_eq!(
        annotation(&out.pod, "limits.hami.io/c299"),
        Some(
            "CUDA_DEVICE_MEMORY_LIMIT=8192m\nCUDA_DEVICE_MEMORY_SHARED_CACHE=/var/lib/hami-limits/region/usage.cache\nHAMI_GPU_FRACTION=0.5\nHAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/usr/local/vgpu/node-gpus\n"
        )
    );
    // 2,500: the limits files alone pass the API server's 256 KiB of annotations.
    let message = denial(&many_containers(2500), &s);
    assert!(message.contains("pod ml/wide: the limits files of its 2500 containers would bring the pod's annotations past 256 KiB"), "{message}");
    // The tester's 91,358: the variables pass the patch bound before the files are built.
    let message = denial(&many_containers(91_358), &s);
    assert!(
        message.contains("take more than 1536 KiB of JSONPatch"),
        "{message}"
    );
    // In env mode there is no file, but the variables alone pass 1.5 MiB of patch.
    let mut env = many_containers(91_358);
    env["metadata"]["annotations"]["hami.io/limit-delivery"] = json!("env");
    let message = denial(&env, &s);
    assert!(
        message.contains("pod ml/wide: the changes hami-limits must make to its 91358 containers and init containers take more than 1536 KiB of JSONPatch"),
        "{message}"
    );
    // With every container preloaded too.
    let all = Settings {
        kai: KaiSettings {
            preload_containers: PreloadContainers::All,
            hook_delivery: hami_webhook::policy::kai::HookDelivery::HostPath,
            ..s.kai.clone()
        },
        ..s.clone()
    };
    assert!(denial(&env, &all).contains("take more than 1536 KiB of JSONPatch"));
    // Just under the bound is admitted: every patch that is answered fits.
    let mut fits = many_containers(2000);
    fits["metadata"]["annotations"]["hami.io/limit-delivery"] = json!("env");
    let Decision::Allow { patch, .. } = decide(&fits, &all) else {
        panic!("2000 containers in env mode fit");
    };
    let bytes = serde_json::to_vec(&patch).unwrap().len();
    assert!(
        bytes <= hami_webhook::wire::patch::MAX_PATCH_BYTES,
        "{bytes}"
    );
    assert!(
        bytes > 500_000,
        "{bytes}: the case should be near the bound to mean something"
    );
}

#[test]
fn warnings_are_capped() {
    let mut pod = many_containers(100);
    for c in pod["spec"]["containers"].as_array_mut().unwrap() {
        let name = c["name"].as_str().unwrap().to_owned();
        c["env"] =
            json!([{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": format!("{}m", name.len())}]);
    }
    let mut s = allow(settings(16384));
    s.kai.preload_containers = PreloadContainers::All;
    let out = mutate(&pod, &s);
    assert_eq!(
        out.warnings.len(),
        hami_webhook::policy::mutation::MAX_WARNINGS + 1
    );
    assert_eq!(
        out.warnings.last().unwrap(),
        "and 84 more warnings (only the first 16 are shown)"
    );
}

/// A pod's own KAI opt-out counts only in the namespaces of `tenancy.kaiOptOutNamespaces`;
/// elsewhere the pod is mutated as any KAI pod, with a warning saying the opt-out was ignored.
#[test]
fn opted_out_and_other_scheduler_pods_are_untouched() {
    let honoured = |mut s: Settings| {
        s.tenancy.kai_opt_out_namespaces = vec!["ml-team".to_owned()];
        s
    };
    let plain = mutate(&object(SMALL), &settings(16384));
    for (key, value, label) in [
        ("kai-resource-isolator.io/inject", "False", false),
        ("kai-resource-isolator.io/webhook", "ignore", true),
    ] {
        let mut pod = object(SMALL);
        let field = if label { "labels" } else { "annotations" };
        pod["metadata"][field][key] = json!(value);
        assert_eq!(
            decide(&pod, &honoured(settings(16384))),
            Decision::allow(),
            "{key}"
        );
        let out = mutate(&pod, &settings(16384));
        assert_eq!(out.files, plain.files, "{key}");
        let kind = if label { "label" } else { "annotation" };
        assert_eq!(
            out.warnings,
            [format!(
                "the pod's opt-out {kind} {key}={value:?} is ignored: in namespace \"ml-team\" only the operator turns HAMi-core and the GPU memory cap off (tenancy.kaiOptOutNamespaces)"
            )],
            "{key}"
        );
    }
    let mut pod = object(SMALL);
    pod["spec"]["schedulerName"] = json!("default-scheduler");
    assert_eq!(decide(&pod, &settings(16384)), Decision::allow());
}

fn node_index(nodes: Value) -> VramIndex {
    VramIndex::from_node_list(nodes.to_string().as_bytes()).unwrap()
}

#[test]
fn basis_from_nodes_is_narrowed_by_placement() {
    let nodes = json!({"kind": "NodeList", "items": [
        {"metadata": {"name": "t4", "labels": {"nvidia.com/gpu.memory": "15360", "pool": "infer"}}},
        {"metadata": {"name": "a100", "labels": {"nvidia.com/gpu.memory": "81920", "pool": "train"}}},
        {"metadata": {"name": "mig", "labels": {"nvidia.com/gpu.memory": "9728", "pool": "train", "nvidia.com/mig.strategy": "single"}}}
    ]});
    let index = node_index(nodes);
    let s = host_path();
    let limit = |pod: &Value| {
        let out = mutate_with(pod, &s, &index);
        env(
            &out.pod.spec.as_ref().unwrap().containers[0],
            "CUDA_DEVICE_MEMORY_LIMIT",
        )
        .first()
        .map(|s| (*s).to_owned())
    };
    let mut pod = object(SMALL);
    // Unconstrained: the smallest GPU, the MIG slice: 9728 / 4.
    assert_eq!(limit(&pod).as_deref(), Some("2432m"));
    pod["spec"]["nodeSelector"] = json!({"pool": "train"});
    assert_eq!(limit(&pod).as_deref(), Some("2432m"));
    pod["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/mig.strategy", "operator": "DoesNotExist"}]}]}}});
    assert_eq!(limit(&pod).as_deref(), Some("20480m"));
    let mut pinned = object(SMALL);
    pinned["spec"]["nodeName"] = json!("t4");
    assert_eq!(limit(&pinned).as_deref(), Some("3840m"));
    // No GPU node matches: denied by default (below); with the opt-out allowed, injected, no
    // cap, a warning, a metric, and a limits file saying why.
    let mut nowhere = object(SMALL);
    nowhere["spec"]["nodeSelector"] = json!({"pool": "cpu"});
    assert!(matches!(
        decide_with(&nowhere, &s, &index),
        Decision::Deny { .. }
    ));
    let out = mutate_with(&nowhere, &warn(), &index);
    let c = &out.pod.spec.as_ref().unwrap().containers[0];
    assert!(env(c, "CUDA_DEVICE_MEMORY_LIMIT").is_empty());
    assert!(mounts(c).iter().any(|m| m.1 == "/etc/ld.so.preload"));
    assert!(mounts(c).contains(&limits_mount("train")));
    assert_eq!(
        annotation(&out.pod, "limits.hami.io/train"),
        Some("HAMI_LIMITS_FORMAT=1\nHAMI_UNCAPPED=no-matching-node\n")
    );
    assert_eq!(out.warnings.len(), 1);
    assert!(
        out.warnings[0].contains("GPU memory cap skipped (kai.missingBasis is warn)"),
        "{:?}",
        out.warnings
    );
    assert!(
        out.warnings[0].contains("no GPU node this pod can be placed on"),
        "{:?}",
        out.warnings
    );
    // Observed, not counted: the shell counts (once per review).
    assert_eq!(
        out.observations,
        [
            Observation::KaiCapSkipped(hami_webhook::policy::basis::SkipReason::NoMatchingNode),
            Observation::KaiPod(hami_webhook::policy::mutation::KaiLimit::None)
        ]
    );
    let metrics = KaiMetrics::default();
    metrics.observe(&out.observations);
    metrics.observe(&out.observations);
    let skipped = metrics
        .caps_skipped
        .get_or_create(&[("reason", "no-matching-node")])
        .get();
    assert_eq!(skipped, 2);
}

#[test]
fn no_source_and_unsynced_index_skip_the_cap_with_a_reason() {
    let s = warn();
    let out = mutate(&object(SMALL), &s);
    assert!(
        out.warnings[0].contains("no per-GPU VRAM basis is configured"),
        "{:?}",
        out.warnings
    );
    assert_eq!(
        out.files,
        [(
            "train".to_owned(),
            "HAMI_LIMITS_FORMAT=1\nHAMI_UNCAPPED=no-source\n".to_owned()
        )]
    );
    let out = mutate_with(&object(SMALL), &s, &NotSynced);
    assert!(
        out.warnings[0].contains("has not been read yet"),
        "{:?}",
        out.warnings
    );
    assert_eq!(
        out.files,
        [(
            "train".to_owned(),
            "HAMI_LIMITS_FORMAT=1\nHAMI_UNCAPPED=not-synced\n".to_owned()
        )]
    );
    // gpu-memory needs no basis.
    let mut pod = object(SMALL);
    let a = pod["metadata"]["annotations"].as_object_mut().unwrap();
    a.remove("gpu-fraction");
    a.insert("gpu-memory".into(), json!("1234"));
    let out = mutate_with(&pod, &s, &NotSynced);
    assert!(out.warnings.is_empty());
    assert_eq!(
        env(
            &out.pod.spec.as_ref().unwrap().containers[0],
            "CUDA_DEVICE_MEMORY_LIMIT"
        ),
        ["1234m"]
    );
}

#[test]
fn mutate_command_shows_the_projected_files() {
    let pod = serde_json::to_vec(&object(SMALL)).unwrap();
    let out = hami_webhook::shell::offline_commands::mutate_command(
        &pod,
        hami_webhook::shell::offline_commands::MutateOutput::Pod,
        &settings(16384),
        &NoBasis,
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "limits file for container \"train\" (read-only at /overrideEnv):\n  CUDA_DEVICE_MEMORY_LIMIT=4096m\n  HAMI_GPU_FRACTION=0.25\n  HAMI_LIMITS_FORMAT=1\n  HAMI_NODE_GPUS=/usr/local/vgpu/node-gpus\n"
        ),
        "{}",
        out.stderr
    );
    assert!(
        out.stdout.contains("limits.hami.io/train"),
        "{}",
        out.stdout
    );
    // env delivery: no file to show.
    let mut s = settings(16384);
    s.kai.limit_delivery = hami_shared::values::LimitDelivery::Env;
    let out = hami_webhook::shell::offline_commands::mutate_command(
        &pod,
        hami_webhook::shell::offline_commands::MutateOutput::Pod,
        &s,
        &NoBasis,
    );
    assert!(!out.stderr.contains("limits file"), "{}", out.stderr);
}

#[test]
fn spoofed_limits_annotation_is_replaced_or_removed_when_the_cap_is_skipped() {
    let mut pod = object(SMALL);
    pod["metadata"]["annotations"]["limits.hami.io/train"] =
        json!("CUDA_DEVICE_MEMORY_LIMIT=999999m\n");
    pod["metadata"]["annotations"]["limits.hami.io/ghost"] =
        json!("CUDA_DEVICE_MEMORY_LIMIT=999999m\n");
    let out = mutate(&pod, &warn());
    assert_eq!(
        annotation(&out.pod, "limits.hami.io/train"),
        Some("HAMI_LIMITS_FORMAT=1\nHAMI_UNCAPPED=no-source\n")
    );
    assert_eq!(annotation(&out.pod, "limits.hami.io/ghost"), None);
    assert_eq!(out.warnings.len(), 1);
    // env delivery: no file at all, and none of the user's.
    pod["metadata"]["annotations"]["hami.io/limit-delivery"] = json!("env");
    let out = mutate(&pod, &warn());
    assert_eq!(annotation(&out.pod, "limits.hami.io/train"), None);
    assert_eq!(annotation(&out.pod, "limits.hami.io/ghost"), None);
}

#[test]
fn duplicated_env_entries_follow_kubernetes_the_last_one_wins() {
    // A KAI container with CUDA_TASK_PRIORITY=1 then CUDA_TASK_PRIORITY=2 runs with 2 (the last
    // entry wins in Kubernetes); its limits file must say 2 as well, as the device plugin's would.
    let mut pod = object(SMALL);
    pod["spec"]["containers"][0]["env"] = json!([
        {"name": "CUDA_TASK_PRIORITY", "value": "1"},
        {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"},
        {"name": "CUDA_TASK_PRIORITY", "value": "2"},
        {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "disable"}
    ]);
    let out = mutate(&pod, &allow(settings(16384)));
    let (container, text) = &out.files[0];
    assert_eq!(container, "train");
    assert_eq!(
        text,
        "CUDA_DEVICE_MEMORY_LIMIT=4096m\nCUDA_TASK_PRIORITY=2\nGPU_CORE_UTILIZATION_POLICY=disable\nHAMI_GPU_FRACTION=0.25\nHAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/usr/local/vgpu/node-gpus\n"
    );
    assert!(parse(text).diagnostics.is_empty());
    assert!(out.warnings.is_empty(), "{:?}", out.warnings);
    // The same rule as the device plugin: the shared builder over the same entries.
    let mut b = hami_shared::container::LimitsBuilder::new("train");
    b.memory_limit(
        None,
        hami_shared::values::MemoryLimitMib::new(4096).unwrap(),
    )
    .unwrap();
    b.per_node_fraction("0.25", "/usr/local/vgpu/node-gpus")
        .unwrap();
    b.copy_from_spec(&[
        hami_shared::container::SpecEnv {
            name: "CUDA_TASK_PRIORITY",
            value: Some("1"),
        },
        hami_shared::container::SpecEnv {
            name: "GPU_CORE_UTILIZATION_POLICY",
            value: Some("force"),
        },
        hami_shared::container::SpecEnv {
            name: "CUDA_TASK_PRIORITY",
            value: Some("2"),
        },
        hami_shared::container::SpecEnv {
            name: "GPU_CORE_UTILIZATION_POLICY",
            value: Some("disable"),
        },
    ]);
    assert_eq!(&b.finish().0.render(), text);
    // A later valueFrom hides the earlier literal: nothing copied, a warning says why.
    pod["spec"]["containers"][0]["env"] = json!([
        {"name": "CUDA_TASK_PRIORITY", "value": "1"},
        {"name": "CUDA_TASK_PRIORITY", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    ]);
    let out = mutate(&pod, &allow(settings(16384)));
    assert!(
        !out.files[0].1.contains("CUDA_TASK_PRIORITY"),
        "{}",
        out.files[0].1
    );
    assert_eq!(out.warnings.len(), 1);
    assert!(
        out.warnings[0].contains("CUDA_TASK_PRIORITY is set with valueFrom"),
        "{:?}",
        out.warnings
    );
}

/// The limits file the webhook projects for `container`, parsed.
fn file_entries(out: &Mutated, container: &str) -> std::collections::BTreeMap<String, String> {
    let (_, text) = out
        .files
        .iter()
        .find(|(c, _)| c == container)
        .unwrap_or_else(|| panic!("no file for {container}: {:?}", out.files));
    parse(text).entries
}

#[test]
fn per_node_keys_for_gpu_fraction_in_file_delivery_only() {
    // gpu-memory: the MiB asked for is exact on every node; nothing for the preload library.
    let mut memory = object(SMALL);
    let a = memory["metadata"]["annotations"].as_object_mut().unwrap();
    a.remove("gpu-fraction");
    a.insert("gpu-memory".into(), json!("3000"));
    let out = mutate(&memory, &settings(16384));
    assert_eq!(
        out.files,
        [(
            "train".to_owned(),
            "CUDA_DEVICE_MEMORY_LIMIT=3000m\nHAMI_LIMITS_FORMAT=1\n".to_owned()
        )]
    );
    // env delivery: no file, and the keys never become variables.
    let mut env_pod = object(SMALL);
    env_pod["metadata"]["annotations"]["hami.io/limit-delivery"] = json!("env");
    let out = mutate(&env_pod, &settings(16384));
    assert!(out.files.is_empty());
    for c in all_containers(&out.pod) {
        for key in ["HAMI_GPU_FRACTION", "HAMI_NODE_GPUS", "HAMI_UNCAPPED"] {
            assert!(env(c, key).is_empty(), "{} {key}", c.name);
        }
    }
    // The fraction in canonical form, whatever KAI spelling the annotation used.
    for (spelled, canonical) in [
        ("25e-2", "0.25"),
        ("+.50", "0.5"),
        ("000.00024E-00", "0.00024"),
    ] {
        let mut pod = object(SMALL);
        pod["metadata"]["annotations"]["gpu-fraction"] = json!(spelled);
        let out = mutate(&pod, &settings(1_000_000));
        let entries = file_entries(&out, "train");
        assert_eq!(
            entries.get("HAMI_GPU_FRACTION").map(String::as_str),
            Some(canonical),
            "{spelled}"
        );
    }
}

#[test]
fn the_node_gpu_file_is_where_the_hook_folder_is_mounted() {
    for (hook, path) in [
        ("/usr/local/vgpu", "/usr/local/vgpu/node-gpus"),
        ("/opt/kai/vgpu/", "/opt/kai/vgpu/node-gpus"),
        ("//opt/./kai/../kai/vgpu", "/opt/kai/vgpu/node-gpus"),
    ] {
        let mut s = settings(16384);
        s.kai.hook_path = hook.to_owned();
        let out = mutate(&object(SMALL), &s);
        let c = &out.pod.spec.as_ref().unwrap().containers[0];
        // The folder is mounted at that cleaned path, so the file is there in the container.
        let (folder, _) = path.rsplit_once('/').unwrap();
        assert!(
            mounts(c)
                .iter()
                .any(|m| m.0 == "kai-resource-isolator-vgpu" && m.1 == folder),
            "{hook}: {:?}",
            mounts(c)
        );
        let (_, text) = &out.files[0];
        assert!(parse(text).is_clean(), "{hook}: {text}");
        assert_eq!(
            parse(text)
                .entries
                .get("HAMI_NODE_GPUS")
                .map(String::as_str),
            Some(path),
            "{hook}"
        );
    }
    // A folder the file cannot name: the admission-time cap alone, and the operator is told.
    let mut s = settings(16384);
    s.kai.hook_path = "/opt/my vgpu".to_owned();
    let out = mutate(&object(SMALL), &s);
    assert_eq!(
        out.files,
        [(
            "train".to_owned(),
            "CUDA_DEVICE_MEMORY_LIMIT=4096m\nHAMI_LIMITS_FORMAT=1\n".to_owned()
        )]
    );
    assert_eq!(out.warnings.len(), 1, "{:?}", out.warnings);
    for needle in [
        "kai.hookPath \"/opt/my vgpu\"",
        "/opt/my vgpu/node-gpus",
        "admission-time cap only",
    ] {
        assert!(
            out.warnings[0].contains(needle),
            "{needle}: {:?}",
            out.warnings
        );
    }
}

#[test]
fn a_fraction_past_64_places_keeps_the_admission_time_cap_alone() {
    // KAI accepts it (a 64-bit float reads it as 0.1), the cap is computed exactly, but the limits
    // file's HAMI_GPU_FRACTION holds at most 64 places.
    let long = format!("0.1{}1", "0".repeat(64));
    let mut pod = object(SMALL);
    pod["metadata"]["annotations"]["gpu-fraction"] = json!(long);
    let out = mutate(&pod, &settings(100_000));
    assert_eq!(
        out.files,
        [(
            "train".to_owned(),
            "CUDA_DEVICE_MEMORY_LIMIT=10000m\nHAMI_LIMITS_FORMAT=1\n".to_owned()
        )]
    );
    assert_eq!(out.warnings.len(), 1, "{:?}", out.warnings);
    assert!(
        out.warnings[0].contains("more than 64 decimal places"),
        "{:?}",
        out.warnings
    );
    // 64 places exactly: the keys are written.
    let at_bound = format!("0.1{}1", "0".repeat(62));
    pod["metadata"]["annotations"]["gpu-fraction"] = json!(at_bound);
    let out = mutate(&pod, &settings(100_000));
    assert_eq!(
        file_entries(&out, "train")
            .get("HAMI_GPU_FRACTION")
            .map(String::as_str),
        Some(at_bound.as_str())
    );
    assert!(out.warnings.is_empty(), "{:?}", out.warnings);
}

#[test]
fn only_the_preloaded_container_gets_the_per_node_keys() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "annotations": {"gpu-fraction": "0.5", "gpu-fraction-container-name": "gpu"}},
        "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "sidecar"}, {"name": "gpu"}]}});
    let out = mutate(&pod, &settings(81_920));
    // The sidecar gets no GPU and no HAMi-core: no file at all.
    assert_eq!(
        out.files,
        [
            (
                "gpu".to_owned(),
                "CUDA_DEVICE_MEMORY_LIMIT=40960m\nHAMI_GPU_FRACTION=0.5\nHAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/usr/local/vgpu/node-gpus\n"
                    .to_owned()
            ),
        ]
    );
    for (_, text) in &out.files {
        assert!(parse(text).is_clean(), "{text}");
    }
}

#[test]
fn the_opt_out_gives_each_preloaded_container_a_file_saying_it_is_uncapped() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "p", "namespace": "ml", "annotations": {"gpu-fraction": "0.5"}},
    "spec": {"schedulerName": "kai-scheduler",
        "initContainers": [{"name": "init"}],
        "containers": [
            {"name": "main"},
            {"name": "own", "env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "1000m"}]}
        ]}});
    let mut s = allow(warn());
    s.kai.preload_containers = PreloadContainers::All;
    let out = mutate(&pod, &s);
    // Every preloaded container without a limit of its own; none gets a cap.
    let names: Vec<&str> = out.files.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(names, ["init", "main"]);
    for (container, text) in &out.files {
        assert_eq!(text, "HAMI_LIMITS_FORMAT=1\nHAMI_UNCAPPED=no-source\n");
        // What `hami-limits check /overrideEnv` shows in the container: one warning.
        let parsed = parse(text);
        assert_eq!(parsed.diagnostics.len(), 1, "{:?}", parsed.diagnostics);
        let d = &parsed.diagnostics[0];
        assert_eq!(d.severity, hami_shared::limits_file::Severity::Warning);
        for needle in [
            "runs without a GPU memory cap",
            "kai.missingBasis is warn",
            "no kai.perGpuVramMib",
        ] {
            assert!(d.message.contains(needle), "{needle}: {}", d.message);
        }
        let c = all_containers(&out.pod)
            .into_iter()
            .find(|c| &c.name == container)
            .unwrap();
        assert!(env(c, "CUDA_DEVICE_MEMORY_LIMIT").is_empty());
        assert!(mounts(c).contains(&limits_mount(container)), "{container}");
    }
    let own = &out.pod.spec.as_ref().unwrap().containers[1];
    assert!(!mounts(own).iter().any(|m| m.1 == "/overrideEnv"));
    assert_eq!(
        out.observations,
        [
            Observation::KaiCapSkipped(hami_webhook::policy::basis::SkipReason::NoSource),
            Observation::KaiPod(hami_webhook::policy::mutation::KaiLimit::None)
        ]
    );
    // preloadContainers: fraction: the one preloaded container.
    let out = mutate(&pod, &warn());
    let names: Vec<&str> = out.files.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(names, ["main"]);
    // Its own mount at /overrideEnv would hide the file: denied, as for a capped pod.
    let mut shadow = pod.clone();
    shadow["spec"]["volumes"] = json!([{"name": "mine", "emptyDir": {}}]);
    shadow["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "mine", "mountPath": "/overrideEnv"}]);
    assert!(denial(&shadow, &warn()).contains("/overrideEnv"));
}

/// `hami.io/preload` delivery: `serve-preload` mounts each preloaded container's slot folder at
/// `/var/lib/hami-limits/region`, and the limits file points HAMi-core's region there, so every
/// process of the container joins one region the node reads. Not in `hostPath` delivery (no slot
/// folder), not in a file without a cap, and a container's own value does not replace it.
#[test]
fn device_plugin_delivery_puts_the_region_in_the_slot_folder() {
    const KEY: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
    const AT: &str = "/var/lib/hami-limits/region/usage.cache";
    let mut s = settings(16384);
    s.kai.hook_delivery = HookDelivery::DevicePlugin;
    let mut pod = object(SMALL);
    pod["spec"]["containers"][0]["env"] = json!([{"name": KEY, "value": "/tmp/elsewhere.cache"}]);
    let out = mutate(&pod, &allow(s.clone()));
    let file = annotation(&out.pod, "limits.hami.io/train").unwrap();
    assert_eq!(
        parse(file).entries.get(KEY).map(String::as_str),
        Some(AT),
        "{file}"
    );
    assert!(parse(file).diagnostics.is_empty(), "{file}");
    // hostPath delivery: no slot folder, no key.
    let out = mutate(&object(SMALL), &settings(16384));
    let file = annotation(&out.pod, "limits.hami.io/train").unwrap();
    assert!(!file.contains(KEY), "{file}");
    // Admitted without a cap (`kai.missingBasis: warn`): the file says why, nothing else.
    let mut uncapped = s;
    uncapped.kai.per_gpu_vram_mib = None;
    uncapped.kai.missing_basis = MissingBasis::Warn;
    let out = mutate_with(&object(SMALL), &uncapped, &NoBasis);
    let file = annotation(&out.pod, "limits.hami.io/train").unwrap();
    assert!(!file.contains(KEY), "{file}");
}
