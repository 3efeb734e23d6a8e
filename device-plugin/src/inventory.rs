//! What GPUs this node has: the [`GpuInventory`] trait and its two backends, NVML
//! ([`crate::nvml::NvmlInventory`]) and an inventory file ([`FileInventory`]) for machines
//! without NVIDIA hardware (development, CI, the in-process tests).

use std::path::{Path, PathBuf};
use std::time::Duration;

use hami_shared::names::MAX_GPU_MINOR;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::health::HealthCheckPolicy;
pub use crate::health::HealthEvent;
use crate::topology::{GpuLinks, MAX_NVLINKS, PcieLink, PeerLink};

/// One physical GPU as the plugin sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// NVML UUID, e.g. `GPU-6e8a…`.
    pub uuid: String,
    /// NVML index (the order `nvidia-smi` lists).
    pub index: u32,
    /// NVML minor number: the GPU's device node is `/dev/nvidia<minor>` (0..=254; not always the
    /// index, e.g. when a GPU is missing or the driver enumerates in another order).
    pub minor: u32,
    /// NVML product name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Total framebuffer memory in MiB (bytes / 1024²); 0 when the GPU reports none (unified
    /// memory, such as the GB10): `preConfiguredDeviceMemory` then stands in for it.
    pub memory_mib: u64,
    /// NUMA node of the PCI device, when the platform reports one.
    pub numa_node: Option<i64>,
    /// MIG mode currently enabled on this GPU.
    pub mig_enabled: bool,
    /// False after a critical Xid error (NVML) or when the inventory file says so.
    pub healthy: bool,
    /// The GPU's MIG devices (static MIG), when MIG mode is enabled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_devices: Vec<MigDevice>,
}

/// One MIG device (a GPU instance with its compute instance) of a MIG-enabled GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigDevice {
    /// NVML UUID, `MIG-…`: the kubelet device ID and the container's `NVIDIA_VISIBLE_DEVICES`.
    pub uuid: String,
    /// The profile, e.g. `1g.18gb` (go-nvlib's name; `nvidia.com/mig-<profile>` under `mixed`).
    pub profile: String,
    /// Its memory in MiB.
    pub memory_mib: u64,
    /// False after a critical Xid on its GPU, or when the inventory file says so.
    pub healthy: bool,
}

/// Errors finding GPUs.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// NVML could not be loaded or initialised (no driver, no GPU, no libnvidia-ml.so.1).
    #[error(
        "NVML is not available ({0}); on a machine without NVIDIA GPUs pass --inventory FILE (env HAMI_INVENTORY) with a YAML list of GPUs"
    )]
    NvmlUnavailable(String),
    /// An NVML call failed for one GPU.
    #[error("NVML: {call} for GPU {index}: {message}")]
    Nvml {
        /// The NVML function.
        call: &'static str,
        /// The GPU index.
        index: u32,
        /// NVML's error text.
        message: String,
    },
    /// The inventory file could not be read.
    #[error("inventory file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The inventory file is not a YAML list of GPUs.
    #[error("inventory file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the position.
        message: String,
    },
    /// A GPU entry is unusable.
    #[error("inventory file {path}: GPU #{position} ({uuid:?}): {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Position in the list, from 0.
        position: usize,
        /// The UUID as written.
        uuid: String,
        /// What is wrong and what would be accepted.
        message: String,
    },
    /// The backend cannot tell how GPUs are linked (`ENABLE_TOPOLOGY_SCORE`).
    #[error("the {backend} GPU source cannot describe the links between GPUs")]
    NoTopology {
        /// The backend.
        backend: &'static str,
    },
}

/// A source of GPUs and of their health changes.
pub trait GpuInventory: Send + Sync + std::fmt::Debug {
    /// Short backend name for logs and `inventory --json` (`nvml`, `file`).
    fn backend(&self) -> &'static str;

    /// The GPUs present now, in index order.
    fn discover(&self) -> Result<Vec<Gpu>, InventoryError>;

    /// Starts watching the health of `gpus` (and of their MIG devices) in the background; every
    /// change is sent on `events`, naming the GPU or the MIG device. The watch stops when the
    /// receiver is dropped. With `policy` disabling every check nothing is watched.
    fn watch_health(
        &self,
        gpus: &[Gpu],
        policy: &HealthCheckPolicy,
        events: mpsc::UnboundedSender<HealthEvent>,
    ) -> Result<(), InventoryError>;

