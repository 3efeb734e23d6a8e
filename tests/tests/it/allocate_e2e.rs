//! `Allocate` end to end, in process: the test API server, the fake kubelet calling the plugin
//! over its unix socket, the plugin (inventory-file backend) with the real `Allocator`, the
//! webhook's decision applied to the pod at admission, and the HAMi scheduler's annotations and
//! binding played by the test.

use crate::allocate_support;

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

use allocate_support::*;
use hami_device_plugin::allocation::plan::AllocationSettings;
use hami_device_plugin::allocation::shell::collector::{Collector, CollectorSettings};
use hami_device_plugin::settings::{AllocationInputs, PluginSettings};
use hami_shared::values::LimitDelivery;
use kube::api::DeleteParams;
use serde_json::json;

/// The uid that owns files this process creates (root when the tests run as root).
fn own_uid(dir: &Path) -> u32 {
    let probe = dir.join("owner-probe");
    std::fs::write(&probe, "").unwrap();
    let uid = std::fs::metadata(&probe).unwrap().uid();
    std::fs::remove_file(&probe).unwrap();
    uid
}

fn assert_check_clean(bytes: &[u8]) {
    // What `hami-limits check` runs: the tolerant parser with HAMi-core's value checks.
    let parsed = hami_shared::limits_file::parse_bytes(bytes);
    assert!(
        parsed.diagnostics.is_empty(),
        "hami-limits check: {:?}",
        parsed.diagnostics
    );
}

