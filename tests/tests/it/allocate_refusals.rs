//! `Allocate`'s own checks end to end, in process (the test API server, the fake kubelet, the
//! plugin with the real `Allocator`): a pod that never met the webhook, or whose scheduler
//! annotations a tenant wrote, is refused at `Allocate` — the gRPC error, `hami.io/bind-phase:
//! failed`, the node lock released, one Warning Event naming pod, container, field and path, and
//! nothing written on the node.

use crate::allocate_support;

use allocate_support::*;
use hami_device_plugin::allocation::plan::AllocationSettings;
use serde_json::{Value, json};

async fn start() -> Harness {
    Harness::start(|hook| AllocationSettings {
        hook_path: hook.to_path_buf(),
        ..AllocationSettings::default()
    })
    .await
}

/// The allocation of `name` failed with `reason`: status, bind-phase, lock, one Event whose note
/// contains every one of `says`, and no container folder or limits file of the pod on the node.
async fn assert_refused(
    h: &Harness,
    name: &str,
    status: &tonic::Status,
    reason: &str,
    says: &[&str],
) {
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    for s in says {
        assert!(
            status.message().contains(s),
            "{s:?} in {}",
            status.message()
        );
    }
    let pod = h.pod(name).await;
    assert_eq!(annotation(&pod, "hami.io/bind-phase").unwrap(), "failed");
    assert_eq!(h.node_lock().await, None, "lock released");
    let events = h.events(name).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason.as_deref(), Some(reason));
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    let note = events[0].note.clone().unwrap();
    for s in says {
        assert!(note.contains(s), "{s:?} in {note}");
    }
    let ours: Vec<String> = names(&h.containers_dir())
        .into_iter()
        .filter(|n| n.starts_with(&uid(&pod)))
        .collect();
    assert!(ours.is_empty(), "nothing written: {ours:?}");
}

/// A GPU pod as a tenant writes it, with `fields` merged into its container.
fn tenant_pod(name: &str, fields: &Value) -> Value {
    let mut pod = gpu_pod(name, &[Ctr::gpu("main", 3000, 50)], json!({}));
    for (k, v) in fields.as_object().unwrap() {
        pod["spec"]["containers"][0][k] = v.clone();
    }
    pod
}

/// A pod created without the webhook (its label opt-out, `failurePolicy: Ignore`, created before
/// the install) that mounts its own file over the limits file never starts uncapped.
#[tokio::test]
async fn a_pod_that_bypassed_the_webhook_is_refused_for_its_mount() {
    let h = start().await;
    let pod = h
        .create(tenant_pod(
            "bypass",
            &json!({
                "volumeMounts": [{"name": "mine", "mountPath": "//overrideEnv/", "subPath": "limits"}]
            }),
        ))
        .await;
    h.schedule(&pod, &[vec![dev(GPU_A, 3000, 50)]], true).await;
    let status = h.allocate(&[&format!("{GPU_A}-0")]).await.unwrap_err();
    assert_refused(
        &h,
        "bypass",
        &status,
        "GpuContainerMountRefused",
        &[
            "pod default/bypass: container \"main\" refused",
            "spec.containers[0].volumeMounts[0].mountPath=\"//overrideEnv/\" (cleaned /overrideEnv)",
            "the limits file",
        ],
    )
    .await;
}

