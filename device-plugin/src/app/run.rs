//! `run`, phase by phase: the settings resolved before anything starts ([`StartSettings`]), the
//! ops server first (`super::ops`: its probes answer while the plugin waits), the GPUs or the
//! wait for them (`super::kubelet`), the cluster (`super::cluster`: client, pod cache,
//! pending-pod lookup), one plugin per advertised resource with its health watch, the node
//! handshake, and the stop in order: the plugins, the handshake and the gauges, the ops server
//! last.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::cluster::{connect, pending_pods, spawn_node_register};
use super::kubelet::{
    log_advertised, plugin_states, serve_plugins, spawn_device_counts, wait_for_gpus, watch_health,
};
use super::ops::OpsServer;
use super::tasks::TaskStop;
use super::{AppError, load_settings, node_score, registered_table, seconds};
use crate::allocation::shell::pod_lookup::cache::PodCache;
use crate::cli::{RunArgs, SourceArgs};
use crate::gpu::health::HealthCheckPolicy;
use crate::gpu::topology;
use crate::kubelet::service::AllocateHandler;
use crate::metrics::Metrics;
use crate::node_register::NodeRegisterConfig;
use crate::settings::{AllocationInputs, PluginSettings};

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
    /// Allocation flags (the collector's interval and grace).
    pub allocate: crate::cli::AllocateArgs,
    /// The allocation settings, built once at start as `plan` builds them
    /// ([`PluginSettings::allocation_settings`]); their device list (`DEVICE_LIST_STRATEGY`, …)
    /// serves GPU shares and MIG devices alike.
    pub allocation: crate::allocation::plan::AllocationSettings,
    /// Where the allocator and the collector report.
    pub metrics: Arc<Metrics>,
    /// The watch-fed view of this node's pods (with a client), shared by `Allocate` and
    /// `GetPreferredAllocation`.
    pub pod_cache: Option<Arc<PodCache>>,
    /// The region exporter's flags.
    pub allocate_regions: crate::regions::export::RegionArgs,
    /// Stops the tasks the allocate handler factory spawns (the collector, the region
    /// exporter); `run` cancels it when it stops.
    pub tasks: TaskStop,
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
    make_allocate: impl FnOnce(&RunContext) -> crate::Result<Arc<dyn AllocateHandler>>,
    shutdown: impl Future<Output = ()>,
) -> crate::Result<()> {
    run_with_client(args, None, make_allocate, shutdown).await
}

/// [`run`] with a given API server client (tests, embedding); without one, the client comes from
/// the in-cluster service account or `KUBECONFIG` unless `--skip-node-register` is set.
pub async fn run_with_client(
    args: RunArgs,
    client: Option<kube::Client>,
    make_allocate: impl FnOnce(&RunContext) -> crate::Result<Arc<dyn AllocateHandler>>,
    shutdown: impl Future<Output = ()>,
) -> crate::Result<()> {
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
    make_allocate: impl FnOnce(&RunContext) -> crate::Result<Arc<dyn AllocateHandler>>,
    shutdown: impl Future<Output = ()>,
) -> crate::Result<()> {
    let RunOptions {
        client,
        metrics_listener,
    } = options;
    tokio::pin!(shutdown);
    let metrics_listener = match metrics_listener {
        Some(listener) => Some(listener),
        None => bind_metrics_listener(&args.metrics_listen).await?,
    };
    let metrics = Arc::new(Metrics::new());
    let start = StartSettings::resolve(&args)?;
    // The ops server first: its probes answer while the plugin waits for GPUs.
    let ops = OpsServer::start(metrics_listener, &metrics);
    // The tasks beside the kubelet side: stopped, and waited for, however `serve` returns.
    let tasks = TaskStop::new();
    let result = serve(
        &args,
        &start,
        client,
        make_allocate,
        (&metrics, &tasks),
        &ops,
        &mut shutdown,
    )
    .await;
    tasks.stop().await;
    ops.stop().await;
    result
}

/// `--metrics-listen`: the address bound, or `None` when empty or `off`.
async fn bind_metrics_listener(listen: &str) -> crate::Result<Option<tokio::net::TcpListener>> {
    let Some(addr) = crate::metrics::parse_listen(listen)? else {
        return Ok(None);
    };
    let listener = crate::metrics::bind_listen(addr).await?;
    Ok(Some(listener))
}

/// What `run` resolves before anything starts: a configuration mistake ends it here, before a
/// socket is bound or a task started.
struct StartSettings {
    settings: PluginSettings,
    node_name: String,
    register_interval: Duration,
    register_retry: Duration,
    health: HealthCheckPolicy,
}

