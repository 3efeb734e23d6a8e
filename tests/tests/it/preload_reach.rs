//! The preload library reaches every container that gets the preload list, with nothing else to
//! change: `install-hook` fills a hook folder, then every path the generated `ld.so.preload` names
//! must resolve, through the mounts the device plugin (HAMi pods, `plan`), the `hami.io/preload`
//! plugin (KAI pods, `kai.hookDelivery: device-plugin`) or the webhook (KAI pods,
//! `kai.hookDelivery: hostPath`, which mount the whole folder) give the container, to the file
//! `install-hook` installed.
//! A listed but unreachable library would make the loader print an error in every process.

use std::path::{Path, PathBuf};

use hami_device_plugin::commands::install_hook::{InstallHookArgs, install_hook};
use hami_device_plugin::commands::plan::{PlanArgs, run_plan};
use hami_device_plugin::commands::serve_preload::plugin::{allocate_response, inspect_hook};
use hami_device_plugin::kubelet::api::v1beta1;
use hami_tests::inventory::ONE_H200;
use hami_webhook::policy::kai::{HookDelivery, KaiSettings};
use hami_webhook::policy::settings::Settings;
use hami_webhook::{Decision, decide_pod};
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A hook folder filled by `install-hook` from a HAMi-style image folder and an inventory file of
/// one GPU (so `node-gpus` is published whatever the machine's NVML says).
fn installed_hook() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("image");
    std::fs::create_dir(&image).unwrap();
    std::fs::write(image.join("libvgpu.so.v2.10.0"), b"\x7fELF hami-core").unwrap();
    std::fs::write(image.join("ld.so.preload"), "/usr/local/vgpu/libvgpu.so\n").unwrap();
    let preload = dir.path().join("libhami_preload.so");
    std::fs::write(&preload, b"\x7fELF preload").unwrap();
    let inventory = dir.path().join("gpus.yaml");
    std::fs::write(&inventory, ONE_H200).unwrap();
    let hook = dir.path().join("hook");
    install_hook(&InstallHookArgs {
        hami_core_dir: image,
        preload,
        hook_path: hook.clone(),
        inventory: Some(inventory),
    })
    .unwrap();
    (dir, hook)
}

/// (container path, host path) pairs, resolved as a container runtime stacks them: the deepest
/// mount point that contains a path wins.
fn resolve(mounts: &[(String, PathBuf)], path: &str) -> Option<PathBuf> {
    mounts
        .iter()
        .filter_map(|(at, host)| {
            if path == at {
                Some((at.len(), host.clone()))
            } else {
                let rest = path.strip_prefix(at.as_str())?.strip_prefix('/')?;
                Some((at.len(), host.join(rest)))
            }
        })
        .max_by_key(|(depth, _)| *depth)
        .map(|(_, host)| host)
}

/// Every library the list names is reachable inside the container and is the installed file.
fn assert_list_reachable(mounts: &[(String, PathBuf)], vgpu: &Path, who: &str) {
    let list_host = resolve(mounts, "/etc/ld.so.preload")
        .unwrap_or_else(|| panic!("{who}: /etc/ld.so.preload is not mounted: {mounts:?}"));
    assert_eq!(list_host, vgpu.join("ld.so.preload"), "{who}");
    let list = std::fs::read_to_string(&list_host).unwrap();
    let libraries: Vec<&str> = list.lines().collect();
    assert_eq!(libraries.len(), 2, "{who}: {list:?}");
    assert!(
        libraries[0].ends_with("/libhami_preload.so"),
        "{who}: the preload library comes first"
    );
    for lib in libraries {
        let host = resolve(mounts, lib)
            .unwrap_or_else(|| panic!("{who}: {lib} is listed but not mounted: {mounts:?}"));
        assert!(
            host.is_file(),
            "{who}: {lib} resolves to {}, which does not exist",
            host.display()
        );
        let name = Path::new(lib).file_name().unwrap();
        assert_eq!(
            std::fs::read(&host).unwrap(),
            std::fs::read(vgpu.join(name)).unwrap(),
            "{who}: {lib} is not the installed file"
        );
    }
}

#[test]
fn hami_pods_get_the_list_and_the_library_through_allocate_mounts() {
    let (_dir, hook) = installed_hook();
    let report = run_plan(
        &PlanArgs {
            pod: repo().join("examples/hami-pod-scheduled.yaml"),
            node: Some("gpu-0".to_owned()),
            config: None,
            node_config: None,
            hook_path: hook.clone(),
            inventory: None,
            write: true,
            device_list: Default::default(),
            guard: Default::default(),
        },
        std::env::vars(),
    )
    .unwrap();
    assert_eq!(report.containers.len(), 1);
    let mounts: Vec<(String, PathBuf)> = report.containers[0]
        .mounts
        .iter()
        .map(|m| (m.container_path.clone(), PathBuf::from(&m.host_path)))
        .collect();
    assert_list_reachable(&mounts, &hook.join("vgpu"), "HAMi pod (plan)");
}

