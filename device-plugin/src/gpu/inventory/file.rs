//! The inventory-file backend of [`GpuInventory`]: the file's schema (`FileGpu`, its MIG devices
//! and links), its checks, and [`FileInventory`], which re-reads it every second for health.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hami_shared::names::MAX_GPU_MINOR;
use serde::Deserialize;
use tokio::sync::mpsc;

use super::{Gpu, GpuInventory, HealthEvent, InventoryError, MigDevice};
use crate::gpu::health::HealthCheckPolicy;
use crate::gpu::topology::{GpuLinks, MAX_NVLINKS, PcieLink, PeerLink};

/// One entry of an inventory file. Keys are camelCase; unknown keys are refused (a typo must not
/// silently become a default).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileGpu {
    uuid: String,
    index: Option<u32>,
    minor: Option<u32>,
    name: String,
    #[serde(default)]
    memory_mib: Option<u64>,
    #[serde(default)]
    numa_node: Option<i64>,
    #[serde(default)]
    mig_enabled: bool,
    #[serde(default = "default_true")]
    healthy: bool,
    #[serde(default)]
    mig_devices: Vec<FileMigDevice>,
    #[serde(default)]
    links: Vec<FileLink>,
}

/// One entry of a GPU's optional `links` in an inventory file: what this GPU's NVML would report
/// about another GPU.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileLink {
    peer: String,
    #[serde(default)]
    pcie: Option<PcieLink>,
    #[serde(default)]
    nvlinks: u32,
}

/// One entry of a GPU's `migDevices`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileMigDevice {
    uuid: String,
    profile: String,
    memory_mib: u64,
    #[serde(default = "default_true")]
    healthy: bool,
    #[serde(default)]
    index: Option<String>,
    #[serde(default)]
    device_paths: Vec<String>,
}

/// What is wrong with one GPU entry of an inventory file, and what would be accepted.
#[derive(Debug, thiserror::Error)]
pub enum GpuEntryError {
    /// The UUID's form.
    #[error("uuid must be 1..={MAX_UUID_LEN} characters of letters, digits, '-', '_', '.'")]
    Uuid,
    /// `memoryMib: 0`.
    #[error(
        "memoryMib must be a positive number of MiB (leave it out for a GPU that reports no memory)"
    )]
    Memory,
    /// An empty name.
    #[error("name must not be empty")]
    Name,
    /// A negative NUMA node.
    #[error(
        "numaNode {0} is not a NUMA node: give 0 or more, or leave it out for a GPU without NUMA affinity"
    )]
    NumaNode(i64),
    /// The UUID of a GPU or MIG device before it.
    #[error("uuid appears twice")]
    DuplicateUuid,
    /// More GPUs than an index can count.
    #[error("too many GPUs")]
    TooMany,
    /// The index of a GPU before it.
    #[error("index {0} appears twice")]
    DuplicateIndex(u32),
    /// A minor beyond `/dev/nvidia254`.
    #[error(
        "{from} {minor} is not in 0..={MAX_GPU_MINOR}: give the entry `minor`, the N of its /dev/nvidiaN"
    )]
    MinorRange {
        /// `minor`, or `minor (by default the index)`.
        from: &'static str,
        /// The minor.
        minor: u32,
    },
    /// The minor of a GPU before it.
    #[error("{from} {minor} is also the minor of GPU {other:?}: each GPU has its own /dev/nvidiaN")]
    DuplicateMinor {
        /// `minor`, or `minor (by default the index)`.
        from: &'static str,
        /// The minor.
        minor: u32,
        /// The other GPU.
        other: String,
    },
    /// MIG devices on a GPU not in MIG mode.
    #[error("migDevices is set but migEnabled is not true: a GPU has MIG devices only in MIG mode")]
    MigDevicesWithoutMig,
    /// A link to itself.
    #[error("links: peer {0:?} is the GPU itself: name another GPU of the file")]
    LinkToItself(String),
    /// A link to a GPU not in the file.
    #[error("links: peer {peer:?} is not a GPU of the file (known: {known})")]
    UnknownPeer {
        /// The peer named.
        peer: String,
        /// The GPUs of the file.
        known: String,
    },
    /// Two links to one peer.
    #[error("links: peer {0:?} appears twice")]
    DuplicatePeer(String),
    /// More NVLinks than a GPU has.
    #[error("links: peer {peer:?}: nvlinks {nvlinks} is not in 0..={MAX_NVLINKS}")]
    NvLinks {
        /// The peer.
        peer: String,
        /// The count given.
        nvlinks: u32,
    },
    /// One of its MIG devices.
    #[error("migDevices[{position}] ({uuid:?}): {problem}")]
    MigDevice {
        /// Position in `migDevices`, from 0.
        position: usize,
        /// The UUID as written.
        uuid: String,
        /// What is wrong with it.
        problem: MigEntryError,
    },
}

