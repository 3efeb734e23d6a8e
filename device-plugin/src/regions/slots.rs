//! KAI containers' regions on the node: one folder per `hami.io/preload` slot,
//! `<HOOK>/regions/preload-<n>`, made anew by `serve-preload`'s `Allocate` and mounted read-write
//! at [`hami_shared::names::KAI_REGION_DIR`]; the webhook points `CUDA_DEVICE_MEMORY_SHARED_CACHE` at `usage.cache`
//! in it, so every process of the container joins one region the node can read.
//!
//! The tenant writes that folder (its processes map `usage.cache`; root in the container can
//! replace it). So: the folder is root's, 0755, and only `usage.cache` (0666, pre-created
//! `O_EXCL|O_NOFOLLOW`) is writable by the container's users; a slot folder is removed whole —
//! links removed as links, never followed — and created anew at every `Allocate`, so no container
//! ever sees what the slot's previous holder left; kubelet hands a slot to one container at a
//! time, so no container reaches another's folder. `<HOOK>/regions` is outside `<HOOK>/vgpu`: a
//! `hostPath` delivery mounts `<HOOK>/vgpu` into pods, and would otherwise show them every slot.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use hami_shared::names::{ANNOTATION_LIMITS_PREFIX, RESOURCE_PRELOAD, USAGE_CACHE_FILE};
use hami_shared::region::read_limits_bytes;

use super::export::{Folder, FolderSource, LimitsAt};
use super::observe::Owner;
use super::podresources;
use super::slot_id::is_slot;
use crate::allocation::shell::executor::no_follow::{
    NoFollowError, create_dir_at, create_new_file_at, open_dir, own_and_chmod, remove_entry_at,
};

/// Mode of `<HOOK>/regions` and of each slot folder: root's; containers cannot add entries.
pub const FOLDER_MODE: u32 = 0o755;
/// Mode of `usage.cache`: every user of the container maps it read-write, as HAMi-core needs.
pub const REGION_FILE_MODE: u32 = 0o666;

/// Creates `regions_dir` if missing (its parent is the operator's hook path), and makes it root's
/// 0755; a link there is refused.
///
/// # Errors
/// [`NoFollowError`] naming the path.
pub fn ensure_regions_dir(regions_dir: &Path) -> Result<(), NoFollowError> {
    match std::fs::create_dir(regions_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(NoFollowError::Io {
                op: "create directory",
                path: regions_dir.to_path_buf(),
                source,
            });
        }
    }
    let dir = open_dir(regions_dir)?;
    own_and_chmod(&dir, regions_dir, FOLDER_MODE)
}

/// Makes the folder of `slot` anew: whatever was there removed (links as links), a fresh 0755
/// folder with an empty 0666 `usage.cache` created `O_EXCL|O_NOFOLLOW`. Returns its host path.
///
/// # Errors
/// [`NoFollowError`] naming the path.
pub fn prepare_slot(regions_dir: &Path, slot: &str) -> Result<PathBuf, NoFollowError> {
    ensure_regions_dir(regions_dir)?;
    let dir = open_dir(regions_dir)?;
    remove_entry_at(&dir, regions_dir, slot)?;
    let path = regions_dir.join(slot);
    let folder = create_dir_at(&dir, slot, FOLDER_MODE, &path)?;
    create_new_file_at(
        &folder,
        USAGE_CACHE_FILE,
        REGION_FILE_MODE,
        &path.join(USAGE_CACHE_FILE),
    )?;
    Ok(path)
}

/// What the last refresh learnt.
#[derive(Debug, Default)]
struct Known {
    /// Slot → owner (kubelet's pod-resources).
    owners: BTreeMap<String, Owner>,
    /// (namespace, pod, container) → limits file text (the pod's annotation).
    limits: BTreeMap<(String, String, String), String>,
    /// When `owners` was read.
    taken_at: Option<Instant>,
}

