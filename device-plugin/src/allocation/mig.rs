//! `Allocate` for static MIG devices (`MIG_STRATEGY` single or mixed): the container gets its MIG
//! devices in `NVIDIA_VISIBLE_DEVICES` and nothing else — no HAMi-core variable, no limits file,
//! no mount, since the slice is the limit (as HAMi v2.10's `plugin/server.go` `Allocate`
//! answers a request whose device IDs contain `MIG` with `getAllocateResponse(req.DevicesIds)`,
//! skipping the HAMi-core part).
//!
//! The answer is taken from kubelet's device IDs, which kubelet accounts for, without the pod:
//! HAMi looks up the HAMi scheduler's pending pod first and fails without one (so a pod asking
//! for `nvidia.com/mig-1g.10gb`, which that scheduler does not place, cannot start); we do not,
//! and leave the pod's annotations as HAMi does (it pops no entry for a MIG request).

use tonic::Status;

use crate::api::v1beta1;
use crate::devices::DeviceTable;
use crate::service::{AllocateHandler, ENV_NVIDIA_VISIBLE_DEVICES};

/// The answer for one container request on a MIG resource: `NVIDIA_VISIBLE_DEVICES` = its MIG
/// UUIDs in request order, each once. A device ID that is not one of this resource's MIG devices
/// is an `InvalidArgument` naming it (HAMi: "unknown device").
pub fn mig_container_response(
    devices: &DeviceTable,
    device_ids: &[String],
) -> Result<v1beta1::ContainerAllocateResponse, Status> {
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
    let mut response = v1beta1::ContainerAllocateResponse::default();
    response
        .envs
        .insert(ENV_NVIDIA_VISIBLE_DEVICES.to_owned(), uuids.join(","));
    Ok(response)
}

/// The [`AllocateHandler`] of a MIG resource.
#[derive(Debug, Clone, Copy, Default)]
pub struct MigAllocate;

#[tonic::async_trait]
impl AllocateHandler for MigAllocate {
    async fn allocate(
        &self,
        devices: &DeviceTable,
        request: v1beta1::AllocateRequest,
    ) -> Result<v1beta1::AllocateResponse, Status> {
        let container_responses = request
            .container_requests
            .iter()
            .map(|c| mig_container_response(devices, &c.devices_ids))
            .collect::<Result<Vec<_>, _>>()?;
        for (container, response) in request.container_requests.iter().zip(&container_responses) {
            tracing::info!(
                devices = ?container.devices_ids,
                visible = response.envs.get(ENV_NVIDIA_VISIBLE_DEVICES).map(String::as_str),
                "allocated MIG devices (no HAMi-core)"
            );
        }
        Ok(v1beta1::AllocateResponse {
            container_responses,
        })
    }
}
