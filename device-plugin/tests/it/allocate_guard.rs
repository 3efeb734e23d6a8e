//! Table tests of `Allocate`'s own checks, whether or not the webhook saw the pod: the GPU
//! container's spec (`allocation::plan::spec_guard`, through the plan) and the scheduler's entry against
//! the node (`allocation::plan::entry_check`), and which `GetPreferredAllocation` answers count as
//! steered (`kubelet::service`).

use std::path::Path;

use hami_device_plugin::allocation::plan::codec::{ContainerDevice, PodDevices};
use hami_device_plugin::allocation::plan::entry_check::{
    EntryError, NodeCapacity, check_kubelet_ids, check_pod,
};
use hami_device_plugin::allocation::plan::spec_guard::{SpecRefusal, is_system_owned};
use hami_device_plugin::allocation::plan::{
    AllocationPlan, AllocationSettings, PlanError, plan_container,
};
use hami_device_plugin::gpu::devices::DeviceTable;
use hami_device_plugin::gpu::inventory::Gpu;
use hami_device_plugin::kubelet::api::v1beta1;
use hami_device_plugin::kubelet::service::{Steering, is_steered};
use hami_shared::values::CorePolicy;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

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

/// A pod in namespace `team-a` whose container `main` (after one init container `warmup`
/// without fields) has `fields` merged into it.
fn pod(fields: &Value) -> Pod {
    let mut main = json!({"name": "main", "image": "cuda"});
    for (k, v) in fields.as_object().unwrap() {
        main[k] = v.clone();
    }
    serde_json::from_value(json!({
        "metadata": {"name": "train", "namespace": "team-a", "uid": UID},
        "spec": {"initContainers": [{"name": "warmup", "image": "cuda"}], "containers": [main]}
    }))
    .unwrap()
}

/// Plans `main` (entry 1: after the init container) with one device.
fn plan_main(
    p: &Pod,
    settings: &AllocationSettings,
    uuid: &str,
) -> Result<AllocationPlan, PlanError> {
    plan_container(
        p,
        1,
        &[dev(uuid, 1000, 10)],
        Some(1),
        settings,
        Path::new(LIB),
    )
}

fn refusals(fields: &Value, settings: &AllocationSettings) -> Vec<SpecRefusal> {
    match plan_main(&pod(fields), settings, "GPU-a") {
        Ok(_) => Vec::new(),
        Err(PlanError::Refused {
            pod,
            container,
            refusals,
        }) => {
            assert_eq!(pod, "team-a/train");
            assert_eq!(container, "main");
            assert!(!refusals.is_empty());
            refusals
        }
        Err(other) => panic!("not a refusal: {other}"),
    }
}

fn mounts(paths: &[(&str, Option<&str>)]) -> Value {
    let list: Vec<Value> = paths
        .iter()
        .enumerate()
        .map(|(i, (path, sub))| {
            let mut m = json!({"name": format!("v{i}"), "mountPath": path});
            if let Some(sub) = sub {
                m["subPath"] = json!(sub);
            }
            m
        })
        .collect();
    json!({ "volumeMounts": list })
}

