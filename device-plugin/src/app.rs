//! The composition root of `run` and `inventory`: loads the configuration (once), opens the GPU
//! inventory, connects to the API server, starts the pod cache, the allocator and its collector,
//! the node handshake, the ops server (`hami_ops`) and the kubelet side, and stops them in order.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::allocation::config::ConfigError;
use crate::allocation::mig::MigAllocate;
use crate::allocation::pod_lookup::cache::PodCache;
use crate::allocation::pod_lookup::locator::KubePendingPod;
use crate::allocation::{collector, executor};
use crate::cli::{RunArgs, SourceArgs};
use crate::gpu::devices::{
    AdvertiseSettings, Advertised, DeviceTable, MigLayoutError, NoGpuError, SkippedGpu, advertise,
};
use crate::gpu::health::HealthCheckPolicy;
use crate::gpu::inventory::{FileInventory, Gpu, GpuInventory, InventoryError};
use crate::gpu::mig::MigStrategy;
use crate::gpu::nvml::NvmlInventory;
use crate::gpu::topology;
use crate::kubelet::api;
use crate::kubelet::plugin::{self, Lifecycle, LifecycleError};
use crate::kubelet::service::{
    AllocateHandler, NoPendingPod, PendingPodDevices, SharedState, spawn_health_updates_all,
};
use crate::metrics::Metrics;
use crate::node_register::{self, ANNOTATION_NODE_NVIDIA_REGISTER, NodeRegisterConfig};
use crate::settings::{PluginSettings, SettingsError};
use hami_ops::Readiness;

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
    /// A MIG layout the strategy refuses (as HAMi does).
    #[error(transparent)]
    MigLayout(#[from] MigLayoutError),
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
    /// The device list settings cannot be honoured for a MIG resource's devices.
    #[error(
        "{resource}: {source}; set PASS_DEVICE_SPECS=false or use a CDI device list strategy, or give the MIG devices their device nodes"
    )]
    MigDeviceList {
        /// The resource, e.g. `nvidia.com/mig-1g.18gb`.
        resource: String,
        /// Why.
        source: crate::allocation::device_list::DeviceListError,
    },
    /// `--metrics-listen` is not an address, or cannot be bound.
    #[error("{0}")]
    MetricsListen(String),
    /// `plan` failed.
    #[error(transparent)]
    Plan(#[from] crate::commands::plan::DryRunError),
    /// `install-hook` failed.
    #[error(transparent)]
    InstallHook(#[from] crate::commands::install_hook::InstallHookError),
    /// `ENABLE_TOPOLOGY_SCORE=true` but the links between GPUs cannot be read.
    #[error(
        "{}=true: cannot read how the GPUs are linked: {source}",
        topology::ENV_ENABLE_TOPOLOGY_SCORE
    )]
    TopologyLinks {
        /// What the GPU source said.
        source: InventoryError,
    },
    /// `ENABLE_TOPOLOGY_SCORE=true` but the links do not cover the advertised GPUs.
    #[error("{env}=true: {0}", env = topology::ENV_ENABLE_TOPOLOGY_SCORE)]
    Topology(#[from] topology::TopologyError),
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
            | Self::Plan(crate::commands::plan::DryRunError::Config(_)) => 2,
            Self::InstallHook(e) => e.exit_code(),
            _ => 1,
        }
    }
}

/// The process environment's variables for the layered loader (`HAMI_NVIDIA__*` over the device
/// config): the one place the plugin reads them (`main.rs` hands them to `plan` too).
pub fn config_environment() -> impl Iterator<Item = (String, String)> {
    std::env::vars()
}

/// The settings for this node from the files named in `source` and the process environment.
pub fn load_settings(source: &SourceArgs) -> Result<PluginSettings, SettingsError> {
    let mut settings = PluginSettings::load(
        source.config.as_deref(),
        source.node_config.as_deref(),
        source.node_name.as_deref(),
        config_environment(),
    )?;
    settings.numa_topology |= source.numa_topology;
    Ok(settings)
}

