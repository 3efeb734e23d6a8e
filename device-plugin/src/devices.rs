//! The devices advertised to kubelet: each GPU split into `deviceSplitCount` shares
//! `<uuid>-0 … <uuid>-(n-1)`, with the GPU's health and, when enabled, its NUMA node.

use serde::Serialize;

use crate::api::{self, v1beta1};
use crate::inventory::{DeviceFilter, Gpu};

/// Why a GPU found on the node is not advertised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkippedGpu {
    /// The GPU's UUID.
    pub uuid: String,
    /// The GPU's index.
    pub index: u32,
    /// Why it is left out.
    pub reason: String,
}

/// No GPU left to advertise: a plugin that advertises nothing is an error, not a silent no-op.
#[derive(Debug, thiserror::Error)]
#[error("no GPU to advertise: {found} found{}", describe_skipped(.skipped))]
pub struct NoGpuError {
    /// How many GPUs the inventory reported.
    pub found: usize,
    /// Those left out, with the reason.
    pub skipped: Vec<SkippedGpu>,
}

fn describe_skipped(skipped: &[SkippedGpu]) -> String {
    if skipped.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = skipped
        .iter()
        .map(|s| format!("{} (index {}): {}", s.uuid, s.index, s.reason))
        .collect();
    format!(", all left out: {}", parts.join("; "))
}

/// The GPUs this plugin advertises and how they are split.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceTable {
    gpus: Vec<Gpu>,
    split_count: u32,
    numa_topology: bool,
}

impl DeviceTable {
    /// Applies the node's device filter and leaves out MIG-enabled GPUs (their slices are not
    /// shared through HAMi-core). Returns the table and what was left out; an empty table is an
    /// error.
    pub fn build(
        found: Vec<Gpu>,
        filter: &DeviceFilter,
        split_count: u32,
        numa_topology: bool,
    ) -> Result<(Self, Vec<SkippedGpu>), NoGpuError> {
        let total = found.len();
        let mut gpus = Vec::new();
        let mut skipped = Vec::new();
        for gpu in found {
            let reason = if filter.excludes(&gpu) {
                Some("excluded by filterdevices in the node config")
            } else if gpu.mig_enabled {
                Some("MIG mode is enabled; MIG GPUs are not shared through HAMi-core")
            } else {
                None
            };
            match reason {
                Some(reason) => skipped.push(SkippedGpu {
                    uuid: gpu.uuid,
                    index: gpu.index,
                    reason: reason.to_owned(),
                }),
                None => gpus.push(gpu),
            }
        }
        if gpus.is_empty() {
            return Err(NoGpuError {
                found: total,
                skipped,
            });
        }
        Ok((
            Self {
                gpus,
                split_count: split_count.max(1),
                numa_topology,
            },
            skipped,
        ))
    }

    /// The advertised GPUs, in index order.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    /// Shares per GPU.
    pub fn split_count(&self) -> u32 {
        self.split_count
    }

    /// The list sent on `ListAndWatch`.
    pub fn kubelet_devices(&self) -> Vec<v1beta1::Device> {
        let mut devices = Vec::with_capacity(self.gpus.len() * self.split_count as usize);
        for gpu in &self.gpus {
            let health = if gpu.healthy {
                api::HEALTHY
            } else {
                api::UNHEALTHY
            };
            let topology = match (self.numa_topology, gpu.numa_node) {
                (true, Some(id)) => Some(v1beta1::TopologyInfo {
                    nodes: vec![v1beta1::NumaNode { id }],
                }),
                _ => None,
            };
            for share in 0..self.split_count {
                devices.push(v1beta1::Device {
                    id: device_id(&gpu.uuid, share),
                    health: health.to_owned(),
                    topology: topology.clone(),
                });
            }
        }
        devices
    }

    /// Sets a GPU's health; returns whether anything changed.
    pub fn set_health(&mut self, uuid: &str, healthy: bool) -> bool {
        match self.gpus.iter_mut().find(|g| g.uuid == uuid) {
            Some(gpu) if gpu.healthy != healthy => {
                gpu.healthy = healthy;
                true
            }
            _ => false,
        }
    }

