//! The pod kubelet is admitting on this node, found the way HAMi's plugin finds it (the node lock
//! first, else the first pending pod the HAMi scheduler bound here), for `GetPreferredAllocation`.
//! Only the UUIDs of the first non-empty container entry are read; the full device codec and pod
//! locator used by `Allocate` live with the allocation code.

use k8s_openapi::api::core::v1::Pod;
use tonic::Status;

use crate::service::PendingPodDevices;

use hami_shared::names::{
    ANNOTATION_BIND_PHASE, ANNOTATION_BIND_TIME,
    ANNOTATION_VGPU_DEVICES_TO_ALLOCATE as ANNOTATION_TO_ALLOCATE, ANNOTATION_VGPU_NODE,
    BIND_PHASE_ALLOCATING, BIND_PHASE_SUCCESS,
};

/// The GPU UUIDs of the first non-empty container entry of `hami.io/vgpu-devices-to-allocate`
/// (`UUID,NVIDIA,<mem>,<cores>:` per device, `;` per container).
pub fn first_entry_uuids(annotation: &str) -> Vec<String> {
    crate::allocation::codec::next_request_uuids(annotation)
}

/// Namespace and name from a node lock `<time>,<namespace>,<pod>` (legacy bare time: none).
pub fn lock_holder(lock: &str) -> Option<(&str, &str)> {
    let mut parts = lock.splitn(3, ',');
    let _time = parts.next()?;
    let namespace = parts.next()?;
    let name = parts.next()?;
    (!namespace.is_empty() && !name.is_empty()).then_some((namespace, name))
}

/// Whether the node lock `lock` names `pod` (by namespace and name).
pub fn lock_names(lock: &str, pod: &Pod) -> bool {
    lock_holder(lock).is_some_and(|holder| {
        Some(holder)
            == pod
                .metadata
                .namespace
                .as_deref()
                .zip(pod.metadata.name.as_deref())
    })
}

/// The value of the pod's annotation `key`.
pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// HAMi's pending-pod test: `Pending`, `hami.io/bind-time` set, `hami.io/bind-phase` allocating or
/// success, and `hami.io/vgpu-node` = `node`.
pub fn is_pending_here(pod: &Pod, node: &str) -> bool {
    let pending = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending");
    let phase_ok = annotation(pod, ANNOTATION_BIND_PHASE)
        .is_some_and(|p| p == BIND_PHASE_ALLOCATING || p == BIND_PHASE_SUCCESS);
    pending
        && phase_ok
        && annotation(pod, ANNOTATION_BIND_TIME).is_some()
        && annotation(pod, ANNOTATION_VGPU_NODE) == Some(node)
}

/// Reads the pending pod from the API server.
#[derive(Clone)]
pub struct KubePendingPod {
    client: kube::Client,
    node_name: String,
    cache: Option<std::sync::Arc<crate::allocation::pod_cache::PodCache>>,
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
    pub fn with_pod_cache(
        mut self,
        cache: std::sync::Arc<crate::allocation::pod_cache::PodCache>,
    ) -> Self {
        self.cache = Some(cache);
        self
    }

    /// The pod being admitted on this node (the locator `Allocate` uses too): the node lock (one
    /// node GET), then the pod from the cache when it holds it, else from the API server.
    pub async fn find(&self) -> Result<Option<Pod>, kube::Error> {
        use crate::allocation::locator::{LocateTrips, locate_with, node_lock};
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
        .map(|found| found.map(|(l, _)| l.pod))
    }
}

#[tonic::async_trait]
impl PendingPodDevices for KubePendingPod {
    async fn wanted_uuids(&self) -> Result<Vec<String>, Status> {
        let pod = self
            .find()
            .await
            .map_err(|e| Status::unavailable(format!("finding the pending pod: {e}")))?;
        Ok(pod
            .as_ref()
            .and_then(|p| annotation(p, ANNOTATION_TO_ALLOCATE))
            .map(first_entry_uuids)
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_of_the_first_non_empty_entry() {
        assert_eq!(
            first_entry_uuids(";GPU-a,NVIDIA,3000,50:GPU-b,NVIDIA,3000,50:;GPU-c,NVIDIA,1,1:;"),
            ["GPU-a", "GPU-b"]
        );
        assert!(first_entry_uuids(";;").is_empty());
        assert!(first_entry_uuids("").is_empty());
    }

    #[test]
    fn lock_names_a_pod_or_not() {
        assert_eq!(
            lock_holder("2026-01-01T00:00:00Z,default,train-1"),
            Some(("default", "train-1"))
        );
        assert_eq!(lock_holder("2026-01-01T00:00:00Z"), None);
        assert_eq!(lock_holder("t,,x"), None);
    }
}