/// `hami.io/node-nvidia-score` for the advertised GPUs when `--enable-topology-score`
/// (`ENABLE_TOPOLOGY_SCORE=true`), from the GPU source's links; `None` when off. A pair HAMi
/// would call asymmetric (scored 0) is logged as a warning.
pub fn node_score(
    source: &SourceArgs,
    inventory: &dyn GpuInventory,
    table: &DeviceTable,
) -> Result<Option<topology::Scores>, AppError> {
    if !source.topology_score {
        return Ok(None);
    }
    let links = inventory
        .gpu_links()
        .map_err(|source| AppError::TopologyLinks { source })?;
    let uuids: Vec<&str> = table.gpus().iter().map(|g| g.uuid.as_str()).collect();
    let scores = topology::gpu_scores(&uuids, &links)?;
    for (a, b) in &scores.asymmetric {
        // The node register loop also raises HAMi's Warning Event `AsymmetricGPUP2PLink` (hourly).
        tracing::warn!(gpu = %a, peer = %b, reason = "AsymmetricGPUP2PLink", "the two GPUs report different P2P links to each other; the pair is scored 0 (possible NVLink hardware or driver issue)");
    }
    Ok(Some(scores))
}

/// The inventory backend: the file when given, else NVML.
pub fn open_inventory(source: &SourceArgs) -> Result<Box<dyn GpuInventory>, InventoryError> {
    match &source.inventory {
        Some(path) => Ok(Box::new(FileInventory::new(path))),
        None => Ok(Box::new(
            NvmlInventory::init()?.with_mig_devices(source.mig_strategy != MigStrategy::None),
        )),
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
    /// The first advertised resource (`resourceCountName`, unless every GPU is in MIG mode).
    pub resource_name: String,
    /// Its plugin socket's file name.
    pub socket: String,
    /// Shares per GPU.
    pub split_count: u32,
    /// The list `ListAndWatch` would send.
    pub kubelet_devices: Vec<ReportDevice>,
    /// Every advertised resource (the first is the one above; static MIG adds more).
    pub resources: Vec<ReportResource>,
    /// The node annotation key.
    pub node_annotation_key: String,
    /// The node annotation value, exactly as it would be patched.
    pub node_annotation: String,
    /// `hami.io/node-nvidia-score`, exactly as it would be patched (`--enable-topology-score`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_score_annotation: Option<String>,
}

/// One advertised resource in the report.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportResource {
    /// The extended resource.
    pub resource_name: String,
    /// The plugin socket's file name.
    pub socket: String,
    /// `true` for MIG devices (advertised whole, no HAMi-core).
    pub mig: bool,
    /// The list `ListAndWatch` would send.
    pub kubelet_devices: Vec<ReportDevice>,
}

fn report_devices(table: &DeviceTable) -> Vec<ReportDevice> {
    table
        .kubelet_devices()
        .into_iter()
        .map(|d| ReportDevice {
            id: d.id,
            health: d.health,
            numa_node: d.topology.and_then(|t| t.nodes.first().map(|n| n.id)),
        })
        .collect()
}