    /// The GPU behind a kubelet device ID, if it is one of ours.
    pub fn gpu_of(&self, device_id: &str) -> Option<&Gpu> {
        let (uuid, share) = split_device_id(device_id)?;
        self.gpus
            .iter()
            .find(|g| g.uuid == uuid && share < self.split_count)
    }
}

/// The kubelet device ID of one share of a GPU.
pub fn device_id(uuid: &str, share: u32) -> String {
    format!("{uuid}-{share}")
}

/// Splits `<uuid>-<share>` into the UUID and the share number.
pub fn split_device_id(device_id: &str) -> Option<(&str, u32)> {
    let (uuid, share) = device_id.rsplit_once('-')?;
    if uuid.is_empty() || share.is_empty() || !share.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((uuid, share.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(uuid: &str, index: u32) -> Gpu {
        Gpu {
            uuid: uuid.into(),
            index,
            minor: index,
            name: "NVIDIA H200".into(),
            memory_mib: 143_771,
            numa_node: Some(1),
            mig_enabled: false,
            healthy: true,
        }
    }

    #[test]
    fn splits_each_gpu_into_shares() {
        let (table, skipped) = DeviceTable::build(
            vec![gpu("GPU-a", 0), gpu("GPU-b", 1)],
            &DeviceFilter::default(),
            3,
            false,
        )
        .unwrap();
        assert!(skipped.is_empty());
        let ids: Vec<String> = table.kubelet_devices().into_iter().map(|d| d.id).collect();
        assert_eq!(
            ids,
            [
                "GPU-a-0", "GPU-a-1", "GPU-a-2", "GPU-b-0", "GPU-b-1", "GPU-b-2"
            ]
        );
        assert!(
            table
                .kubelet_devices()
                .iter()
                .all(|d| d.health == "Healthy" && d.topology.is_none())
        );
    }

    #[test]
    fn numa_topology_only_when_enabled() {
        let (table, _) =
            DeviceTable::build(vec![gpu("GPU-a", 0)], &DeviceFilter::default(), 1, true).unwrap();
        let topo = table.kubelet_devices()[0].topology.clone().unwrap();
        assert_eq!(topo.nodes[0].id, 1);
    }

    #[test]
    fn filter_and_mig_are_left_out_and_empty_is_an_error() {
        let mut mig = gpu("GPU-m", 2);
        mig.mig_enabled = true;
        let filter = DeviceFilter {
            uuids: vec!["GPU-a".into()],
            indices: vec![1],
        };
        let err = DeviceTable::build(
            vec![gpu("GPU-a", 0), gpu("GPU-b", 1), mig],
            &filter,
            2,
            false,
        )
        .unwrap_err();
        assert_eq!(err.found, 3);
        assert_eq!(err.skipped.len(), 3);
        let text = err.to_string();
        assert!(
            text.starts_with(
                "no GPU to advertise: 3 found, all left out: GPU-a (index 0): excluded"
            ),
            "{text}"
        );
        assert!(text.contains("MIG mode is enabled"), "{text}");
        let err = DeviceTable::build(vec![], &DeviceFilter::default(), 2, false).unwrap_err();
        assert_eq!(err.to_string(), "no GPU to advertise: 0 found");
    }

    #[test]
    fn health_changes_and_device_ids_map_back() {
        let (mut table, _) =
            DeviceTable::build(vec![gpu("GPU-a-b", 0)], &DeviceFilter::default(), 2, false)
                .unwrap();
        assert!(table.set_health("GPU-a-b", false));
        assert!(!table.set_health("GPU-a-b", false));
        assert!(
            table
                .kubelet_devices()
                .iter()
                .all(|d| d.health == "Unhealthy")
        );
        assert_eq!(table.gpu_of("GPU-a-b-1").map(|g| g.index), Some(0));
        assert!(table.gpu_of("GPU-a-b-2").is_none());
        assert!(table.gpu_of("GPU-a-b").is_none());
        assert_eq!(split_device_id("GPU-x-12"), Some(("GPU-x", 12)));
        assert_eq!(split_device_id("-1"), None);
        assert_eq!(split_device_id("GPU-x-"), None);
    }
}
