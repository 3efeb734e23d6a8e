//! The executor: the thin I/O around [`super::plan`]. For each `Allocate` call:
//!
//! 1. **under a node-wide lock, in memory only**: find the pod ([`super::pod_lookup`]; from the
//!    watch-fed pod cache when it holds it, else from the API server; its devices annotation
//!    decoded once), plan each requested container (pure), and *claim* the pod ([`claims`]): the
//!    cache shows the selected entries erased, so the next call passes over them, and a call
//!    that finds the same pod (its next container) waits until this claim has settled;
//! 2. **outside the lock**, so that concurrent calls overlap their fsyncs and round trips:
//!    recreate each per-container directory and publish its limits file atomically ([`disk`], on
//!    a blocking thread) while the node lock `hami.io/mutex.lock` is read (one node GET). HAMi's
//!    rule holds: when the lock names another pod than the one selected, the files are removed
//!    and the selection redone knowing the lock. Then one merge patch ([`pod_api`]) erases the
//!    entries from `hami.io/vgpu-devices-to-allocate` — adding `hami.io/bind-phase: success`
//!    when no NVIDIA entry is left — and carries the pod's `resourceVersion`, so the API server
//!    accepts it only if the pod read was current: a stale cache can never cause a wrong
//!    allocation. On 409 (or 404) the files are removed, the claim dropped, the pod read again
//!    from the API server and the allocation redone ([`allocator`], at most [`MAX_SELECT_ATTEMPTS`]
//!    times). Then the node lock is released (only if it still names this pod).
//!
//! Any other failure after the pod is found fails the allocation: gRPC error, `hami.io/bind-phase:
//! failed`, node lock released, an Event on the pod naming the path and the error, and nothing
//! from this call left on disk. The pod is never marked `success` before its files are durable.
//! Where the time goes is told by `tracing` spans ([`timing`]).

pub mod allocator;
pub mod claims;
pub mod disk;
pub mod no_follow;
pub mod pod_api;
pub mod timing;

use std::sync::Arc;

use tonic::Status;
use tracing::instrument::WithSubscriber as _;

pub use allocator::MAX_SELECT_ATTEMPTS;
pub use disk::{
    CONTAINER_DIR_MODE, DiskError, LOCK_DIR_MODE, LOCK_FILE_MODE, USAGE_CACHE_MODE, Written,
    create_container_dir, ensure_lock_dir, execute_plan, sweep_containers_dir,
};
pub use timing::{AllocateTiming, TimingLog};

use crate::allocation::plan::AllocationSettings;
use crate::allocation::shell::pod_lookup::cache::PodCache;
use crate::gpu::devices::DeviceTable;
use crate::kubelet::api::v1beta1;
use crate::kubelet::service::AllocateHandler;
use crate::metrics::Metrics;

/// The `Allocate` handler of hami-limits. Each call runs as its own task, so that a call whose
/// kubelet went away (its gRPC future dropped) still runs to a definite end: files and pod agree,
/// and its claim is settled.
pub struct Allocator {
    core: Arc<allocator::Core>,
    /// Where the calls report their spans instead of the process's subscriber (timings).
    dispatch: Option<tracing::Dispatch>,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.core.fmt(f)
    }
}

impl Allocator {
    /// An allocator for `node_name`. Removes leftover temporary files from the containers
    /// directory first (a warning if that fails: the allocations will say what is wrong).
    pub fn new(
        client: kube::Client,
        node_name: impl Into<String>,
        settings: AllocationSettings,
    ) -> Self {
        match sweep_containers_dir(&settings) {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(removed = n, dir = %settings.containers_dir().display(), "removed leftover temporary files")
            }
            Err(error) => tracing::warn!(%error, "cannot sweep the containers directory"),
        }
        Self {
            core: Arc::new(allocator::Core::new(client, node_name.into(), settings)),
            dispatch: None,
        }
    }

    /// The shared part, to set up before the first call (an `Allocator` is not `Clone`; only a
    /// running call shares it).
    fn setup(&mut self, f: impl FnOnce(&mut allocator::Core)) {
        match Arc::get_mut(&mut self.core) {
            Some(core) => f(core),
            None => tracing::warn!("allocator set up after its first call; setting ignored"),
        }
    }

    /// Reports every call (outcome, latency, files published, delivery mode) to `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.setup(|core| core.metrics = metrics);
        self
    }

    /// Reads pods from `cache` first (kept current by [`PodCache::run`]); the pods this allocator
    /// patches are put back into it.
    #[must_use]
    pub fn with_pod_cache(mut self, cache: Arc<PodCache>) -> Self {
        self.setup(|core| {
            core.api.set_cache(Arc::clone(&cache));
            core.cache = Some(cache);
        });
        self
    }

    /// Records every call's [`AllocateTiming`] into `log` (tests, benchmarks): the calls report
    /// their spans to [`TimingLog::dispatch`] instead of the process's subscriber, so they write
    /// no log lines.
    #[must_use]
    pub fn with_timings(mut self, log: Arc<TimingLog>) -> Self {
        self.dispatch = Some(TimingLog::dispatch(log));
        self
    }

    /// The settings in use.
    pub fn settings(&self) -> &AllocationSettings {
        &self.core.settings
    }
}

#[tonic::async_trait]
impl AllocateHandler for Allocator {
    async fn allocate(
        &self,
        devices: &DeviceTable,
        request: v1beta1::AllocateRequest,
    ) -> Result<v1beta1::AllocateResponse, Status> {
        self.allocate_steered(devices, Vec::new(), request).await
    }

    async fn allocate_steered(
        &self,
        devices: &DeviceTable,
        steered: Vec<bool>,
        request: v1beta1::AllocateRequest,
    ) -> Result<v1beta1::AllocateResponse, Status> {
        let core = Arc::clone(&self.core);
        let table = devices.clone();
        let call = async move {
            let call = allocator::Call {
                request: &request,
                table: &table,
                steered: &steered,
            };
            core.allocate(call).await
        };
        let task = match &self.dispatch {
            Some(dispatch) => tokio::spawn(call.with_subscriber(dispatch.clone())),
            None => tokio::spawn(call),
        };
        task.await
            .unwrap_or_else(|e| Err(Status::internal(format!("allocation task failed: {e}"))))
    }
}
