//! The composition root of `run` and `inventory`: loads the configuration (once), opens the GPU
//! inventory, connects to the API server, starts the pod cache, the allocator and its collector,
//! the node handshake, the ops server (`hami_ops`) and the kubelet side, and stops them in order.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::allocation::config::ConfigError;
use crate::allocation::pod_lookup::cache::PodCache;
use crate::allocation::pod_lookup::locator::KubePendingPod;
use crate::allocation::{collector, executor};
use crate::api;
use crate::cli::{RunArgs, SourceArgs};
use crate::devices::{DeviceTable, NoGpuError, SkippedGpu};
use crate::inventory::{FileInventory, Gpu, GpuInventory, InventoryError};
use crate::metrics::Metrics;
use crate::node_register::{self, ANNOTATION_NODE_NVIDIA_REGISTER, NodeRegisterConfig};
use crate::nvml::NvmlInventory;
use crate::plugin::{self, Lifecycle, LifecycleError};
use crate::service::{
    AllocateHandler, NoPendingPod, PendingPodDevices, SharedState, spawn_health_updates,
};
use crate::settings::{PluginSettings, SettingsError};

/// Why the binary stops with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// Configuration is invalid.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// GPUs could not be listed.
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    /// No GPU left to advertise.
    #[error(transparent)]
    NoGpu(#[from] NoGpuError),
    /// `run` without a node name.
    #[error("no node name: set HAMI_NODE_NAME (downward API spec.nodeName) or pass --node-name")]
    MissingNodeName,
    /// A duration flag is not a positive number of seconds.
    #[error("--{flag}={value} is not a positive number of seconds")]
    BadDuration {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: f64,
    },
    /// No API server configuration.
    #[error(
        "cannot configure the Kubernetes client (in-cluster service account or KUBECONFIG): {0}"
    )]
    Kube(#[from] kube::Error),
    /// SIGTERM/SIGINT handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    /// kubelet side failed.
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// Allocation settings are invalid (dynamic MIG, a bad config value).
    #[error(transparent)]
    Allocation(#[from] ConfigError),
    /// `--metrics-listen` is not an address, or cannot be bound.
    #[error("{0}")]
    MetricsListen(String),
    /// `plan` failed.
    #[error(transparent)]
    Plan(#[from] crate::allocation::dry_run::DryRunError),
    /// `install-hook` failed.
    #[error(transparent)]
    InstallHook(#[from] crate::install_hook::InstallHookError),
}

impl AppError {
    /// Exit status: 2 for configuration mistakes, 1 for everything else.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Settings(_)
            | Self::MissingNodeName
            | Self::BadDuration { .. }
            | Self::Allocation(_)
            | Self::MetricsListen(_)
            | Self::Plan(crate::allocation::dry_run::DryRunError::Config(_)) => 2,
            Self::InstallHook(e) => e.exit_code(),
            _ => 1,
        }
    }
}

/// The settings for this node from the files named in `source`.
pub fn load_settings(source: &SourceArgs) -> Result<PluginSettings, SettingsError> {
    let mut settings = PluginSettings::load(
        source.config.as_deref(),
        source.node_config.as_deref(),
        source.node_name.as_deref(),
    )?;
    settings.numa_topology |= source.numa_topology;
    Ok(settings)
}

/// The inventory backend: the file when given, else NVML.
pub fn open_inventory(source: &SourceArgs) -> Result<Box<dyn GpuInventory>, InventoryError> {
    match &source.inventory {
        Some(path) => Ok(Box::new(FileInventory::new(path))),
        None => Ok(Box::new(NvmlInventory::init()?)),
    }
}

fn seconds(flag: &'static str, value: f64) -> Result<Duration, AppError> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or(AppError::BadDuration { flag, value })
}

/// One kubelet device in the report.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportDevice {
    /// Device ID.
    pub id: String,
    /// `Healthy` / `Unhealthy`.
    pub health: String,
    /// NUMA node, when topology is attached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i64>,
}

/// What `inventory` prints.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InventoryReport {
    /// `nvml` or `file`.
    pub backend: String,
    /// Every GPU found.
    pub gpus: Vec<Gpu>,
    /// GPUs not advertised, with the reason.
    pub skipped: Vec<SkippedGpu>,
    /// The extended resource.
    pub resource_name: String,
    /// The plugin socket's file name.
    pub socket: String,
    /// Shares per GPU.
    pub split_count: u32,
    /// The list `ListAndWatch` would send.
    pub kubelet_devices: Vec<ReportDevice>,
    /// The node annotation key.
    pub node_annotation_key: String,
    /// The node annotation value, exactly as it would be patched.
    pub node_annotation: String,
}

