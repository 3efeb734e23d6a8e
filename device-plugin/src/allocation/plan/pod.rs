//! What makes a pod the one being allocated on this node, as HAMi's plugin decides it (pure:
//! no I/O): the node lock's holder, the pending-pod test, and the pod's decoded devices.

use k8s_openapi::api::core::v1::Pod;

use crate::allocation::plan::codec::{CodecError, PodDevices};

use hami_shared::names::{
    ANNOTATION_BIND_PHASE, ANNOTATION_BIND_TIME,
    ANNOTATION_VGPU_DEVICES_TO_ALLOCATE as ANNOTATION_TO_ALLOCATE, ANNOTATION_VGPU_NODE,
    BIND_PHASE_ALLOCATING, BIND_PHASE_SUCCESS,
};

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

fn decode_devices(pod: &Pod) -> Option<Result<PodDevices, CodecError>> {
    annotation(pod, ANNOTATION_TO_ALLOCATE).map(PodDevices::decode)
}

fn fully_allocated(devices: Option<&Result<PodDevices, CodecError>>) -> bool {
    matches!(devices, Some(Ok(d)) if !d.has_nvidia())
}

/// A pod that may be the one being allocated, with its `hami.io/vgpu-devices-to-allocate`
/// decoded once: the locator decides with it, and `Allocate` plans from it.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The pod, as read.
    pub pod: Pod,
    /// Its decoded devices annotation; `None` when the pod has none.
    pub devices: Option<Result<PodDevices, CodecError>>,
}

impl Candidate {
    /// Decodes the pod's devices annotation.
    pub fn new(pod: Pod) -> Self {
        let devices = decode_devices(&pod);
        Self { pod, devices }
    }

    /// The candidate when `pod` has an NVIDIA entry left (or a malformed annotation), the pod
    /// cloned only then.
    pub fn unless_fully_allocated(pod: &Pod) -> Option<Self> {
        let devices = decode_devices(pod);
        (!fully_allocated(devices.as_ref())).then(|| Self {
            pod: pod.clone(),
            devices,
        })
    }

    /// True when the devices annotation decodes and names no NVIDIA device any more (a
    /// malformed one is not passed over: the allocation fails loudly on it).
    pub fn fully_allocated(&self) -> bool {
        fully_allocated(self.devices.as_ref())
    }

    /// The GPU UUIDs of the first container entry with an NVIDIA device left (what
    /// `GetPreferredAllocation` prefers).
    pub fn wanted_uuids(&self) -> Vec<String> {
        match &self.devices {
            Some(Ok(d)) => d
                .next_request()
                .map(|(_, devices)| devices.into_iter().map(|d| d.uuid).collect())
                .unwrap_or_default(),
            // Malformed or absent: no preference.
            Some(Err(_)) | None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    // The GPU UUIDs of the first non-empty container entry of `hami.io/vgpu-devices-to-allocate`.
    use crate::allocation::plan::codec::next_request_uuids as first_entry_uuids;

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
