//! The `DevicePlugin` gRPC service kubelet calls, and its two extension points:
//! [`AllocateHandler`] (what a container gets on `Allocate`) and [`PendingPodDevices`] (which
//! GPUs the HAMi scheduler chose for the pod being admitted, for `GetPreferredAllocation`).

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::gpu::devices::{DeviceTable, split_device_id};
use crate::kubelet::api::v1beta1::{self, device_plugin_server::DevicePlugin};

/// What `Allocate` answers. The plugin resolves nothing itself: it hands kubelet's request and a
/// snapshot of the advertised devices to the handler and returns its answer (one
/// `ContainerAllocateResponse` per container request, in order) or its error status.
#[tonic::async_trait]
pub trait AllocateHandler: Send + Sync + std::fmt::Debug + 'static {
    /// Answers one `Allocate` call.
    async fn allocate(
        &self,
        devices: &DeviceTable,
        request: v1beta1::AllocateRequest,
    ) -> Result<v1beta1::AllocateResponse, Status>;

    /// [`Self::allocate`], told for each container request whether the `GetPreferredAllocation`
    /// call just before it steered kubelet to exactly these device IDs from a pod's entry
    /// ([`Steering::steered`]); a handler that checks kubelet's IDs against the entry overrides
    /// it.
    async fn allocate_steered(
        &self,
        devices: &DeviceTable,
        _steered: Vec<bool>,
        request: v1beta1::AllocateRequest,
    ) -> Result<v1beta1::AllocateResponse, Status> {
        self.allocate(devices, request).await
    }
}

/// How long a `GetPreferredAllocation` answer is taken to be the one the next `Allocate` follows
/// (kubelet calls `Allocate` right after it, under its device manager's lock).
pub const STEERING_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// What the last `GetPreferredAllocation` call answered, per container: the device IDs, and
/// whether they are one share of each wanted GPU and nothing else (the answer was steered by the
/// pending pod's entry, not filled from must-include or the first available devices). Taken by
/// the next `Allocate`.
#[derive(Debug, Default)]
pub struct Steering {
    last: std::sync::Mutex<Option<(std::time::Instant, Vec<BTreeSet<String>>)>>,
}

impl Steering {
    /// Records the steered answers of one `GetPreferredAllocation` call.
    pub fn record(&self, steered: Vec<BTreeSet<String>>) {
        if let Ok(mut last) = self.last.lock() {
            *last = Some((std::time::Instant::now(), steered));
        }
    }

    /// Takes the last record: for each container request, whether kubelet asks for exactly the
    /// IDs of a steered answer.
    pub fn steered(&self, request: &v1beta1::AllocateRequest) -> Vec<bool> {
        let last = self.last.lock().ok().and_then(|mut l| l.take());
        let answers = last
            .filter(|(at, _)| at.elapsed() < STEERING_TTL)
            .map(|(_, a)| a)
            .unwrap_or_default();
        request
            .container_requests
            .iter()
            .map(|c| {
                let ids: BTreeSet<String> = c.devices_ids.iter().cloned().collect();
                !ids.is_empty() && answers.contains(&ids)
            })
            .collect()
    }
}

/// Whether `answer` is exactly one device of each wanted GPU and nothing else (`whole`: an ID is
/// the device's UUID, not `<uuid>-<share>`).
pub fn is_steered(answer: &[String], wanted: &[String], whole: bool) -> bool {
    let gpu = |id: &String| {
        if whole {
            Some(id.clone())
        } else {
            split_device_id(id).map(|(uuid, _)| uuid.to_owned())
        }
    };
    let gpus: Vec<Option<String>> = answer.iter().map(gpu).collect();
    let wanted_set: BTreeSet<&String> = wanted.iter().collect();
    !wanted.is_empty()
        && gpus.len() == wanted_set.len()
        && gpus
            .iter()
            .all(|g| g.as_ref().is_some_and(|g| wanted_set.contains(g)))
        && gpus.iter().collect::<BTreeSet<_>>().len() == gpus.len()
}

/// The handler used until the HAMi-core allocation is plugged in: checks that every device ID is
/// one of ours and answers `NVIDIA_VISIBLE_DEVICES=<uuids>` per container, nothing else (no
/// limits, no mounts).
#[derive(Debug, Clone, Copy, Default)]
pub struct VisibleDevicesOnly;