/// Builds the `inventory` report.
pub fn inventory_report(source: &SourceArgs) -> Result<InventoryReport, AppError> {
    let settings = load_settings(source)?;
    let inventory = open_inventory(source)?;
    let gpus = inventory.discover()?;
    let (table, skipped) = DeviceTable::build(
        gpus.clone(),
        &settings.filter,
        settings.split_count,
        settings.numa_topology,
    )?;
    let annotation = node_register::register_annotation(&table, settings.scaling());
    let kubelet_devices = table
        .kubelet_devices()
        .into_iter()
        .map(|d| ReportDevice {
            id: d.id,
            health: d.health,
            numa_node: d.topology.and_then(|t| t.nodes.first().map(|n| n.id)),
        })
        .collect();
    Ok(InventoryReport {
        backend: inventory.backend().to_owned(),
        gpus,
        skipped,
        socket: plugin::socket_name(&settings.resource_name),
        resource_name: settings.resource_name,
        split_count: table.split_count(),
        kubelet_devices,
        node_annotation_key: ANNOTATION_NODE_NVIDIA_REGISTER.to_owned(),
        node_annotation: annotation,
    })
}

/// The report as text for people.
pub fn render_report(report: &InventoryReport) -> String {
    let mut out = format!("backend: {}\n", report.backend);
    for gpu in &report.gpus {
        out.push_str(&format!(
            "GPU {} {} {} {} MiB numa={} mig={} healthy={}\n",
            gpu.index,
            gpu.uuid,
            gpu.name,
            gpu.memory_mib,
            gpu.numa_node
                .map_or_else(|| "-".to_owned(), |n| n.to_string()),
            gpu.mig_enabled,
            gpu.healthy
        ));
    }
    for skipped in &report.skipped {
        out.push_str(&format!(
            "skipped {} (index {}): {}\n",
            skipped.uuid, skipped.index, skipped.reason
        ));
    }
    out.push_str(&format!(
        "resource {} on {}: {} devices ({} per GPU)\n",
        report.resource_name,
        report.socket,
        report.kubelet_devices.len(),
        report.split_count
    ));
    for device in &report.kubelet_devices {
        out.push_str(&format!("  {} {}\n", device.id, device.health));
    }
    out.push_str(&format!(
        "{}: {}\n",
        report.node_annotation_key, report.node_annotation
    ));
    out
}

/// What an allocate handler factory may use.
#[derive(Clone)]
pub struct RunContext {
    /// This node.
    pub node_name: String,
    /// Settings for this node.
    pub settings: PluginSettings,
    /// The API server client (absent with `--skip-node-register`).
    pub client: Option<kube::Client>,
    /// Where the settings came from.
    pub source: SourceArgs,
    /// Allocation flags.
    pub allocate: crate::cli::AllocateArgs,
    /// Where the allocator and the collector report.
    pub metrics: Arc<Metrics>,
    /// The watch-fed view of this node's pods (with a client), shared by `Allocate` and
    /// `GetPreferredAllocation`.
    pub pod_cache: Option<Arc<PodCache>>,
}

impl std::fmt::Debug for RunContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunContext")
            .field("node_name", &self.node_name)
            .field("settings", &self.settings)
            .field("client", &self.client.as_ref().map(|_| "kube::Client"))
            .finish()
    }
}

/// `run`: serves kubelet until `shutdown` completes. `make_allocate` builds the `Allocate`
/// handler from the resolved context (the extension point of the allocation logic).
pub async fn run(
    args: RunArgs,
    make_allocate: impl FnOnce(&RunContext) -> Result<Arc<dyn AllocateHandler>, AppError>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), AppError> {
    run_with_client(args, None, make_allocate, shutdown).await
}

/// [`run`] with a given API server client (tests, embedding); without one, the client comes from
/// the in-cluster service account or `KUBECONFIG` unless `--skip-node-register` is set.
pub async fn run_with_client(
    args: RunArgs,
    client: Option<kube::Client>,
    make_allocate: impl FnOnce(&RunContext) -> Result<Arc<dyn AllocateHandler>, AppError>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), AppError> {
    let options = RunOptions {
        client,
        ..RunOptions::default()
    };
    run_with_options(args, options, make_allocate, shutdown).await
}