/// What is wrong with one MIG device of a GPU entry.
#[derive(Debug, thiserror::Error)]
pub enum MigEntryError {
    /// The UUID's form.
    #[error(
        "uuid must start with MIG- and be at most {MAX_MIG_UUID_LEN} characters of letters, digits, '-', '_', '.', '/'"
    )]
    Uuid,
    /// The UUID of a GPU or MIG device before it.
    #[error("uuid appears twice")]
    DuplicateUuid,
    /// Not a MIG profile.
    #[error("profile {0}")]
    Profile(crate::gpu::mig::MigError),
    /// `memoryMib: 0`.
    #[error("memoryMib must be a positive number of MiB")]
    Memory,
    /// Not `<GPU index>:<MIG slot>`.
    #[error("index {0:?} must be <GPU index>:<MIG slot>, two decimal numbers")]
    Index(String),
    /// A device path outside `/dev`.
    #[error("devicePaths entry {0:?} must be an absolute path under /dev without '..'")]
    DevicePath(String),
}

/// Longest MIG UUID we accept (`MIG-<uuid>`, or the older `MIG-GPU-<uuid>/<gi>/<ci>`).
const MAX_MIG_UUID_LEN: usize = 80;

fn mig_devices(
    gpu_index: u32,
    gpu_uuid: &str,
    mig_enabled: bool,
    entries: Vec<FileMigDevice>,
    seen: &mut Vec<String>,
) -> Result<Vec<MigDevice>, GpuEntryError> {
    if !entries.is_empty() && !mig_enabled {
        return Err(GpuEntryError::MigDevicesWithoutMig);
    }
    let mut out = Vec::with_capacity(entries.len());
    for (j, entry) in entries.into_iter().enumerate() {
        let at = |problem: MigEntryError| GpuEntryError::MigDevice {
            position: j,
            uuid: entry.uuid.clone(),
            problem,
        };
        let uuid_ok = entry.uuid.starts_with("MIG-")
            && entry.uuid.len() <= MAX_MIG_UUID_LEN
            && entry
                .uuid
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
        if !uuid_ok {
            return Err(at(MigEntryError::Uuid));
        }
        if entry.uuid == gpu_uuid || seen.contains(&entry.uuid) {
            return Err(at(MigEntryError::DuplicateUuid));
        }
        let profile = crate::gpu::mig::MigProfile::parse(&entry.profile)
            .map_err(|e| at(MigEntryError::Profile(e)))?;
        if entry.memory_mib == 0 {
            return Err(at(MigEntryError::Memory));
        }
        let index = match entry.index {
            Some(index) if is_mig_index(&index) => index,
            Some(index) => {
                return Err(at(MigEntryError::Index(index)));
            }
            None => format!("{gpu_index}:{j}"),
        };
        if let Some(bad) = entry.device_paths.iter().find(|p| !is_dev_path(p)) {
            return Err(at(MigEntryError::DevicePath(bad.clone())));
        }
        seen.push(entry.uuid.clone());
        out.push(MigDevice {
            uuid: entry.uuid,
            profile: profile.to_string(),
            memory_mib: entry.memory_mib,
            healthy: entry.healthy,
            index,
            paths: entry.device_paths,
        });
    }
    Ok(out)
}