pub use hami_shared::names::ENV_NVIDIA_VISIBLE_DEVICES;

/// The distinct GPU UUIDs behind kubelet device IDs, in request order; an ID that is not ours is
/// an `InvalidArgument` status naming it.
pub fn uuids_of(devices: &DeviceTable, device_ids: &[String]) -> Result<Vec<String>, Status> {
    let mut uuids: Vec<String> = Vec::new();
    for id in device_ids {
        let gpu = devices.gpu_of(id).ok_or_else(|| {
            Status::invalid_argument(format!("device {id:?} is not advertised by this plugin"))
        })?;
        if !uuids.contains(&gpu.uuid) {
            uuids.push(gpu.uuid.clone());
        }
    }
    Ok(uuids)
}

#[tonic::async_trait]
impl AllocateHandler for VisibleDevicesOnly {
    async fn allocate(
        &self,
        devices: &DeviceTable,
        request: v1beta1::AllocateRequest,
    ) -> Result<v1beta1::AllocateResponse, Status> {
        let mut container_responses = Vec::with_capacity(request.container_requests.len());
        for container in &request.container_requests {
            let uuids = uuids_of(devices, &container.devices_ids)?;
            let mut response = v1beta1::ContainerAllocateResponse::default();
            response
                .envs
                .insert(ENV_NVIDIA_VISIBLE_DEVICES.to_owned(), uuids.join(","));
            container_responses.push(response);
        }
        Ok(v1beta1::AllocateResponse {
            container_responses,
        })
    }
}

/// The GPUs the HAMi scheduler assigned to the pod being admitted on this node.
#[tonic::async_trait]
pub trait PendingPodDevices: Send + Sync + std::fmt::Debug + 'static {
    /// UUIDs of the container's devices in the pod's `hami.io/vgpu-devices-to-allocate`, in
    /// order; empty when no pending pod is known.
    async fn wanted_uuids(&self) -> Result<Vec<String>, Status>;
}

/// No pod information: `GetPreferredAllocation` prefers the first available devices.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPendingPod;

#[tonic::async_trait]
impl PendingPodDevices for NoPendingPod {
    async fn wanted_uuids(&self) -> Result<Vec<String>, Status> {
        Ok(Vec::new())
    }
}

/// The preferred allocation for one container: the devices that must be included, then one share
/// of each wanted GPU (in the scheduler's order), then the first available devices, up to `size`.
pub fn preferred_allocation(
    available: &[String],
    must_include: &[String],
    size: usize,
    wanted_uuids: &[String],
) -> Vec<String> {
    preferred_allocation_of(available, must_include, size, wanted_uuids, false)
}

/// [`preferred_allocation`] over MIG devices too (`whole`: a device ID is the device's UUID,
/// not `<uuid>-<share>`), so that with `MIG_STRATEGY=single` kubelet takes the MIG devices the
/// HAMi scheduler chose, as HAMi's `GetPreferredAllocation` does.
pub fn preferred_allocation_of(
    available: &[String],
    must_include: &[String],
    size: usize,
    wanted_uuids: &[String],
    whole: bool,
) -> Vec<String> {
    let mut chosen: Vec<String> = Vec::with_capacity(size);
    for id in must_include {
        if chosen.len() < size && !chosen.contains(id) {
            chosen.push(id.clone());
        }
    }
    let uuid_of = |id: &str| {
        if whole {
            Some(id.to_owned())
        } else {
            split_device_id(id).map(|(uuid, _)| uuid.to_owned())
        }
    };
    for wanted in wanted_uuids {
        if chosen.len() >= size {
            break;
        }
        // A GPU already covered by a must-include device counts as served.
        if chosen.iter().any(|c| uuid_of(c).as_deref() == Some(wanted)) {
            continue;
        }
        if let Some(id) = available
            .iter()
            .find(|a| !chosen.contains(a) && uuid_of(a).as_deref() == Some(wanted))
        {
            chosen.push(id.clone());
        }
    }
    for id in available {
        if chosen.len() >= size {
            break;
        }
        if !chosen.contains(id) {
            chosen.push(id.clone());
        }
    }
    chosen
}