/// `serve-preload`'s slot folders and their owners.
#[derive(Debug)]
pub struct SlotFolders {
    /// `<HOOK>/regions`.
    pub regions_dir: PathBuf,
    /// Slots advertised.
    pub slots: u32,
    /// `<HOOK>/vgpu/node-gpus`.
    pub node_gpus: PathBuf,
    known: Mutex<Known>,
    /// Slot → when `Allocate` last made its folder: a slot made after the owners were read
    /// belongs to a container they do not name yet.
    allocated: Mutex<BTreeMap<String, Instant>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SlotFolders {
    /// Over `regions_dir` with `slots` slots.
    #[must_use]
    pub fn new(regions_dir: PathBuf, slots: u32, node_gpus: PathBuf) -> Self {
        Self {
            regions_dir,
            slots,
            node_gpus,
            known: Mutex::new(Known::default()),
            allocated: Mutex::new(BTreeMap::new()),
        }
    }

    /// `Allocate` made `slot`'s folder now.
    pub fn allocated(&self, slot: &str) {
        lock(&self.allocated).insert(slot.to_owned(), Instant::now());
    }

    /// Records what kubelet (and the API server, where reachable) say now.
    pub fn set_known(
        &self,
        owners: BTreeMap<String, Owner>,
        limits: BTreeMap<(String, String, String), String>,
        taken_at: Instant,
    ) {
        *lock(&self.known) = Known {
            owners,
            limits,
            taken_at: Some(taken_at),
        };
    }

    /// Reads the owners from kubelet's pod-resources socket and, with a client, the limits files
    /// from the pods' annotations; a failure keeps what was known and is logged.
    pub async fn refresh(
        &self,
        socket: &Path,
        pods: Option<&(kube::Client, String)>,
        timeout: Duration,
    ) {
        let taken_at = Instant::now();
        let list = match podresources::list(socket, timeout).await {
            Ok(list) => list,
            Err(error) => {
                tracing::warn!(%error, "region exporter: cannot read which container holds which slot");
                return;
            }
        };
        let owners =
            podresources::slot_owners(&list, RESOURCE_PRELOAD, |id| is_slot(id, self.slots));
        let limits = match pods {
            Some((client, node)) => match node_limits(client, node, timeout).await {
                Ok(l) => l,
                Err(error) => {
                    tracing::warn!(%error, "region exporter: cannot read the KAI pods' limits files");
                    lock(&self.known).limits.clone()
                }
            },
            None => BTreeMap::new(),
        };
        self.set_known(owners, limits, taken_at);
    }
}

/// Why the KAI pods' limits files could not be read from the API server.
#[derive(Debug, thiserror::Error)]
pub enum NodeLimitsError {
    /// The list did not answer in time.
    #[error("listing the pods of node {node} took over {timeout:?}")]
    Timeout {
        /// The node.
        node: String,
        /// The time allowed.
        timeout: Duration,
    },
    /// The list failed.
    #[error("cannot list the pods of node {node}: {source}")]
    List {
        /// The node.
        node: String,
        /// Why.
        source: kube::Error,
    },
}

/// The limits files of the pods on `node`: their `limits.hami.io/<container>` annotations.
async fn node_limits(
    client: &kube::Client,
    node: &str,
    timeout: Duration,
) -> Result<BTreeMap<(String, String, String), String>, NodeLimitsError> {
    use k8s_openapi::api::core::v1::Pod;
    let api: kube::Api<Pod> = kube::Api::all(client.clone());
    let params = kube::api::ListParams::default().fields(&format!("spec.nodeName={node}"));
    let pods = tokio::time::timeout(timeout, api.list_metadata(&params))
        .await
        .map_err(|_| NodeLimitsError::Timeout {
            node: node.to_owned(),
            timeout,
        })?
        .map_err(|source| NodeLimitsError::List {
            node: node.to_owned(),
            source,
        })?;
    let mut out = BTreeMap::new();
    for pod in pods {
        let m = &pod.metadata;
        let (Some(ns), Some(name)) = (&m.namespace, &m.name) else {
            continue;
        };
        for (key, text) in m.annotations.iter().flatten() {
            if let Some(container) = key.strip_prefix(ANNOTATION_LIMITS_PREFIX) {
                out.insert(
                    (ns.clone(), name.clone(), container.to_owned()),
                    text.clone(),
                );
            }
        }
    }
    Ok(out)
}

impl FolderSource for SlotFolders {
    fn folders(&self) -> io::Result<Vec<Folder>> {
        let entries = match std::fs::read_dir(&self.regions_dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            other => other?,
        };
        let known = lock(&self.known);
        let mut folders = Vec::new();
        for entry in entries {
            let entry = entry?;
            // DirEntry::file_type does not follow links.
            if !entry.file_type()?.is_dir() {
                continue;
            }
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if !is_slot(&name, self.slots) {
                continue;
            }
            let limits = known.owners.get(&name).and_then(|o| {
                known
                    .limits
                    .get(&(o.namespace.clone(), o.pod.clone(), o.container.clone()))
                    .map(|t| LimitsAt::Text(t.clone()))
            });
            folders.push(Folder {
                region: entry.path().join(USAGE_CACHE_FILE),
                limits,
                name,
            });
        }
        folders.sort_by(|a, b| super::slot_id::slot_order(&a.name, &b.name));
        Ok(folders)
    }

    fn owners(&self, _folders: &[Folder]) -> BTreeMap<String, Owner> {
        let known = lock(&self.known);
        let allocated = lock(&self.allocated);
        known
            .owners
            .iter()
            .filter(|(slot, _)| {
                // Made after kubelet was asked: its owner is not known yet.
                allocated
                    .get(*slot)
                    .is_none_or(|at| known.taken_at.is_some_and(|t| *at <= t))
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn node_gpu_mib(&self) -> BTreeMap<String, u64> {
        let Ok(Some(bytes)) = read_limits_bytes(&self.node_gpus) else {
            return BTreeMap::new();
        };
        let parsed = hami_shared::node_gpus::parse(&bytes);
        parsed
            .uuids
            .iter()
            .filter_map(|(minor, uuid)| parsed.mib_for(*minor).map(|mib| (uuid.clone(), mib)))
            .collect()
    }
}