/// `<digits>:<digits>`.
fn is_mig_index(s: &str) -> bool {
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    s.split_once(':')
        .is_some_and(|(gpu, slot)| digits(gpu) && digits(slot))
}

/// `/dev/<name>[/<name>…]`, no `.`/`..` segments, no empty segment.
fn is_dev_path(p: &str) -> bool {
    p.strip_prefix("/dev/").is_some_and(|rest| {
        rest.split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != ".." && !seg.contains('\0'))
    })
}

fn default_true() -> bool {
    true
}

/// Longest UUID we accept: kubelet device IDs (`<uuid>-<n>`) must stay within 63 characters.
const MAX_UUID_LEN: usize = 58;

/// GPUs described by a YAML file, for machines without NVIDIA hardware:
///
/// ```yaml
/// - uuid: GPU-00000000-0000-0000-0000-000000000000
///   index: 0            # optional, default: position in the list
///   minor: 0            # optional, default: the index; /dev/nvidia<minor>, 0..=254
///   name: NVIDIA H200
///   memoryMib: 143771   # optional: absent for a GPU that reports no memory (unified memory,
///                       # e.g. GB10); preConfiguredDeviceMemory then stands in for it
///   numaNode: 0         # optional
///   migEnabled: false   # optional
///   healthy: true       # optional; edit to false while running to mark the GPU unhealthy
///   migDevices:         # optional, with migEnabled: true: its static MIG devices
///   - uuid: MIG-00000000-0000-0000-0000-000000000000
///     profile: 1g.18gb
///     memoryMib: 16384
///     healthy: true     # optional, editable like the GPU's
///     index: "0:0"      # optional, default <GPU index>:<position>; DEVICE_ID_STRATEGY=index
///     devicePaths:      # optional; PASS_DEVICE_SPECS=true needs them (parent, GI, CI nodes)
///     - /dev/nvidia0
///     - /dev/nvidia-caps/nvidia-cap12
///     - /dev/nvidia-caps/nvidia-cap13
///   links:              # optional (ENABLE_TOPOLOGY_SCORE); what this GPU's NVML reports
///     - peer: GPU-11111111-0000-0000-0000-000000000000   # another GPU of the file
///       pcie: singleSwitch  # optional: crossCpu | sameCpu | hostBridge | multiSwitch |
///                           #   singleSwitch | sameBoard (NVML's common-ancestor level)
///       nvlinks: 4          # optional, 0..=18 active NVLinks to it (default 0)
/// ```
///
/// Links are one-way, as NVML reports them; list each pair on both GPUs (a pair whose two sides
/// disagree on the number of link kinds scores 0, as in HAMi).
#[derive(Debug, Clone)]
pub struct FileInventory {
    path: PathBuf,
    poll: Duration,
}

impl FileInventory {
    /// Reads GPUs from `path`; the file is re-read for health every second.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            poll: Duration::from_secs(1),
        }
    }

    /// Sets how often the file is checked for health changes.
    #[must_use]
    pub fn with_poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Parses the text of an inventory file (`path` is only used in messages).