fn envs(
    r: &hami_device_plugin::kubelet::api::v1beta1::ContainerAllocateResponse,
) -> HashMap<&str, &str> {
    r.envs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

#[tokio::test]
async fn file_mode_end_to_end() {
    let h = Harness::start(|hook| AllocationSettings {
        hook_path: hook.to_path_buf(),
        ..AllocationSettings::default()
    })
    .await;
    let mut ctr = Ctr::gpu("trainer", 3000, 50);
    ctr.priority = Some(0);
    let pod = h.admit(gpu_pod("train", &[ctr], json!({}))).await;
    // The webhook's decision is on the pod.
    let spec_env = pod.spec.as_ref().unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    assert!(
        spec_env
            .iter()
            .any(|e| e.name == "CUDA_TASK_PRIORITY" && e.value.as_deref() == Some("0"))
    );
    assert!(spec_env.iter().any(|e| e.name == "GPU_CORE_UTILIZATION_POLICY" && e.value.as_deref() == Some("force")));
    h.schedule(&pod, &[vec![dev(GPU_B, 3000, 50)]], true).await;
    assert!(h.node_lock().await.unwrap().ends_with(",default,train"));

    // GetPreferredAllocation uses the same locator and codec: the scheduler's GPU first.
    let available: Vec<String> = (0..10)
        .map(|i| format!("{GPU_A}-{i}"))
        .chain((0..10).map(|i| format!("{GPU_B}-{i}")))
        .collect();
    let preferred = h
        .client
        .clone()
        .preferred(&available, &[], 1)
        .await
        .unwrap();
    assert_eq!(preferred, [format!("{GPU_B}-0")]);

    let response = h.allocate(&[&format!("{GPU_B}-0")]).await.unwrap();
    let uid = uid(&pod);
    let hook = h.hook.display().to_string();
    let e = envs(&response);
    assert_eq!(e["CUDA_DEVICE_MEMORY_LIMIT_0"], "3000m");
    assert_eq!(e["CUDA_DEVICE_SM_LIMIT"], "50");
    assert_eq!(
        e["CUDA_DEVICE_MEMORY_SHARED_CACHE"],
        format!("{hook}/vgpu/usage.cache")
    );
    assert_eq!(e["NVIDIA_VISIBLE_DEVICES"], GPU_B);
    assert_eq!(e.len(), 4, "{e:?}");
    let file = h.containers_dir().join(format!("{uid}_trainer.limits"));
    let dir = h.containers_dir().join(format!("{uid}_trainer"));
    let mounts: Vec<(&str, &str, bool)> = response
        .mounts
        .iter()
        .map(|m| (m.container_path.as_str(), m.host_path.as_str(), m.read_only))
        .collect();
    let lib = format!("{hook}/vgpu/libvgpu.so");
    let vgpu = format!("{hook}/vgpu");
    let preload = format!("{hook}/vgpu/ld.so.preload");
    let preload_lib = format!("{hook}/vgpu/libhami_preload.so");
    let dir_s = dir.display().to_string();
    let file_s = file.display().to_string();
    assert_eq!(
        mounts,
        [
            (lib.as_str(), lib.as_str(), true),
            (vgpu.as_str(), dir_s.as_str(), false),
            ("/tmp/vgpulock", "/tmp/vgpulock", false),
            ("/etc/ld.so.preload", preload.as_str(), true),
            (preload_lib.as_str(), preload_lib.as_str(), true),
            ("/overrideEnv", file_s.as_str(), true),
        ]
    );

    // The file: exact bytes, 0644, owned by the plugin's user (root in a DaemonSet), clean.
    let bytes = std::fs::read(&file).unwrap();
    assert_eq!(
        String::from_utf8(bytes.clone()).unwrap(),
        format!(
            "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\nCUDA_DEVICE_MEMORY_SHARED_CACHE={hook}/vgpu/usage.cache\n\
             CUDA_DEVICE_SM_LIMIT=50\nCUDA_TASK_PRIORITY=0\nGPU_CORE_UTILIZATION_POLICY=force\n\
             HAMI_LIMITS_FORMAT=1\n"
        )
    );
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o644);
    assert_eq!(meta.uid(), own_uid(h.dir.path()));
    assert_check_clean(&bytes);
    // The per-container directory: the plugin's, not writable by the container's users (none of
    // them can replace the region with a link), with HAMi-core's region file pre-created, empty,
    // open to every UID.
    let dmeta = std::fs::symlink_metadata(&dir).unwrap();
    assert!(dmeta.is_dir());
    assert_eq!(dmeta.permissions().mode() & 0o7777, 0o755);
    assert_eq!(dmeta.uid(), own_uid(h.dir.path()));
    let cache = std::fs::symlink_metadata(dir.join("usage.cache")).unwrap();
    assert!(cache.is_file());
    assert_eq!(cache.len(), 0);
    assert_eq!(cache.permissions().mode() & 0o7777, 0o666);
    assert_eq!(cache.uid(), own_uid(h.dir.path()));
    assert_eq!(
        names(&h.containers_dir()),
        [format!("{uid}_trainer"), format!("{uid}_trainer.limits")]
    );

    // The pod's annotations: entry erased, allocated kept, success; lock released.
    let pod = h.pod("train").await;
    assert_eq!(
        annotation(&pod, "hami.io/vgpu-devices-to-allocate").unwrap(),
        ";"
    );
    assert_eq!(
        annotation(&pod, "hami.io/vgpu-devices-allocated").unwrap(),
        format!("{GPU_B},NVIDIA,3000,50:;")
    );
    assert_eq!(annotation(&pod, "hami.io/bind-phase").unwrap(), "success");
    assert_eq!(h.node_lock().await, None);
    assert!(h.events("train").await.is_empty());
    // Round trips: node GET, pod GET (unless the pod cache already held the pod), one pod PATCH
    // (entry erased + bind-phase success), node PATCH (lock released).
    let t = h.timings.take();
    assert_eq!(t.len(), 1);
    assert!(t[0].ok);
    assert_eq!(t[0].api_round_trips, if t[0].from_cache { 3 } else { 4 });
}

