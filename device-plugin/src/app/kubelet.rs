//! The kubelet side of `run`: the GPUs (or the wait for them, across kubelet restarts), one
//! device plugin per advertised resource, their health and the device gauges.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hami_ops::Readiness;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::ops::OpsServer;
use super::{AppError, Discovered, discover};
use crate::allocation::plan::device_list::{DeviceListSettings, NodeDevices};
use crate::allocation::shell::mig::MigAllocate;
use crate::cli::{RunArgs, SourceArgs};
use crate::gpu::devices::{Advertised, DeviceTable};
use crate::gpu::health::HealthCheckPolicy;
use crate::gpu::inventory::{Gpu, GpuInventory, InventoryError};
use crate::gpu::mig::MigStrategy;
use crate::kubelet::api;
use crate::kubelet::plugin::{self, Lifecycle};
use crate::kubelet::service::{AllocateHandler, PendingPodDevices, SharedState, health_updates};
use crate::metrics::Metrics;
use crate::settings::PluginSettings;

/// How often the device-plugin directory is checked (kubelet restart, lost socket).
pub(super) fn watch_interval(args: &RunArgs) -> Duration {
    Duration::from_millis(args.kubelet_watch_ms.max(10))
}

/// GPUs, or the wait for them (HAMi's start loop: "No devices found. Waiting indefinitely.",
/// looking again when kubelet restarts). `None`: `shutdown` came while waiting.
pub(super) async fn wait_for_gpus<S: Future<Output = ()>>(
    args: &RunArgs,
    settings: &PluginSettings,
    ops: &OpsServer,
    metrics: &Metrics,
    shutdown: &mut Pin<&mut S>,
) -> crate::Result<Option<Discovered>> {
    let kubelet_socket = args.kubelet_dir.join(api::KUBELET_SOCKET);
    loop {
        let reason = match discover(&args.source, settings) {
            Ok(discovered) if !discovered.2.resources.is_empty() => return Ok(Some(discovered)),
            Ok((_, _, advertised)) => advertised.no_gpu().to_string(),
            Err(AppError::Inventory(InventoryError::NvmlUnavailable(reason)))
                if !args.gpu.fail_on_init_error =>
            {
                format!("NVML is not available ({reason}) and FAIL_ON_INIT_ERROR is false")
            }
            Err(error) => return Err(error),
        };
        ops.probes.set_waiting(true);
        ops.readiness.set(plugin::READY_REGISTERED, true);
        metrics.set_devices(0, 0);
        // Logged once the probes say so: whoever reads the line may probe at once.
        tracing::warn!(%reason, "No devices found. Waiting indefinitely.");
        if !kubelet_restarted(&kubelet_socket, watch_interval(args), shutdown).await {
            return Ok(None);
        }
        tracing::info!("kubelet.sock recreated (kubelet restarted); looking for GPUs again");
        ops.readiness.set(plugin::READY_REGISTERED, false);
        ops.probes.set_waiting(false);
    }
}

/// Waits until `socket` is recreated (`true`) or `shutdown` completes (`false`).
pub(super) async fn kubelet_restarted<S: Future<Output = ()>>(
    socket: &Path,
    interval: Duration,
    shutdown: &mut Pin<&mut S>,
) -> bool {
    let seen = plugin_identity(socket);
    loop {
        tokio::select! {
            () = shutdown.as_mut() => return false,
            () = tokio::time::sleep(interval) => {}
        }
        let now = plugin_identity(socket);
        if now.is_some() && now != seen {
            return true;
        }
    }
}

/// What is advertised, what is not and why.
pub(super) fn log_advertised(
    source: &SourceArgs,
    inventory: &dyn GpuInventory,
    found: &[Gpu],
    advertised: &Advertised,
) {
    for s in &advertised.skipped {
        tracing::warn!(gpu = %s.uuid, index = s.index, reason = %s.reason, "GPU not advertised");
    }
    if source.mig_strategy == MigStrategy::None {
        for gpu in found.iter().filter(|g| g.mig_enabled) {
            tracing::warn!(gpu = %gpu.uuid, index = gpu.index, "MIG mode is enabled on this GPU but MIG_STRATEGY is none: it is advertised as a whole GPU split into shares, as HAMi does; set MIG_STRATEGY=single or mixed to advertise its MIG devices");
        }
    }
    for resource in &advertised.resources {
        for gpu in resource.table.gpus() {
            tracing::info!(backend = inventory.backend(), resource = %resource.resource_name, gpu = %gpu.uuid, index = gpu.index, name = %gpu.name, memory_mib = gpu.memory_mib, "GPU advertised");
        }
    }
}

