//! What HAMi's vGPU monitor finds of our allocations on disk.
//!
//! The monitor (HAMi v2.10.0, commit 4707fb02, `pkg/monitor/nvidia/cudevshr.go`) lists
//! `$HOOK_PATH/containers` (line 133, HOOK_PATH = `<hook>/vgpu` in HAMi's chart), keeps
//! directories only (185), splits each name at its first `_` into pod UID and container name
//! (188-191, 219-220), and in each folder (`loadCache`, 227-260) counts the entries whose name
//! contains `libvgpu.so` or ends in `.cache` (more than two: the folder is refused, 240-242), then
//! maps the first entry ending in `.cache` that is not `libvgpu.so*` (246-256) read-write (269-278).
//! `monitor_view` below is that logic (without the mapping). The layout is produced by our own
//! plan and executor (`plan_container`, `execute_plan`); the container runtime's mount points and
//! HAMi-core's shared region are created where the plan's mounts put them.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use hami_device_plugin::allocation::plan::codec::ContainerDevice;
use hami_device_plugin::allocation::plan::{AllocationPlan, AllocationSettings, plan_container};
use hami_device_plugin::allocation::shell::executor::execute_plan;
use hami_shared::values::LimitDelivery;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

const UID: &str = "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b";

/// One folder as the monitor sees it: (pod UID, container name) -> the cache file it would map.
type MonitorView = BTreeMap<(String, String), Result<PathBuf, String>>;

