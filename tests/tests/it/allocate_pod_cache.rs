//! `Allocate` with its watch-fed pod cache: a pod found in the cache costs no pod GET or LIST,
//! and a stale cache never leads to an allocation made from an old version of the pod (the patch
//! that erases the entries carries the pod's resourceVersion; a 409 or 404 removes the files,
//! and the plugin reads the pod again from the API server and allocates again).

use crate::allocate_support;

use std::time::Duration;

use allocate_support::*;
use hami_device_plugin::allocation::plan::AllocationSettings;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

fn settings(hook: &std::path::Path) -> AllocationSettings {
    AllocationSettings {
        hook_path: hook.to_path_buf(),
        ..AllocationSettings::default()
    }
}

/// Waits until the cache holds `name` with a non-empty devices annotation.
async fn wait_cached(h: &Harness, name: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if h.cache
            .get(NS, name)
            .is_some_and(|p| annotation(&p, "hami.io/vgpu-devices-to-allocate").is_some())
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never reached the cache"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_pod_in_the_cache_is_allocated_without_a_pod_get_or_list() {
    let h = Harness::start_with(PodView::Watch, settings).await;
    for (name, lock) in [("locked", true), ("listed", false)] {
        let pod = h
            .admit(gpu_pod(name, &[Ctr::gpu("main", 3000, 40)], json!({})))
            .await;
        h.schedule(&pod, &[vec![dev(GPU_A, 3000, 40)]], lock).await;
        wait_cached(&h, name).await;
        h.timings.take();
        let response = h.allocate(&[&format!("{GPU_A}-1")]).await.unwrap();
        assert!(
            response
                .mounts
                .iter()
                .any(|m| m.container_path == "/overrideEnv"),
            "{name}"
        );
        let timing = h.timings.take().pop().unwrap();
        assert!(timing.ok && timing.from_cache, "{name}: {timing:?}");
        assert_eq!(timing.retries, 0, "{name}");
        // node GET, one patch (entry erased + bind-phase success), and the lock release.
        assert_eq!(
            timing.api_round_trips,
            if lock { 3 } else { 2 },
            "{name}: {timing:?}"
        );
        let pod = h.pod(name).await;
        assert_eq!(annotation(&pod, "hami.io/bind-phase").unwrap(), "success");
        assert_eq!(
            annotation(&pod, "hami.io/vgpu-devices-to-allocate").unwrap(),
            ";"
        );
        assert_eq!(h.node_lock().await, None, "{name}");
    }
    assert_eq!(h.metrics.pod_lookups(true), 2);
    assert_eq!(h.metrics.pod_lookups(false), 0);
    assert_eq!(h.metrics.stale_pod_retries(), 0);
}

#[tokio::test]
async fn a_stale_cached_pod_is_read_again_and_its_current_version_decides() {
    let h = Harness::start_with(PodView::Manual, settings).await;
    let pod = h
        .admit(gpu_pod("stale", &[Ctr::gpu("main", 4000, 30)], json!({})))
        .await;
    h.schedule(&pod, &[vec![dev(GPU_B, 4000, 30)]], true).await;
    // The cache holds the scheduled pod...
    let scheduled = h.pod("stale").await;
    h.cache.begin_list();
    h.cache.list_item(scheduled.clone());
    h.cache.end_list();
    // ...then the pod changes behind its back: env delivery requested.
    h.pods()
        .patch(
            "stale",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"hami.io/limit-delivery": "env"}}})),
        )
        .await
        .unwrap();
    h.timings.take();
    let response = h.allocate(&[&format!("{GPU_B}-2")]).await.unwrap();
    // The plan came from the current pod: env mode, no limits file, no /overrideEnv mount.
    assert!(
        response
            .mounts
            .iter()
            .all(|m| m.container_path != "/overrideEnv"),
        "{:?}",
        response.mounts
    );
    assert_eq!(
        response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "4000m",
        "{:?}",
        response.envs
    );
    assert_eq!(names(&h.containers_dir()), [format!("{}_main", uid(&pod))]);
    let timing = h.timings.take().pop().unwrap();
    assert!(timing.ok && !timing.from_cache, "{timing:?}");
    assert_eq!(timing.retries, 1);
    assert_eq!(h.metrics.stale_pod_retries(), 1);
    assert_eq!(h.metrics.pod_lookups(false), 1);
    let now = h.pod("stale").await;
    assert_eq!(annotation(&now, "hami.io/bind-phase").unwrap(), "success");
    assert_eq!(
        annotation(&now, "hami.io/vgpu-devices-to-allocate").unwrap(),
        ";"
    );
    assert_eq!(h.node_lock().await, None);
    // The allocator put its own writes back into the cache: it holds the current version.
    assert_eq!(
        h.cache.get(NS, "stale").unwrap().metadata.resource_version,
        now.metadata.resource_version
    );
    assert!(h.events("stale").await.is_empty());
}