    /// How every GPU is linked to the others (PCIe path, NVLinks), for
    /// `hami.io/node-nvidia-score` ([`crate::topology`]). Read once, at start, only when
    /// `ENABLE_TOPOLOGY_SCORE` is true.
    fn gpu_links(&self) -> Result<Vec<GpuLinks>, InventoryError> {
        Err(InventoryError::NoTopology {
            backend: self.backend(),
        })
    }
}

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
}

/// Longest MIG UUID we accept (`MIG-<uuid>`, or the older `MIG-GPU-<uuid>/<gi>/<ci>`).
const MAX_MIG_UUID_LEN: usize = 80;

fn mig_devices(
    gpu_uuid: &str,
    mig_enabled: bool,
    entries: Vec<FileMigDevice>,
    seen: &mut Vec<String>,
) -> Result<Vec<MigDevice>, String> {
    if !entries.is_empty() && !mig_enabled {
        return Err(
            "migDevices is set but migEnabled is not true: a GPU has MIG devices only in MIG mode"
                .to_owned(),
        );
    }
    let mut out = Vec::with_capacity(entries.len());
    for (j, entry) in entries.into_iter().enumerate() {
        let at = |message: String| format!("migDevices[{j}] ({:?}): {message}", entry.uuid);
        let uuid_ok = entry.uuid.starts_with("MIG-")
            && entry.uuid.len() <= MAX_MIG_UUID_LEN
            && entry
                .uuid
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
        if !uuid_ok {
            return Err(at(format!(
                "uuid must start with MIG- and be at most {MAX_MIG_UUID_LEN} characters of letters, digits, '-', '_', '.', '/'"
            )));
        }
        if entry.uuid == gpu_uuid || seen.contains(&entry.uuid) {
            return Err(at("uuid appears twice".to_owned()));
        }
        let profile = crate::mig::MigProfile::parse(&entry.profile)
            .map_err(|e| at(format!("profile {e}")))?;
        if entry.memory_mib == 0 {
            return Err(at("memoryMib must be a positive number of MiB".to_owned()));
        }
        seen.push(entry.uuid.clone());
        out.push(MigDevice {
            uuid: entry.uuid,
            profile: profile.to_string(),
            memory_mib: entry.memory_mib,
            healthy: entry.healthy,
        });
    }
    Ok(out)
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
        let invalid = |message: String| InventoryError::Invalid {
            path: path.to_path_buf(),
            position,
            uuid: entry.uuid.clone(),
            message,
        };
        let uuid_ok = !entry.uuid.is_empty()
            && entry.uuid.len() <= MAX_UUID_LEN
            && entry
                .uuid
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        if !uuid_ok {
            return Err(invalid(format!(
                "uuid must be 1..={MAX_UUID_LEN} characters of letters, digits, '-', '_', '.'"
            )));
        }
        if entry.memory_mib == Some(0) {
            return Err(invalid(
                "memoryMib must be a positive number of MiB (leave it out for a GPU that reports no memory)".to_owned(),
            ));
        }
        if entry.name.trim().is_empty() {
            return Err(invalid("name must not be empty".to_owned()));
        }
        if gpus.iter().any(|g: &Gpu| g.uuid == entry.uuid) {
            return Err(invalid("uuid appears twice".to_owned()));
        }
        let index = match entry.index {
            Some(i) => i,
            None => u32::try_from(position).map_err(|_| invalid("too many GPUs".to_owned()))?,
        };
        if gpus.iter().any(|g: &Gpu| g.index == index) {
            return Err(invalid(format!("index {index} appears twice")));
        }
        let (minor, from) = match entry.minor {
            Some(m) => (m, "minor"),
            None => (index, "minor (by default the index)"),
        };
        if minor > MAX_GPU_MINOR {
            return Err(invalid(format!(
                "{from} {minor} is not in 0..={MAX_GPU_MINOR}: give the entry `minor`, the N of its /dev/nvidiaN"
            )));
        }
        if let Some(other) = gpus.iter().find(|g: &&Gpu| g.minor == minor) {
            return Err(invalid(format!(
                "{from} {minor} is also the minor of GPU {:?}: each GPU has its own /dev/nvidiaN",
                other.uuid
            )));
        }
        if gpus
            .iter()
            .any(|g: &Gpu| g.mig_devices.iter().any(|m| m.uuid == entry.uuid))
        {
            return Err(invalid("uuid appears twice".to_owned()));
        }
        let mut seen: Vec<String> = gpus
            .iter()
            .flat_map(|g: &Gpu| g.mig_devices.iter().map(|m| m.uuid.clone()))
            .collect();
        let migs = mig_devices(
            &entry.uuid,
            entry.mig_enabled,
            entry.mig_devices.clone(),
            &mut seen,
        )
        .map_err(invalid)?;
        gpus.push(Gpu {
            uuid: entry.uuid,
            index,
            minor,
            name: entry.name,
            memory_mib: entry.memory_mib.unwrap_or(0),
            numa_node: entry.numa_node,
            mig_enabled: entry.mig_enabled,
            healthy: entry.healthy,
            mig_devices: migs,
        });
    }
    gpus.sort_by_key(|g| g.index);
    Ok(gpus)
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
        let invalid = |message: String| InventoryError::Invalid {
            path: path.to_path_buf(),
            position,
            uuid: entry.uuid.clone(),
            message,
        };
        let mut links: Vec<PeerLink> = Vec::with_capacity(entry.links.len());
        for link in &entry.links {
            if link.peer == entry.uuid {
                return Err(invalid(format!(
                    "links: peer {:?} is the GPU itself: name another GPU of the file",
                    link.peer
                )));
            }
            if !uuids.contains(&link.peer) {
                return Err(invalid(format!(
                    "links: peer {:?} is not a GPU of the file (known: {})",
                    link.peer,
                    uuids.join(", ")
                )));
            }
            if links.iter().any(|l| l.peer == link.peer) {
                return Err(invalid(format!(
                    "links: peer {:?} appears twice",
                    link.peer
                )));
            }
            if link.nvlinks > MAX_NVLINKS {
                return Err(invalid(format!(
                    "links: peer {:?}: nvlinks {} is not in 0..={MAX_NVLINKS}",
                    link.peer, link.nvlinks
                )));
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

/// GPUs the node config excludes (`filterdevices`), by UUID or by index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceFilter {
    /// UUIDs to leave out.
    pub uuids: Vec<String>,
    /// Indices to leave out.
    pub indices: Vec<u32>,
}

impl DeviceFilter {
    /// Whether this GPU is excluded.
    pub fn excludes(&self, gpu: &Gpu) -> bool {
        self.uuids.iter().any(|u| u == &gpu.uuid) || self.indices.contains(&gpu.index)
    }

    /// Whether this MIG device is excluded: by its own UUID only (HAMi's
    /// `FilterDeviceToRegister` gets the MIG index `"<gpu>:<mig>"`, which is no number, so
    /// `index` never excludes a MIG device, nor does its GPU's UUID).
    pub fn excludes_mig(&self, mig_uuid: &str) -> bool {
        self.uuids.iter().any(|u| u == mig_uuid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "
- uuid: GPU-aaa
  name: NVIDIA H200
  memoryMib: 143771
  numaNode: 1
- uuid: GPU-bbb
  index: 1
  name: Tesla P4
  memoryMib: 7680
  healthy: false
";

    #[test]
    fn parses_a_list_with_defaults() {
        let gpus = parse_inventory(Path::new("inv.yaml"), TWO).unwrap();
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].index, 0);
        assert_eq!(gpus[0].numa_node, Some(1));
        assert!(gpus[0].healthy);
        assert!(!gpus[0].mig_enabled);
        assert_eq!(gpus[1].name, "Tesla P4");
        assert!(!gpus[1].healthy);
    }

    #[test]
    fn refuses_unknown_keys_and_bad_entries() {
        let err = parse_inventory(
            Path::new("i.yaml"),
            "- uuid: GPU-a\n  name: x\n  memoryMB: 5\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("memoryMB"), "{err}");
        let err = parse_inventory(
            Path::new("i.yaml"),
            "- uuid: GPU-a\n  name: x\n  memoryMib: 0\n",
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("memoryMib must be a positive"),
            "{err}"
        );
        let err = parse_inventory(
            Path::new("i.yaml"),
            "- {uuid: GPU-a, name: x, memoryMib: 1}\n- {uuid: GPU-a, name: y, memoryMib: 1}\n",
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("GPU #1") && err.to_string().contains("twice"),
            "{err}"
        );
        let err = parse_inventory(
            Path::new("i.yaml"),
            "- {uuid: 'GPU a/b', name: x, memoryMib: 1}\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("uuid must be"), "{err}");
        let err = parse_inventory(Path::new("i.yaml"), "gpus: []\n").unwrap_err();
        assert!(
            err.to_string().starts_with("inventory file i.yaml:"),
            "{err}"
        );
    }

    #[test]
    fn minor_defaults_to_the_index_and_is_checked() {
        let gpus = parse_inventory(
            Path::new("inv.yaml"),
            "- {uuid: GPU-a, name: x, memoryMib: 1}\n- {uuid: GPU-b, index: 5, name: x, memoryMib: 1}\n- {uuid: GPU-c, name: x, memoryMib: 1, minor: 7}\n",
        )
        .unwrap();
        let minors: Vec<(u32, u32)> = gpus.iter().map(|g| (g.index, g.minor)).collect();
        assert_eq!(minors, [(0, 0), (2, 7), (5, 5)]);

        for (text, needle) in [
            (
                "- {uuid: GPU-a, name: x, memoryMib: 1, minor: 255}\n",
                "GPU #0 (\"GPU-a\"): minor 255 is not in 0..=254",
            ),
            (
                "- {uuid: GPU-a, index: 300, name: x, memoryMib: 1}\n",
                "GPU #0 (\"GPU-a\"): minor (by default the index) 300 is not in 0..=254: give the entry `minor`",
            ),
            (
                "- {uuid: GPU-a, name: x, memoryMib: 1, minor: 1}\n- {uuid: GPU-b, name: x, memoryMib: 1}\n",
                "GPU #1 (\"GPU-b\"): minor (by default the index) 1 is also the minor of GPU \"GPU-a\"",
            ),
            (
                "- {uuid: GPU-a, name: x, memoryMib: 1, minor: -1}\n",
                "minor",
            ),
        ] {
            let err = parse_inventory(Path::new("i.yaml"), text).unwrap_err();
            let message = err.to_string();
            assert!(message.starts_with("inventory file i.yaml:"), "{message}");
            assert!(message.contains(needle), "{text}: {message}");
        }
    }

    #[test]
    fn links_are_read_and_checked() {
        let text = "
- uuid: GPU-a
  name: x
  memoryMib: 1
  links:
    - {peer: GPU-b, pcie: singleSwitch, nvlinks: 4}
- uuid: GPU-b
  name: x
  memoryMib: 1
  links:
    - {peer: GPU-a, pcie: singleSwitch, nvlinks: 4}
- {uuid: GPU-c, name: x, memoryMib: 1}
";
        let links = parse_links(Path::new("i.yaml"), text).unwrap();
        assert_eq!(links.len(), 3);
        assert_eq!(
            links[0].links,
            [PeerLink {
                peer: "GPU-b".into(),
                pcie: Some(PcieLink::SingleSwitch),
                nvlinks: 4
            }]
        );
        assert!(links[2].links.is_empty());
        // `discover` ignores the links.
        assert_eq!(parse_inventory(Path::new("i.yaml"), text).unwrap().len(), 3);

        let base = "- {uuid: GPU-a, name: x, memoryMib: 1, links: [LINK]}\n- {uuid: GPU-b, name: x, memoryMib: 1}\n";
        for (link, needle) in [
            ("{peer: GPU-a}", "peer \"GPU-a\" is the GPU itself"),
            (
                "{peer: GPU-z}",
                "peer \"GPU-z\" is not a GPU of the file (known: GPU-a, GPU-b)",
            ),
            ("{peer: GPU-b}, {peer: GPU-b}", "appears twice"),
            ("{peer: GPU-b, nvlinks: 19}", "nvlinks 19 is not in 0..=18"),
            (
                "{peer: GPU-b, pcie: pcie4}",
                "unknown variant `pcie4`, expected one of",
            ),
            ("{peer: GPU-b, nvlink: 2}", "unknown field `nvlink`"),
        ] {
            let text = base.replace("LINK", link);
            let err = parse_links(Path::new("i.yaml"), &text)
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("inventory file i.yaml:"), "{err}");
            assert!(err.contains(needle), "{link}: {err}");
        }
    }

    #[test]
    fn filter_by_uuid_or_index() {
        let gpus = parse_inventory(Path::new("inv.yaml"), TWO).unwrap();
        let by_uuid = DeviceFilter {
            uuids: vec!["GPU-bbb".into()],
            indices: vec![],
        };
        assert!(!by_uuid.excludes(&gpus[0]) && by_uuid.excludes(&gpus[1]));
        let by_index = DeviceFilter {
            uuids: vec![],
            indices: vec![0],
        };
        assert!(by_index.excludes(&gpus[0]) && !by_index.excludes(&gpus[1]));
    }
}
