//! The pod's `hami.io/vgpu-devices-to-allocate` checked against what this node knows, before
//! anything is granted (pure: no I/O). The annotation is written by HAMi's scheduler, but a
//! tenant who can write pod annotations can write one too; the admission policy keeps tenants from
//! writing it, and this is the backstop: an entry HAMi's scheduler could never have written is
//! refused.
//!
//! What HAMi v2.10's scheduler writes (`pkg/device/nvidia/device.go` `Fit`, `pkg/scheduler/score.go`
//! `fitInDevices`), and so what every check here lets through: devices of the node's
//! `hami.io/node-nvidia-register` (our advertised GPUs), each at most once per container; memory
//! `<= Totalmem` (the GPU's memory × `deviceMemoryScaling`; a percentage request or
//! `defaultMemory: 0` resolve to a share of that, 100 % being the whole of it); cores clamped to
//! 100 and `<= Totalcore` (100 × `deviceCoreScaling`), 0 allowed; and, as the scheduler adds each
//! container's usage to the GPU before fitting the next container of the pod, at most
//! `deviceSplitCount` containers of one pod on one GPU, their memory summed `<= Totalmem` and
//! their cores summed `<= Totalcore`.
//!
//! Not checked (cannot be, from one pod): whether the scheduler or a tenant wrote an entry that
//! fits; what other pods already use of the GPU (kubelet's shares and HAMi's scheduler count
//! them).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::codec::{ContainerDevice, PodDevices};
use crate::gpu::devices::DeviceTable;
use crate::gpu::inventory::Gpu;

/// What this node registered for HAMi's scheduler: its GPUs and their capacity as the scheduler
/// sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCapacity {
    /// `Totalmem` (MiB, scaled) of each advertised GPU, by UUID.
    pub devmem: BTreeMap<String, u64>,
    /// `Totalcore` of every GPU (100 × `deviceCoreScaling`).
    pub devcore: u64,
    /// `deviceSplitCount`.
    pub split_count: u32,
}

impl NodeCapacity {
    /// The capacity of the advertised GPUs, scaled as the node annotation registers it
    /// ([`crate::node_register::device_info`]: truncated as Go converts `float64` to `int32`).
    pub fn from_table(table: &DeviceTable, memory_scaling: f64, core_scaling: f64) -> Self {
        Self::from_gpus(
            table.gpus(),
            table.split_count(),
            memory_scaling,
            core_scaling,
        )
    }

    /// The capacity of `gpus` split `split_count` ways (the dry run's `--inventory`).
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_precision_loss,
        clippy::cast_sign_loss
    )]
    pub fn from_gpus(
        gpus: &[Gpu],
        split_count: u32,
        memory_scaling: f64,
        core_scaling: f64,
    ) -> Self {
        let devmem = gpus
            .iter()
            .map(|g| {
                let scaled = (g.memory_mib as f64 * memory_scaling) as i32;
                (g.uuid.clone(), u64::try_from(scaled).unwrap_or(0))
            })
            .collect();
        let devcore = u64::try_from((core_scaling * 100.0) as i32).unwrap_or(0);
        Self {
            devmem,
            devcore,
            split_count: split_count.max(1),
        }
    }

    /// The most cores one container may get on a GPU: the scheduler clamps a request to 100.
    fn max_cores(&self) -> u64 {
        self.devcore.min(100)
    }
}

/// Why an entry is refused: none of these can come from HAMi's scheduler for this node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// A UUID this node does not advertise.
    #[error(
        "entry {entry} names GPU {uuid:?}, which this node does not advertise (its GPUs: {known})"
    )]
    UnknownGpu {
        /// The entry.
        entry: usize,
        /// The UUID.
        uuid: String,
        /// The node's UUIDs, comma-separated.
        known: String,
    },
    /// The same GPU twice in one container's entry.
    #[error(
        "entry {entry} names GPU {uuid:?} twice (the scheduler gives one container a GPU once)"
    )]
    DuplicateGpu {
        /// The entry.
        entry: usize,
        /// The UUID.
        uuid: String,
    },
    /// More memory than the GPU has (scaled).
    #[error(
        "entry {entry} grants {memory_mib} MiB on GPU {uuid:?}, above the {devmem} MiB it registers (memory x deviceMemoryScaling)"
    )]
    Memory {
        /// The entry.
        entry: usize,
        /// The UUID.
        uuid: String,
        /// The entry's memory.
        memory_mib: u64,
        /// The GPU's registered memory.
        devmem: u64,
    },
    /// More cores than one container can get.
    #[error(
        "entry {entry} grants {cores} % of the cores of GPU {uuid:?}, above {max} (100, and 100 x deviceCoreScaling)"
    )]
    Cores {
        /// The entry.
        entry: usize,
        /// The UUID.
        uuid: String,
        /// The entry's cores.
        cores: u32,
        /// The most one container may get.
        max: u64,
    },
    /// The pod's containers on one GPU exceed what the scheduler fits on it.
    #[error(
        "the pod's entries give GPU {uuid:?} to {containers} container(s) with {memory_mib} MiB and {cores} % of the cores in all; the scheduler fits at most {split_count} container(s), {devmem} MiB and {devcore} %"
    )]
    Split {
        /// The UUID.
        uuid: String,
        /// Containers of the pod on it.
        containers: usize,
        /// Their memory.
        memory_mib: u64,
        /// Their cores.
        cores: u64,
        /// `deviceSplitCount`.
        split_count: u32,
        /// The GPU's registered memory.
        devmem: u64,
        /// `Totalcore`.
        devcore: u64,
    },
    /// kubelet's device ID is not one this plugin advertises.
    #[error("kubelet's device ID {id:?} is not advertised by this plugin")]
    UnknownDeviceId {
        /// The ID.
        id: String,
    },
    /// `GetPreferredAllocation` steered kubelet to other GPUs than the entry names.
    #[error(
        "entry {entry} names GPU(s) {entry_gpus} but kubelet allocated {kubelet_gpus}, where GetPreferredAllocation had steered it from the pod's entry as it was then: the entry changed, or another pod's entry is being allocated"
    )]
    Steered {
        /// The entry.
        entry: usize,
        /// The entry's GPUs.
        entry_gpus: String,
        /// kubelet's GPUs.
        kubelet_gpus: String,
    },
}