/// The example KAI pod as the webhook mutates it with `hook_delivery`, the hook folder `vgpu`.
fn mutated_kai_pod(vgpu: &Path, hook_delivery: HookDelivery) -> Pod {
    let text = std::fs::read_to_string(repo().join("examples/kai-gpu-memory-pod.yaml")).unwrap();
    let pod: Value = serde_yaml_ng::from_str(&text).unwrap();
    let settings = Settings {
        kai: KaiSettings {
            hook_path: vgpu.display().to_string(),
            hook_delivery,
            ..KaiSettings::default()
        },
        ..Settings::default()
    };
    let bytes = serde_json::to_vec(&pod).unwrap();
    let view: hami_webhook::wire::pod::Pod<'_> = serde_json::from_slice(&bytes).unwrap();
    let Decision::Allow { patch, .. } = decide_pod(
        &view,
        Some("default"),
        &settings,
        &hami_webhook::policy::basis::NoBasis,
    ) else {
        panic!("the KAI pod was denied");
    };
    let patch: json_patch::Patch =
        serde_json::from_value(serde_json::to_value(&patch).unwrap()).unwrap();
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &patch).unwrap();
    serde_json::from_value(patched).unwrap()
}

/// The node GPU file is at `<KAI hook folder>/node-gpus` inside the container too (the path the
/// limits file's HAMI_NODE_GPUS names).
fn assert_node_gpus_reachable(mounts: &[(String, PathBuf)], vgpu: &Path) {
    let node_gpus = format!("{}/{}", vgpu.display(), hami_shared::names::NODE_GPUS_FILE);
    let host = resolve(mounts, &node_gpus)
        .unwrap_or_else(|| panic!("{node_gpus} is not mounted: {mounts:?}"));
    assert_eq!(host, vgpu.join(hami_shared::names::NODE_GPUS_FILE));
    assert!(
        hami_shared::node_gpus::parse(&std::fs::read(&host).unwrap()).usable(),
        "{}",
        host.display()
    );
}

#[test]
fn kai_pods_get_the_library_through_the_preload_resource() {
    let (_dir, hook) = installed_hook();
    let vgpu = hook.join("vgpu");
    let pod = mutated_kai_pod(&vgpu, HookDelivery::DevicePlugin);
    let spec = pod.spec.unwrap();
    assert!(
        spec.volumes.iter().flatten().all(|v| v.host_path.is_none()),
        "no hostPath volume"
    );
    let container = &spec.containers[0];
    let limits = container
        .resources
        .as_ref()
        .unwrap()
        .limits
        .as_ref()
        .unwrap();
    assert_eq!(limits["hami.io/preload"].0, "1");
    // What kubelet then gets from the hami.io/preload plugin on a node with this folder.
    let found = inspect_hook(&vgpu).unwrap();
    let response = allocate_response(
        &found,
        8,
        None,
        &v1beta1::AllocateRequest {
            container_requests: vec![v1beta1::ContainerAllocateRequest {
                devices_ids: vec!["preload-0".to_owned()],
            }],
        },
    )
    .unwrap();
    let mounts: Vec<(String, PathBuf)> = response.container_responses[0]
        .mounts
        .iter()
        .map(|m| (m.container_path.clone(), PathBuf::from(&m.host_path)))
        .collect();
    assert_list_reachable(&mounts, &vgpu, "KAI pod (hami.io/preload)");
    assert_node_gpus_reachable(&mounts, &vgpu);
}

#[test]
fn kai_pods_get_the_library_through_the_hook_folder_with_nothing_else_to_change() {
    let (_dir, hook) = installed_hook();
    let vgpu = hook.join("vgpu");
    let patched = mutated_kai_pod(&vgpu, HookDelivery::HostPath);
    let spec = patched.spec.unwrap();
    let volumes = spec.volumes.unwrap_or_default();
    let container = &spec.containers[0];
    let mounts: Vec<(String, PathBuf)> = container
        .volume_mounts
        .iter()
        .flatten()
        .filter_map(|m| {
            let volume = volumes.iter().find(|v| v.name == m.name)?;
            let host = PathBuf::from(&volume.host_path.as_ref()?.path);
            let host = match &m.sub_path {
                Some(sub) if !sub.is_empty() => host.join(sub),
                _ => host,
            };
            Some((m.mount_path.clone(), host))
        })
        .collect();
    assert_list_reachable(&mounts, &vgpu, "KAI pod (webhook)");
    assert_node_gpus_reachable(&mounts, &vgpu);
}