#[test]
fn every_spelling_of_a_protected_mount_is_refused() {
    let settings = AllocationSettings::default();
    // (mount path, subPath, refused, what the message names)
    let cases: &[(&str, Option<&str>, bool, &str)] = &[
        (
            "/overrideEnv",
            None,
            true,
            "at the same path as /overrideEnv",
        ),
        (
            "/overrideEnv/",
            None,
            true,
            "at the same path as /overrideEnv",
        ),
        (
            "//overrideEnv",
            None,
            true,
            "at the same path as /overrideEnv",
        ),
        (
            "/./overrideEnv",
            None,
            true,
            "at the same path as /overrideEnv",
        ),
        (
            "/tmp/../overrideEnv",
            None,
            true,
            "at the same path as /overrideEnv",
        ),
        (
            "/../overrideEnv",
            None,
            true,
            "at the same path as /overrideEnv",
        ),
        (
            "overrideEnv",
            None,
            true,
            "at the same path as /overrideEnv",
        ),
        (
            "/overrideEnv",
            Some("limits"),
            true,
            "at the same path as /overrideEnv",
        ),
        ("/overrideEnv/x", None, true, "inside /overrideEnv"),
        ("/", None, true, "above /overrideEnv"),
        (
            "/etc/ld.so.preload",
            None,
            true,
            "at the same path as /etc/ld.so.preload",
        ),
        (
            "/etc//ld.so.preload",
            None,
            true,
            "at the same path as /etc/ld.so.preload",
        ),
        (
            "/etc/./ld.so.preload/",
            None,
            true,
            "at the same path as /etc/ld.so.preload",
        ),
        (
            "/etc/ld.so.preload",
            Some("ld.so.preload"),
            true,
            "at the same path as /etc/ld.so.preload",
        ),
        ("/etc", None, true, "above /etc/ld.so.preload"),
        ("/etc/", Some("etc"), true, "above /etc/ld.so.preload"),
        (
            "/usr/local/vgpu",
            None,
            true,
            "at the same path as /usr/local/vgpu",
        ),
        (
            "/usr/local/vgpu/",
            None,
            true,
            "at the same path as /usr/local/vgpu",
        ),
        ("/usr/local", None, true, "above /usr/local/vgpu"),
        ("/usr", None, true, "above /usr/local/vgpu"),
        (
            "/usr/local/vgpu/libvgpu.so",
            None,
            true,
            "inside /usr/local/vgpu",
        ),
        (
            "/usr/local/vgpu/libhami_preload.so",
            Some("lib.so"),
            true,
            "inside /usr/local/vgpu",
        ),
        (
            "/usr/local/vgpu/containers/x",
            None,
            true,
            "inside /usr/local/vgpu",
        ),
        (
            "/usr/local/./vgpu/../vgpu/usage.cache",
            None,
            true,
            "inside /usr/local/vgpu",
        ),
        (
            "/tmp/vgpulock",
            None,
            true,
            "at the same path as /tmp/vgpulock",
        ),
        ("/tmp/vgpulock/lock", None, true, "inside /tmp/vgpulock"),
        // Not ours: allowed.
        ("/tmp", None, false, ""),
        ("/data", None, false, ""),
        ("/overrideEnvX", None, false, ""),
        ("/etc/ld.so.preload.d", None, false, ""),
        ("/etc/ssl", None, false, ""),
        ("/usr/local/vgpu2", None, false, ""),
        ("/usr/local/cuda", None, false, ""),
        ("/usr/local/vgpux/libvgpu.so", None, false, ""),
    ];
    for &(path, sub, refused, says) in cases {
        let got = refusals(&mounts(&[(path, sub)]), &settings);
        assert_eq!(
            !got.is_empty(),
            refused,
            "{path:?} subPath {sub:?}: {got:?}"
        );
        if refused {
            let text = got[0].to_string();
            assert!(
                text.contains("spec.containers[0].volumeMounts[0].mountPath")
                    && text.contains(&format!("{path:?}"))
                    && text.contains(says),
                "{path:?}: {text}"
            );
            assert_eq!(got[0].reason(), "GpuContainerMountRefused");
        }
    }
}

#[test]
fn block_devices_count_as_mounts_and_each_mount_is_named() {
    let settings = AllocationSettings::default();
    let fields = json!({
        "volumeMounts": [
            {"name": "data", "mountPath": "/data"},
            {"name": "limits", "mountPath": "/overrideEnv"}
        ],
        "volumeDevices": [{"name": "blk", "devicePath": "/etc/ld.so.preload"}]
    });
    let got = refusals(&fields, &settings);
    let text: Vec<String> = got.iter().map(ToString::to_string).collect();
    assert_eq!(got.len(), 2, "{text:?}");
    assert!(text[0].contains("volumeMounts[1].mountPath"), "{text:?}");
    assert!(text[1].contains("volumeDevices[0].devicePath"), "{text:?}");
}

#[test]
fn the_hook_folder_follows_hook_path() {
    let settings = AllocationSettings {
        hook_path: "/opt/hami/".into(),
        ..AllocationSettings::default()
    };
    // The default hook folder is not this node's: nothing of ours there.
    assert!(refusals(&mounts(&[("/usr/local/vgpu", None)]), &settings).is_empty());
    let got = refusals(&mounts(&[("/opt/hami", None)]), &settings);
    assert!(
        got[0].to_string().contains("above /opt/hami/vgpu"),
        "{got:?}"
    );
    let got = refusals(&mounts(&[("/opt/hami/vgpu/libvgpu.so", None)]), &settings);
    assert!(
        got[0].to_string().contains("inside /opt/hami/vgpu"),
        "{got:?}"
    );
}

