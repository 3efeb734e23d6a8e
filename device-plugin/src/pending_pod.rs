//! The pod kubelet is admitting on this node, found the way HAMi's plugin finds it (the node lock
//! first, else the first pending pod the HAMi scheduler bound here), for `GetPreferredAllocation`.
//! Only the UUIDs of the first non-empty container entry are read; the full device codec and pod
//! locator used by `Allocate` live with the allocation code.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use tonic::Status;

use crate::service::PendingPodDevices;

const ANNOTATION_MUTEX_LOCK: &str = "hami.io/mutex.lock";
const ANNOTATION_VGPU_NODE: &str = "hami.io/vgpu-node";
const ANNOTATION_BIND_PHASE: &str = "hami.io/bind-phase";
const ANNOTATION_BIND_TIME: &str = "hami.io/bind-time";
const ANNOTATION_TO_ALLOCATE: &str = "hami.io/vgpu-devices-to-allocate";

/// The GPU UUIDs of the first non-empty container entry of `hami.io/vgpu-devices-to-allocate`
/// (`UUID,NVIDIA,<mem>,<cores>:` per device, `;` per container).
pub fn first_entry_uuids(annotation: &str) -> Vec<String> {
    annotation
        .split(';')
        .find(|entry| !entry.is_empty())
        .map(|entry| {
            entry
                .split(':')
                .filter(|d| !d.is_empty())
                .filter_map(|d| d.split(',').next())
                .filter(|u| !u.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Namespace and name from a node lock `<time>,<namespace>,<pod>` (legacy bare time: none).
pub fn lock_holder(lock: &str) -> Option<(&str, &str)> {
    let mut parts = lock.splitn(3, ',');
    let _time = parts.next()?;
    let namespace = parts.next()?;
    let name = parts.next()?;
    (!namespace.is_empty() && !name.is_empty()).then_some((namespace, name))
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn is_pending_here(pod: &Pod, node: &str) -> bool {
    let pending = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending");
    let phase_ok = matches!(
        annotation(pod, ANNOTATION_BIND_PHASE),
        Some("allocating" | "success")
    );
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
        }
    }

    async fn find(&self) -> Result<Option<Pod>, kube::Error> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = nodes.get(&self.node_name).await?;
        let lock = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_MUTEX_LOCK));
        if let Some((namespace, name)) = lock.and_then(|l| lock_holder(l)) {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
            if let Some(pod) = pods.get_opt(name).await? {
                return Ok(Some(pod));
            }
        }
        let pods: Api<Pod> = Api::all(self.client.clone());
        let list = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={}", self.node_name)))
            .await?;
        Ok(list
            .items
            .into_iter()
            .find(|p| is_pending_here(p, &self.node_name)))
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