#[tokio::test]
async fn env_mode_injects_variables_without_file_or_mount() {
    let h = Harness::start(|hook| AllocationSettings {
        hook_path: hook.to_path_buf(),
        global_delivery: Some(LimitDelivery::Env),
        ..AllocationSettings::default()
    })
    .await;
    let pod = h
        .admit(gpu_pod("envpod", &[Ctr::gpu("main", 2048, 0)], json!({})))
        .await;
    h.schedule(&pod, &[vec![dev(GPU_A, 2048, 0)]], true).await;
    let response = h.allocate(&[&format!("{GPU_A}-3")]).await.unwrap();
    let e = envs(&response);
    assert_eq!(e["CUDA_DEVICE_MEMORY_LIMIT_0"], "2048m");
    assert_eq!(e["CUDA_DEVICE_SM_LIMIT"], "0");
    assert!(
        response
            .mounts
            .iter()
            .all(|m| m.container_path != "/overrideEnv")
    );
    // libvgpu.so, the shared-region directory, the lock, ld.so.preload and its preload library.
    assert_eq!(response.mounts.len(), 5);
    // Only the shared-region directory; no limits file.
    assert_eq!(names(&h.containers_dir()), [format!("{}_main", uid(&pod))]);
    let pod = h.pod("envpod").await;
    assert_eq!(annotation(&pod, "hami.io/bind-phase").unwrap(), "success");
    assert_eq!(h.node_lock().await, None);
}

#[tokio::test]
async fn node_config_and_pod_annotation_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let global = dir.path().join("device-config.yaml");
    std::fs::write(
        &global,
        "nvidia:\n  limitDelivery: env\n  deviceMemoryScaling: 2\n",
    )
    .unwrap();
    let node_config = dir.path().join("config.json");
    std::fs::write(
        &node_config,
        format!(
            r#"{{"nodeconfig":[{{"name":"{NODE}","limitdelivery":"file","libcudaloglevel":3}}]}}"#
        ),
    )
    .unwrap();
    let (g, n) = (global.clone(), node_config.clone());
    let h = Harness::start_in(dir, move |hook| {
        PluginSettings::load(Some(&g), Some(&n), Some(NODE), std::env::vars())
            .unwrap()
            .allocation_settings(AllocationInputs {
                hook_path: hook.to_path_buf(),
                ..AllocationInputs::default()
            })
            .unwrap()
    })
    .await;

    // Node config (file) over global (env).
    let a = h
        .admit(gpu_pod("by-node", &[Ctr::gpu("main", 1000, 10)], json!({})))
        .await;
    h.schedule(&a, &[vec![dev(GPU_A, 1000, 10)]], true).await;
    let r = h.allocate(&[&format!("{GPU_A}-0")]).await.unwrap();
    assert!(r.mounts.iter().any(|m| m.container_path == "/overrideEnv"));
    let text = std::fs::read_to_string(h.containers_dir().join(format!("{}_main.limits", uid(&a))))
        .unwrap();
    assert!(text.contains("CUDA_OVERSUBSCRIBE=true\n"), "{text}");
    assert!(text.contains("LIBCUDA_LOG_LEVEL=3\n"), "{text}");
    assert_check_clean(text.as_bytes());

    // Pod annotation (env) over node config (file).
    let b = h
        .admit(gpu_pod(
            "by-annotation",
            &[Ctr::gpu("main", 1000, 10)],
            json!({"hami.io/limit-delivery": "env"}),
        ))
        .await;
    h.schedule(&b, &[vec![dev(GPU_A, 1000, 10)]], true).await;
    let r = h.allocate(&[&format!("{GPU_A}-1")]).await.unwrap();
    assert!(r.mounts.iter().all(|m| m.container_path != "/overrideEnv"));
    assert_eq!(envs(&r)["CUDA_OVERSUBSCRIBE"], "true");
    assert!(
        !h.containers_dir()
            .join(format!("{}_main.limits", uid(&b)))
            .exists()
    );

    // An invalid annotation that bypassed the webhook: node config wins, with an Event.
    let c = h
        .create(gpu_pod(
            "bad-annotation",
            &[Ctr::gpu("main", 1000, 10)],
            json!({"hami.io/limit-delivery": "Env"}),
        ))
        .await;
    h.schedule(&c, &[vec![dev(GPU_A, 1000, 10)]], true).await;
    let r = h.allocate(&[&format!("{GPU_A}-2")]).await.unwrap();
    assert!(r.mounts.iter().any(|m| m.container_path == "/overrideEnv"));
    let events = h.events("bad-annotation").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason.as_deref(), Some("InvalidLimitDelivery"));
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    let message = events[0].note.clone().unwrap();
    assert!(
        message.contains("\"Env\"") && message.contains("node-config"),
        "{message}"
    );
    assert_eq!(
        annotation(&h.pod("bad-annotation").await, "hami.io/bind-phase").unwrap(),
        "success"
    );
}

