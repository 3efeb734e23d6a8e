//! `Allocate` for HAMi-core: find the pod the HAMi scheduler bound, decode its devices, plan the
//! container (envs, mounts, limits file), publish the limits file, update the pod; and collect
//! the files of pods that are gone.
//!
//! - [`codec`]: `hami.io/vgpu-devices-to-allocate`, decoded and encoded as HAMi does;
//! - [`locator`]: the pod being allocated (node lock, else the pending pod);
//! - [`plan`]: the pure [`plan::AllocationPlan`];
//! - [`pod_cache`]: the watch-fed view of this node's pods the locator reads first;
//! - [`executor`]: [`executor::Allocator`], the [`crate::service::AllocateHandler`];
//! - [`collector`]: removal of dead pods' directories and limits files;
//! - [`config`]: the settings the plan needs, from the device and node config files;
//! - [`dry_run`]: `hami-device-plugin plan`.

pub mod codec;
pub mod collector;
pub mod config;
pub mod dry_run;
pub mod executor;
pub mod locator;
pub mod plan;
pub mod pod_cache;

use std::path::PathBuf;

use clap::Args;

/// Allocation flags of `run`.
#[derive(Debug, Clone, Args)]
pub struct AllocateArgs {
    /// HAMi-core's install directory on the host (and in the container): `<DIR>/vgpu/...`.
    #[arg(long = "hook-path", env = "HOOK_PATH", default_value = hami_shared::names::DEFAULT_HOOK_PATH, value_name = "DIR")]
    pub hook_path: PathBuf,
    /// Seconds between two passes of the collector of dead pods' files.
    #[arg(
        long = "collect-interval",
        env = "HAMI_COLLECT_INTERVAL",
        default_value_t = 60.0,
        value_name = "SECONDS"
    )]
    pub collect_interval: f64,
    /// Minimum age in seconds of a dead pod's directory or limits file before it is removed.
    #[arg(
        long = "collect-grace",
        env = "HAMI_COLLECT_GRACE",
        default_value_t = 300.0,
        value_name = "SECONDS"
    )]
    pub collect_grace: f64,
}

/// The `Allocate` handler `run` installs: the [`executor::Allocator`] with its settings from the
/// device and node config (dynamic MIG refused here, at start), reading pods from the run's
/// [`pod_cache::PodCache`] (fed by a watch of the node's pods), and the [`collector::Collector`]
/// started beside it. Without an API server client (`--skip-node-register`) the pod cannot be
/// found, so only `NVIDIA_VISIBLE_DEVICES` is answered, with a warning.
pub fn make_handler(
    ctx: &crate::cli::RunContext,
) -> Result<std::sync::Arc<dyn crate::service::AllocateHandler>, crate::cli::CliError> {
    use crate::cli::CliError;
    let settings = config::load_allocation_settings(
        ctx.source.config.as_deref(),
        ctx.source.node_config.as_deref(),
        &ctx.node_name,
        &ctx.allocate.hook_path,
    )?;
    let seconds = |flag: &'static str, value: f64| {
        std::time::Duration::try_from_secs_f64(value)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or(CliError::BadDuration { flag, value })
    };
    let collect = collector::CollectorSettings {
        interval: seconds("collect-interval", ctx.allocate.collect_interval)?,
        grace: seconds("collect-grace", ctx.allocate.collect_grace)?,
    };
    let Some(client) = &ctx.client else {
        tracing::warn!(
            "no API server (--skip-node-register): Allocate answers NVIDIA_VISIBLE_DEVICES only, without limits"
        );
        return Ok(std::sync::Arc::new(crate::service::VisibleDevicesOnly));
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
    .with_metrics(std::sync::Arc::clone(&ctx.metrics));
    tokio::spawn(collector.run(std::future::pending()));
    let mut allocator = executor::Allocator::new(client.clone(), ctx.node_name.clone(), settings)
        .with_metrics(std::sync::Arc::clone(&ctx.metrics));
    if let Some(pods) = &ctx.pod_cache {
        allocator = allocator.with_pod_cache(std::sync::Arc::clone(pods));
    }
    Ok(std::sync::Arc::new(allocator))
}