pub fn parse_inventory(path: &Path, text: &str) -> Result<Vec<Gpu>, InventoryError> {
    let entries: Vec<FileGpu> =
        serde_yaml_ng::from_str(text).map_err(|e| InventoryError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    let mut gpus = Vec::with_capacity(entries.len());
    for (position, entry) in entries.into_iter().enumerate() {
        let uuid = entry.uuid.clone();
        let gpu =
            inventory_gpu(entry, position, &gpus).map_err(|problem| InventoryError::Invalid {
                path: path.to_path_buf(),
                position,
                uuid,
                problem: Box::new(problem),
            })?;
        gpus.push(gpu);
    }
    gpus.sort_by_key(|g| g.index);
    Ok(gpus)
}

/// The GPU of one entry (at `position`), checked on its own and against the GPUs before it;
/// the error says what is wrong.
fn inventory_gpu(entry: FileGpu, position: usize, earlier: &[Gpu]) -> Result<Gpu, GpuEntryError> {
    check_entry_fields(&entry)?;
    if earlier.iter().any(|g| g.uuid == entry.uuid) {
        return Err(GpuEntryError::DuplicateUuid);
    }
    let (index, minor) = index_and_minor(&entry, position, earlier)?;
    if earlier
        .iter()
        .any(|g| g.mig_devices.iter().any(|m| m.uuid == entry.uuid))
    {
        return Err(GpuEntryError::DuplicateUuid);
    }
    let mut seen: Vec<String> = earlier
        .iter()
        .flat_map(|g| g.mig_devices.iter().map(|m| m.uuid.clone()))
        .collect();
    let migs = mig_devices(
        index,
        &entry.uuid,
        entry.mig_enabled,
        entry.mig_devices,
        &mut seen,
    )?;
    Ok(Gpu {
        uuid: entry.uuid,
        index,
        minor,
        name: entry.name,
        memory_mib: entry.memory_mib.unwrap_or(0),
        numa_node: entry.numa_node,
        mig_enabled: entry.mig_enabled,
        healthy: entry.healthy,
        mig_devices: migs,
    })
}

/// The checks of one entry on its own: the UUID's form, a positive `memoryMib`, a name, a NUMA
/// node of 0 or more.
fn check_entry_fields(entry: &FileGpu) -> Result<(), GpuEntryError> {
    let uuid_ok = !entry.uuid.is_empty()
        && entry.uuid.len() <= MAX_UUID_LEN
        && entry
            .uuid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if !uuid_ok {
        return Err(GpuEntryError::Uuid);
    }
    if entry.memory_mib == Some(0) {
        return Err(GpuEntryError::Memory);
    }
    if entry.name.trim().is_empty() {
        return Err(GpuEntryError::Name);
    }
    // kubelet's TopologyManager takes the id as a NUMA node; sysfs' -1 (no affinity) is left out,
    // as the NVML backend leaves it out.
    if let Some(numa) = entry.numa_node.filter(|n| *n < 0) {
        return Err(GpuEntryError::NumaNode(numa));
    }
    Ok(())
}

/// The entry's index (by default its position) and minor (by default the index), each unique
/// among the GPUs before it; the minor within `0..=MAX_GPU_MINOR`.
fn index_and_minor(
    entry: &FileGpu,
    position: usize,
    earlier: &[Gpu],
) -> Result<(u32, u32), GpuEntryError> {
    let index = match entry.index {
        Some(i) => i,
        None => u32::try_from(position).map_err(|_| GpuEntryError::TooMany)?,
    };
    if earlier.iter().any(|g| g.index == index) {
        return Err(GpuEntryError::DuplicateIndex(index));
    }
    let (minor, from) = match entry.minor {
        Some(m) => (m, "minor"),
        None => (index, "minor (by default the index)"),
    };
    if minor > MAX_GPU_MINOR {
        return Err(GpuEntryError::MinorRange { from, minor });
    }
    if let Some(other) = earlier.iter().find(|g| g.minor == minor) {
        return Err(GpuEntryError::DuplicateMinor {
            from,
            minor,
            other: other.uuid.clone(),
        });
    }
    Ok((index, minor))
}

/// The `links` of an inventory file's GPUs (every GPU listed, those without `links` with none).
/// A peer must be another GPU of the file, named once per GPU; `nvlinks` is at most 18.
pub fn parse_links(path: &Path, text: &str) -> Result<Vec<GpuLinks>, InventoryError> {
    // The GPUs themselves are checked as `discover` checks them.
    parse_inventory(path, text)?;
    let entries: Vec<FileGpu> =
        serde_yaml_ng::from_str(text).map_err(|e| InventoryError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    let uuids: Vec<String> = entries.iter().map(|e| e.uuid.clone()).collect();
    let mut out = Vec::with_capacity(entries.len());
    for (position, entry) in entries.into_iter().enumerate() {
        let invalid = |problem: GpuEntryError| InventoryError::Invalid {
            path: path.to_path_buf(),
            position,
            uuid: entry.uuid.clone(),
            problem: Box::new(problem),
        };
        let mut links: Vec<PeerLink> = Vec::with_capacity(entry.links.len());
        for link in &entry.links {
            if link.peer == entry.uuid {
                return Err(invalid(GpuEntryError::LinkToItself(link.peer.clone())));
            }
            if !uuids.contains(&link.peer) {
                return Err(invalid(GpuEntryError::UnknownPeer {
                    peer: link.peer.clone(),
                    known: uuids.join(", "),
                }));
            }
            if links.iter().any(|l| l.peer == link.peer) {
                return Err(invalid(GpuEntryError::DuplicatePeer(link.peer.clone())));
            }
            if link.nvlinks > MAX_NVLINKS {
                return Err(invalid(GpuEntryError::NvLinks {
                    peer: link.peer.clone(),
                    nvlinks: link.nvlinks,
                }));
            }
            links.push(PeerLink {
                peer: link.peer.clone(),
                pcie: link.pcie,
                nvlinks: link.nvlinks,
            });
        }
        out.push(GpuLinks {
            uuid: entry.uuid,
            links,
        });
    }
    Ok(out)
}

fn read_inventory(path: &Path) -> Result<Vec<Gpu>, InventoryError> {
    let text = std::fs::read_to_string(path).map_err(|source| InventoryError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_inventory(path, &text)
}

impl GpuInventory for FileInventory {
    fn backend(&self) -> &'static str {
        "file"
    }

    fn discover(&self) -> Result<Vec<Gpu>, InventoryError> {
        read_inventory(&self.path)
    }

    fn gpu_links(&self) -> Result<Vec<GpuLinks>, InventoryError> {
        let text = std::fs::read_to_string(&self.path).map_err(|source| InventoryError::Read {
            path: self.path.clone(),
            source,
        })?;
        parse_links(&self.path, &text)
    }

    fn watch_health(
        &self,
        gpus: &[Gpu],
        policy: &HealthCheckPolicy,
        events: mpsc::UnboundedSender<HealthEvent>,
    ) -> Result<(), InventoryError> {
        if policy.all_disabled() {
            return Ok(());
        }
        let path = self.path.clone();
        let poll = self.poll;
        let mut known: Vec<(String, bool)> = health_of(gpus);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(poll);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_error: Option<String> = None;
            loop {
                tokio::select! {
                    _ = ticker.tick() => {}
                    () = events.closed() => return,
                }
                let current = match read_inventory(&path) {
                    Ok(current) => {
                        last_error = None;
                        current
                    }
                    Err(error) => {
                        // Once per distinct problem, not every poll.
                        let text = error.to_string();
                        if last_error.as_deref() != Some(text.as_str()) {
                            tracing::warn!(error = %text, "inventory file cannot be read; health unchanged");
                            last_error = Some(text);
                        }
                        continue;
                    }
                };
                let now = health_of(&current);
                for (uuid, healthy) in &mut known {
                    let Some((_, current)) = now.iter().find(|(u, _)| u == uuid) else {
                        continue;
                    };
                    if current != healthy {
                        *healthy = *current;
                        let event = HealthEvent {
                            uuid: uuid.clone(),
                            healthy: *current,
                            reason: format!("inventory file {}", path.display()),
                        };
                        if events.send(event).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(())
    }
}

/// The health the file gives each GPU and each MIG device.
fn health_of(gpus: &[Gpu]) -> Vec<(String, bool)> {
    gpus.iter()
        .flat_map(|g| {
            std::iter::once((g.uuid.clone(), g.healthy))
                .chain(g.mig_devices.iter().map(|m| (m.uuid.clone(), m.healthy)))
        })
        .collect()
}