#[tokio::test]
async fn a_cached_pod_that_was_deleted_is_not_allocated() {
    let h = Harness::start_with(PodView::Manual, settings).await;
    let pod = h
        .admit(gpu_pod("gone", &[Ctr::gpu("main", 1000, 0)], json!({})))
        .await;
    h.schedule(&pod, &[vec![dev(GPU_A, 1000, 0)]], false).await;
    h.cache.begin_list();
    h.cache.list_item(h.pod("gone").await);
    h.cache.end_list();
    h.pods()
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    let status = h.allocate(&[&format!("{GPU_A}-0")]).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("no pod is being allocated"),
        "{}",
        status.message()
    );
    // The files written for the stale selection were removed when the API server refused it.
    assert!(names(&h.containers_dir()).is_empty());
    assert_eq!(h.metrics.stale_pod_retries(), 1);
}

#[tokio::test]
async fn an_unsynced_cache_is_not_read() {
    // Manual view, never listed: every pod comes from the API server, as without a cache.
    let h = Harness::start_with(PodView::Manual, settings).await;
    let pod = h
        .admit(gpu_pod("api", &[Ctr::gpu("main", 1500, 10)], json!({})))
        .await;
    h.cache.apply(h.pod("api").await);
    h.schedule(&pod, &[vec![dev(GPU_A, 1500, 10)]], true).await;
    h.timings.take();
    h.allocate(&[&format!("{GPU_A}-4")]).await.unwrap();
    let timing = h.timings.take().pop().unwrap();
    assert!(
        timing.ok && !timing.from_cache && timing.retries == 0,
        "{timing:?}"
    );
    // node GET, pod GET (the lock names it), one patch (erased + success), lock release.
    assert_eq!(timing.api_round_trips, 4);
    assert_eq!(h.metrics.pod_lookups(false), 1);
}

#[tokio::test]
async fn the_pod_the_node_lock_names_comes_first() {
    let h = Harness::start_with(PodView::Watch, settings).await;
    // "aaa" lists first, but the scheduler locked the node for "zzz".
    let first = h
        .admit(gpu_pod("aaa", &[Ctr::gpu("main", 1111, 10)], json!({})))
        .await;
    h.schedule(&first, &[vec![dev(GPU_A, 1111, 10)]], false)
        .await;
    let locked = h
        .admit(gpu_pod("zzz", &[Ctr::gpu("main", 2222, 20)], json!({})))
        .await;
    h.schedule(&locked, &[vec![dev(GPU_B, 2222, 20)]], true)
        .await;
    wait_cached(&h, "aaa").await;
    wait_cached(&h, "zzz").await;
    h.timings.take();
    let response = h.allocate(&[&format!("{GPU_B}-0")]).await.unwrap();
    assert_eq!(response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "2222m");
    let timing = h.timings.take().pop().unwrap();
    // The first pick ("aaa", read while the lock was being read) was redone for "zzz".
    assert_eq!(timing.retries, 1, "{timing:?}");
    assert_eq!(
        annotation(&h.pod("zzz").await, "hami.io/bind-phase").unwrap(),
        "success"
    );
    assert_eq!(h.node_lock().await, None);
    // "aaa" untouched: its entry still there, no file of it left behind.
    let aaa = h.pod("aaa").await;
    assert_eq!(
        annotation(&aaa, "hami.io/bind-phase").unwrap(),
        "allocating"
    );
    assert!(
        annotation(&aaa, "hami.io/vgpu-devices-to-allocate")
            .unwrap()
            .contains("NVIDIA")
    );
    assert_eq!(
        names(&h.containers_dir()),
        [
            format!("{}_main", uid(&locked)),
            format!("{}_main.limits", uid(&locked))
        ]
    );
    // Then "aaa", found by listing.
    let response = h.allocate(&[&format!("{GPU_A}-0")]).await.unwrap();
    assert_eq!(response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "1111m");
    assert_eq!(
        annotation(&h.pod("aaa").await, "hami.io/bind-phase").unwrap(),
        "success"
    );
}

