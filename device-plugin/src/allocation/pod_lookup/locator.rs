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
//! With a watch-fed [`PodCache`], `Allocate` reads the pod from it instead of the API server
//! (the node lock is always read from the API server); see [`super::pod_cache`] for why a stale
//! view cannot cause a wrong allocation.
//!
//! One locator for both callers: `Allocate` ([`super::executor`]) and `GetPreferredAllocation`
//! ([`crate::pending_pod::KubePendingPod`] delegates here).

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};

use super::codec::PodDevices;
use super::pod_cache::PodCache;
use crate::pending_pod::{annotation, is_pending_here, lock_holder, lock_names};
use hami_shared::names::{ANNOTATION_MUTEX_LOCK, ANNOTATION_VGPU_DEVICES_TO_ALLOCATE};

/// True when the pod's devices annotation decodes and names no NVIDIA device any more.
pub fn fully_allocated(pod: &Pod) -> bool {
    annotation(pod, ANNOTATION_VGPU_DEVICES_TO_ALLOCATE)
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

/// Where [`locate_with`] found the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The watch-fed [`PodCache`] (selected with a resourceVersion precondition).
    Cache,
    /// The API server (GET or LIST).
    Api,
}

/// Reads the node lock `hami.io/mutex.lock` (one node GET).
pub async fn node_lock(
    client: &kube::Client,
    node_name: &str,
    trips: &mut LocateTrips,
) -> Result<Option<String>, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    trips.node_gets += 1;
    let node = nodes.get(node_name).await?;
    Ok(node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_MUTEX_LOCK))
        .cloned())
}

/// Finds the pod being allocated on `node_name`, given the node lock's value: the pod the lock
/// names, else the first pending pod on the node. With a synced `cache`, the pod is taken from it
/// when it holds one that qualifies; otherwise (and without a cache) from the API server. A pod
/// for which `passed_over` is true (its last entries are being allocated by another call) counts
/// as fully allocated.
pub async fn locate_with(
    client: &kube::Client,
    node_name: &str,
    lock: Option<&str>,
    cache: Option<&PodCache>,
    passed_over: &(dyn Fn(&Pod) -> bool + Sync),
    trips: &mut LocateTrips,
) -> Result<Option<(Located, Source)>, kube::Error> {
    let nothing_left = |pod: &Pod| fully_allocated(pod) || passed_over(pod);
    if let Some(lock) = lock
        && let Some((namespace, name)) = lock_holder(lock)
    {
        let (pod, source) = match cache.and_then(|c| c.get(namespace, name)) {
            Some(pod) => (Some(pod), Source::Cache),
            None => {
                let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
                trips.pod_gets += 1;
                (pods.get_opt(name).await?, Source::Api)
            }
        };
        if let Some(pod) = pod
            && !nothing_left(&pod)
        {
            return Ok(Some((
                Located {
                    pod,
                    lock: Some(lock.to_owned()),
                },
                source,
            )));
        }
    }
    // The lock still goes with the pod it names when that pod is found by listing.
    let located = |pod: Pod| Located {
        lock: lock.filter(|l| lock_names(l, &pod)).map(str::to_owned),
        pod,
    };
    if let Some(pod) = cache.and_then(|c| c.first_pending(node_name, passed_over)) {
        return Ok(Some((located(pod), Source::Cache)));
    }
    let pods: Api<Pod> = Api::all(client.clone());
    trips.pod_lists += 1;
    let list = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .find(|p| is_pending_here(p, node_name) && !nothing_left(p))
        .map(|pod| (located(pod), Source::Api)))
}
