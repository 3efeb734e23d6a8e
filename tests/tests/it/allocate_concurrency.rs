//! kubelet calling `Allocate` for several pods at once (over the plugin's unix socket, through
//! the in-process API server): every file whole, every annotation right, every container
//! allocated exactly once.

use crate::allocate_support;

use std::collections::BTreeMap;

use allocate_support::*;
use hami_device_plugin::allocation::plan::AllocationSettings;
use serde_json::json;

/// How the plugin's pod cache stands when the calls come.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cache {
    /// Fed by the pod watch, as `run` does.
    Watched,
    /// None: every pod read from the API server.
    Off,
    /// Holds every pod as scheduled, but each pod has changed since: every first selection is
    /// refused (409) and redone from the API server.
    Stale,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_allocations_leave_every_file_whole_and_every_annotation_right() {
    scenario(Cache::Watched).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_allocations_without_a_pod_cache() {
    scenario(Cache::Off).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_allocations_with_a_stale_pod_cache() {
    let h = scenario(Cache::Stale).await;
    // Each call's first selection came from the stale cache and was refused by the API server.
    assert!(h.metrics.stale_pod_retries() >= 1);
}

async fn scenario(cache: Cache) -> Harness {
    let view = match cache {
        Cache::Watched => PodView::Watch,
        Cache::Off => PodView::Off,
        Cache::Stale => PodView::Manual,
    };
    let h = Harness::start_with(view, |hook| AllocationSettings {
        hook_path: hook.to_path_buf(),
        ..AllocationSettings::default()
    })
    .await;
    // 12 one-container pods and 4 pods with two GPU containers: 20 containers. Each container
    // gets a distinct memory limit, so an answer names the container it was for.
    let mut expected: BTreeMap<u64, (String, String)> = BTreeMap::new(); // mem -> (pod, ctr)
    let mut pods = Vec::new();
    for i in 0..16u64 {
        let name = format!("p{i:02}");
        let (containers, devices) = if i < 12 {
            let mem = 1000 + i;
            expected.insert(mem, (name.clone(), "main".into()));
            (
                vec![Ctr::gpu("main", mem, 10)],
                vec![vec![dev(if i % 2 == 0 { GPU_A } else { GPU_B }, mem, 10)]],
            )
        } else {
            let (m1, m2) = (2000 + i, 3000 + i);
            expected.insert(m1, (name.clone(), "first".into()));
            expected.insert(m2, (name.clone(), "second".into()));
            (
                vec![Ctr::gpu("first", m1, 20), Ctr::gpu("second", m2, 30)],
                vec![vec![dev(GPU_A, m1, 20)], vec![dev(GPU_B, m2, 30)]],
            )
        };
        let pod = h.admit(gpu_pod(&name, &containers, json!({}))).await;
        // No node lock: several pods are bound and pending at once, found by listing.
        h.schedule(&pod, &devices, false).await;
        pods.push(pod);
    }
    if cache == Cache::Stale {
        h.cache.begin_list();
        for pod in &pods {
            h.cache
                .list_item(h.pod(pod.metadata.name.as_deref().unwrap()).await);
        }
        h.cache.end_list();
        for pod in &pods {
            h.pods()
                .patch(
                    pod.metadata.name.as_deref().unwrap(),
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
                )
                .await
                .unwrap();
        }
    }

    let mut calls = tokio::task::JoinSet::new();
    for i in 0..expected.len() {
        let mut client = h.client.clone();
        let id = format!("{}-{}", if i % 2 == 0 { GPU_A } else { GPU_B }, i % 10);
        calls.spawn(async move { client.allocate(&[vec![id]]).await });
    }
    let mut answered: BTreeMap<u64, usize> = BTreeMap::new();
    while let Some(result) = calls.join_next().await {
        let response = result.unwrap().unwrap();
        let envs = &response.container_responses[0].envs;
        let mem: u64 = envs["CUDA_DEVICE_MEMORY_LIMIT_0"]
            .strip_suffix('m')
            .unwrap()
            .parse()
            .unwrap();
        *answered.entry(mem).or_default() += 1;
    }
    assert_eq!(
        answered.keys().copied().collect::<Vec<_>>(),
        expected.keys().copied().collect::<Vec<_>>(),
        "every container allocated"
    );
    assert!(
        answered.values().all(|n| *n == 1),
        "exactly once: {answered:?}"
    );

    // Every file whole and exact; no temporary file left.
    let dir = h.containers_dir();
    let uids: BTreeMap<String, String> = pods
        .iter()
        .map(|p| (p.metadata.name.clone().unwrap(), uid(p)))
        .collect();
    let hook = h.hook.display().to_string();
    for (mem, (pod, ctr)) in &expected {
        let cores = match ctr.as_str() {
            "main" => 10,
            "first" => 20,
            _ => 30,
        };
        let text =
            std::fs::read_to_string(dir.join(format!("{}_{ctr}.limits", uids[pod]))).unwrap();
        assert_eq!(
            text,
            format!(
                "CUDA_DEVICE_MEMORY_LIMIT_0={mem}m\nCUDA_DEVICE_MEMORY_SHARED_CACHE={hook}/vgpu/usage.cache\n\
                 CUDA_DEVICE_SM_LIMIT={cores}\nGPU_CORE_UTILIZATION_POLICY=force\nHAMI_LIMITS_FORMAT=1\n"
            ),
            "{pod}/{ctr}"
        );
        assert!(
            hami_shared::limits_file::parse(&text)
                .diagnostics
                .is_empty()
        );
    }
    let files = names(&dir);
    assert_eq!(files.len(), 2 * expected.len(), "{files:?}");
    assert!(files.iter().all(|f| !f.contains(".hami-tmp.")), "{files:?}");

    // Every annotation right.
    for pod in &pods {
        let name = pod.metadata.name.clone().unwrap();
        let p = h.pod(&name).await;
        assert_eq!(
            annotation(&p, "hami.io/bind-phase").unwrap(),
            "success",
            "{name}"
        );
        let left = annotation(&p, "hami.io/vgpu-devices-to-allocate").unwrap();
        assert!(!left.contains("NVIDIA"), "{name}: {left}");
        let allocated = annotation(&p, "hami.io/vgpu-devices-allocated").unwrap();
        assert!(allocated.contains("NVIDIA"), "{name}: allocated kept");
        assert!(h.events(&name).await.is_empty(), "{name}");
    }
    assert_eq!(
        h.timings.take().iter().filter(|t| t.ok).count(),
        expected.len()
    );
    if cache == Cache::Off {
        assert_eq!(h.metrics.pod_lookups(true), 0);
    }
    h
}