/// Checks every pending entry of the pod, each container's devices alone and, per GPU, the
/// pod's containers together. Non-NVIDIA devices of other plugins are not ours to check.
pub fn check_pod(devices: &PodDevices, node: &NodeCapacity) -> Result<(), EntryError> {
    #[derive(Default)]
    struct Sum {
        containers: usize,
        memory_mib: u64,
        cores: u64,
    }
    let mut sums: BTreeMap<&str, Sum> = BTreeMap::new();
    for entry in 0..devices.len() {
        let ours: Vec<&ContainerDevice> = devices
            .devices(entry)
            .unwrap_or_default()
            .iter()
            .filter(|d| d.is_nvidia())
            .collect();
        check_container(entry, &ours, node)?;
        for d in ours {
            let sum = sums.entry(d.uuid.as_str()).or_default();
            sum.containers += 1;
            sum.memory_mib = sum.memory_mib.saturating_add(d.memory_mib);
            sum.cores = sum.cores.saturating_add(u64::from(d.cores));
        }
    }
    for (uuid, sum) in sums {
        let devmem = node.devmem.get(uuid).copied().unwrap_or(0);
        if sum.containers > node.split_count as usize
            || sum.memory_mib > devmem
            || sum.cores > node.devcore
        {
            return Err(EntryError::Split {
                uuid: uuid.to_owned(),
                containers: sum.containers,
                memory_mib: sum.memory_mib,
                cores: sum.cores,
                split_count: node.split_count,
                devmem,
                devcore: node.devcore,
            });
        }
    }
    Ok(())
}

fn check_container(
    entry: usize,
    devices: &[&ContainerDevice],
    node: &NodeCapacity,
) -> Result<(), EntryError> {
    let mut seen = BTreeSet::new();
    for d in devices {
        let Some(&devmem) = node.devmem.get(&d.uuid) else {
            return Err(EntryError::UnknownGpu {
                entry,
                uuid: d.uuid.clone(),
                known: node.devmem.keys().cloned().collect::<Vec<_>>().join(","),
            });
        };
        if !seen.insert(d.uuid.as_str()) {
            return Err(EntryError::DuplicateGpu {
                entry,
                uuid: d.uuid.clone(),
            });
        }
        if d.memory_mib > devmem {
            return Err(EntryError::Memory {
                entry,
                uuid: d.uuid.clone(),
                memory_mib: d.memory_mib,
                devmem,
            });
        }
        if u64::from(d.cores) > node.max_cores() {
            return Err(EntryError::Cores {
                entry,
                uuid: d.uuid.clone(),
                cores: d.cores,
                max: node.max_cores(),
            });
        }
    }
    Ok(())
}

/// kubelet's device IDs for one container: each must be advertised; and when
/// `GetPreferredAllocation` steered kubelet to exactly these IDs from a pod's entry
/// (`steered`), the GPUs behind them must be the entry's. Unsteered (kubelet did not ask, reused
/// an init container's devices, or found no free share of a wanted GPU), the GPUs may differ
/// legitimately and the container gets the entry's GPUs, as in HAMi.
pub fn check_kubelet_ids(
    entry: usize,
    devices: &[ContainerDevice],
    ids: &[String],
    table: &DeviceTable,
    steered: bool,
) -> Result<(), EntryError> {
    let mut kubelet = BTreeSet::new();
    for id in ids {
        let gpu = table
            .gpu_of(id)
            .ok_or_else(|| EntryError::UnknownDeviceId { id: id.clone() })?;
        kubelet.insert(gpu.uuid.as_str());
    }
    let wanted: BTreeSet<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
    if steered && kubelet != wanted {
        let join = |s: &BTreeSet<&str>| s.iter().copied().collect::<Vec<_>>().join(",");
        return Err(EntryError::Steered {
            entry,
            entry_gpus: join(&wanted),
            kubelet_gpus: join(&kubelet),
        });
    }
    Ok(())
}
