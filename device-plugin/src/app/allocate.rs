//! The `Allocate` handler `run` installs, with the collector of dead pods' files beside it.

use std::sync::Arc;

use super::{RunContext, seconds};
use crate::allocation::shell::{collector, executor};
use crate::kubelet::service::AllocateHandler;

/// The `Allocate` handler `run` installs: the [`executor::Allocator`] with the allocation
/// settings `run` built at start ([`RunContext::allocation`]: dynamic MIG already refused),
/// reading pods from the run's `PodCache` (fed by a watch of the node's pods), and the
/// [`collector::Collector`] started beside it, stopped with the run ([`RunContext::tasks`]).
/// Without an API server client (`--skip-node-register`) the pod cannot be found, so only
/// `NVIDIA_VISIBLE_DEVICES` is answered, with a warning.
pub fn make_allocate_handler(ctx: &RunContext) -> crate::Result<Arc<dyn AllocateHandler>> {
    // Built once at start, by the constructor `plan` uses too.
    let settings = ctx.allocation.clone();
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
        core_scaling = settings.core_scaling,
        allow_privileged_namespaces = ?settings.guard.privileged_namespaces,
        allow_hami_core_env_namespaces = ?settings.guard.hami_core_env_namespaces,
        collect_interval_s = collect.interval.as_secs_f64(),
        collect_grace_s = collect.grace.as_secs_f64(),
        "allocation settings"
    );
    // Once at start, what every HAMi-core allocation needs: the host's /tmp/vgpulock (root's 0755
    // holding HAMi-core's `lock`, 0666; never followed if a link) and a hook folder with
    // HAMi-core and a preload list it can honour.
    let lock = std::path::Path::new(hami_shared::names::VGPU_LOCK_PATH);
    if let Err(error) = executor::ensure_lock_dir(lock) {
        tracing::error!(%error, "HAMi-core's lock folder is not usable; every allocation will fail until it is");
    }
    if let Err(error) =
        crate::allocation::shell::hook::HookFolder::read(&settings.vgpu_dir()).check_ready()
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
    ctx.tasks.spawn(collector.run(ctx.tasks.until_stopped()));
    start_region_exporter(ctx, client, settings.containers_dir())?;
    let mut allocator = executor::Allocator::new(client.clone(), ctx.node_name.clone(), settings)
        .with_metrics(Arc::clone(&ctx.metrics));
    if let Some(pods) = &ctx.pod_cache {
        allocator = allocator.with_pod_cache(Arc::clone(pods));
    }
    Ok(Arc::new(allocator))
}

/// The exporter of the HAMi containers' regions (`<HOOK>/vgpu/containers`), owned as the pod
/// cache says, its metrics on the plugin's `/metrics` and its Events on the pods; off with
/// `--region-interval=0` or without a pod cache.
fn start_region_exporter(
    ctx: &RunContext,
    client: &kube::Client,
    containers_dir: std::path::PathBuf,
) -> crate::Result<()> {
    use crate::regions::{RegionExporter, events, hami::HamiFolders};
    let Some(settings) = ctx.allocate_regions.settings()? else {
        tracing::info!("region exporter off (--region-interval=0)");
        return Ok(());
    };
    let Some(pods) = &ctx.pod_cache else {
        return Ok(());
    };
    let source = Arc::new(HamiFolders {
        containers_dir,
        pods: Arc::clone(pods),
    });
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let exporter = RegionExporter::new(&ctx.node_name, source, settings, Some(tx));
    ctx.metrics.set_regions(exporter.registry());
    // The exporter's sender lives as long as the metrics registry holds the exporter: the
    // publisher stops on the signal, not when the channel closes.
    let publish = events::publish(
        crate::node_register::recorder(client.clone(), &ctx.node_name),
        rx,
    );
    let stop = ctx.tasks.until_stopped();
    ctx.tasks.spawn(async move {
        tokio::select! {
            () = stop => {}
            () = publish => {}
        }
    });
    tracing::info!(
        interval_s = settings.interval.as_secs_f64(),
        scrape_files = settings.scrape_files,
        scrape_budget_ms = settings.scrape_budget.as_millis(),
        "region exporter started"
    );
    ctx.tasks
        .spawn(exporter.run(|| async {}, ctx.tasks.until_stopped()));
    Ok(())
}