/// State shared by every server instance of one plugin.
#[derive(Debug)]
pub struct SharedState {
    /// The advertised devices; a change is pushed to every `ListAndWatch` stream.
    pub table: watch::Sender<DeviceTable>,
    /// What `GetDevicePluginOptions` answers.
    pub options: v1beta1::DevicePluginOptions,
    /// `Allocate`.
    pub allocate: Arc<dyn AllocateHandler>,
    /// The pending pod's GPUs for `GetPreferredAllocation`.
    pub pending: Arc<dyn PendingPodDevices>,
    /// What the last `GetPreferredAllocation` steered, for the next `Allocate`.
    pub steering: Steering,
}

impl SharedState {
    /// State over `table`; `GetDevicePluginOptions` announces `GetPreferredAllocation` only when
    /// `preferred_allocation` is set, and never `PreStartContainer` (it has nothing to do).
    pub fn new(
        table: DeviceTable,
        preferred_allocation: bool,
        allocate: Arc<dyn AllocateHandler>,
        pending: Arc<dyn PendingPodDevices>,
    ) -> Arc<Self> {
        let (table, _) = watch::channel(table);
        let options = v1beta1::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: preferred_allocation,
        };
        Arc::new(Self {
            table,
            options,
            allocate,
            pending,
            steering: Steering::default(),
        })
    }

    /// Sets one GPU's health; every `ListAndWatch` stream gets the new list if it changed.
    pub fn set_health(&self, uuid: &str, healthy: bool) -> bool {
        self.table
            .send_if_modified(|table| table.set_health(uuid, healthy))
    }
}

/// Applies health events from an inventory's watch until the sender side is dropped.
pub fn spawn_health_updates(
    state: Arc<SharedState>,
    events: tokio::sync::mpsc::UnboundedReceiver<crate::gpu::inventory::HealthEvent>,
) -> tokio::task::JoinHandle<()> {
    spawn_health_updates_all(vec![state], events)
}

/// [`spawn_health_updates`] for several resources (static MIG): an event about a physical GPU
/// reaches every resource with a device on it.
pub fn spawn_health_updates_all(
    states: Vec<Arc<SharedState>>,
    events: tokio::sync::mpsc::UnboundedReceiver<crate::gpu::inventory::HealthEvent>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(health_updates(states, events))
}

/// What [`spawn_health_updates_all`] runs: applies each health event to every resource with a
/// device on that GPU, until the watch's sender is dropped. Dropping this future closes the
/// channel, which stops the watch (it checks for a closed channel).
pub async fn health_updates(
    states: Vec<Arc<SharedState>>,
    mut events: tokio::sync::mpsc::UnboundedReceiver<crate::gpu::inventory::HealthEvent>,
) {
    while let Some(event) = events.recv().await {
        let mut changed = false;
        for state in &states {
            changed |= state.set_health(&event.uuid, event.healthy);
        }
        if changed {
            if event.healthy {
                tracing::info!(gpu = %event.uuid, reason = %event.reason, "GPU healthy again");
            } else {
                tracing::warn!(gpu = %event.uuid, reason = %event.reason, "GPU unhealthy");
            }
        }
    }
}

/// The gRPC service of one bound socket. `stop` ends its `ListAndWatch` streams, so that a
/// graceful shutdown of the server does not wait for them forever.
#[derive(Debug, Clone)]
pub struct DevicePluginService {
    state: Arc<SharedState>,
    stop: watch::Receiver<bool>,
}

impl DevicePluginService {
    /// A service over `state`, stopped when `stop` becomes true.
    pub fn new(state: Arc<SharedState>, stop: watch::Receiver<bool>) -> Self {
        Self { state, stop }
    }
}

type DeviceStream =
    Pin<Box<dyn Stream<Item = Result<v1beta1::ListAndWatchResponse, Status>> + Send + 'static>>;

fn list_response(table: &DeviceTable) -> v1beta1::ListAndWatchResponse {
    v1beta1::ListAndWatchResponse {
        devices: table.kubelet_devices(),
    }
}

