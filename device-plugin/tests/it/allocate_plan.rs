//! Table tests of the pure allocation plan (`allocation::plan`).

use std::collections::BTreeMap;
use std::path::Path;

use hami_device_plugin::allocation::plan::codec::{ContainerDevice, ContainerSlot, PodDevices};
use hami_device_plugin::allocation::plan::{
    AllocationPlan, AllocationSettings, AllocationWarning, PlanError, PlannedMount, plan_container,
    plan_pod,
};
use hami_shared::container::PlanWarning;
use hami_shared::values::{DeliverySource, LimitDelivery};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

const UID: &str = "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b";
const LIB: &str = "/usr/local/vgpu/libvgpu.so";

fn dev(uuid: &str, mem: u64, cores: u32) -> ContainerDevice {
    ContainerDevice {
        uuid: uuid.into(),
        kind: "NVIDIA".into(),
        memory_mib: mem,
        cores,
        extra: vec![],
    }
}

/// A pod with `init` init containers and `containers` containers (`(name, env)`), the given
/// annotations.
fn pod(
    init: &[(&str, serde_json::Value)],
    containers: &[(&str, serde_json::Value)],
    annotations: serde_json::Value,
) -> Pod {
    let c = |list: &[(&str, serde_json::Value)]| {
        list.iter()
            .map(|(n, env)| json!({"name": n, "image": "cuda", "env": env}))
            .collect::<Vec<_>>()
    };
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml", "uid": UID, "annotations": annotations},
        "spec": {"initContainers": c(init), "containers": c(containers)}
    }))
    .unwrap()
}

/// The default settings with the pods' namespace allowed to set HAMi-core's variables and
/// `CUDA_DISABLE_CONTROL` in their spec, as HAMi lets every pod (these tests pin HAMi's
/// behaviour; `allocate_guard.rs` tests the default refusal).
fn hami() -> AllocationSettings {
    let mut s = AllocationSettings::default();
    s.guard.hami_core_env_namespaces.insert("ml".into());
    s
}

fn one(env: serde_json::Value) -> Pod {
    pod(&[], &[("main", env)], json!({}))
}

fn plan(pod: &Pod, devices: &[ContainerDevice], settings: &AllocationSettings) -> AllocationPlan {
    plan_container(
        pod,
        0,
        devices,
        Some(devices.len()),
        settings,
        Path::new(LIB),
    )
    .unwrap()
}

fn envs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn m(container: &str, host: &str, ro: bool) -> PlannedMount {
    PlannedMount {
        container_path: container.into(),
        host_path: host.into(),
        read_only: ro,
    }
}

/// Whether the plan mounts the preload pair (`/etc/ld.so.preload` and the preload library it
/// names): `Some(true)` both, `Some(false)` neither, `None` one without the other.
fn preload_pair(p: &AllocationPlan) -> Option<bool> {
    let list = p
        .mounts
        .iter()
        .any(|m| m.container_path == "/etc/ld.so.preload");
    let lib = p
        .mounts
        .iter()
        .any(|m| m.container_path.ends_with("/vgpu/libhami_preload.so"));
    (list == lib).then_some(list)
}

fn assert_file_clean(text: &str) {
    let parsed = hami_shared::limits_file::parse(text);
    assert!(parsed.diagnostics.is_empty(), "{:?}", parsed.diagnostics);
    for line in text.lines() {
        let (k, v) = line.split_once('=').unwrap();
        let warnings = hami_shared::hami_core::check_entry(k, v);
        assert!(warnings.is_empty(), "{line}: {warnings:?}");
        assert!(!v.is_empty() && !v.contains(char::is_whitespace), "{line}");
        assert!(!v.starts_with('0') || v == "0", "leading zero: {line}");
        assert_ne!(v, "0m", "{line}");
    }
    assert!(!text.contains('\r'));
    assert!(text.ends_with('\n'));
}

