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
//! (the node lock is always read from the API server); see [`super::cache`] for why a stale
//! view cannot cause a wrong allocation.
//!
//! One locator for both callers: `Allocate` ([`crate::allocation::shell::executor`]) and
//! `GetPreferredAllocation` ([`KubePendingPod`]). The pod's devices annotation is decoded once,
//! here ([`Candidate`]), and handed on with the pod.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use tonic::Status;

use super::cache::PodCache;
use crate::allocation::plan::pod::{Candidate, is_pending_here, lock_holder, lock_names};
use crate::kubelet::service::PendingPodDevices;
use hami_shared::names::ANNOTATION_MUTEX_LOCK;

/// The pod found, its devices decoded, and the node lock when it names the pod.
#[derive(Debug, Clone)]
pub struct Located {
    /// The pod, as read, with its decoded `hami.io/vgpu-devices-to-allocate`.
    pub candidate: Candidate,
    /// The node lock's value when the lock named this pod (the value to release it with).
    pub lock: Option<String>,
}

impl Located {
    /// The pod.
    pub fn pod(&self) -> &Pod {
        &self.candidate.pod
    }
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
            && !passed_over(&pod)
        {
            let candidate = Candidate::new(pod);
            if !candidate.fully_allocated() {
                return Ok(Some((
                    Located {
                        candidate,
                        lock: Some(lock.to_owned()),
                    },
                    source,
                )));
            }
        }
    }
    // The lock still goes with the pod it names when that pod is found by listing.
    let located = |candidate: Candidate| Located {
        lock: lock
            .filter(|l| lock_names(l, &candidate.pod))
            .map(str::to_owned),
        candidate,
    };
    if let Some(candidate) = cache.and_then(|c| c.first_pending(node_name, passed_over)) {
        return Ok(Some((located(candidate), Source::Cache)));
    }
    let pods: Api<Pod> = Api::all(client.clone());
    trips.pod_lists += 1;
    let list = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
        .await?;
    Ok(list
        .items
        .iter()
        .filter(|p| is_pending_here(p, node_name) && !passed_over(p))
        .find_map(Candidate::unless_fully_allocated)
        .map(|candidate| (located(candidate), Source::Api)))
}

/// `GetPreferredAllocation`'s view of the pod being admitted on this node: the same locator as
/// `Allocate`, reading the watch-fed [`PodCache`] first when it has one.
#[derive(Clone)]
pub struct KubePendingPod {
    client: kube::Client,
    node_name: String,
    cache: Option<std::sync::Arc<PodCache>>,
}

impl std::fmt::Debug for KubePendingPod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubePendingPod")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

impl KubePendingPod {
    /// For node `node_name`.
    pub fn new(client: kube::Client, node_name: impl Into<String>) -> Self {
        Self {
            client,
            node_name: node_name.into(),
            cache: None,
        }
    }

    /// Reads pods from `cache` first (the view `Allocate` reads too).
    #[must_use]
    pub fn with_pod_cache(mut self, cache: std::sync::Arc<PodCache>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// The pod being admitted on this node: the node lock (one node GET), then the pod from the
    /// cache when it holds it, else from the API server.
    pub async fn find(&self) -> Result<Option<Candidate>, kube::Error> {
        let mut trips = LocateTrips::default();
        let lock = node_lock(&self.client, &self.node_name, &mut trips).await?;
        locate_with(
            &self.client,
            &self.node_name,
            lock.as_deref(),
            self.cache.as_deref(),
            &|_| false,
            &mut trips,
        )
        .await
        .map(|found| found.map(|(l, _)| l.candidate))
    }
}

#[tonic::async_trait]
impl PendingPodDevices for KubePendingPod {
    async fn wanted_uuids(&self) -> Result<Vec<String>, Status> {
        let candidate = self
            .find()
            .await
            .map_err(|e| Status::unavailable(format!("finding the pending pod: {e}")))?;
        Ok(candidate
            .as_ref()
            .map(Candidate::wanted_uuids)
            .unwrap_or_default())
    }
}