#[tokio::test]
async fn read_only_containers_folder_fails_the_allocation() {
    let h = Harness::start(|hook| AllocationSettings {
        hook_path: hook.to_path_buf(),
        ..AllocationSettings::default()
    })
    .await;
    // Tests run as root, and root ignores permission bits: a chmod 0555 directory would still be
    // writable. `chattr +i` needs a file system and capability that CI may not have. A regular
    // file where the containers folder should be fails every directory operation for root too
    // (ENOTDIR/EEXIST), deterministically, on any file system.
    let containers = h.containers_dir();
    std::fs::write(&containers, "not a directory").unwrap();
    let pod = h
        .admit(gpu_pod("doomed", &[Ctr::gpu("main", 3000, 50)], json!({})))
        .await;
    h.schedule(&pod, &[vec![dev(GPU_A, 3000, 50)]], true).await;

    let status = h.allocate(&[&format!("{GPU_A}-0")]).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Internal);
    let containers_s = containers.display().to_string();
    assert!(
        status.message().contains(&containers_s),
        "{}",
        status.message()
    );

    let pod = h.pod("doomed").await;
    assert_eq!(annotation(&pod, "hami.io/bind-phase").unwrap(), "failed");
    assert_eq!(h.node_lock().await, None, "lock released");
    let events = h.events("doomed").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason.as_deref(), Some("AllocationFailed"));
    let message = events[0].note.clone().unwrap();
    assert!(message.contains(&containers_s), "{message}");
    assert!(
        message.contains("ot a directory") || message.contains("exists"),
        "{message}"
    );
    // Nothing written: the vgpu folder holds only the file we put there (beside the stand-in
    // libraries and preload list of the hook folder).
    assert_eq!(
        names(&h.hook.join("vgpu")),
        [
            "containers",
            "ld.so.preload",
            "libhami_preload.so",
            "libvgpu.so"
        ]
    );
    assert_eq!(
        std::fs::read_to_string(&containers).unwrap(),
        "not a directory"
    );
}

#[tokio::test]
async fn failed_publication_leaves_nothing_half_written() {
    let h = Harness::start(|hook| AllocationSettings {
        hook_path: hook.to_path_buf(),
        ..AllocationSettings::default()
    })
    .await;
    let pod = h
        .admit(gpu_pod("blocked", &[Ctr::gpu("main", 3000, 50)], json!({})))
        .await;
    h.schedule(&pod, &[vec![dev(GPU_A, 3000, 50)]], true).await;
    // The final name is taken by a non-empty directory: the rename fails after the directory was
    // created and the temporary file written.
    let blocker = h
        .containers_dir()
        .join(format!("{}_main.limits", uid(&pod)));
    std::fs::create_dir_all(blocker.join("x")).unwrap();
    let status = h.allocate(&[&format!("{GPU_A}-0")]).await.unwrap_err();
    assert!(
        status.message().contains(&blocker.display().to_string()),
        "{}",
        status.message()
    );
    assert_eq!(
        annotation(&h.pod("blocked").await, "hami.io/bind-phase").unwrap(),
        "failed"
    );
    assert_eq!(h.node_lock().await, None);
    // No temporary file, and the per-container directory created by this call is gone again.
    assert_eq!(
        names(&h.containers_dir()),
        [format!("{}_main.limits", uid(&pod))]
    );
    assert_eq!(names(&blocker), ["x"]);
}