#[test]
fn single_device_file_mode_is_exact() {
    let p = plan(&one(json!([])), &[dev("GPU-aaa", 3000, 50)], &hami());
    assert_eq!(p.container, "main");
    assert_eq!(p.slot, ContainerSlot::App(0));
    assert!(!p.mig);
    assert_eq!(p.delivery.mode, LimitDelivery::File);
    assert_eq!(p.delivery.source, DeliverySource::Default);
    assert_eq!(
        p.envs,
        envs(&[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "3000m"),
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                "/usr/local/vgpu/usage.cache"
            ),
            ("CUDA_DEVICE_SM_LIMIT", "50"),
            ("NVIDIA_VISIBLE_DEVICES", "GPU-aaa"),
        ])
    );
    let dir = format!("/usr/local/vgpu/containers/{UID}_main");
    let file = format!("/usr/local/vgpu/containers/{UID}_main.limits");
    assert_eq!(
        p.mounts,
        [
            m("/usr/local/vgpu/libvgpu.so", LIB, true),
            m("/usr/local/vgpu", &dir, false),
            m("/tmp/vgpulock", "/tmp/vgpulock", false),
            m("/etc/ld.so.preload", "/usr/local/vgpu/ld.so.preload", true),
            m(
                "/usr/local/vgpu/libhami_preload.so",
                "/usr/local/vgpu/libhami_preload.so",
                true
            ),
            m("/overrideEnv", &file, true),
        ]
    );
    assert_eq!(p.container_dir.as_deref(), Some(Path::new(&dir)));
    let f = p.limits_file.as_ref().unwrap();
    assert_eq!(f.path(), Path::new(&file));
    assert_eq!(f.text, hami_shared::limits_file::EXAMPLE);
    assert_file_clean(&f.text);
    assert!(p.warnings.is_empty());
    let response = p.response();
    assert_eq!(response.envs.len(), 4);
    assert_eq!(response.mounts.len(), 6);
    assert_eq!(response.mounts[5].container_path, "/overrideEnv");
    assert!(response.mounts[5].read_only);
}

