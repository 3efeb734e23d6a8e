//! `Allocate` for static MIG devices (`MIG_STRATEGY` single or mixed): the container gets its MIG
//! devices through the device list strategy (by default `NVIDIA_VISIBLE_DEVICES`) and nothing
//! else — no HAMi-core variable, no limits file, no HAMi-core mount, since the slice is the limit (as HAMi v2.10's `plugin/server.go` `Allocate`
//! answers a request whose device IDs contain `MIG` with `getAllocateResponse(req.DevicesIds)`,
//! skipping the HAMi-core part).
//!
//! The answer is taken from kubelet's device IDs, which kubelet accounts for, without the pod:
//! HAMi looks up the HAMi scheduler's pending pod first and fails without one (so a pod asking
//! for `nvidia.com/mig-1g.10gb`, which that scheduler does not place, cannot start); we do not,
//! and leave the pod's annotations as HAMi does (it pops no entry for a MIG request).

use std::collections::BTreeSet;

use tonic::Status;

use crate::allocation::plan::container_response::{PlannedDeviceSpec, PlannedMount};
use crate::allocation::plan::device_list::{
    self, DeviceListError, DeviceListSettings, NodeDevices,
};
use crate::gpu::devices::DeviceTable;
use crate::kubelet::api::v1beta1;
use crate::kubelet::service::{AllocateHandler, ENV_NVIDIA_VISIBLE_DEVICES};

/// The MIG UUIDs of one container request, in request order, each once. A device ID that is not
/// one of this resource's MIG devices is an `InvalidArgument` naming it (HAMi: "unknown
/// device").
fn requested_mig_uuids<'a>(
    devices: &'a DeviceTable,
    device_ids: &[String],
) -> Result<Vec<&'a str>, Status> {
    if !devices.is_mig() {
        return Err(Status::internal(
            "MIG allocation asked of a resource whose devices are GPU shares",
        ));
    }
    if device_ids.is_empty() {
        return Err(Status::invalid_argument(
            "a container request without device IDs",
        ));
    }
    let mut uuids: Vec<&str> = Vec::with_capacity(device_ids.len());
    for id in device_ids {
        let device = devices.gpu_of(id).ok_or_else(|| {
            Status::invalid_argument(format!(
                "device {id:?} is not a MIG device advertised by this plugin"
            ))
        })?;
        if !uuids.contains(&device.uuid.as_str()) {
            uuids.push(&device.uuid);
        }
    }
    Ok(uuids)
}

/// The answer for one container request on a MIG resource under HAMi's default device list
/// settings (`envvar`, `uuid`, no device specs): `NVIDIA_VISIBLE_DEVICES` = its MIG UUIDs in
/// request order, each once.
pub fn mig_container_response(
    devices: &DeviceTable,
    device_ids: &[String],
) -> Result<v1beta1::ContainerAllocateResponse, Status> {
    MigAllocate::default().container_response(devices, device_ids, &BTreeSet::new())
}

/// The [`AllocateHandler`] of a MIG resource: the device list settings (`DEVICE_LIST_STRATEGY`,
/// `DEVICE_ID_STRATEGY`, `PASS_DEVICE_SPECS`, GDS/MOFED/GDRCopy, IMEX) apply to MIG devices as
/// to GPUs — HAMi's `Allocate` sends a MIG request through the same `getAllocateResponse` — with
/// `<gpu>:<slot>` names and the parent's and capability device nodes.
#[derive(Debug, Clone, Default)]
pub struct MigAllocate {
    device_list: DeviceListSettings,
    node: NodeDevices,
}

impl MigAllocate {
    /// The handler for `table`'s MIG devices. Refused at start when the settings cannot be
    /// honoured for one of them (`PASS_DEVICE_SPECS=true` without its capability nodes), rather
    /// than start containers without access to their slice.
    pub fn new(
        device_list: DeviceListSettings,
        node: NodeDevices,
        table: &DeviceTable,
    ) -> Result<Self, DeviceListError> {
        device_list.check_devices(&node, table.gpus().iter().map(|g| g.uuid.as_str()))?;
        Ok(Self { device_list, node })
    }

    /// One container's answer; `control_nodes` are the control device nodes present on the host
    /// (an optional device spec whose node is absent is dropped, as HAMi's `apiDeviceSpecs`).
    pub fn container_response(
        &self,
        devices: &DeviceTable,
        device_ids: &[String],
        control_nodes: &BTreeSet<String>,
    ) -> Result<v1beta1::ContainerAllocateResponse, Status> {
        let uuids = requested_mig_uuids(devices, device_ids)?;
        // The CDI annotation key must differ between containers: the first MIG device is
        // this container's alone (HAMi takes a random UUID per response).
        let answer = device_list::answer(&self.device_list, &self.node, &uuids, uuids[0])
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        let mut response = v1beta1::ContainerAllocateResponse {
            envs: answer.envs.into_iter().collect(),
            annotations: answer.annotations.into_iter().collect(),
            mounts: answer.mounts.iter().map(PlannedMount::to_api).collect(),
            devices: answer
                .device_specs
                .iter()
                .filter(|d| !d.optional || control_nodes.contains(&d.container_path))
                .map(PlannedDeviceSpec::to_api)
                .collect(),
            ..Default::default()
        };
        response.cdi_devices = answer
            .cdi_devices
            .into_iter()
            .map(|name| v1beta1::CdiDevice { name })
            .collect();
        Ok(response)
    }
}

#[tonic::async_trait]
impl AllocateHandler for MigAllocate {
    async fn allocate(
        &self,
        devices: &DeviceTable,
        request: v1beta1::AllocateRequest,
    ) -> Result<v1beta1::AllocateResponse, Status> {
        let control_nodes = if self.device_list.pass_device_specs {
            super::executor::disk::probe_control_nodes()
        } else {
            BTreeSet::new()
        };
        let container_responses = request
            .container_requests
            .iter()
            .map(|c| self.container_response(devices, &c.devices_ids, &control_nodes))
            .collect::<Result<Vec<_>, _>>()?;
        for (container, response) in request.container_requests.iter().zip(&container_responses) {
            tracing::info!(
                devices = ?container.devices_ids,
                visible = response.envs.get(ENV_NVIDIA_VISIBLE_DEVICES).map(String::as_str),
                cdi_devices = response.cdi_devices.len(),
                device_specs = response.devices.len(),
                "allocated MIG devices (no HAMi-core)"
            );
        }
        Ok(v1beta1::AllocateResponse {
            container_responses,
        })
    }
}