#[test]
fn privilege_and_sys_admin_are_refused_unless_the_namespace_is_allowed() {
    let settings = AllocationSettings::default();
    let cases: &[(Value, Option<&str>)] = &[
        (
            json!({"privileged": true}),
            Some("securityContext.privileged=true"),
        ),
        (json!({"privileged": false}), None),
        (json!({"allowPrivilegeEscalation": true}), None),
        (
            json!({"capabilities": {"add": ["SYS_ADMIN"]}}),
            Some("securityContext.capabilities.add[0] adds \"SYS_ADMIN\""),
        ),
        (
            json!({"capabilities": {"add": ["NET_ADMIN", "CAP_SYS_ADMIN"]}}),
            Some("securityContext.capabilities.add[1] adds \"CAP_SYS_ADMIN\""),
        ),
        (
            json!({"capabilities": {"add": ["sys_admin"]}}),
            Some("adds \"sys_admin\""),
        ),
        (
            json!({"capabilities": {"add": ["ALL"]}}),
            Some("adds \"ALL\""),
        ),
        (
            json!({"capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}}),
            None,
        ),
    ];
    for (sc, says) in cases {
        let fields = json!({ "securityContext": sc });
        let got = refusals(&fields, &settings);
        match says {
            None => assert!(got.is_empty(), "{sc}: {got:?}"),
            Some(says) => {
                let text = got[0].to_string();
                assert!(
                    text.contains(&format!(
                        "spec.containers[0].{}",
                        says.trim_start_matches("adds ")
                    )) || text.contains(says),
                    "{sc}: {text}"
                );
                assert!(text.contains("--allow-privileged-namespaces"), "{text}");
                assert_eq!(got[0].reason(), "GpuContainerPrivilegeRefused");
            }
        }
    }
    let mut allowed = AllocationSettings::default();
    allowed.guard.privileged_namespaces.insert("team-a".into());
    assert!(refusals(&json!({"securityContext": {"privileged": true}}), &allowed).is_empty());
    // Another namespace's allowance is not this one's.
    allowed.guard.privileged_namespaces = ["team-b".to_owned()].into();
    assert!(!refusals(&json!({"securityContext": {"privileged": true}}), &allowed).is_empty());
}

#[test]
fn a_privileged_init_container_is_named_as_such() {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "train", "namespace": "team-a", "uid": UID},
        "spec": {
            "initContainers": [{"name": "warmup", "image": "cuda", "securityContext": {"privileged": true}}],
            "containers": [{"name": "main", "image": "cuda"}]
        }
    }))
    .unwrap();
    let err = plan_container(
        &p,
        0,
        &[dev("GPU-a", 1000, 10)],
        Some(1),
        &AllocationSettings::default(),
        Path::new(LIB),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("pod team-a/train: container \"warmup\" refused: spec.initContainers[0].securityContext.privileged=true"),
        "{text}"
    );
    assert_eq!(err.reason(), "GpuContainerPrivilegeRefused");
}