impl StartSettings {
    fn resolve(args: &RunArgs) -> crate::Result<Self> {
        let settings = load_settings(&args.source)?;
        let node_name = args
            .source
            .node_name
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or(AppError::MissingNodeName)?;
        let start = Self {
            register_interval: seconds("register-interval", args.register_interval)?,
            register_retry: seconds("register-retry", args.register_retry)?,
            health: HealthCheckPolicy::new(
                args.gpu.disable_healthchecks.as_deref(),
                args.gpu.enable_healthchecks.as_deref(),
            ),
            settings,
            node_name,
        };
        start.warn_about_what_is_ignored(&args.source);
        Ok(start)
    }

    /// Settings accepted as HAMi accepts them, but not acted on.
    fn warn_about_what_is_ignored(&self, source: &SourceArgs) {
        for (key, item) in self.health.malformed() {
            tracing::warn!(env = key, value = %item, accepted = "an Xid number, `all` or `xids`", "ignoring a malformed Xid, as HAMi does");
        }
        if self.health.all_disabled() {
            tracing::warn!(
                env = crate::gpu::health::ENV_DISABLE_HEALTHCHECKS,
                "GPU health checks disabled"
            );
        }
        if let Some(written) = self
            .settings
            .node
            .as_ref()
            .and_then(|n| n.mig_strategy.as_deref())
        {
            tracing::warn!(
                node_config = "migstrategy",
                value = written,
                used = %source.mig_strategy,
                "the node entry's migstrategy is ignored, as HAMi v2.10 ignores it: the strategy is MIG_STRATEGY (--mig-strategy)"
            );
        }
    }
}

/// Everything after the ops server: GPUs, cluster, plugins, handshake, until `shutdown` (or a
/// failure); the caller stops the ops server.
async fn serve<S: Future<Output = ()>>(
    args: &RunArgs,
    start: &StartSettings,
    client: Option<kube::Client>,
    make_allocate: impl FnOnce(&RunContext) -> crate::Result<Arc<dyn AllocateHandler>>,
    (metrics, tasks): (&Arc<Metrics>, &TaskStop),
    ops: &OpsServer,
    shutdown: &mut Pin<&mut S>,
) -> crate::Result<()> {
    let settings = &start.settings;
    let Some((inventory, found, advertised)) =
        wait_for_gpus(args, settings, ops, metrics, shutdown).await?
    else {
        tracing::info!("stopped while waiting for GPUs");
        return Ok(());
    };
    log_advertised(&args.source, inventory.as_ref(), &found, &advertised);
    // Over the GPUs of the register annotation (HAMi: `GetDevicesUUIDList` of the same list).
    let scored = registered_table(&advertised, settings);
    let score = node_score(&args.source, inventory.as_ref(), &scored)?;
    let (client, pod_cache) = connect(args, client, &start.node_name, tasks).await?;
    let (device_list, notes) = crate::allocation::shell::host_checks::device_list_settings(
        &args.allocate.device_list.clone().into(),
    )?;
    for note in &notes {
        tracing::warn!("{note}");
    }
    let allocation = settings.allocation_settings(AllocationInputs {
        hook_path: args.allocate.hook_path.clone(),
        device_list,
        // Every GPU and MIG device found (index and device nodes); the scheduler assigns only
        // advertised ones.
        node_devices: crate::allocation::plan::device_list::NodeDevices::from_gpus(&found),
        guard: args.allocate.guard.clone().into(),
    })?;
    let context = RunContext {
        node_name: start.node_name.clone(),
        settings: settings.clone(),
        client: client.clone(),
        source: args.source.clone(),
        allocate: args.allocate.clone(),
        allocation,
        metrics: Arc::clone(metrics),
        pod_cache: pod_cache.clone(),
        allocate_regions: args.regions.clone().into(),
        tasks: tasks.clone(),
    };
    let allocate = make_allocate(&context)?;
    let pending = pending_pods(client.as_ref(), pod_cache, &start.node_name);
    let lists = (
        &context.allocation.device_list,
        &context.allocation.node_devices,
    );
    let states = plugin_states(&advertised, settings, lists, &allocate, &pending)?;
    watch_health(
        inventory.as_ref(),
        &found,
        &advertised,
        &start.health,
        &states,
        tasks,
    )?;
    let devices_task = spawn_device_counts(&states, Arc::clone(metrics), ops.until_stopped());
    let register_task = client.map(|client| {
        let config = NodeRegisterConfig {
            node_name: start.node_name.clone(),
            interval: start.register_interval,
            retry: start.register_retry,
            scaling: settings.scaling(),
            score: score.as_ref().map(topology::Scores::annotation),
            asymmetric_links: score.map(|s| s.asymmetric).unwrap_or_default(),
        };
        spawn_node_register(
            client,
            config,
            settings,
            &states,
            metrics,
            ops.until_stopped(),
        )
    });
    let result = serve_plugins(args, &states, ops, metrics, shutdown).await;
    ops.signal_stop();
    if let Some(task) = register_task {
        let _ = task.await;
    }
    let _ = devices_task.await;
    result
}