/// What an embedder (a test) may hand to [`run_with_options`] instead of the flags.
#[derive(Default)]
pub struct RunOptions {
    /// The API server client (see [`run_with_client`]).
    pub client: Option<kube::Client>,
    /// An already-bound listener for `/healthz`, `/readyz`, `/metrics`, used instead of
    /// `--metrics-listen` (tests bind port 0 and read the address first).
    pub metrics_listener: Option<tokio::net::TcpListener>,
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("client", &self.client.as_ref().map(|_| "kube::Client"))
            .field("metrics_listener", &self.metrics_listener)
            .finish()
    }
}

/// [`run`] with [`RunOptions`].
pub async fn run_with_options(
    args: RunArgs,
    options: RunOptions,
    make_allocate: impl FnOnce(&RunContext) -> Result<Arc<dyn AllocateHandler>, AppError>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), AppError> {
    let RunOptions {
        client,
        metrics_listener,
    } = options;
    let metrics_listener = match metrics_listener {
        Some(listener) => Some(listener),
        None => match crate::metrics::parse_listen(&args.metrics_listen)
            .map_err(AppError::MetricsListen)?
        {
            Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                AppError::MetricsListen(format!("cannot listen on {addr} (--metrics-listen): {e}"))
            })?),
            None => None,
        },
    };
    let metrics = Arc::new(Metrics::new());
    let settings = load_settings(&args.source)?;
    let readiness = plugin::readiness(
        args.kubelet_dir
            .join(plugin::socket_name(&settings.resource_name)),
    );
    let node_name = args
        .source
        .node_name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or(AppError::MissingNodeName)?;
    let interval = seconds("register-interval", args.register_interval)?;
    let retry = seconds("register-retry", args.register_retry)?;
    let inventory = open_inventory(&args.source)?;
    let found = inventory.discover()?;
    let (table, skipped) = DeviceTable::build(
        found,
        &settings.filter,
        settings.split_count,
        settings.numa_topology,
    )?;
    for s in &skipped {
        tracing::warn!(gpu = %s.uuid, index = s.index, reason = %s.reason, "GPU not advertised");
    }
    for gpu in table.gpus() {
        tracing::info!(backend = inventory.backend(), gpu = %gpu.uuid, index = gpu.index, name = %gpu.name, memory_mib = gpu.memory_mib, "GPU advertised");
    }
    let client = match client {
        _ if args.skip_node_register => None,
        Some(client) => Some(client),
        None => Some(kube::Client::try_default().await?),
    };
    // The pods bound to this node, watched, so that Allocate and GetPreferredAllocation find
    // their pod without a LIST.
    let pod_cache = client.as_ref().map(|client| {
        let cache = PodCache::new();
        tokio::spawn(Arc::clone(&cache).run(
            client.clone(),
            node_name.clone(),
            std::future::pending(),
        ));
        cache
    });
    let context = RunContext {
        node_name: node_name.clone(),
        settings: settings.clone(),
        client: client.clone(),
        source: args.source.clone(),
        allocate: args.allocate.clone(),
        metrics: Arc::clone(&metrics),
        pod_cache: pod_cache.clone(),
    };
    let allocate = make_allocate(&context)?;
    let pending: Arc<dyn PendingPodDevices> = match (&client, pod_cache) {
        (Some(client), Some(cache)) => {
            Arc::new(KubePendingPod::new(client.clone(), node_name.clone()).with_pod_cache(cache))
        }
        (Some(client), None) => Arc::new(KubePendingPod::new(client.clone(), node_name.clone())),
        (None, _) => Arc::new(NoPendingPod),
    };
    let state = SharedState::new(
        table.clone(),
        settings.preferred_allocation,
        allocate,
        pending,
    );
    let (health_tx, health_rx) = mpsc::unbounded_channel();
    inventory.watch_health(table.gpus(), health_tx)?;
    spawn_health_updates(Arc::clone(&state), health_rx);

    let (stopping, stopped) = watch::channel(false);
    let until_stopped = || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let ops_task = metrics_listener.map(|listener| {
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, "serving /healthz, /readyz, /metrics");
        }
        let router = hami_ops::router(
            crate::metrics::renderer(Arc::clone(&metrics)),
            readiness.clone(),
        );
        tokio::spawn(hami_ops::serve(listener, router, until_stopped()))
    });
    let devices_task = {
        let mut table = state.table.subscribe();
        let metrics = Arc::clone(&metrics);
        let stop = until_stopped();
        tokio::spawn(async move {
            tokio::pin!(stop);
            loop {
                {
                    let t = table.borrow_and_update();
                    let healthy = t
                        .kubelet_devices()
                        .iter()
                        .filter(|d| d.health == api::HEALTHY)
                        .count();
                    let all = t.kubelet_devices().len();
                    metrics.set_devices(healthy, all - healthy);
                }
                tokio::select! {
                    () = &mut stop => return,
                    changed = table.changed() => if changed.is_err() { return },
                }
            }
        })
    };
    let register_task = client.map(|client| {
        let config = NodeRegisterConfig {
            node_name,
            interval,
            retry,
            scaling: settings.scaling(),
        };
        let table = state.table.subscribe();
        let metrics = Arc::clone(&metrics);
        let stop = until_stopped();
        tokio::spawn(async move {
            node_register::run_node_register_observed(client, config, table, &metrics, stop).await;
        })
    });
    let mut lifecycle = Lifecycle::new(&args.kubelet_dir, &settings.resource_name);
    lifecycle.watch_interval = Duration::from_millis(args.kubelet_watch_ms.max(10));
    let result = plugin::serve_observed(lifecycle, state, &metrics, &readiness, shutdown).await;
    let _ = stopping.send(true);
    if let Some(task) = register_task {
        let _ = task.await;
    }
    let _ = devices_task.await;
    if let Some(task) = ops_task {
        match task.await {
            Ok(Err(error)) => tracing::warn!(%error, "metrics server ended with an error"),
            Err(error) => tracing::warn!(%error, "metrics server task failed"),
            Ok(Ok(())) => {}
        }
    }
    result.map_err(AppError::from)
}

