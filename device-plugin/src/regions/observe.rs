//! The pure part of the node's region exporter: what was read from the node's container folders
//! (region bytes, limits-file bytes, or why not), who owns each folder, and which PIDs exist, in;
//! the samples to export and the Events to raise, out. No file system, no clock, no API.
//!
//! Everything read here was written by a tenant's processes (the region) or sits in a folder they
//! write (the pre-created file): the bytes were read bounded and without following links by the
//! shell ([`hami_shared::region::read_region_bytes`]), and nothing of them becomes a label but the
//! GPU index, which the layout bounds to 0..16. The labels `namespace`, `pod`, `container` come
//! from the node's view of its pods (the API server's pod list, or kubelet's pod-resources), never
//! from a file.

use std::collections::{BTreeMap, BTreeSet};

use hami_shared::limits_file::parse_bytes;
use hami_shared::region::{
    ContainerVerdict, FileLimits, Liveness, ProcSlot, Region, RegionError, Verdict, judge,
    parse_region_bytes,
};

/// The pod and container a folder belongs to, as the node knows them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Pod UID, where known (HAMi folders carry it; kubelet's pod-resources does not).
    pub uid: Option<String>,
    /// Container name.
    pub container: String,
}

/// One container folder as read by the shell.
#[derive(Debug, Clone)]
pub struct FolderRead {
    /// The folder's name (`<pod-uid>_<container>` on HAMi nodes, `preload-<n>` on KAI nodes).
    pub folder: String,
    /// The region file's path (for messages).
    pub region_path: std::path::PathBuf,
    /// Its bytes (bounded), or why it could not be read.
    pub region: Result<Vec<u8>, RegionError>,
    /// The limits file's bytes (bounded; `None`: there is none), or why it could not be read.
    pub limits: Result<Option<Vec<u8>>, String>,
}

/// One container's judged state: what the exporter publishes for it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerSample {
    /// The folder it was read from.
    pub folder: String,
    /// Who it belongs to.
    pub owner: Owner,
    /// The verdict and its per-GPU figures.
    pub verdict: ContainerVerdict,
    /// Why the limits file could not be read, when it could not (the verdict then compares
    /// nothing).
    pub limits_error: Option<String>,
}

/// What identifies an Event already raised: once per pod, container and verdict.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventKey {
    /// The owner.
    pub owner: Owner,
    /// `uncapped` or `mismatch`.
    pub verdict: Verdict,
}

/// A Warning Event to raise on a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapEvent {
    /// Its key (recorded so that it is raised once).
    pub key: EventKey,
    /// The Event's reason: `GpuMemoryUncapped` or `GpuLimitMismatch`.
    pub reason: &'static str,
    /// The note: the container, the verdict's reason and what to do.
    pub message: String,
}

/// The Event reason for `uncapped`.
pub const REASON_UNCAPPED: &str = "GpuMemoryUncapped";
/// The Event reason for `mismatch`.
pub const REASON_MISMATCH: &str = "GpuLimitMismatch";

/// What one pass observed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observation {
    /// One per folder with an owner, in folder order.
    pub containers: Vec<ContainerSample>,
    /// Folders read that no pod owns (a HAMi pod gone and not yet collected; a KAI slot not held
    /// now): not exported.
    pub unowned: Vec<String>,
    /// Events not raised before.
    pub events: Vec<CapEvent>,
}

/// The MiB of the smallest node GPU the region's first process saw (its `uuids[]` looked up in
/// the node GPU file, UUID → MiB): what the preload library caps a KAI `gpu-fraction` container
/// against. `None` when none of its UUIDs is a node GPU.
fn smallest_gpu_mib(region: &Region, node_gpu_mib: &BTreeMap<String, u64>) -> Option<u64> {
    region
        .uuids
        .iter()
        .flatten()
        .filter_map(|uuid| node_gpu_mib.get(uuid).copied())
        .min()
}

/// Judges every folder of `reads` that `owners` maps to a pod, and returns the samples and the
/// Events (`uncapped`, `mismatch`) not in `reported`.
///
/// `node_gpu_mib`: the node GPU file's UUID → MiB (empty where there is none); `liveness`:
/// whether a slot's process exists, as the node can tell.
pub fn observe(
    reads: &[FolderRead],
    owners: &BTreeMap<String, Owner>,
    node_gpu_mib: &BTreeMap<String, u64>,
    liveness: &dyn Fn(&ProcSlot) -> Liveness,
    reported: &BTreeSet<EventKey>,
) -> Observation {
    let mut out = Observation::default();
    for read in reads {
        let Some(owner) = owners.get(&read.folder) else {
            out.unowned.push(read.folder.clone());
            continue;
        };
        let region = read
            .region
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|bytes| parse_region_bytes(&read.region_path, bytes));
        let gpu_mib = region
            .as_ref()
            .ok()
            .and_then(|r| smallest_gpu_mib(r, node_gpu_mib));
        let (file, limits_error) = match &read.limits {
            Ok(Some(bytes)) => (
                Some(FileLimits::from_entries(
                    &parse_bytes(bytes).entries,
                    gpu_mib,
                )),
                None,
            ),
            Ok(None) => (None, None),
            Err(e) => (None, Some(e.clone())),
        };
        let verdict = judge(region.as_ref(), file.as_ref(), liveness);
        if let Some(event) = event_for(owner, &verdict, reported) {
            out.events.push(event);
        }
        out.containers.push(ContainerSample {
            folder: read.folder.clone(),
            owner: owner.clone(),
            verdict,
            limits_error,
        });
    }
    out
}

/// The Event a container's verdict calls for, unless raised before.
fn event_for(
    owner: &Owner,
    verdict: &ContainerVerdict,
    reported: &BTreeSet<EventKey>,
) -> Option<CapEvent> {
    let (reason, advice) = match verdict.verdict {
        Verdict::Uncapped => (
            REASON_UNCAPPED,
            "a process without the limits created the shared region, so no process of the container is capped; recreate the pod (a restarted container keeps its region) and run `hami-limits check` in it",
        ),
        Verdict::Mismatch => (
            REASON_MISMATCH,
            "the first process to start CUDA stamped other limits than the container's limits file; recreate the pod (a restarted container keeps its region) and run `hami-limits check` in it",
        ),
        _ => return None,
    };
    let key = EventKey {
        owner: owner.clone(),
        verdict: verdict.verdict,
    };
    if reported.contains(&key) {
        return None;
    }
    Some(CapEvent {
        message: format!(
            "container {:?}: GPU cap {}: {}; {advice}",
            owner.container, verdict.verdict, verdict.reason
        ),
        key,
        reason,
    })
}

/// The HAMi folder name's owner: `<pod-uid>_<container>` (UUID, DNS-1123 label) and the pod of
/// that UID as the node's pod list has it (`uid` → namespace, name).
pub fn hami_owner(folder: &str, pods_by_uid: &BTreeMap<String, (String, String)>) -> Option<Owner> {
    let (uid, container) = folder.split_once('_')?;
    if !hami_shared::container::is_uuid(uid) || !hami_shared::container::is_dns1123_label(container)
    {
        return None;
    }
    let (namespace, pod) = pods_by_uid.get(uid)?;
    Some(Owner {
        namespace: namespace.clone(),
        pod: pod.clone(),
        uid: Some(uid.to_owned()),
        container: container.to_owned(),
    })
}