#[tokio::test]
async fn two_container_pod_in_two_calls_with_init_and_gpu_less_containers() {
    let h = Harness::start(|hook| AllocationSettings {
        hook_path: hook.to_path_buf(),
        ..AllocationSettings::default()
    })
    .await;
    let mut init = Ctr::gpu("warmup", 1000, 20);
    init.init = true;
    let pod = h
        .admit(gpu_pod(
            "pair",
            &[init, Ctr::plain("sidecar"), Ctr::gpu("trainer", 4000, 60)],
            json!({}),
        ))
        .await;
    h.schedule(
        &pod,
        &[
            vec![dev(GPU_A, 1000, 20)],
            vec![],
            vec![dev(GPU_B, 4000, 60)],
        ],
        true,
    )
    .await;
    let uid = uid(&pod);

    let first = h.allocate(&[&format!("{GPU_A}-0")]).await.unwrap();
    assert_eq!(envs(&first)["CUDA_DEVICE_MEMORY_LIMIT_0"], "1000m");
    let p = h.pod("pair").await;
    assert_eq!(
        annotation(&p, "hami.io/vgpu-devices-to-allocate").unwrap(),
        format!(";;{GPU_B},NVIDIA,4000,60:;")
    );
    assert_eq!(annotation(&p, "hami.io/bind-phase").unwrap(), "allocating");
    assert!(
        h.node_lock().await.is_some(),
        "lock kept until the last container"
    );

    let second = h.allocate(&[&format!("{GPU_B}-0")]).await.unwrap();
    assert_eq!(envs(&second)["CUDA_DEVICE_MEMORY_LIMIT_0"], "4000m");
    assert_eq!(envs(&second)["NVIDIA_VISIBLE_DEVICES"], GPU_B);
    let p = h.pod("pair").await;
    assert_eq!(
        annotation(&p, "hami.io/vgpu-devices-to-allocate").unwrap(),
        ";;;"
    );
    assert_eq!(annotation(&p, "hami.io/bind-phase").unwrap(), "success");
    assert_eq!(h.node_lock().await, None);
    assert_eq!(
        names(&h.containers_dir()),
        [
            format!("{uid}_trainer"),
            format!("{uid}_trainer.limits"),
            format!("{uid}_warmup"),
            format!("{uid}_warmup.limits"),
        ]
    );
    for c in ["trainer", "warmup"] {
        assert_check_clean(
            &std::fs::read(h.containers_dir().join(format!("{uid}_{c}.limits"))).unwrap(),
        );
    }
    // A third call finds no pod with anything left to allocate.
    let status = h.allocate(&[&format!("{GPU_B}-1")]).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        annotation(&h.pod("pair").await, "hami.io/bind-phase").unwrap(),
        "success"
    );
}

#[tokio::test]
async fn device_count_mismatch_fails_the_allocation() {
    let h = Harness::start(|hook| AllocationSettings {
        hook_path: hook.to_path_buf(),
        ..AllocationSettings::default()
    })
    .await;
    let pod = h
        .admit(gpu_pod("mismatch", &[Ctr::gpu("main", 1000, 0)], json!({})))
        .await;
    h.schedule(
        &pod,
        &[vec![dev(GPU_A, 1000, 0), dev(GPU_B, 1000, 0)]],
        true,
    )
    .await;
    let status = h.allocate(&[&format!("{GPU_A}-0")]).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("assigned 2 device(s)"),
        "{}",
        status.message()
    );
    assert_eq!(
        annotation(&h.pod("mismatch").await, "hami.io/bind-phase").unwrap(),
        "failed"
    );
    assert_eq!(h.node_lock().await, None);
    assert!(names(&h.containers_dir()).is_empty());
}