#[tonic::async_trait]
impl DevicePlugin for DevicePluginService {
    async fn get_device_plugin_options(
        &self,
        _request: Request<v1beta1::Empty>,
    ) -> Result<Response<v1beta1::DevicePluginOptions>, Status> {
        Ok(Response::new(self.state.options))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _request: Request<v1beta1::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut table = self.state.table.subscribe();
        let first = list_response(&table.borrow_and_update());
        let stop = self.stop.clone();
        let rest = futures::stream::unfold((table, stop), |(mut table, mut stop)| async move {
            let changed = tokio::select! {
                changed = table.changed() => changed.is_ok(),
                _ = stop.wait_for(|stopped| *stopped) => false,
            };
            if !changed {
                return None;
            }
            let response = list_response(&table.borrow_and_update());
            Some((Ok(response), (table, stop)))
        });
        let stream =
            futures::StreamExt::chain(futures::stream::once(async move { Ok(first) }), rest);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<v1beta1::PreferredAllocationRequest>,
    ) -> Result<Response<v1beta1::PreferredAllocationResponse>, Status> {
        let request = request.into_inner();
        let wanted = self.state.pending.wanted_uuids().await.unwrap_or_else(|status| {
            tracing::warn!(error = %status.message(), "pending pod unknown; preferring the first available devices");
            Vec::new()
        });
        let whole = self.state.table.borrow().is_mig();
        let container_responses: Vec<_> = request
            .container_requests
            .iter()
            .map(|c| v1beta1::ContainerPreferredAllocationResponse {
                device_i_ds: preferred_allocation_of(
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    usize::try_from(c.allocation_size).unwrap_or(0),
                    &wanted,
                    whole,
                ),
            })
            .collect();
        self.state.steering.record(
            container_responses
                .iter()
                .filter(|r| is_steered(&r.device_i_ds, &wanted, whole))
                .map(|r| r.device_i_ds.iter().cloned().collect())
                .collect(),
        );
        Ok(Response::new(v1beta1::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<v1beta1::AllocateRequest>,
    ) -> Result<Response<v1beta1::AllocateResponse>, Status> {
        let devices = self.state.table.borrow().clone();
        let request = request.into_inner();
        let steered = self.state.steering.steered(&request);
        let response = self
            .state
            .allocate
            .allocate_steered(&devices, steered, request)
            .await?;
        Ok(Response::new(response))
    }

    async fn pre_start_container(
        &self,
        _request: Request<v1beta1::PreStartContainerRequest>,
    ) -> Result<Response<v1beta1::PreStartContainerResponse>, Status> {
        // Not requested in the options (pre_start_required = false); answer politely if called.
        Ok(Response::new(v1beta1::PreStartContainerResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn prefers_the_scheduler_gpus_then_first_available() {
        let available = ids(&["GPU-a-0", "GPU-a-1", "GPU-b-0", "GPU-b-1", "GPU-c-0"]);
        assert_eq!(
            preferred_allocation(&available, &[], 1, &ids(&["GPU-b"])),
            ids(&["GPU-b-0"])
        );
        assert_eq!(
            preferred_allocation(&available, &[], 2, &ids(&["GPU-c", "GPU-a"])),
            ids(&["GPU-c-0", "GPU-a-0"])
        );
        assert_eq!(
            preferred_allocation(&available, &[], 2, &[]),
            ids(&["GPU-a-0", "GPU-a-1"])
        );
        // A wanted GPU with no free share falls back to the first available.
        assert_eq!(
            preferred_allocation(&available, &[], 1, &ids(&["GPU-z"])),
            ids(&["GPU-a-0"])
        );
        // must_include first, and a GPU it covers is not taken twice.
        assert_eq!(
            preferred_allocation(&available, &ids(&["GPU-b-1"]), 2, &ids(&["GPU-b", "GPU-c"])),
            ids(&["GPU-b-1", "GPU-c-0"])
        );
        assert!(preferred_allocation(&available, &[], 0, &ids(&["GPU-a"])).is_empty());
    }

    #[test]
    fn mig_devices_are_preferred_by_their_uuid() {
        let available = ids(&["MIG-aaaa-0001", "MIG-aaaa-0002", "MIG-bbbb-0001"]);
        assert_eq!(
            preferred_allocation_of(&available, &[], 1, &ids(&["MIG-bbbb-0001"]), true),
            ids(&["MIG-bbbb-0001"])
        );
        // Read as shares, `MIG-aaaa-0001` would be share 1 of `MIG-aaaa`.
        assert_eq!(
            preferred_allocation_of(&available, &[], 1, &ids(&["MIG-bbbb-0001"]), false),
            ids(&["MIG-aaaa-0001"])
        );
    }
}