/// The `Allocate` handler `run` installs: the [`executor::Allocator`] with its settings from the
/// device and node config (dynamic MIG refused here, at start), reading pods from the run's
/// [`pod_cache::PodCache`] (fed by a watch of the node's pods), and the [`collector::Collector`]
/// started beside it. Without an API server client (`--skip-node-register`) the pod cannot be
/// found, so only `NVIDIA_VISIBLE_DEVICES` is answered, with a warning.
pub fn make_allocate_handler(ctx: &RunContext) -> Result<Arc<dyn AllocateHandler>, AppError> {
    // From the settings loaded at start: the configuration files are read once.
    let settings = crate::allocation::config::from_plugin_settings(
        &ctx.settings,
        ctx.source.node_config.as_deref(),
        &ctx.node_name,
        &ctx.allocate.hook_path,
    )?;
    let seconds = |flag: &'static str, value: f64| {
        std::time::Duration::try_from_secs_f64(value)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or(AppError::BadDuration { flag, value })
    };
    let collect = collector::CollectorSettings {
        interval: seconds("collect-interval", ctx.allocate.collect_interval)?,
        grace: seconds("collect-grace", ctx.allocate.collect_grace)?,
    };
    let Some(client) = &ctx.client else {
        tracing::warn!(
            "no API server (--skip-node-register): Allocate answers NVIDIA_VISIBLE_DEVICES only, without limits"
        );
        return Ok(Arc::new(crate::service::VisibleDevicesOnly));
    };
    tracing::info!(
        hook_path = %settings.hook_path.display(),
        memory_scaling = settings.memory_scaling,
        disable_core_limit = settings.disable_core_limit,
        node_delivery = ?settings.node_delivery.map(|d| d.as_str()),
        global_delivery = ?settings.global_delivery.map(|d| d.as_str()),
        collect_interval_s = collect.interval.as_secs_f64(),
        collect_grace_s = collect.grace.as_secs_f64(),
        "allocation settings"
    );
    let collector = collector::Collector::new(
        client.clone(),
        ctx.node_name.clone(),
        settings.containers_dir(),
        collect,
    )
    .with_metrics(Arc::clone(&ctx.metrics));
    tokio::spawn(collector.run(std::future::pending()));
    let mut allocator = executor::Allocator::new(client.clone(), ctx.node_name.clone(), settings)
        .with_metrics(Arc::clone(&ctx.metrics));
    if let Some(pods) = &ctx.pod_cache {
        allocator = allocator.with_pod_cache(Arc::clone(pods));
    }
    Ok(Arc::new(allocator))
}