#[tokio::test]
async fn no_pending_pod_is_a_clear_error_and_writes_nothing() {
    let h = Harness::start(|hook| AllocationSettings {
        hook_path: hook.to_path_buf(),
        ..AllocationSettings::default()
    })
    .await;
    // A pod on the node that the scheduler has not bound yet (no bind-phase) is not it.
    let pod = h
        .admit(gpu_pod("unbound", &[Ctr::gpu("main", 1000, 0)], json!({})))
        .await;
    let status = h.allocate(&[&format!("{GPU_A}-0")]).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status
            .message()
            .contains("no pod is being allocated on node gpu-0"),
        "{}",
        status.message()
    );
    assert!(!h.containers_dir().exists());
    assert_eq!(
        annotation(&h.pod("unbound").await, "hami.io/bind-phase"),
        None
    );
    assert!(h.events("unbound").await.is_empty());
    // Without the lock, the pending pod is found by listing the node's pods.
    h.schedule(&pod, &[vec![dev(GPU_A, 1000, 0)]], false).await;
    h.allocate(&[&format!("{GPU_A}-0")]).await.unwrap();
    assert_eq!(
        annotation(&h.pod("unbound").await, "hami.io/bind-phase").unwrap(),
        "success"
    );
}

#[tokio::test]
async fn deleted_pod_files_are_collected_after_the_grace_period() {
    let h = Harness::start(|hook| AllocationSettings {
        hook_path: hook.to_path_buf(),
        ..AllocationSettings::default()
    })
    .await;
    let gone = h
        .admit(gpu_pod("gone", &[Ctr::gpu("main", 1000, 0)], json!({})))
        .await;
    h.schedule(&gone, &[vec![dev(GPU_A, 1000, 0)]], true).await;
    h.allocate(&[&format!("{GPU_A}-0")]).await.unwrap();
    let alive = h
        .admit(gpu_pod("alive", &[Ctr::gpu("main", 1000, 0)], json!({})))
        .await;
    h.schedule(&alive, &[vec![dev(GPU_A, 1000, 0)]], true).await;
    h.allocate(&[&format!("{GPU_A}-1")]).await.unwrap();
    let dir = h.containers_dir();
    // Something that is not ours, old and matching nothing: never touched.
    std::fs::write(dir.join("notes.txt"), "keep").unwrap();

    let collector = Collector::new(
        h.server.client(),
        NODE,
        &dir,
        CollectorSettings {
            interval: Duration::from_secs(60),
            grace: Duration::from_secs(300),
        },
    );
    // Both pods exist: nothing to collect.
    assert_eq!(collector.collect_once().await.unwrap().directories, 0);
    h.pods()
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    // Deleted, but younger than the grace period: kept.
    let report = collector.collect_once().await.unwrap();
    assert_eq!((report.directories, report.files), (0, 0));
    assert_eq!(names(&dir).len(), 5);
    // Age everything past the grace period.
    let old = SystemTime::now() - Duration::from_secs(600);
    for name in names(&dir) {
        let f = std::fs::File::open(dir.join(&name)).unwrap();
        f.set_modified(old).unwrap();
    }
    let report = collector.collect_once().await.unwrap();
    assert_eq!((report.directories, report.files, report.errors), (1, 1, 0));
    let a = uid(&alive);
    assert_eq!(
        names(&dir),
        [
            format!("{a}_main"),
            format!("{a}_main.limits"),
            "notes.txt".to_owned()
        ]
    );
    let stats = collector.stats();
    assert_eq!(
        stats
            .directories_removed
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(
        stats
            .files_removed
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn a_lock_naming_another_pod_is_left_alone() {
    let h = Harness::start(|hook| AllocationSettings {
        hook_path: hook.to_path_buf(),
        ..AllocationSettings::default()
    })
    .await;
    let pod = h
        .admit(gpu_pod("mine", &[Ctr::gpu("main", 1000, 0)], json!({})))
        .await;
    h.schedule(&pod, &[vec![dev(GPU_A, 1000, 0)]], false).await;
    // The lock names a pod that does not exist: the pending pod is found by listing, and the
    // lock, which does not name it, is not released.
    let ghost = "2026-01-01T00:00:00Z,default,ghost";
    h.nodes()
        .patch(
            NODE,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {"hami.io/mutex.lock": ghost}}}),
            ),
        )
        .await
        .unwrap();
    h.allocate(&[&format!("{GPU_A}-0")]).await.unwrap();
    assert_eq!(
        annotation(&h.pod("mine").await, "hami.io/bind-phase").unwrap(),
        "success"
    );
    assert_eq!(h.node_lock().await.as_deref(), Some(ghost));
}