/// HAMi's `ContainerLister.Update` + `loadCache` selection, on `containers_dir`.
fn monitor_view(containers_dir: &Path) -> MonitorView {
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(containers_dir).unwrap() {
        let entry = entry.unwrap();
        if !entry.file_type().unwrap().is_dir() {
            continue; // `.limits` files beside the folders end here
        }
        let name = entry.file_name().into_string().unwrap();
        let Some((uid, container)) = name.split_once('_') else {
            continue;
        };
        if uid.is_empty() || container.is_empty() {
            continue;
        }
        let mut files: Vec<String> = fs::read_dir(entry.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort(); // os.ReadDir returns entries sorted by name
        let matched = files
            .iter()
            .filter(|f| f.contains("libvgpu.so") || f.ends_with(".cache"))
            .count();
        let picked = if matched > 2 {
            Err("cache num not matched".to_owned())
        } else {
            files
                .iter()
                .find(|f| !f.contains("libvgpu.so") && f.ends_with(".cache"))
                .map(|f| entry.path().join(f))
                .ok_or_else(|| "no cache file".to_owned())
        };
        out.insert((uid.to_owned(), container.to_owned()), picked);
    }
    out
}

/// The host path behind `container_path` through the plan's mounts (the longest mount prefix).
fn host_path(plan: &AllocationPlan, container_path: &str) -> PathBuf {
    let m = plan
        .mounts
        .iter()
        .filter(|m| {
            container_path == m.container_path
                || container_path.starts_with(&format!("{}/", m.container_path))
        })
        .max_by_key(|m| m.container_path.len())
        .unwrap_or_else(|| panic!("{container_path} is in no mount of {:?}", plan.mounts));
    let rest = container_path[m.container_path.len()..].trim_start_matches('/');
    if rest.is_empty() {
        PathBuf::from(&m.host_path)
    } else {
        Path::new(&m.host_path).join(rest)
    }
}

/// What the container runtime and HAMi-core leave on the host for one running container: a mount
/// point file for every file mount that lands inside another (writable, host-backed) mount, then
/// the shared region at `CUDA_DEVICE_MEMORY_SHARED_CACHE`.
fn run_container(plan: &AllocationPlan) -> PathBuf {
    for m in &plan.mounts {
        let Some(parent) = plan.mounts.iter().find(|p| {
            p.container_path != m.container_path
                && m.container_path
                    .starts_with(&format!("{}/", p.container_path))
        }) else {
            continue;
        };
        let rest = &m.container_path[parent.container_path.len() + 1..];
        let point = Path::new(&parent.host_path).join(rest);
        fs::create_dir_all(point.parent().unwrap()).unwrap();
        fs::write(&point, b"").unwrap();
    }
    let cache = host_path(plan, &plan.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"]);
    fs::write(&cache, [0u8; 64]).unwrap();
    cache
}

fn pod(containers: &[(&str, serde_json::Value)], annotations: serde_json::Value) -> Pod {
    let list: Vec<_> = containers
        .iter()
        .map(|(n, env)| json!({"name": n, "image": "cuda", "env": env}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml", "uid": UID, "annotations": annotations},
        "spec": {"containers": list}
    }))
    .unwrap()
}

fn dev(uuid: &str) -> ContainerDevice {
    ContainerDevice {
        uuid: uuid.into(),
        kind: "NVIDIA".into(),
        memory_mib: 3000,
        cores: 30,
        extra: vec![],
    }
}

fn allocate(hook: &Path, pod: &Pod, entry: usize, devices: &[ContainerDevice]) -> AllocationPlan {
    let mut settings = AllocationSettings {
        hook_path: hook.to_path_buf(),
        ..AllocationSettings::default()
    };
    // The `no-preload` container sets CUDA_DISABLE_CONTROL, as HAMi lets every pod.
    settings.guard.hami_core_env_namespaces.insert("ml".into());
    let lib = hook.join("vgpu/libvgpu.so");
    let plan = plan_container(pod, entry, devices, Some(devices.len()), &settings, &lib).unwrap();
    execute_plan(&plan).unwrap();
    plan
}

#[test]
fn the_monitor_finds_every_containers_region_and_skips_the_limits_files() {
    let hook = tempfile::tempdir().unwrap();
    // Three containers: file delivery, a second GPU in the same pod, env delivery (no file), and
    // one that turns the preload off (fewer mount points in its folder).
    let p = pod(
        &[
            ("trainer", json!([])),
            ("sidecar-gpu", json!([])),
            (
                "no-preload",
                json!([{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]),
            ),
        ],
        json!({}),
    );
    let mut expected = BTreeMap::new();
    for (entry, name) in ["trainer", "sidecar-gpu", "no-preload"].iter().enumerate() {
        let devices = [dev("GPU-0aa"), dev("GPU-0bb")];
        let plan = allocate(hook.path(), &p, entry, &devices[..=entry.min(1)]);
        assert_eq!(plan.delivery.mode, LimitDelivery::File);
        let cache = run_container(&plan);
        // The region is named usage.cache, inside the container's folder.
        assert_eq!(cache.file_name().unwrap(), "usage.cache");
        assert_eq!(
            cache.parent().unwrap(),
            plan.container_dir.as_deref().unwrap()
        );
        // The limits file is beside the folder, never in it.
        let limits = plan.limits_file.as_ref().unwrap().path();
        assert!(limits.is_file());
        assert_eq!(
            limits.parent().unwrap(),
            plan.container_dir.as_ref().unwrap().parent().unwrap()
        );
        expected.insert((UID.to_owned(), (*name).to_owned()), Ok(cache));
    }
    let containers_dir = hook.path().join("vgpu/containers");
    assert_eq!(monitor_view(&containers_dir), expected);
    // Three folders and three .limits files side by side.
    let names: Vec<String> = fs::read_dir(&containers_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 6, "{names:?}");
    assert_eq!(names.iter().filter(|n| n.ends_with(".limits")).count(), 3);
}

#[test]
fn env_delivery_looks_the_same_to_the_monitor() {
    let hook = tempfile::tempdir().unwrap();
    let p = pod(
        &[("main", json!([]))],
        json!({"hami.io/limit-delivery": "env"}),
    );
    let plan = allocate(hook.path(), &p, 0, &[dev("GPU-0aa")]);
    assert_eq!(plan.delivery.mode, LimitDelivery::Env);
    assert!(plan.limits_file.is_none());
    let cache = run_container(&plan);
    let view = monitor_view(&hook.path().join("vgpu/containers"));
    assert_eq!(
        view,
        BTreeMap::from([((UID.to_owned(), "main".to_owned()), Ok(cache))])
    );
}

#[test]
fn the_folder_holds_at_most_the_two_entries_the_monitor_tolerates() {
    // libvgpu.so's mount point and usage.cache are the only names the monitor counts; the preload
    // library's mount point (libhami_preload.so) is not one of them.
    let hook = tempfile::tempdir().unwrap();
    let p = pod(&[("main", json!([]))], json!({}));
    let plan = allocate(hook.path(), &p, 0, &[dev("GPU-0aa")]);
    run_container(&plan);
    let dir = plan.container_dir.as_deref().unwrap();
    let mut files: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files, ["libhami_preload.so", "libvgpu.so", "usage.cache"]);
    // A second .cache would make the monitor refuse the folder: the plan has one path only.
    fs::write(dir.join("other.cache"), b"").unwrap();
    let view = monitor_view(&hook.path().join("vgpu/containers"));
    assert_eq!(view.len(), 1, "{view:?}");
    assert!(view.values().all(Result::is_err), "{view:?}");
}