#[test]
fn multi_device_container() {
    let p = plan(
        &one(json!([])),
        &[dev("GPU-a", 4000, 30), dev("GPU-b", 8000, 60)],
        &hami(),
    );
    assert_eq!(p.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "4000m");
    assert_eq!(p.envs["CUDA_DEVICE_MEMORY_LIMIT_1"], "8000m");
    assert_eq!(
        p.envs["CUDA_DEVICE_SM_LIMIT"], "30",
        "cores of the first device"
    );
    assert_eq!(p.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
    let text = &p.limits_file.as_ref().unwrap().text;
    assert_eq!(
        text,
        "CUDA_DEVICE_MEMORY_LIMIT_0=4000m\nCUDA_DEVICE_MEMORY_LIMIT_1=8000m\n\
         CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/usage.cache\nCUDA_DEVICE_SM_LIMIT=30\n\
         HAMI_LIMITS_FORMAT=1\n"
    );
    assert_file_clean(text);
}

#[test]
fn init_containers_first_and_gpu_less_containers_skipped() {
    let annotation = PodDevices::from_containers(&[
        vec![dev("GPU-i", 1000, 10)],
        vec![],
        vec![],
        vec![dev("GPU-a", 2000, 20), dev("GPU-b", 2000, 20)],
        vec![dev("GPU-c", 3000, 0)],
    ])
    .encode();
    let p = pod(
        &[("setup", json!([])), ("fetch", json!([]))],
        &[
            ("sidecar", json!([])),
            ("trainer", json!([])),
            ("eval", json!([])),
        ],
        json!({"hami.io/vgpu-devices-to-allocate": annotation}),
    );
    let plans = plan_pod(&p, &hami(), Path::new(LIB)).unwrap();
    let got: Vec<(&str, ContainerSlot, usize, &str)> = plans
        .iter()
        .map(|p| {
            (
                p.container.as_str(),
                p.slot,
                p.entry,
                p.envs["NVIDIA_VISIBLE_DEVICES"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("setup", ContainerSlot::Init(0), 0, "GPU-i"),
            ("trainer", ContainerSlot::App(1), 3, "GPU-a,GPU-b"),
            ("eval", ContainerSlot::App(2), 4, "GPU-c"),
        ]
    );
    assert_eq!(plans[2].envs["CUDA_DEVICE_SM_LIMIT"], "0");
    for p in &plans {
        assert_file_clean(&p.limits_file.as_ref().unwrap().text);
    }
    // An entry naming a container the pod does not have.
    let bad = pod(
        &[],
        &[("main", json!([]))],
        json!({"hami.io/vgpu-devices-to-allocate": ";GPU-a,NVIDIA,1,1:;"}),
    );
    let err = plan_pod(&bad, &hami(), Path::new(LIB)).unwrap_err();
    assert!(
        matches!(err, PlanError::NoSuchContainer { entry: 1, .. }),
        "{err}"
    );
    // No annotation: nothing to plan.
    assert!(
        plan_pod(&one(json!([])), &hami(), Path::new(LIB))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn env_mode_has_the_same_variables_and_no_file() {
    let settings = AllocationSettings {
        global_delivery: Some(LimitDelivery::Env),
        ..hami()
    };
    let file = plan(&one(json!([])), &[dev("GPU-a", 3000, 50)], &hami());
    let env = plan(&one(json!([])), &[dev("GPU-a", 3000, 50)], &settings);
    assert_eq!(env.delivery.mode, LimitDelivery::Env);
    assert_eq!(env.delivery.source, DeliverySource::GlobalConfig);
    assert_eq!(env.envs, file.envs, "variables are injected in both modes");
    assert!(env.limits_file.is_none());
    assert!(
        env.mounts
            .iter()
            .all(|m| m.container_path != "/overrideEnv")
    );
    assert_eq!(env.mounts.len(), 5);
    assert_eq!(preload_pair(&env), Some(true));
    assert!(
        env.container_dir.is_some(),
        "the shared-region directory stays"
    );
}

#[test]
fn each_resolution_source() {
    use DeliverySource::*;
    use LimitDelivery::*;
    // (annotation, node, global) -> (mode, source, warned)
    type Case<'a> = (
        Option<&'a str>,
        Option<LimitDelivery>,
        Option<LimitDelivery>,
        LimitDelivery,
        DeliverySource,
        bool,
    );
    let cases: &[Case] = &[
        (None, None, None, File, Default, false),
        (None, None, Some(Env), Env, GlobalConfig, false),
        (None, Some(Env), Some(File), Env, NodeConfig, false),
        (None, Some(File), Some(Env), File, NodeConfig, false),
        (
            Some("file"),
            Some(Env),
            Some(Env),
            File,
            PodAnnotation,
            false,
        ),
        (Some("env"), Some(File), None, Env, PodAnnotation, false),
        (Some("ENV"), Some(File), Some(Env), File, NodeConfig, true),
        (Some(" env"), None, Some(Env), Env, GlobalConfig, true),
        (Some(""), None, None, File, Default, true),
    ];
    for (annotation, node, global, mode, source, warned) in cases {
        let annotations = match annotation {
            Some(a) => json!({"hami.io/limit-delivery": a}),
            None => json!({}),
        };
        let p = pod(&[], &[("main", json!([]))], annotations);
        let settings = AllocationSettings {
            node_delivery: *node,
            global_delivery: *global,
            ..hami()
        };
        let plan = plan(&p, &[dev("GPU-a", 1000, 0)], &settings);
        let case = format!("{annotation:?} {node:?} {global:?}");
        assert_eq!(plan.delivery.mode, *mode, "{case}");
        assert_eq!(plan.delivery.source, *source, "{case}");
        assert_eq!(plan.limits_file.is_some(), *mode == File, "{case}");
        assert_eq!(!plan.warnings.is_empty(), *warned, "{case}");
        if *warned {
            let w = &plan.warnings[0];
            assert!(
                matches!(w, AllocationWarning::InvalidLimitDelivery { .. }),
                "{case}: {w:?}"
            );
            assert_eq!(w.reason(), "InvalidLimitDelivery", "{case}");
            assert!(w.to_string().contains("hami.io/limit-delivery"), "{case}");
            assert!(w.to_string().contains("env, file"), "{case}");
        }
    }
}

#[test]
fn cuda_disable_control_drops_the_preload_mount_like_go_parse_bool() {
    for (value, preload) in [
        ("true", false),
        ("1", false),
        ("True", false),
        ("TRUE", false),
        ("t", false),
        ("false", true),
        ("yes", true),
        ("0", true),
        ("", true),
    ] {
        let p = plan(
            &one(json!([{"name": "CUDA_DISABLE_CONTROL", "value": value}])),
            &[dev("GPU-a", 1000, 0)],
            &hami(),
        );
        assert_eq!(
            preload_pair(&p),
            Some(preload),
            "CUDA_DISABLE_CONTROL={value:?}"
        );
        // The limits file is still written: only the preload is the container's choice.
        assert!(p.limits_file.is_some());
    }
    // valueFrom has no literal value: the preload stays.
    let p = plan(
        &one(
            json!([{"name": "CUDA_DISABLE_CONTROL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]),
        ),
        &[dev("GPU-a", 1000, 0)],
        &hami(),
    );
    assert_eq!(preload_pair(&p), Some(true));
}

#[test]
fn memory_scaling_log_level_and_core_limit_switch() {
    let settings = AllocationSettings {
        memory_scaling: 1.5,
        lib_cuda_log_level: Some(3),
        disable_core_limit: true,
        ..hami()
    };
    let p = plan(
        &one(json!([{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}])),
        &[dev("GPU-a", 1000, 25)],
        &settings,
    );
    assert_eq!(p.envs["CUDA_OVERSUBSCRIBE"], "true");
    assert_eq!(p.envs["LIBCUDA_LOG_LEVEL"], "3");
    assert_eq!(p.envs["GPU_CORE_UTILIZATION_POLICY"], "disable");
    let text = &p.limits_file.as_ref().unwrap().text;
    assert!(text.contains("CUDA_OVERSUBSCRIBE=true\n"));
    assert!(text.contains("LIBCUDA_LOG_LEVEL=3\n"));
    assert!(
        text.contains("GPU_CORE_UTILIZATION_POLICY=disable\n"),
        "disableCoreLimit wins: {text}"
    );
    assert_file_clean(text);
    let p = plan(&one(json!([])), &[dev("GPU-a", 1000, 25)], &hami());
    assert!(!p.envs.contains_key("CUDA_OVERSUBSCRIBE"));
    assert!(!p.envs.contains_key("LIBCUDA_LOG_LEVEL"));
    assert!(!p.envs.contains_key("GPU_CORE_UTILIZATION_POLICY"));
    let p = plan(
        &one(json!([])),
        &[dev("GPU-a", 1000, 25)],
        &AllocationSettings {
            memory_scaling: 1.0,
            ..hami()
        },
    );
    assert!(
        !p.envs.contains_key("CUDA_OVERSUBSCRIBE"),
        "exactly 1 is not oversubscription"
    );
}

#[test]
fn spec_values_the_webhook_set_are_copied_into_the_file_only() {
    let p = plan(
        &one(json!([
            {"name": "CUDA_TASK_PRIORITY", "value": "5"},
            {"name": "CUDA_TASK_PRIORITY", "value": "0"},
            {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"},
            {"name": "LIBVGPU_HOSTPID_BROKER", "value": "1"},
            {"name": "OTHER", "value": "x"}
        ])),
        &[dev("GPU-a", 1000, 25)],
        &hami(),
    );
    let text = &p.limits_file.as_ref().unwrap().text;
    assert!(
        text.contains("CUDA_TASK_PRIORITY=0\n"),
        "the last entry wins: {text}"
    );
    assert!(text.contains("GPU_CORE_UTILIZATION_POLICY=force\n"));
    assert!(text.contains("LIBVGPU_HOSTPID_BROKER=1\n"));
    assert!(!text.contains("OTHER"));
    assert!(
        !p.envs.contains_key("CUDA_TASK_PRIORITY"),
        "the container has it already"
    );
    assert_file_clean(text);
    let p = plan(
        &one(json!([{"name": "CUDA_TASK_PRIORITY", "value": "high"}])),
        &[dev("GPU-a", 1000, 25)],
        &hami(),
    );
    assert!(
        !p.limits_file
            .as_ref()
            .unwrap()
            .text
            .contains("CUDA_TASK_PRIORITY")
    );
    assert!(
        p.warnings
            .iter()
            .any(|w| w.to_string().contains("CUDA_TASK_PRIORITY")),
        "{:?}",
        p.warnings
    );
}

#[test]
fn static_mig_passes_through() {
    let p = plan(
        &one(json!([])),
        &[dev("MIG-4f5e6d7c-1111-2222-3333-444455556666", 10240, 0)],
        &hami(),
    );
    assert!(p.mig);
    assert_eq!(
        p.envs,
        envs(&[(
            "NVIDIA_VISIBLE_DEVICES",
            "MIG-4f5e6d7c-1111-2222-3333-444455556666"
        )])
    );
    assert!(p.mounts.is_empty());
    assert_eq!(preload_pair(&p), Some(false));
    assert!(p.limits_file.is_none());
    assert!(p.container_dir.is_none());
}

#[test]
fn values_that_must_never_be_written() {
    let pod = one(json!([]));
    let s = hami();
    // Zero memory means unlimited to HAMi-core.
    let err =
        plan_container(&pod, 0, &[dev("GPU-a", 0, 50)], Some(1), &s, Path::new(LIB)).unwrap_err();
    assert!(matches!(err, PlanError::Value { .. }), "{err}");
    assert!(
        err.to_string().contains("CUDA_DEVICE_MEMORY_LIMIT_0"),
        "{err}"
    );
    // More than 100 % of the cores.
    let err = plan_container(
        &pod,
        0,
        &[dev("GPU-a", 10, 150)],
        Some(1),
        &s,
        Path::new(LIB),
    )
    .unwrap_err();
    assert!(err.to_string().contains("CUDA_DEVICE_SM_LIMIT"), "{err}");
    // HAMi-core reads device indexes 0..=15 only.
    let many: Vec<ContainerDevice> = (0..17).map(|i| dev(&format!("GPU-{i}"), 10, 0)).collect();
    let err = plan_container(&pod, 0, &many, Some(17), &s, Path::new(LIB)).unwrap_err();
    assert!(
        err.to_string().contains("CUDA_DEVICE_MEMORY_LIMIT_16"),
        "{err}"
    );
    // Leading zeros in the annotation are read as decimal and never written.
    let annotated = pod_with_annotation("GPU-a,NVIDIA,04000,050:;");
    let plans = plan_pod(&annotated, &s, Path::new(LIB)).unwrap();
    assert_eq!(plans[0].envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "4000m");
    assert_eq!(plans[0].envs["CUDA_DEVICE_SM_LIMIT"], "50");
    assert_file_clean(&plans[0].limits_file.as_ref().unwrap().text);
    // A malformed annotation names the pod and the text.
    let err = plan_pod(
        &pod_with_annotation("GPU-a,NVIDIA,lots,50:;"),
        &s,
        Path::new(LIB),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("ml/train") && err.contains("lots"), "{err}");
}

fn pod_with_annotation(value: &str) -> Pod {
    pod(
        &[],
        &[("main", json!([]))],
        json!({"hami.io/vgpu-devices-to-allocate": value}),
    )
}

#[test]
fn names_are_validated_before_they_become_paths() {
    let s = hami();
    let mut p = one(json!([]));
    for uid in [
        "",
        "../../etc",
        "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5",
        "6f1c2a3b_4d5e-4f60-8a9b-0c1d2e3f4a5b",
    ] {
        p.metadata.uid = Some(uid.into());
        let err =
            plan_container(&p, 0, &[dev("GPU-a", 1, 0)], Some(1), &s, Path::new(LIB)).unwrap_err();
        assert!(
            matches!(err, PlanError::InvalidPodUid { .. }),
            "{uid}: {err}"
        );
    }
    p.metadata.uid = Some(UID.into());
    for name in ["../x", "Main", "a_b", "-a", "a.b", ""] {
        p.spec.as_mut().unwrap().containers[0].name = name.into();
        let err =
            plan_container(&p, 0, &[dev("GPU-a", 1, 0)], Some(1), &s, Path::new(LIB)).unwrap_err();
        assert!(
            matches!(err, PlanError::InvalidContainerName { .. }),
            "{name}: {err}"
        );
    }
}

#[test]
fn device_count_must_match_the_request() {
    let err = plan_container(
        &one(json!([])),
        0,
        &[dev("GPU-a", 1, 0), dev("GPU-b", 1, 0)],
        Some(1),
        &hami(),
        Path::new(LIB),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "pod ml/train: container main was assigned 2 device(s) by the scheduler but kubelet requests 1"
    );
}

#[test]
fn hook_path_and_versioned_library() {
    let s = AllocationSettings {
        hook_path: "/opt/hami".into(),
        ..hami()
    };
    assert_eq!(
        s.libvgpu_host_path("2.10.0", true),
        Path::new("/opt/hami/vgpu/libvgpu.so.2.10.0")
    );
    assert_eq!(
        s.libvgpu_host_path("2.10.0", false),
        Path::new("/opt/hami/vgpu/libvgpu.so")
    );
    let lib = s.libvgpu_host_path("2.10.0", true);
    let p = plan_container(&one(json!([])), 0, &[dev("GPU-a", 1, 0)], Some(1), &s, &lib).unwrap();
    assert_eq!(
        p.mounts[0],
        m(
            "/opt/hami/vgpu/libvgpu.so",
            "/opt/hami/vgpu/libvgpu.so.2.10.0",
            true
        )
    );
    assert_eq!(
        p.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"],
        "/opt/hami/vgpu/usage.cache"
    );
    assert_eq!(
        p.limits_file.as_ref().unwrap().path(),
        Path::new(&format!("/opt/hami/vgpu/containers/{UID}_main.limits"))
    );
}

#[test]
fn preload_list_and_preload_library_are_mounted_together_or_not_at_all() {
    let hook = AllocationSettings {
        hook_path: "/opt/hami".into(),
        ..hami()
    };
    let env_mode = AllocationSettings {
        global_delivery: Some(LimitDelivery::Env),
        ..hami()
    };
    let gpu = [dev("GPU-a", 1000, 10)];
    let mig = [dev("MIG-4f5e6d7c-1111-2222-3333-444455556666", 1000, 0)];
    let disabled = json!([{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]);
    let enabled = json!([{"name": "CUDA_DISABLE_CONTROL", "value": "false"}]);
    for (what, settings, devices, env, expected) in [
        ("normal", &hami(), &gpu, json!([]), true),
        ("env mode", &env_mode, &gpu, json!([]), true),
        ("hook path", &hook, &gpu, json!([]), true),
        ("control false", &hami(), &gpu, enabled, true),
        ("control disabled", &hami(), &gpu, disabled.clone(), false),
        (
            "control disabled, env mode",
            &env_mode,
            &gpu,
            disabled.clone(),
            false,
        ),
        ("MIG", &hami(), &mig, json!([]), false),
        ("MIG, control disabled", &hami(), &mig, disabled, false),
    ] {
        let p = plan(&one(env), devices, settings);
        assert_eq!(preload_pair(&p), Some(expected), "{what}: {:?}", p.mounts);
        if !expected {
            continue;
        }
        // Exact pair: both read-only, the library at the same path on both sides, under the
        // configured hook path (the path ld.so.preload names).
        let vgpu = settings.vgpu_dir().display().to_string();
        let list = p
            .mounts
            .iter()
            .position(|x| x.container_path == "/etc/ld.so.preload")
            .unwrap();
        assert_eq!(
            p.mounts[list..list + 2],
            [
                m("/etc/ld.so.preload", &format!("{vgpu}/ld.so.preload"), true),
                m(
                    &format!("{vgpu}/libhami_preload.so"),
                    &format!("{vgpu}/libhami_preload.so"),
                    true
                ),
            ],
            "{what}"
        );
        // The response kubelet gets carries the same pair.
        let response = p.response();
        let paths: Vec<&str> = response
            .mounts
            .iter()
            .map(|x| x.container_path.as_str())
            .collect();
        assert!(paths.contains(&"/etc/ld.so.preload"), "{what}");
        assert!(
            paths.contains(&format!("{vgpu}/libhami_preload.so").as_str()),
            "{what}"
        );
    }
    assert_eq!(
        hami_device_plugin::allocation::plan::preload_mounts(Path::new("/x/vgpu")),
        [
            m("/etc/ld.so.preload", "/x/vgpu/ld.so.preload", true),
            m(
                "/x/vgpu/libhami_preload.so",
                "/x/vgpu/libhami_preload.so",
                true
            ),
        ]
    );
}

#[test]
fn plan_pod_mounts_the_preload_pair_per_container() {
    let p = pod(
        &[("warmup", json!([]))],
        &[
            ("main", json!([])),
            (
                "nocontrol",
                json!([{"name": "CUDA_DISABLE_CONTROL", "value": "1"}]),
            ),
            ("mig", json!([])),
        ],
        json!({"hami.io/vgpu-devices-to-allocate": PodDevices::from_containers(&[
            vec![dev("GPU-a", 1000, 10)],
            vec![dev("GPU-a", 1000, 10)],
            vec![dev("GPU-b", 1000, 10)],
            vec![dev("MIG-4f5e6d7c-1111-2222-3333-444455556666", 1000, 0)],
        ])
        .encode()}),
    );
    let plans = plan_pod(&p, &hami(), Path::new(LIB)).unwrap();
    let got: Vec<(&str, Option<bool>)> = plans
        .iter()
        .map(|p| (p.container.as_str(), preload_pair(p)))
        .collect();
    assert_eq!(
        got,
        [
            ("warmup", Some(true)),
            ("main", Some(true)),
            ("nocontrol", Some(false)),
            ("mig", Some(false)),
        ]
    );
}

/// Kubernetes gives a container the **last** entry of a duplicated name; the file agrees, and a
/// value HAMi-core would not read as meant is left out with a typed warning (Event reason
/// `LimitsFileValueSkipped`), never written.
#[test]
fn duplicated_env_entries_last_wins_and_unreadable_values_are_left_out() {
    let p = plan(
        &one(json!([
            {"name": "CUDA_TASK_PRIORITY", "value": "1"},
            {"name": "CUDA_TASK_PRIORITY", "value": "2"}
        ])),
        &[dev("GPU-a", 1000, 25)],
        &hami(),
    );
    let text = &p.limits_file.as_ref().unwrap().text;
    assert!(text.contains("CUDA_TASK_PRIORITY=2\n"), "{text}");
    assert!(!text.contains("CUDA_TASK_PRIORITY=1\n"), "{text}");
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    for bad in [" 1", "01", "abc"] {
        let p = plan(
            &one(json!([
                {"name": "CUDA_TASK_PRIORITY", "value": "1"},
                {"name": "CUDA_TASK_PRIORITY", "value": bad}
            ])),
            &[dev("GPU-a", 1000, 25)],
            &hami(),
        );
        let text = &p.limits_file.as_ref().unwrap().text;
        assert!(!text.contains("CUDA_TASK_PRIORITY"), "{bad:?}: {text}");
        assert_eq!(p.warnings.len(), 1, "{bad:?}: {:?}", p.warnings);
        match &p.warnings[0] {
            AllocationWarning::Limits(PlanWarning::NotCopied { key, value, .. }) => {
                assert_eq!((key.as_str(), value.as_str()), ("CUDA_TASK_PRIORITY", bad));
            }
            other => panic!("{bad:?}: {other:?}"),
        }
        assert_eq!(p.warnings[0].reason(), "LimitsFileValueSkipped");
        assert_file_clean(text);
    }
}