/// A hook folder filled by HAMi v2.10's `vgpu-init.sh` (chart `hamiCore.install=false` on a node
/// that ran HAMi): HAMi-core is found under HAMi's name, but the container's preload pair needs
/// `libhami_preload.so`, which HAMi does not install: the allocation fails, naming the path and
/// what installs it, instead of starting a container whose `/etc/ld.so.preload` names a file it
/// does not have. Our layout restored, the next pod is served, and the host's lock folder is the
/// plugin's 0755 holding HAMi-core's `lock`, 0666.
#[tokio::test]
async fn hamis_hook_layout_is_refused_loudly_and_ours_is_served() {
    let h = Harness::start(|hook| AllocationSettings {
        hook_path: hook.to_path_buf(),
        ..AllocationSettings::default()
    })
    .await;
    let vgpu = h.hook.join("vgpu");
    for name in ["libvgpu.so", "libhami_preload.so"] {
        std::fs::remove_file(vgpu.join(name)).unwrap();
    }
    std::fs::write(vgpu.join("libvgpu.so.v2.10.0"), b"\x7fELF HAMi-core").unwrap();
    std::fs::write(
        vgpu.join("ld.so.preload"),
        format!("{}/libvgpu.so\n", vgpu.display()),
    )
    .unwrap();
    let pod = h
        .admit(gpu_pod("hamis", &[Ctr::gpu("main", 3000, 50)], json!({})))
        .await;
    h.schedule(&pod, &[vec![dev(GPU_A, 3000, 50)]], true).await;
    let status = h.allocate(&[&format!("{GPU_A}-0")]).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    let missing = format!(
        "{}/libhami_preload.so does not exist: hami-device-plugin install-hook",
        vgpu.display()
    );
    assert!(status.message().contains(&missing), "{}", status.message());
    assert_eq!(
        annotation(&h.pod("hamis").await, "hami.io/bind-phase").unwrap(),
        "failed"
    );
    let events = h.events("hamis").await;
    assert!(
        events
            .iter()
            .any(|e| e.note.as_deref().is_some_and(|n| n.contains(&missing))),
        "{events:?}"
    );
    assert!(
        !h.containers_dir()
            .join(format!("{}_main.limits", uid(&pod)))
            .exists(),
        "nothing published for a refused allocation"
    );

    // install-hook's layout beside HAMi's versioned file: `libvgpu.so` is mounted.
    hami_tests::hook::install_stand_in(&vgpu).unwrap();
    let pod = h
        .admit(gpu_pod("ours", &[Ctr::gpu("main", 3000, 50)], json!({})))
        .await;
    h.schedule(&pod, &[vec![dev(GPU_A, 3000, 50)]], true).await;
    let response = h.allocate(&[&format!("{GPU_A}-0")]).await.unwrap();
    let lib = format!("{}/libvgpu.so", vgpu.display());
    assert!(
        response
            .mounts
            .iter()
            .any(|m| m.container_path == lib && m.host_path == lib && m.read_only),
        "{:?}",
        response.mounts
    );
    // HAMi-core's lock folder, the host's /tmp/vgpulock: not writable by containers (HAMi makes
    // it 0777); HAMi-core's lock file pre-created for every UID.
    let lock = std::fs::symlink_metadata("/tmp/vgpulock").unwrap();
    assert!(lock.is_dir());
    assert_eq!(lock.permissions().mode() & 0o7777, 0o755);
    let file = std::fs::symlink_metadata("/tmp/vgpulock/lock").unwrap();
    assert!(file.is_file());
    assert_eq!(file.permissions().mode() & 0o7777, 0o666);
}