/// kubelet may go away in the middle of a call (the gRPC future is dropped): the call still runs
/// to a definite end on its own task (files and pod agree, its claim settled), and the next call
/// for that pod does not hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_leaves_no_claim_behind() {
    use hami_device_plugin::allocation::shell::executor::Allocator;
    use hami_device_plugin::gpu::devices::DeviceTable;
    use hami_device_plugin::gpu::inventory::{DeviceFilter, FileInventory, GpuInventory};
    use hami_device_plugin::kubelet::service::AllocateHandler;

    let h = Harness::start_with(PodView::Watch, settings).await;
    // A second allocator on the same cache and API server, called directly so that the test
    // can drop its future at any point.
    let allocator =
        Allocator::new(h.server.client(), NODE, settings(&h.hook)).with_pod_cache(h.cache.clone());
    let gpus = FileInventory::new(h.dir.path().join("inventory.yaml"))
        .discover()
        .unwrap();
    let (table, _) = DeviceTable::build(gpus, &DeviceFilter::default(), 10, false).unwrap();
    let request = |id: &str| hami_device_plugin::kubelet::api::v1beta1::AllocateRequest {
        container_requests: vec![
            hami_device_plugin::kubelet::api::v1beta1::ContainerAllocateRequest {
                devices_ids: vec![id.to_owned()],
            },
        ],
    };
    for (i, micros) in [0u64, 50, 200, 500, 1000, 1500, 2000, 3000, 5000]
        .into_iter()
        .enumerate()
    {
        let name = format!("cancel-{i}");
        let mem = 1000 + i as u64;
        let pod = h
            .admit(gpu_pod(&name, &[Ctr::gpu("main", mem, 10)], json!({})))
            .await;
        h.schedule(&pod, &[vec![dev(GPU_A, mem, 10)]], false).await;
        wait_cached(&h, &name).await;
        let id = format!("{GPU_A}-{}", i % 10);
        // Dropped after `micros` (or finished before): the next call for the same pod must
        // complete, and the pod end up allocated once, with its file.
        let cancelled = tokio::time::timeout(
            Duration::from_micros(micros),
            allocator.allocate(&table, request(&id)),
        )
        .await;
        if cancelled.is_err() {
            let again = tokio::time::timeout(WAIT, allocator.allocate(&table, request(&id)))
                .await
                .unwrap_or_else(|_| panic!("{name}: the call after a cancelled one hung"));
            // Either call may be the one that allocates the pod; the other finds no pod left.
            if let Err(status) = &again {
                assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
            }
        }
        // A dropped call still runs to its end on its own task; wait for it.
        let deadline = tokio::time::Instant::now() + WAIT;
        while annotation(&h.pod(&name).await, "hami.io/bind-phase").as_deref() != Some("success") {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} after {micros} µs: never allocated"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let text = std::fs::read_to_string(
            h.containers_dir()
                .join(format!("{}_main.limits", uid(&pod))),
        )
        .unwrap();
        assert!(
            text.contains(&format!("CUDA_DEVICE_MEMORY_LIMIT_0={mem}m\n")),
            "{text}"
        );
    }
}
