//! The composition root of `run` and `inventory`: loads the configuration (once), opens the GPU
//! inventory, connects to the API server, starts the pod cache, the allocator and its collector,
//! the node handshake, the ops server (`hami_ops`) and the kubelet side, and stops them in order.
//!
//! - this module: the errors, the settings and the GPU source both commands share;
//! - [`run`](mod@run): `run`, phase by phase: its ops server (`ops`), the GPUs and the plugins
//!   (`kubelet`), the API server side (`cluster`), and the stop in order;
//! - [`inventory_report`](mod@inventory_report): what `inventory` prints;
//! - [`allocate`]: the `Allocate` handler `run` installs.

use std::time::Duration;

use crate::allocation::shell::host_checks::HostCheckError;
use crate::cli::SourceArgs;
use crate::commands::plan::DryRunError;
use crate::gpu::devices::{
    AdvertiseSettings, Advertised, DeviceTable, MigLayoutError, NoGpuError, advertise,
};
use crate::gpu::inventory::{FileInventory, Gpu, GpuInventory, InventoryError};
use crate::gpu::mig::MigStrategy;
use crate::gpu::nvml::NvmlInventory;
use crate::gpu::topology;
use crate::kubelet::plugin::LifecycleError;
use crate::settings::{PluginSettings, PluginSettingsError};

pub mod allocate;
mod cluster;
pub mod inventory_report;
mod kubelet;
mod ops;
pub mod run;
pub mod tasks;

pub use allocate::make_allocate_handler;
pub use inventory_report::{
    InventoryReport, ReportDevice, ReportResource, inventory_report, render_report,
};
pub use run::{RunContext, RunOptions, run, run_with_client, run_with_options};

/// Why the binary stops with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The device config or the node config is invalid (the one error for it, from `run`,
    /// `inventory` and `plan` alike).
    #[error(transparent)]
    Settings(#[from] PluginSettingsError),
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
    #[error(
        "no node name: set {} (downward API spec.nodeName) or pass --node-name",
        hami_shared::names::ENV_HAMI_NODE_NAME
    )]
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
    /// The device list settings cannot be used on this host.
    #[error(transparent)]
    HostCheck(#[from] HostCheckError),
    /// The device list settings cannot be honoured for a MIG resource's devices.
    #[error(
        "{resource}: {source}; set PASS_DEVICE_SPECS=false or use a CDI device list strategy, or give the MIG devices their device nodes"
    )]
    MigDeviceList {
        /// The resource, e.g. `nvidia.com/mig-1g.18gb`.
        resource: String,
        /// Why.
        source: crate::allocation::plan::device_list::DeviceListError,
    },
    /// `--metrics-listen` is not an address, or cannot be bound.
    #[error(transparent)]
    MetricsListen(#[from] crate::metrics::ListenError),
    /// A region exporter flag is not usable.
    #[error(transparent)]
    RegionExport(#[from] crate::regions::export::RegionIntervalError),
    /// `plan` failed (for another reason than its settings).
    #[error(transparent)]
    Plan(DryRunError),
    /// `install-hook` failed.
    #[error(transparent)]
    InstallHook(#[from] crate::commands::install_hook::InstallHookError),
    /// `serve-preload` failed.
    #[error(transparent)]
    ServePreload(#[from] crate::commands::serve_preload::ServePreloadError),
    /// `regions` failed.
    #[error(transparent)]
    Regions(#[from] crate::commands::regions::RegionsError),
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
            | Self::HostCheck(_)
            | Self::MetricsListen(_)
            | Self::RegionExport(_) => 2,
            Self::InstallHook(e) => e.exit_code(),
            Self::ServePreload(e) => e.exit_code(),
            Self::Regions(e) => e.exit_code(),
            _ => 1,
        }
    }
}

impl From<DryRunError> for AppError {
    /// A settings error of `plan` is the settings error `run` would stop with.
    fn from(error: DryRunError) -> Self {
        match error {
            DryRunError::Settings(e) => Self::Settings(e),
            DryRunError::HostCheck(e) => Self::HostCheck(e),
            other => Self::Plan(other),
        }
    }
}

/// The process environment's variables for the layered loader (`HAMI_NVIDIA__*` over the device
/// config): the one place the plugin reads them (`main.rs` hands them to `plan` too).
pub fn config_environment() -> impl Iterator<Item = (String, String)> {
    std::env::vars()
}

/// The settings for this node from the files named in `source` and the process environment.
pub fn load_settings(source: &SourceArgs) -> crate::Result<PluginSettings, PluginSettingsError> {
    let mut settings = PluginSettings::load(
        source.config.as_deref(),
        source.node_config.as_deref(),
        source.node_name.as_deref(),
        config_environment(),
    )?;
    settings.numa_topology |= source.numa_topology;
    for difference in &settings.hami_differences {
        tracing::warn!(key = "nodeconfig", "{difference}");
    }
    Ok(settings)
}

/// `hami.io/node-nvidia-score` for the advertised GPUs when `--enable-topology-score`
/// (`ENABLE_TOPOLOGY_SCORE=true`), from the GPU source's links; `None` when off. A pair HAMi
/// would call asymmetric (scored 0) is logged as a warning.
pub fn node_score(
    source: &SourceArgs,
    inventory: &dyn GpuInventory,
    table: &DeviceTable,
) -> crate::Result<Option<topology::Scores>> {
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
        tracing::warn!(gpu = %a, peer = %b, reason = crate::node_register::REASON_ASYMMETRIC_LINK, "the two GPUs report different P2P links to each other; the pair is scored 0 (possible NVLink hardware or driver issue)");
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

fn seconds(flag: &'static str, value: f64) -> crate::Result<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or(AppError::BadDuration { flag, value })
}

/// The table of the resource the node annotation registers (`resourceCountName`): that resource's
/// devices, or none when it is not advertised (every GPU in MIG mode under `mixed`).
fn registered_table(advertised: &Advertised, settings: &PluginSettings) -> DeviceTable {
    advertised
        .resource(&settings.resource_name)
        .map(|r| r.table.clone())
        .unwrap_or_else(|| DeviceTable::shares(Vec::new(), settings.split_count(), false))
}

/// The inventory backend, the GPUs it listed, and what is advertised of them.
type Discovered = (Box<dyn GpuInventory>, Vec<Gpu>, Advertised);

/// Opens the inventory, lists the GPUs and decides what to advertise.
fn discover(source: &SourceArgs, settings: &PluginSettings) -> crate::Result<Discovered> {
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
        split_count: settings.split_count(),
        numa_topology: settings.numa_topology,
        mig_strategy: source.mig_strategy,
        pre_configured_memory_mib: settings.nvidia.plugin.pre_configured_device_memory,
    }
}