/// One plugin per resource: GPU shares get the HAMi-core allocation, MIG devices the device
/// list alone (refused here when the device list settings cannot be honoured for one of them).
pub(super) fn plugin_states(
    advertised: &Advertised,
    settings: &PluginSettings,
    (device_list, node_devices): (&DeviceListSettings, &NodeDevices),
    allocate: &Arc<dyn AllocateHandler>,
    pending: &Arc<dyn PendingPodDevices>,
) -> crate::Result<Vec<(String, Arc<SharedState>)>> {
    let mut states = Vec::with_capacity(advertised.resources.len());
    for r in &advertised.resources {
        let handler: Arc<dyn AllocateHandler> = if r.table.is_mig() {
            let mig = MigAllocate::new(device_list.clone(), node_devices.clone(), &r.table)
                .map_err(|source| AppError::MigDeviceList {
                    resource: r.resource_name.clone(),
                    source,
                })?;
            Arc::new(mig)
        } else {
            Arc::clone(allocate)
        };
        let state = SharedState::new(
            r.table.clone(),
            settings.preferred_allocation,
            handler,
            Arc::clone(pending),
        );
        states.push((r.resource_name.clone(), state));
    }
    Ok(states)
}

/// Watches the health of the GPUs behind the advertised devices and feeds every plugin's table.
pub(super) fn watch_health(
    inventory: &dyn GpuInventory,
    found: &[Gpu],
    advertised: &Advertised,
    policy: &HealthCheckPolicy,
    states: &[(String, Arc<SharedState>)],
    tasks: &super::tasks::TaskStop,
) -> crate::Result<()> {
    let watched: Vec<String> = advertised
        .resources
        .iter()
        .flat_map(|r| r.table.physical_gpus())
        .collect();
    let watched_gpus: Vec<Gpu> = found
        .iter()
        .filter(|g| watched.contains(&g.uuid))
        .cloned()
        .collect();
    let (health_tx, health_rx) = mpsc::unbounded_channel();
    inventory.watch_health(&watched_gpus, policy, health_tx)?;
    // On the stop, the receiver is dropped: the watch sees its channel closed and ends.
    let updates = health_updates(
        states.iter().map(|(_, s)| Arc::clone(s)).collect(),
        health_rx,
    );
    let stop = tasks.until_stopped();
    tasks.spawn(async move {
        tokio::select! {
            () = stop => {}
            () = updates => {}
        }
    });
    Ok(())
}

/// Serves every plugin until one fails or `shutdown` completes; `/readyz` then covers them all.
pub(super) async fn serve_plugins<S: Future<Output = ()>>(
    args: &RunArgs,
    states: &[(String, Arc<SharedState>)],
    ops: &OpsServer,
    metrics: &Arc<Metrics>,
    shutdown: &mut Pin<&mut S>,
) -> crate::Result<()> {
    let (plugins_stop, plugins_stopped) = watch::channel(false);
    let mut others = Vec::new();
    let mut serving = Vec::new();
    for (i, (resource, state)) in states.iter().enumerate() {
        let mut lifecycle = Lifecycle::new(&args.kubelet_dir, resource);
        lifecycle.watch_interval = watch_interval(args);
        let ready = if i == 0 {
            ops.readiness.clone()
        } else {
            let own = Readiness::new(&[plugin::READY_REGISTERED]);
            others.push(own.clone());
            own
        };
        let mut stop = plugins_stopped.clone();
        let state = Arc::clone(state);
        let metrics = Arc::clone(metrics);
        serving.push(async move {
            plugin::serve_observed(lifecycle, state, &metrics, &ready, async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await
        });
    }
    ops.probes.set_plugins(
        states
            .iter()
            .map(|(resource, _)| args.kubelet_dir.join(plugin::socket_name(resource)))
            .collect(),
        others,
    );
    ops.probes.set_waiting(false);
    let serving = futures::future::try_join_all(serving);
    tokio::pin!(serving);
    let result = tokio::select! {
        result = &mut serving => result,
        () = shutdown.as_mut() => {
            let _ = plugins_stop.send(true);
            serving.await
        }
    };
    let _ = plugins_stop.send(true);
    result.map(|_| ()).map_err(AppError::from)
}

/// The identity (device, inode) of a file, to tell a recreated `kubelet.sock` from the one seen.
pub(super) fn plugin_identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Keeps the device gauges current over every resource's table until `stop`.
pub(super) fn spawn_device_counts(
    states: &[(String, Arc<SharedState>)],
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    let mut tables: Vec<watch::Receiver<DeviceTable>> =
        states.iter().map(|(_, s)| s.table.subscribe()).collect();
    tokio::spawn(async move {
        tokio::pin!(stop);
        loop {
            let (mut healthy, mut all) = (0, 0);
            for table in &mut tables {
                let t = table.borrow_and_update();
                let devices = t.kubelet_devices();
                healthy += devices.iter().filter(|d| d.health == api::HEALTHY).count();
                all += devices.len();
            }
            metrics.set_devices(healthy, all - healthy);
            let changed =
                futures::future::select_all(tables.iter_mut().map(|t| Box::pin(t.changed())));
            tokio::select! {
                () = &mut stop => return,
                (changed, _, _) = changed => if changed.is_err() { return },
            }
        }
    })
}
