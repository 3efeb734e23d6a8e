//! The parts of a kubelet `ContainerAllocateResponse` that the plan builds and the dry run
//! prints: mounts and device specs. Below both [`super::plan`] and [`super::device_list`], which
//! produce them.

use std::path::Path;

use serde::Serialize;

/// One mount of the answer (`v1beta1.Mount`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedMount {
    /// Path in the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// Read-only.
    pub read_only: bool,
}

/// A mount of `host_path` at `container_path`.
pub fn mount(container_path: impl Into<String>, host_path: &Path, read_only: bool) -> PlannedMount {
    PlannedMount {
        container_path: container_path.into(),
        host_path: host_path.display().to_string(),
        read_only,
    }
}

impl PlannedMount {
    /// The kubelet message.
    pub fn to_api(&self) -> crate::kubelet::api::v1beta1::Mount {
        crate::kubelet::api::v1beta1::Mount {
            container_path: self.container_path.clone(),
            host_path: self.host_path.clone(),
            read_only: self.read_only,
        }
    }
}

/// One device node of the answer (`v1beta1.DeviceSpec`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedDeviceSpec {
    /// Path in the container (`/dev/nvidia0`).
    pub container_path: String,
    /// Path on the host (under the dev root).
    pub host_path: String,
    /// cgroup permissions: `rw`, as HAMi passes them.
    pub permissions: String,
    /// Passed only when the node exists where the plugin runs (HAMi's `apiDeviceSpecs` treats
    /// `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools` and `/dev/nvidia-modeset`
    /// so); the executor drops a missing one at each call
    /// ([`super::plan::AllocationPlan::with_host`]).
    pub optional: bool,
}

impl PlannedDeviceSpec {
    /// The kubelet message.
    pub fn to_api(&self) -> crate::kubelet::api::v1beta1::DeviceSpec {
        crate::kubelet::api::v1beta1::DeviceSpec {
            container_path: self.container_path.clone(),
            host_path: self.host_path.clone(),
            permissions: self.permissions.clone(),
        }
    }
}