/// Builds the `inventory` report.
pub fn inventory_report(source: &SourceArgs) -> Result<InventoryReport, AppError> {
    let settings = load_settings(source)?;
    let inventory = open_inventory(source)?;
    let gpus = inventory.discover()?;
    let advertised = advertise(gpus.clone(), &advertise_settings(source, &settings))?;
    let Some(first) = advertised.resources.first() else {
        return Err(AppError::NoGpu(advertised.no_gpu()));
    };
    let registered = advertised
        .resource(&settings.resource_name)
        .map(|r| r.table.clone())
        .unwrap_or_else(|| DeviceTable::shares(Vec::new(), settings.split_count, false));
    let annotation = node_register::register_annotation(&registered, settings.scaling());
    let node_score_annotation =
        node_score(source, inventory.as_ref(), &registered)?.map(|s| s.annotation());
    let resources = advertised
        .resources
        .iter()
        .map(|r| ReportResource {
            resource_name: r.resource_name.clone(),
            socket: plugin::socket_name(&r.resource_name),
            mig: r.table.is_mig(),
            kubelet_devices: report_devices(&r.table),
        })
        .collect();
    Ok(InventoryReport {
        backend: inventory.backend().to_owned(),
        gpus,
        skipped: advertised.skipped.clone(),
        socket: plugin::socket_name(&first.resource_name),
        resource_name: first.resource_name.clone(),
        split_count: first.table.split_count(),
        kubelet_devices: report_devices(&first.table),
        resources,
        node_annotation_key: ANNOTATION_NODE_NVIDIA_REGISTER.to_owned(),
        node_annotation: annotation,
        node_score_annotation,
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
        for mig in &gpu.mig_devices {
            out.push_str(&format!(
                "  MIG {} {} {} MiB healthy={}\n",
                mig.uuid, mig.profile, mig.memory_mib, mig.healthy
            ));
        }
    }
    for skipped in &report.skipped {
        out.push_str(&format!(
            "skipped {} (index {}): {}\n",
            skipped.uuid, skipped.index, skipped.reason
        ));
    }
    for resource in &report.resources {
        let per = if resource.mig {
            "MIG devices, no HAMi-core".to_owned()
        } else {
            format!("{} per GPU", report.split_count)
        };
        out.push_str(&format!(
            "resource {} on {}: {} devices ({per})\n",
            resource.resource_name,
            resource.socket,
            resource.kubelet_devices.len(),
        ));
        for device in &resource.kubelet_devices {
            out.push_str(&format!("  {} {}\n", device.id, device.health));
        }
    }
    out.push_str(&format!(
        "{}: {}\n",
        report.node_annotation_key, report.node_annotation
    ));
    if let Some(score) = &report.node_score_annotation {
        out.push_str(&format!(
            "{}: {score}\n",
            topology::ANNOTATION_NODE_NVIDIA_SCORE
        ));
    }
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
    /// The device list settings (`DEVICE_LIST_STRATEGY`, …), parsed once at start, for GPU
    /// shares and MIG devices alike.
    pub device_list: crate::allocation::device_list::DeviceListSettings,
    /// The advertised GPUs' and MIG devices' index and device nodes by UUID (for
    /// `DEVICE_ID_STRATEGY=index` and `PASS_DEVICE_SPECS`).
    pub node_devices: crate::allocation::device_list::NodeDevices,
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
    tokio::pin!(shutdown);
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
    let node_name = args
        .source
        .node_name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or(AppError::MissingNodeName)?;
    let interval = seconds("register-interval", args.register_interval)?;
    let retry = seconds("register-retry", args.register_retry)?;
    let policy = HealthCheckPolicy::new(
        args.gpu.disable_healthchecks.as_deref(),
        args.gpu.enable_healthchecks.as_deref(),
    );
    for (key, item) in policy.malformed() {
        tracing::warn!(env = key, value = %item, accepted = "an Xid number, `all` or `xids`", "ignoring a malformed Xid, as HAMi does");
    }
    if policy.all_disabled() {
        tracing::warn!(
            env = crate::gpu::health::ENV_DISABLE_HEALTHCHECKS,
            "GPU health checks disabled"
        );
    }
    if let Some(written) = settings
        .node
        .as_ref()
        .and_then(|n| n.mig_strategy.as_deref())
    {
        tracing::warn!(
            node_config = "migstrategy",
            value = written,
            used = %args.source.mig_strategy,
            "the node entry's migstrategy is ignored, as HAMi v2.10 ignores it: the strategy is MIG_STRATEGY (--mig-strategy)"
        );
    }

    // The ops server first: its probes answer while the plugin waits for GPUs.
    let (stopping, stopped) = watch::channel(false);
    let until_stopped = || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let probes = Arc::new(ReadinessProbes::default());
    let readiness = {
        let probes = Arc::clone(&probes);
        Readiness::new(&[plugin::READY_REGISTERED])
            .with_probe(plugin::READY_SOCKET, move || probes.sockets_ready())
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
    let stop_ops = |stopping: watch::Sender<bool>| async move {
        let _ = stopping.send(true);
        if let Some(task) = ops_task {
            match task.await {
                Ok(Err(error)) => tracing::warn!(%error, "metrics server ended with an error"),
                Err(error) => tracing::warn!(%error, "metrics server task failed"),
                Ok(Ok(())) => {}
            }
        }
    };

    // GPUs, or the wait for them (HAMi's start loop: "No devices found. Waiting indefinitely.",
    // looking again when kubelet restarts).
    let kubelet_socket = args.kubelet_dir.join(api::KUBELET_SOCKET);
    let watch_interval = Duration::from_millis(args.kubelet_watch_ms.max(10));
    let (inventory, found, advertised) = loop {
        let reason = match discover(&args.source, &settings) {
            Ok((inventory, found, advertised)) if !advertised.resources.is_empty() => {
                break (inventory, found, advertised);
            }
            Ok((_, _, advertised)) => advertised.no_gpu().to_string(),
            Err(AppError::Inventory(InventoryError::NvmlUnavailable(reason)))
                if !args.gpu.fail_on_init_error =>
            {
                format!("NVML is not available ({reason}) and FAIL_ON_INIT_ERROR is false")
            }
            Err(error) => {
                stop_ops(stopping).await;
                return Err(error);
            }
        };
        tracing::warn!(%reason, "No devices found. Waiting indefinitely.");
        probes.set_waiting(true);
        readiness.set(plugin::READY_REGISTERED, true);
        metrics.set_devices(0, 0);
        let seen = plugin_identity(&kubelet_socket);
        let restarted = loop {
            tokio::select! {
                () = &mut shutdown => break false,
                () = tokio::time::sleep(watch_interval) => {}
            }
            let now = plugin_identity(&kubelet_socket);
            if now.is_some() && now != seen {
                break true;
            }
        };
        if !restarted {
            tracing::info!("stopped while waiting for GPUs");
            stop_ops(stopping).await;
            return Ok(());
        }
        tracing::info!("kubelet.sock recreated (kubelet restarted); looking for GPUs again");
        readiness.set(plugin::READY_REGISTERED, false);
        probes.set_waiting(false);
    };
    for s in &advertised.skipped {
        tracing::warn!(gpu = %s.uuid, index = s.index, reason = %s.reason, "GPU not advertised");
    }
    if args.source.mig_strategy == MigStrategy::None {
        for gpu in found.iter().filter(|g| g.mig_enabled) {
            tracing::warn!(gpu = %gpu.uuid, index = gpu.index, "MIG mode is enabled on this GPU but MIG_STRATEGY is none: it is advertised as a whole GPU split into shares, as HAMi does; set MIG_STRATEGY=single or mixed to advertise its MIG devices");
        }
    }
    for resource in &advertised.resources {
        for gpu in resource.table.gpus() {
            tracing::info!(backend = inventory.backend(), resource = %resource.resource_name, gpu = %gpu.uuid, index = gpu.index, name = %gpu.name, memory_mib = gpu.memory_mib, "GPU advertised");
        }
    }
    // Over the GPUs of the register annotation (HAMi: `GetDevicesUUIDList` of the same list).
    let scored = advertised
        .resource(&settings.resource_name)
        .map(|r| r.table.clone())
        .unwrap_or_else(|| DeviceTable::shares(Vec::new(), settings.split_count, false));
    let score = match node_score(&args.source, inventory.as_ref(), &scored) {
        Ok(score) => score,
        Err(error) => {
            stop_ops(stopping).await;
            return Err(error);
        }
    };
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
    let device_list =
        match crate::allocation::config::device_list_settings(&args.allocate.device_list) {
            Ok((device_list, notes)) => {
                for note in &notes {
                    tracing::warn!("{note}");
                }
                device_list
            }
            Err(error) => {
                stop_ops(stopping).await;
                return Err(error.into());
            }
        };
    let context = RunContext {
        node_name: node_name.clone(),
        settings: settings.clone(),
        client: client.clone(),
        source: args.source.clone(),
        allocate: args.allocate.clone(),
        device_list,
        // Every GPU and MIG device found (index and device nodes); the scheduler assigns only
        // advertised ones.
        node_devices: crate::allocation::device_list::NodeDevices::from_gpus(&found),
        metrics: Arc::clone(&metrics),
        pod_cache: pod_cache.clone(),
    };
    let allocate = match make_allocate(&context) {
        Ok(allocate) => allocate,
        Err(error) => {
            stop_ops(stopping).await;
            return Err(error);
        }
    };
    let pending: Arc<dyn PendingPodDevices> = match (&client, pod_cache) {
        (Some(client), Some(cache)) => {
            Arc::new(KubePendingPod::new(client.clone(), node_name.clone()).with_pod_cache(cache))
        }
        (Some(client), None) => Arc::new(KubePendingPod::new(client.clone(), node_name.clone())),
        (None, _) => Arc::new(NoPendingPod),
    };
    // One plugin per resource: GPU shares get the HAMi-core allocation, MIG devices none.
    let mut states: Vec<(String, Arc<SharedState>)> = Vec::new();
    for r in &advertised.resources {
        let handler: Arc<dyn AllocateHandler> = if r.table.is_mig() {
            let mig = MigAllocate::new(
                context.device_list.clone(),
                context.node_devices.clone(),
                &r.table,
            );
            match mig {
                Ok(mig) => Arc::new(mig),
                Err(error) => {
                    stop_ops(stopping).await;
                    return Err(AppError::MigDeviceList {
                        resource: r.resource_name.clone(),
                        source: error,
                    });
                }
            }
        } else {
            Arc::clone(&allocate)
        };
        let state = SharedState::new(
            r.table.clone(),
            settings.preferred_allocation,
            handler,
            Arc::clone(&pending),
        );
        states.push((r.resource_name.clone(), state));
    }
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
    if let Err(error) = inventory.watch_health(&watched_gpus, &policy, health_tx) {
        stop_ops(stopping).await;
        return Err(error.into());
    }
    spawn_health_updates_all(
        states.iter().map(|(_, s)| Arc::clone(s)).collect(),
        health_rx,
    );

    let devices_task = spawn_device_counts(&states, Arc::clone(&metrics), until_stopped);
    // The HAMi scheduler schedules resourceCountName: the node annotation lists that resource's
    // devices (with `single` and every GPU in MIG mode, the MIG devices under nvidia.com/gpu),
    // and none under `mixed` when every GPU is in MIG mode (HAMi's MIG plugins would each
    // overwrite the annotation with their own devices).
    let registered = states
        .iter()
        .find(|(name, _)| *name == settings.resource_name)
        .map(|(_, state)| state.table.subscribe());
    let (_no_devices, unregistered) = watch::channel(DeviceTable::shares(
        Vec::new(),
        settings.split_count,
        settings.numa_topology,
    ));
    let register_task = client.map(|client| {
        let config = NodeRegisterConfig {
            node_name,
            interval,
            retry,
            scaling: settings.scaling(),
            score: score.as_ref().map(topology::Scores::annotation),
            asymmetric_links: score.map(|s| s.asymmetric).unwrap_or_default(),
        };
        let table = registered.unwrap_or(unregistered);
        let metrics = Arc::clone(&metrics);
        let stop = until_stopped();
        tokio::spawn(async move {
            node_register::run_node_register_observed(client, config, table, &metrics, stop).await;
        })
    });

    let (plugins_stop, plugins_stopped) = watch::channel(false);
    let mut others = Vec::new();
    let mut serving = Vec::new();
    for (i, (resource, state)) in states.iter().enumerate() {
        let mut lifecycle = Lifecycle::new(&args.kubelet_dir, resource);
        lifecycle.watch_interval = watch_interval;
        let ready = if i == 0 {
            readiness.clone()
        } else {
            let own = Readiness::new(&[plugin::READY_REGISTERED]);
            others.push(own.clone());
            own
        };
        let mut stop = plugins_stopped.clone();
        let state = Arc::clone(state);
        let metrics = Arc::clone(&metrics);
        serving.push(async move {
            plugin::serve_observed(lifecycle, state, &metrics, &ready, async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await
        });
    }
    probes.set_plugins(
        states
            .iter()
            .map(|(resource, _)| args.kubelet_dir.join(plugin::socket_name(resource)))
            .collect(),
        others,
    );
    probes.set_waiting(false);
    let serving = futures::future::try_join_all(serving);
    tokio::pin!(serving);
    let result = tokio::select! {
        result = &mut serving => result,
        () = &mut shutdown => {
            let _ = plugins_stop.send(true);
            serving.await
        }
    };
    let _ = plugins_stop.send(true);
    let _ = stopping.send(true);
    if let Some(task) = register_task {
        let _ = task.await;
    }
    let _ = devices_task.await;
    stop_ops(stopping).await;
    result.map(|_| ()).map_err(AppError::from)
}

/// The identity (device, inode) of a file, to tell a recreated `kubelet.sock` from the one seen.
fn plugin_identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// What `/readyz` probes beyond the first plugin's registration: every plugin socket present,
/// the other resources' plugins registered; or, while waiting for GPUs, nothing (the plugin is
/// where it should be, and a DaemonSet rollout must not stall on a node without GPUs).
#[derive(Debug, Default)]
struct ReadinessProbes {
    waiting: std::sync::atomic::AtomicBool,
    plugins: std::sync::OnceLock<(Vec<std::path::PathBuf>, Vec<Readiness>)>,
}

impl ReadinessProbes {
    fn set_waiting(&self, waiting: bool) {
        self.waiting
            .store(waiting, std::sync::atomic::Ordering::Release);
    }

    fn set_plugins(&self, sockets: Vec<std::path::PathBuf>, others: Vec<Readiness>) {
        let _ = self.plugins.set((sockets, others));
    }

    fn sockets_ready(&self) -> bool {
        if self.waiting.load(std::sync::atomic::Ordering::Acquire) {
            return true;
        }
        self.plugins.get().is_some_and(|(sockets, others)| {
            sockets.iter().all(|s| s.exists()) && others.iter().all(Readiness::is_ready)
        })
    }
}

/// Keeps the device gauges current over every resource's table.
fn spawn_device_counts<F, Fut>(
    states: &[(String, Arc<SharedState>)],
    metrics: Arc<Metrics>,
    until_stopped: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut tables: Vec<watch::Receiver<DeviceTable>> =
        states.iter().map(|(_, s)| s.table.subscribe()).collect();
    let stop = until_stopped();
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

/// The inventory backend, the GPUs it listed, and what is advertised of them.
type Discovered = (Box<dyn GpuInventory>, Vec<Gpu>, Advertised);

/// Opens the inventory, lists the GPUs and decides what to advertise.
fn discover(source: &SourceArgs, settings: &PluginSettings) -> Result<Discovered, AppError> {
    let inventory = open_inventory(source)?;
    let found = inventory.discover()?;
    let advertised = advertise(found.clone(), &advertise_settings(source, settings))?;
    Ok((inventory, found, advertised))
}

/// The settings of [`advertise`] from the flags and the device config.
pub fn advertise_settings<'a>(
    source: &SourceArgs,
    settings: &'a PluginSettings,
) -> AdvertiseSettings<'a> {
    AdvertiseSettings {
        resource_name: &settings.resource_name,
        filter: &settings.filter,
        split_count: settings.split_count,
        numa_topology: settings.numa_topology,
        mig_strategy: source.mig_strategy,
        pre_configured_memory_mib: settings.nvidia.plugin.pre_configured_device_memory,
    }
}

/// The `Allocate` handler `run` installs: the [`executor::Allocator`] with its settings from the
/// device and node config (dynamic MIG refused here, at start), reading pods from the run's
/// [`pod_cache::PodCache`] (fed by a watch of the node's pods), and the [`collector::Collector`]
/// started beside it. Without an API server client (`--skip-node-register`) the pod cannot be
/// found, so only `NVIDIA_VISIBLE_DEVICES` is answered, with a warning.
pub fn make_allocate_handler(ctx: &RunContext) -> Result<Arc<dyn AllocateHandler>, AppError> {
    // From the settings loaded at start: the configuration files are read once.
    let mut settings = crate::allocation::config::from_plugin_settings(
        &ctx.settings,
        ctx.source.node_config.as_deref(),
        &ctx.node_name,
        &ctx.allocate.hook_path,
    )?;
    settings.device_list = ctx.device_list.clone();
    settings.node_devices = ctx.node_devices.clone();
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
        return Ok(Arc::new(crate::kubelet::service::VisibleDevicesOnly));
    };
    tracing::info!(
        hook_path = %settings.hook_path.display(),
        memory_scaling = settings.memory_scaling,
        disable_core_limit = settings.disable_core_limit,
        node_delivery = ?settings.node_delivery.map(|d| d.as_str()),
        global_delivery = ?settings.global_delivery.map(|d| d.as_str()),
        device_list_strategy = ?settings.device_list.strategies.as_slice().iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        device_id_strategy = settings.device_list.id_strategy.as_str(),
        pass_device_specs = settings.device_list.pass_device_specs,
        collect_interval_s = collect.interval.as_secs_f64(),
        collect_grace_s = collect.grace.as_secs_f64(),
        "allocation settings"
    );
    // Once at start, what every HAMi-core allocation needs: the host's /tmp/vgpulock (0777, as
    // HAMi makes it) and a hook folder with HAMi-core and a preload list it can honour.
    let lock = std::path::Path::new(hami_shared::names::VGPU_LOCK_PATH);
    if let Err(error) = executor::ensure_lock_dir(lock) {
        tracing::error!(%error, "HAMi-core's lock folder is not usable; every allocation will fail until it is");
    }
    if let Err(error) =
        crate::allocation::hook::HookFolder::read(&settings.vgpu_dir()).check_ready()
    {
        tracing::error!(%error, hook = %settings.vgpu_dir().display(), "the hook folder cannot serve HAMi-core containers; their allocations fail until it can (it is read again on every Allocate)");
    }
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
