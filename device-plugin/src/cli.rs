//! The command line (`run`, `inventory`, `plan`, `install-hook`) and what the binary does with it; `main.rs` only parses,
//! installs logging and signal handling, and calls [`run`] or [`inventory_report`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::api::{self, v1beta1};
use crate::devices::{DeviceTable, NoGpuError, SkippedGpu};
use crate::inventory::{FileInventory, Gpu, GpuInventory, InventoryError};
use crate::metrics::{Metrics, Readiness};
use crate::node_register::{self, ANNOTATION_NODE_NVIDIA_REGISTER, NodeRegisterConfig};
use crate::nvml::NvmlInventory;
use crate::pending_pod::KubePendingPod;
use crate::plugin::{self, Lifecycle, LifecycleError};
use crate::service::{
    AllocateHandler, NoPendingPod, PendingPodDevices, SharedState, spawn_health_updates,
};
use crate::settings::{PluginSettings, SettingsError};

/// hami-device-plugin: kubelet device plugin for GPUs shared through HAMi-core.
#[derive(Debug, Parser)]
#[command(name = "hami-device-plugin", version, about)]
pub struct Cli {
    /// Log format on stderr: `text` for people, `json` (one object per line) for log collectors.
    #[arg(long = "log-format", env = "HAMI_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Parses a command line (the program name first), for callers without `clap` in scope.
    pub fn parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        <Self as Parser>::try_parse_from(args)
    }
}

/// Log format (`--log-format`, `HAMI_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable text.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The log subscriber for `format`: level from `RUST_LOG` (default `info`), written to `writer`
/// (the binary passes stderr), ANSI colours only when `ansi`.
pub fn log_subscriber<W>(
    format: LogFormat,
    writer: W,
    ansi: bool,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Json => Box::new(builder.json().finish()),
        LogFormat::Text => Box::new(builder.with_ansi(ansi).finish()),
    }
}

/// Sub-commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve kubelet and keep the node annotation for the HAMi scheduler current.
    Run(RunArgs),
    /// Print the GPUs found, the kubelet devices and the node annotation that `run` would publish.
    Inventory(InventoryArgs),
    /// Print, as JSON, what `Allocate` would give each container of a pod with pending GPU
    /// entries (delivery mode and source, envs, mounts, limits-file text); `--write` also
    /// publishes the files.
    Plan(crate::allocation::dry_run::PlanArgs),
    /// Install HAMi-core and the preload library into HOOK/vgpu, with a generated ld.so.preload.
    ///
    /// Run it on the host's hook path before `run` (the DaemonSet's init container).
    ///
    /// Installs, in this order, each as mode 0644:
    ///
    ///   HOOK/vgpu/libvgpu.so          HAMi-core, from --hami-core-dir DIR: DIR must hold exactly
    ///                                 one of libvgpu.so or libvgpu.so.<version> (HAMi images since
    ///                                 v2.5 carry only libvgpu.so.<version>, e.g. libvgpu.so.v2.10.0);
    ///                                 none, both, or two versions is an error listing what DIR
    ///                                 holds. Symbolic links to a regular file are followed (two
    ///                                 names of one file count once); a directory is an error.
    ///   HOOK/vgpu/libhami_preload.so  the preload library --preload FILE (it loads /overrideEnv
    ///                                 into the environment before main).
    ///   HOOK/vgpu/ld.so.preload       generated, never copied (an image's copy hard-codes
    ///                                 /usr/local/vgpu, HAMi#2017); exactly two lines:
    ///                                   HOOK/vgpu/libhami_preload.so
    ///                                   HOOK/vgpu/libvgpu.so
    ///
    /// HOOK (--hook-path, HOOK_PATH, default /usr/local) must be absolute, without whitespace,
    /// ':' or '..'; a trailing slash is dropped. HOOK/vgpu and HOOK/vgpu/containers are created
    /// (0755) when missing.
    ///
    /// Both libraries are checked before anything is written: regular (after symbolic links),
    /// readable, non-empty, starting with the ELF magic \x7fELF. Each file is written to a
    /// temporary file beside it (.<name>.hami-tmp.<pid>...), fsync'd, renamed over the final name
    /// and the directory fsync'd, so a library running processes map is never overwritten in
    /// place. The libraries go first and ld.so.preload last: after any failure ld.so.preload is
    /// the previous complete one or absent, never naming a missing library. Leftover temporary
    /// files of an interrupted run are removed before installing. A file that already has the
    /// same bytes and mode is not rewritten ("unchanged"), so running it twice changes nothing.
    ///
    /// Prints one line per file: `installed PATH (...)` or `unchanged PATH (...)`. Exit status: 0
    /// on success, 2 for an invalid --hook-path, 1 for any other failure (the message names the
    /// path).
    #[command(verbatim_doc_comment)]
    InstallHook(crate::install_hook::InstallHookArgs),
}

/// Where the GPUs and the settings come from (shared by both sub-commands).
#[derive(Debug, Clone, Args)]
pub struct SourceArgs {
    /// Global HAMi device config (`device-config.yaml`, `nvidia:` section).
    #[arg(long = "config", env = "HAMI_DEVICE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Per-node config (`config.json` with `nodeconfig: [...]`).
    #[arg(long = "node-config", env = "HAMI_NODE_CONFIG", value_name = "FILE")]
    pub node_config: Option<PathBuf>,
    /// YAML list of GPUs instead of NVML, for machines without NVIDIA GPUs.
    #[arg(long, env = "HAMI_INVENTORY", value_name = "FILE")]
    pub inventory: Option<PathBuf>,
    /// This node's name (downward API `spec.nodeName`).
    #[arg(long = "node-name", env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Attach each GPU's NUMA node to the kubelet devices (for the topology manager).
    #[arg(long = "enable-numa-topology", env = "HAMI_ENABLE_NUMA_TOPOLOGY")]
    pub numa_topology: bool,
}