#[tokio::test]
async fn privilege_and_the_containers_own_hami_core_variables_are_refused() {
    let h = start().await;
    let pod = h
        .create(tenant_pod(
            "escape",
            &json!({
                "securityContext": {"privileged": true},
                "env": [
                    {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80g"},
                    {"name": "CUDA_DISABLE_CONTROL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                ]
            }),
        ))
        .await;
    h.schedule(&pod, &[vec![dev(GPU_A, 3000, 50)]], true).await;
    let status = h.allocate(&[&format!("{GPU_A}-0")]).await.unwrap_err();
    assert_refused(
        &h,
        "escape",
        &status,
        "GpuContainerPrivilegeRefused",
        &[
            "spec.containers[0].securityContext.privileged=true",
            "spec.containers[0].env[0] sets CUDA_DEVICE_MEMORY_LIMIT_0 (\"80g\")",
            "spec.containers[0].env[1] sets CUDA_DISABLE_CONTROL (from valueFrom)",
        ],
    )
    .await;
}

/// A tenant who writes HAMi's scheduler annotations (and binds the pod itself) gets nothing the
/// node could not have granted: a GPU this node does not have, more memory than the card.
#[tokio::test]
async fn a_forged_entry_is_refused() {
    let h = start().await;
    for (name, device, says) in [
        (
            "unknown-gpu",
            dev("GPU-99999999-ffff-4000-8000-000000000009", 3000, 50),
            "which this node does not advertise",
        ),
        (
            "too-much-memory",
            dev(GPU_A, 1_000_000, 100),
            "grants 1000000 MiB on GPU",
        ),
    ] {
        let pod = h.create(tenant_pod(name, &json!({}))).await;
        h.schedule(&pod, &[vec![device]], true).await;
        let status = h.allocate(&[&format!("{GPU_A}-0")]).await.unwrap_err();
        assert_refused(
            &h,
            name,
            &status,
            "GpuEntryRefused",
            &[
                &format!("pod default/{name}: hami.io/vgpu-devices-to-allocate refused"),
                says,
            ],
        )
        .await;
    }
}

/// `GetPreferredAllocation` steered kubelet to the entry's GPU; the entry was changed before
/// `Allocate` (`kubectl annotate` on the pending pod): refused. kubelet choosing other GPUs on its
/// own (no steering) is not refused: the container gets the entry's GPU, as in HAMi.
#[tokio::test]
async fn an_entry_changed_after_steering_is_refused() {
    let h = start().await;
    let available: Vec<String> = (0..10)
        .map(|i| format!("{GPU_A}-{i}"))
        .chain((0..10).map(|i| format!("{GPU_B}-{i}")))
        .collect();

    let pod = h
        .admit(gpu_pod(
            "unsteered",
            &[Ctr::gpu("main", 3000, 50)],
            json!({}),
        ))
        .await;
    h.schedule(&pod, &[vec![dev(GPU_B, 3000, 50)]], true).await;
    let response = h.allocate(&[&format!("{GPU_A}-3")]).await.unwrap();
    assert_eq!(response.envs["NVIDIA_VISIBLE_DEVICES"], GPU_B);

    let pod = h
        .admit(gpu_pod("changed", &[Ctr::gpu("main", 3000, 50)], json!({})))
        .await;
    h.schedule(&pod, &[vec![dev(GPU_B, 3000, 50)]], true).await;
    let preferred = h
        .client
        .clone()
        .preferred(&available, &[], 1)
        .await
        .unwrap();
    assert_eq!(preferred, [format!("{GPU_B}-0")]);
    let forged =
        hami_device_plugin::allocation::plan::codec::PodDevices::from_containers(&[vec![dev(
            GPU_A, 3000, 50,
        )]])
        .encode();
    h.pods()
        .patch(
            "changed",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {"hami.io/vgpu-devices-to-allocate": forged}}}),
            ),
        )
        .await
        .unwrap();
    // The pod cache sees the change before Allocate reads it.
    let deadline = tokio::time::Instant::now() + WAIT;
    while h
        .cache
        .get(NS, "changed")
        .and_then(|p| annotation(&p, "hami.io/vgpu-devices-to-allocate"))
        .as_deref()
        != Some(forged.as_str())
    {
        assert!(tokio::time::Instant::now() < deadline, "cache never saw it");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let status = h.allocate(&[&format!("{GPU_B}-0")]).await.unwrap_err();
    assert_refused(
        &h,
        "changed",
        &status,
        "GpuEntryRefused",
        &[&format!(
            "entry 0 names GPU(s) {GPU_A} but kubelet allocated {GPU_B}, where GetPreferredAllocation had steered it"
        )],
    )
    .await;
}
