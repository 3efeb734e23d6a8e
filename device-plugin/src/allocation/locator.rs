//! Finding the pod kubelet is allocating for — device IDs alone do not name it — exactly as
//! HAMi's plugin does: the node lock `hami.io/mutex.lock` (`<time>,<namespace>,<pod>`) first;
//! else the first pod on this node that is `Pending`, has `hami.io/bind-time`, has
//! `hami.io/bind-phase` `allocating` or `success`, and `hami.io/vgpu-node` equal to this node.
//!
//! One refinement over HAMi: a pod with nothing left to allocate (every NVIDIA entry of
//! `hami.io/vgpu-devices-to-allocate` already erased: `bind-phase: success`, but still `Pending`
//! until its containers start) is passed over, on the lock path and the list path alike. HAMi
//! would pick it again and fail the *next* pod's allocation with "device request not found"; a
//! malformed annotation is not passed over (the allocation fails loudly on it).
//!
//! One locator for both callers: `Allocate` ([`super::executor`]) and `GetPreferredAllocation`
//! ([`crate::pending_pod::KubePendingPod`] delegates here).

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};

use super::codec::PodDevices;
use crate::pending_pod::{is_pending_here, lock_holder};
use hami_shared::names::{ANNOTATION_MUTEX_LOCK, ANNOTATION_VGPU_DEVICES_TO_ALLOCATE};

/// True when the pod's devices annotation decodes and names no NVIDIA device any more.
pub fn fully_allocated(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_VGPU_DEVICES_TO_ALLOCATE))
        .and_then(|v| PodDevices::decode(v).ok())
        .is_some_and(|d| !d.has_nvidia())
}

/// The pod found, and how.
#[derive(Debug, Clone)]
pub struct Located {
    /// The pod, as read from the API server.
    pub pod: Pod,
    /// The node lock's value when the lock named this pod (the value to release it with).
    pub lock: Option<String>,
}

/// API round trips of one lookup (for the benchmark's breakdown).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LocateTrips {
    /// Node GETs.
    pub node_gets: u32,
    /// Pod GETs.
    pub pod_gets: u32,
    /// Pod LISTs.
    pub pod_lists: u32,
}

/// Finds the pod being allocated on `node_name`; `None` when there is none.
pub async fn locate(
    client: &kube::Client,
    node_name: &str,
    trips: &mut LocateTrips,
) -> Result<Option<Located>, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    trips.node_gets += 1;
    let node = nodes.get(node_name).await?;
    let lock = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_MUTEX_LOCK))
        .cloned();
    if let Some(lock) = lock
        && let Some((namespace, name)) = lock_holder(&lock)
    {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        trips.pod_gets += 1;
        if let Some(pod) = pods.get_opt(name).await?
            && !fully_allocated(&pod)
        {
            return Ok(Some(Located {
                pod,
                lock: Some(lock.clone()),
            }));
        }
    }
    let pods: Api<Pod> = Api::all(client.clone());
    trips.pod_lists += 1;
    let list = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .find(|p| is_pending_here(p, node_name) && !fully_allocated(p))
        .map(|pod| Located { pod, lock: None }))
}