#[test]
fn hami_core_variables_in_the_spec_are_refused_direct_or_value_from() {
    let settings = AllocationSettings::default();
    let from = json!({"configMapKeyRef": {"name": "c", "key": "k"}});
    for (name, value) in [
        ("CUDA_DEVICE_MEMORY_LIMIT", json!({"value": "80g"})),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", json!({"value": "80g"})),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", json!({"valueFrom": from})),
        ("CUDA_DEVICE_SM_LIMIT", json!({"value": "100"})),
        ("CUDA_DEVICE_SM_LIMIT_1", json!({"value": "0"})),
        (
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            json!({"value": "/tmp/mine"}),
        ),
        ("CUDA_OVERSUBSCRIBE", json!({"value": "true"})),
        ("LIBCUDA_LOG_LEVEL", json!({"value": "0"})),
        ("CUDA_DISABLE_CONTROL", json!({"value": "true"})),
        ("CUDA_DISABLE_CONTROL", json!({"value": "false"})),
        ("CUDA_DISABLE_CONTROL", json!({"valueFrom": from})),
        ("LIBVGPU_HOSTPID_BROKER", json!({"value": "1"})),
        ("CUDA_REDIRECT", json!({"value": "/tmp/mine.so"})),
        ("ACTIVE_OOM_KILLER", json!({"value": "false"})),
        ("RECORD_KERNEL_INTERVAL", json!({"value": "1"})),
    ] {
        assert!(is_system_owned(name), "{name}");
        let mut entry = json!({"name": name});
        for (k, v) in value.as_object().unwrap() {
            entry[k] = v.clone();
        }
        let got = refusals(
            &json!({"env": [{"name": "OTHER", "value": "x"}, entry]}),
            &settings,
        );
        assert_eq!(got.len(), 1, "{name}: {got:?}");
        let text = got[0].to_string();
        assert!(
            text.contains(&format!("spec.containers[0].env[1] sets {name}"))
                && text.contains("--allow-hami-core-env-namespaces"),
            "{text}"
        );
        if value.get("valueFrom").is_some() {
            assert!(text.contains("from valueFrom"), "{text}");
        }
        assert_eq!(got[0].reason(), "GpuContainerEnvRefused");
    }
    for name in ["CUDA_VISIBLE_DEVICES", "HOME", "CUDA_DEVICE_MEMORY"] {
        assert!(!is_system_owned(name), "{name}");
        assert!(
            refusals(&json!({"env": [{"name": name, "value": "1"}]}), &settings).is_empty(),
            "{name}"
        );
    }
    // The namespace allowed: HAMi's behaviour (CUDA_DISABLE_CONTROL drops the preload list, so
    // a mount at /etc/ld.so.preload is then the container's own business).
    let mut allowed = AllocationSettings::default();
    allowed
        .guard
        .hami_core_env_namespaces
        .insert("team-a".into());
    let fields = json!({
        "env": [
            {"name": "CUDA_DISABLE_CONTROL", "value": "true"},
            {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80g"}
        ],
        "volumeMounts": [{"name": "p", "mountPath": "/etc/ld.so.preload"}]
    });
    assert!(refusals(&fields, &allowed).is_empty());
    // ... but never /overrideEnv, which HAMi-core itself reads.
    let fields = json!({
        "env": [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}],
        "volumeMounts": [{"name": "p", "mountPath": "/overrideEnv"}]
    });
    assert_eq!(refusals(&fields, &allowed).len(), 1);
}

