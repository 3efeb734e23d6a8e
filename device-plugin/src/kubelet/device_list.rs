//! The device table as kubelet sees it: the `ListAndWatch` list of [`DeviceTable`] (an inherent
//! method defined here, on the kubelet side, so that the GPU side never names the kubelet API).

use crate::gpu::devices::{DeviceTable, device_id};
use crate::kubelet::api::{self, v1beta1};

impl DeviceTable {
    /// The list sent on `ListAndWatch`.
    pub fn kubelet_devices(&self) -> Vec<v1beta1::Device> {
        let mut devices = Vec::with_capacity(self.gpus().len() * self.split_count() as usize);
        for gpu in self.gpus() {
            let health = if gpu.healthy {
                api::HEALTHY
            } else {
                api::UNHEALTHY
            };
            let topology = match (self.numa_topology(), gpu.numa_node) {
                (true, Some(id)) => Some(v1beta1::TopologyInfo {
                    nodes: vec![v1beta1::NumaNode { id }],
                }),
                _ => None,
            };
            if self.is_mig() {
                devices.push(v1beta1::Device {
                    id: gpu.uuid.clone(),
                    health: health.to_owned(),
                    topology,
                });
                continue;
            }
            for share in 0..self.split_count() {
                devices.push(v1beta1::Device {
                    id: device_id(&gpu.uuid, share),
                    health: health.to_owned(),
                    topology: topology.clone(),
                });
            }
        }
        devices
    }
}