/// `run` flags.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// GPUs and settings.
    #[command(flatten)]
    pub source: SourceArgs,
    /// kubelet's device-plugin directory.
    #[arg(long = "kubelet-dir", env = "HAMI_KUBELET_DIR", default_value = api::DEFAULT_KUBELET_DIR, value_name = "DIR")]
    pub kubelet_dir: PathBuf,
    /// Seconds between checks of the node annotation `hami.io/node-nvidia-register`.
    #[arg(
        long = "register-interval",
        env = "HAMI_REGISTER_INTERVAL",
        default_value_t = 30.0,
        value_name = "SECONDS"
    )]
    pub register_interval: f64,
    /// Seconds to wait after a failed node annotation update.
    #[arg(
        long = "register-retry",
        env = "HAMI_REGISTER_RETRY",
        default_value_t = 5.0,
        value_name = "SECONDS"
    )]
    pub register_retry: f64,
    /// Milliseconds between checks of the device-plugin directory (kubelet restart, lost socket).
    #[arg(
        long = "kubelet-watch-interval-ms",
        env = "HAMI_KUBELET_WATCH_INTERVAL_MS",
        default_value_t = 250
    )]
    pub kubelet_watch_ms: u64,
    /// Do not talk to the API server (no node annotation, no pending-pod lookup): for trying the
    /// kubelet side alone.
    #[arg(long = "skip-node-register", env = "HAMI_SKIP_NODE_REGISTER")]
    pub skip_node_register: bool,
    /// Plain-HTTP address for `/healthz`, `/readyz` and `/metrics`; empty or `off` disables.
    #[arg(
        long = "metrics-listen",
        env = "HAMI_METRICS_LISTEN",
        default_value = DEFAULT_METRICS_LISTEN,
        value_name = "HOST:PORT"
    )]
    pub metrics_listen: String,
    /// Allocation: hook path, collector of dead pods' files.
    #[command(flatten)]
    pub allocate: crate::allocation::AllocateArgs,
}

/// Default of `--metrics-listen`.
pub const DEFAULT_METRICS_LISTEN: &str = "0.0.0.0:9394";

/// `inventory` flags.
#[derive(Debug, Clone, Args)]
pub struct InventoryArgs {
    /// GPUs and settings.
    #[command(flatten)]
    pub source: SourceArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Why the binary stops with an error.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
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
    #[error("no node name: set NODE_NAME (downward API spec.nodeName) or pass --node-name")]
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
    Allocation(#[from] crate::allocation::config::ConfigError),
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

impl CliError {
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

fn seconds(flag: &'static str, value: f64) -> Result<Duration, CliError> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or(CliError::BadDuration { flag, value })
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
pub fn inventory_report(source: &SourceArgs) -> Result<InventoryReport, CliError> {
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
    pub allocate: crate::allocation::AllocateArgs,
    /// Where the allocator and the collector report.
    pub metrics: Arc<Metrics>,
    /// The watch-fed view of this node's pods (with a client), shared by `Allocate` and
    /// `GetPreferredAllocation`.
    pub pod_cache: Option<Arc<crate::allocation::pod_cache::PodCache>>,
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
    make_allocate: impl FnOnce(&RunContext) -> Result<Arc<dyn AllocateHandler>, CliError>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), CliError> {
    run_with_client(args, None, make_allocate, shutdown).await
}

/// [`run`] with a given API server client (tests, embedding); without one, the client comes from
/// the in-cluster service account or `KUBECONFIG` unless `--skip-node-register` is set.
pub async fn run_with_client(
    args: RunArgs,
    client: Option<kube::Client>,
    make_allocate: impl FnOnce(&RunContext) -> Result<Arc<dyn AllocateHandler>, CliError>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), CliError> {
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
    make_allocate: impl FnOnce(&RunContext) -> Result<Arc<dyn AllocateHandler>, CliError>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), CliError> {
    let RunOptions {
        client,
        metrics_listener,
    } = options;
    let metrics_listener = match metrics_listener {
        Some(listener) => Some(listener),
        None => match crate::metrics::parse_listen(&args.metrics_listen)
            .map_err(CliError::MetricsListen)?
        {
            Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                CliError::MetricsListen(format!("cannot listen on {addr} (--metrics-listen): {e}"))
            })?),
            None => None,
        },
    };
    let metrics = Arc::new(Metrics::new());
    let readiness = Readiness::new();
    let settings = load_settings(&args.source)?;
    let node_name = args
        .source
        .node_name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or(CliError::MissingNodeName)?;
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
        let cache = crate::allocation::pod_cache::PodCache::new();
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
        tokio::spawn(crate::metrics::serve(
            listener,
            Arc::clone(&metrics),
            readiness.clone(),
            until_stopped(),
        ))
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
    result.map_err(CliError::from)
}

/// The options a plugin with these settings announces (for tests and tools).
pub fn plugin_options(settings: &PluginSettings) -> v1beta1::DevicePluginOptions {
    v1beta1::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: settings.preferred_allocation,
    }
}
