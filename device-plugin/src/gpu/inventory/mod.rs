//! What GPUs this node has: the [`GpuInventory`] trait and its two backends, NVML
//! ([`crate::gpu::nvml::NvmlInventory`]) and an inventory file ([`FileInventory`]) for machines
//! without NVIDIA hardware (development, CI, the in-process tests).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::gpu::health::HealthCheckPolicy;
pub use crate::gpu::health::HealthEvent;

mod file;
use crate::gpu::topology::GpuLinks;
pub use file::{FileInventory, GpuEntryError, MigEntryError, parse_inventory, parse_links};

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
    /// Its name under `DEVICE_ID_STRATEGY=index`: `<GPU index>:<MIG slot>` (HAMi v2.10
    /// `rm/nvml_devices.go` `newMigDevice`: `fmt.Sprintf("%v:%v", i, j)`).
    pub index: String,
    /// Its device nodes for `PASS_DEVICE_SPECS=true`: the parent's `/dev/nvidia<minor>` and the
    /// GPU and compute instance capability nodes `/dev/nvidia-caps/nvidia-cap<N>` (HAMi
    /// `nvmlMigDevice.GetPaths`); empty when they could not be found, and then the plugin
    /// refuses `PASS_DEVICE_SPECS=true` at start rather than start a container without them.
    pub paths: Vec<String>,
}

/// Errors finding GPUs.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// NVML could not be loaded or initialised (no driver, no GPU, no libnvidia-ml.so.1).
    #[error(
        "NVML is not available ({0}); on a machine without NVIDIA GPUs pass --inventory FILE (env {env}) with a YAML list of GPUs",
        env = hami_shared::names::ENV_HAMI_INVENTORY
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
    #[error("inventory file {path}: GPU #{position} ({uuid:?}): {problem}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Position in the list, from 0.
        position: usize,
        /// The UUID as written.
        uuid: String,
        /// What is wrong and what would be accepted.
        problem: Box<file::GpuEntryError>,
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
    /// `hami.io/node-nvidia-score` ([`crate::gpu::topology`]). Read once, at start, only when
    /// `ENABLE_TOPOLOGY_SCORE` is true.
    fn gpu_links(&self) -> Result<Vec<GpuLinks>, InventoryError> {
        Err(InventoryError::NoTopology {
            backend: self.backend(),
        })
    }
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
    use crate::gpu::topology::{PcieLink, PeerLink};
    use std::path::Path;

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
            (
                "- {uuid: GPU-a, name: x, memoryMib: 1, numaNode: -1}\n",
                "GPU #0 (\"GPU-a\"): numaNode -1 is not a NUMA node: give 0 or more, or leave it out",
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