#[test]
fn task_priority_and_core_policy_only_as_the_webhook_sets_them() {
    let mut settings = AllocationSettings::default();
    let with_limit = |limit: Option<&str>, env: Value| {
        let mut fields = json!({ "env": env });
        if let Some(l) = limit {
            fields["resources"] =
                json!({"limits": {"nvidia.com/gpu": "1", "nvidia.com/priority": l}});
        }
        fields
    };
    let prio = |v: &str| json!([{"name": "CUDA_TASK_PRIORITY", "value": v}]);
    // As the webhook writes it from the limit: allowed.
    assert!(refusals(&with_limit(Some("0"), prio("0")), &settings).is_empty());
    assert!(refusals(&with_limit(Some("1"), prio("1")), &settings).is_empty());
    // HAMi-core's default where no limit grants another: takes nothing from anyone.
    assert!(refusals(&with_limit(None, prio("1")), &settings).is_empty());
    // Any other value, no limit, or valueFrom: refused.
    for (limit, env) in [
        (Some("1"), prio("0")),
        (None, prio("0")),
        (None, prio("2")),
        (
            Some("0"),
            json!([{"name": "CUDA_TASK_PRIORITY", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]),
        ),
    ] {
        let got = refusals(&with_limit(limit, env.clone()), &settings);
        assert_eq!(got.len(), 1, "{limit:?} {env}");
        assert!(
            got[0].to_string().contains("nvidia.com/priority limit"),
            "{}",
            got[0]
        );
    }
    let policy = |v: &str| json!({"env": [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": v}]});
    // gpuCorePolicy default: the webhook sets nothing, so the spec may not either.
    let got = refusals(&policy("disable"), &settings);
    assert!(
        got[0].to_string().contains("the webhook sets nothing"),
        "{}",
        got[0]
    );
    assert_eq!(refusals(&policy("default"), &settings).len(), 1);
    // The strictest policy takes nothing from anyone.
    assert!(refusals(&policy("force"), &settings).is_empty());
    settings.guard.core_policy = CorePolicy::Force;
    assert!(refusals(&policy("force"), &settings).is_empty());
    assert_eq!(refusals(&policy("disable"), &settings).len(), 1);
    settings
        .guard
        .hami_core_env_namespaces
        .insert("team-a".into());
    assert!(refusals(&policy("disable"), &settings).is_empty());
}

#[test]
fn static_mig_is_checked_for_privilege_only() {
    let p = pod(&json!({
        "env": [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}],
        "volumeMounts": [{"name": "x", "mountPath": "/overrideEnv"}]
    }));
    let mig = "MIG-4f5e6d7c-1111-2222-3333-444455556666";
    assert!(plan_main(&p, &AllocationSettings::default(), mig).is_ok());
    let p = pod(&json!({"securityContext": {"privileged": true}}));
    assert!(plan_main(&p, &AllocationSettings::default(), mig).is_err());
}

fn gpu(uuid: &str, memory_mib: u64) -> Gpu {
    Gpu {
        uuid: uuid.into(),
        index: 0,
        minor: 0,
        name: "NVIDIA H200".into(),
        memory_mib,
        numa_node: None,
        mig_enabled: false,
        healthy: true,
        mig_devices: vec![],
    }
}

/// A case: what it is, the pod's entries, `deviceSplitCount`, memory and core scaling.
type EntryCase = (&'static str, Vec<Vec<ContainerDevice>>, u32, f64, f64);
/// The same, and what the refusal says.
type RefusedCase = (
    &'static str,
    Vec<Vec<ContainerDevice>>,
    u32,
    f64,
    f64,
    &'static str,
);

fn table(split: u32) -> DeviceTable {
    DeviceTable::shares(
        vec![gpu("GPU-a", 80_000), gpu("GPU-b", 40_000)],
        split,
        false,
    )
}

fn check(
    entries: &[Vec<ContainerDevice>],
    split: u32,
    mem: f64,
    core: f64,
) -> Result<(), EntryError> {
    check_pod(
        &PodDevices::from_containers(entries),
        &NodeCapacity::from_table(&table(split), mem, core),
    )
}

/// What HAMi v2.10's scheduler writes is never refused: a whole card (`defaultMemory: 0`, or
/// 100 %), a percentage, cores 0 and 100, several containers on one GPU within its split, several
/// GPUs per container, init containers, and other vendors' devices beside ours.
#[test]
fn entries_hamis_scheduler_writes_pass() {
    let other = ContainerDevice {
        kind: "Ascend".into(),
        ..dev("NPU-1", 1_000_000, 100)
    };
    let legit: &[EntryCase] = &[
        (
            "whole card",
            vec![vec![dev("GPU-a", 80_000, 0)]],
            10,
            1.0,
            1.0,
        ),
        (
            "percentage 50",
            vec![vec![dev("GPU-b", 20_000, 30)]],
            10,
            1.0,
            1.0,
        ),
        (
            "exclusive cores",
            vec![vec![dev("GPU-a", 1000, 100)]],
            10,
            1.0,
            1.0,
        ),
        (
            "two GPUs",
            vec![vec![dev("GPU-a", 3000, 50), dev("GPU-b", 3000, 50)]],
            10,
            1.0,
            1.0,
        ),
        (
            "init and app on one GPU",
            vec![
                vec![dev("GPU-a", 40_000, 50)],
                vec![],
                vec![dev("GPU-a", 40_000, 50)],
            ],
            2,
            1.0,
            1.0,
        ),
        (
            "oversubscribed memory",
            vec![vec![dev("GPU-b", 60_000, 10)]],
            10,
            1.5,
            1.0,
        ),
        (
            "core scaling 2: still 100",
            vec![vec![dev("GPU-a", 1, 100)]],
            10,
            1.0,
            2.0,
        ),
        (
            "other vendor",
            vec![vec![dev("GPU-a", 1000, 10), other]],
            10,
            1.0,
            1.0,
        ),
        ("empty", vec![vec![], vec![]], 10, 1.0, 1.0),
    ];
    for (what, entries, split, mem, core) in legit {
        check(entries, *split, *mem, *core).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

#[test]
fn entries_the_scheduler_cannot_write_are_refused() {
    let cases: &[RefusedCase] = &[
        (
            "unknown GPU",
            vec![vec![dev("GPU-z", 1000, 10)]],
            10,
            1.0,
            1.0,
            "names GPU \"GPU-z\", which this node does not advertise (its GPUs: GPU-a,GPU-b)",
        ),
        (
            "twice in one container",
            vec![vec![dev("GPU-a", 1000, 10), dev("GPU-a", 1000, 10)]],
            10,
            1.0,
            1.0,
            "names GPU \"GPU-a\" twice",
        ),
        (
            "more memory than the card",
            vec![vec![dev("GPU-b", 40_001, 10)]],
            10,
            1.0,
            1.0,
            "grants 40001 MiB on GPU \"GPU-b\", above the 40000 MiB",
        ),
        (
            "more than the scaled memory",
            vec![vec![dev("GPU-b", 60_001, 10)]],
            10,
            1.5,
            1.0,
            "above the 60000 MiB",
        ),
        (
            "cores above 100",
            vec![vec![dev("GPU-a", 1000, 101)]],
            10,
            1.0,
            2.0,
            "grants 101 % of the cores",
        ),
        (
            "cores above the scaled total",
            vec![vec![dev("GPU-a", 1000, 60)]],
            10,
            1.0,
            0.5,
            "above 50",
        ),
        (
            "more containers than the split",
            vec![vec![dev("GPU-a", 1000, 0)], vec![dev("GPU-a", 1000, 0)]],
            1,
            1.0,
            1.0,
            "to 2 container(s)",
        ),
        (
            "containers' memory above the card",
            vec![vec![dev("GPU-b", 30_000, 0)], vec![dev("GPU-b", 30_000, 0)]],
            10,
            1.0,
            1.0,
            "60000 MiB",
        ),
        (
            "containers' cores above the total",
            vec![vec![dev("GPU-a", 1000, 60)], vec![dev("GPU-a", 1000, 60)]],
            10,
            1.0,
            1.0,
            "120 % of the cores in all",
        ),
    ];
    for (what, entries, split, mem, core, says) in cases {
        let err = check(entries, *split, *mem, *core).expect_err(what);
        assert!(err.to_string().contains(says), "{what}: {err}");
    }
}

#[test]
fn kubelet_ids_on_other_gpus_are_refused_only_where_steered() {
    let t = table(10);
    let entry = [dev("GPU-a", 1000, 10)];
    let ids = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    // Steered to the entry's GPU: fine, any share.
    check_kubelet_ids(0, &entry, &ids(&["GPU-a-7"]), &t, true).unwrap();
    // kubelet chose alone (init container's devices reused, no free share): the container gets
    // the entry's GPU, as in HAMi.
    check_kubelet_ids(0, &entry, &ids(&["GPU-b-0"]), &t, false).unwrap();
    // Steered from another entry than the one being allocated: refused.
    let err = check_kubelet_ids(0, &entry, &ids(&["GPU-b-0"]), &t, true).unwrap_err();
    assert!(
        err.to_string()
            .contains("entry 0 names GPU(s) GPU-a but kubelet allocated GPU-b"),
        "{err}"
    );
    // Not ours at all (a share beyond the split, another plugin's ID): refused either way.
    for id in ["GPU-a-10", "GPU-z-0", "GPU-a"] {
        let err = check_kubelet_ids(0, &entry, &ids(&[id]), &t, false).unwrap_err();
        assert!(
            matches!(err, EntryError::UnknownDeviceId { .. }),
            "{id}: {err}"
        );
    }
}

#[test]
fn only_an_answer_of_one_share_per_wanted_gpu_counts_as_steered() {
    let s = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert!(is_steered(&s(&["GPU-a-3"]), &s(&["GPU-a"]), false));
    assert!(is_steered(
        &s(&["GPU-b-0", "GPU-a-3"]),
        &s(&["GPU-a", "GPU-b"]),
        false
    ));
    assert!(
        !is_steered(&s(&["GPU-b-0"]), &s(&["GPU-a"]), false),
        "fallback fill"
    );
    assert!(
        !is_steered(&s(&["GPU-a-3"]), &s(&[]), false),
        "no pending pod"
    );
    assert!(!is_steered(
        &s(&["GPU-a-3", "GPU-a-4"]),
        &s(&["GPU-a"]),
        false
    ));
    assert!(
        !is_steered(&s(&["GPU-a-3", "GPU-c-0"]), &s(&["GPU-a"]), false),
        "must-include"
    );
    assert!(is_steered(&s(&["MIG-1"]), &s(&["MIG-1"]), true));

    let steering = Steering::default();
    steering.record(vec![s(&["GPU-a-3"]).into_iter().collect()]);
    let request = |ids: &[&str]| v1beta1::AllocateRequest {
        container_requests: vec![v1beta1::ContainerAllocateRequest {
            devices_ids: s(ids),
        }],
    };
    assert_eq!(steering.steered(&request(&["GPU-a-3"])), [true]);
    // Taken by the first Allocate: the next one was not steered by it.
    assert_eq!(steering.steered(&request(&["GPU-a-3"])), [false]);
    steering.record(vec![s(&["GPU-a-3"]).into_iter().collect()]);
    assert_eq!(steering.steered(&request(&["GPU-a-4"])), [false]);
}
