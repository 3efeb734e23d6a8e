//! `hami-device-plugin serve-preload`: serve the `hami.io/preload` resource to kubelet
//! ([`plugin`]) until SIGTERM, so that KAI containers get HAMi-core from the hook
//! folder through kubelet's device-plugin mounts instead of a `hostPath` volume of their pod.
//!
//! The hook installer DaemonSet runs it as its long-running container, after its init containers
//! have filled `HOOK/vgpu` (`install-hook`). It checks the folder once at start (a node whose hook
//! is broken never advertises the resource, so no KAI pod is scheduled there) and again on every
//! `Allocate`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hami_shared::names::{self, PRELOAD_SOCKET, RESOURCE_PRELOAD, VGPU_DIR};

use crate::commands::install_hook::{InstallHookError, normalise_hook_path};
use crate::kubelet::plugin::{Lifecycle, LifecycleError, serve};
pub mod plugin;

use plugin::{PreloadHookError, PreloadPlugin, inspect_hook};

/// What `serve-preload` is asked (its flags, as the command line parsed them).
#[derive(Debug, Clone)]
pub struct ServePreloadArgs {
    /// HAMi's hook path on the host, `HOOK` (the value `install-hook` was given): the files are
    /// mounted from `HOOK/vgpu/`, at the same paths in the container.
    pub hook_path: PathBuf,
    /// kubelet's device-plugin directory.
    pub kubelet_dir: PathBuf,
    /// How many containers of the node may hold `hami.io/preload` at once (1 to 100000).
    pub slots: u32,
    /// Give each container a region folder (`HOOK/regions/<slot>`, read-write at
    /// `/var/lib/hami-limits/region`) the node can read; `false`: none (the region stays in the
    /// container's `/tmp`, unseen).
    pub regions: bool,
    /// Plain-HTTP address for `/healthz`, `/readyz` and `/metrics` (the regions' metrics); empty
    /// or `off` disables.
    pub metrics_listen: String,
    /// kubelet's pod resources socket: which container holds which slot.
    pub pod_resources_socket: PathBuf,
    /// Read the KAI containers' limits files from their pods' annotations and raise Events on
    /// them, through the API server (in-cluster service account or `KUBECONFIG`; needs the node
    /// name).
    pub pod_api: bool,
    /// This node (for `--pod-api`).
    pub node_name: Option<String>,
    /// The region exporter.
    pub region_export: crate::regions::export::RegionArgs,
}

/// Why `serve-preload` stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServePreloadError {
    /// `--hook-path` is not usable.
    #[error(transparent)]
    HookPath(#[from] InstallHookError),
    /// The hook folder is not what `install-hook` leaves.
    #[error("the hook folder cannot be handed to containers: {0}")]
    Hook(#[from] PreloadHookError),
    /// The socket could not be served.
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// The folder of the region folders cannot be made safe.
    #[error("region exporter: {0}")]
    RegionsDir(crate::allocation::shell::executor::no_follow::NoFollowError),
    /// `--region-interval` is not usable.
    #[error("region exporter: {0}")]
    RegionInterval(#[from] crate::regions::export::RegionIntervalError),
    /// `--pod-api` without a node name.
    #[error(
        "region exporter: --pod-api needs the node name: set {} or --node-name",
        names::ENV_HAMI_NODE_NAME
    )]
    PodApiWithoutNode,
    /// `--metrics-listen` is not an address, or cannot be bound.
    #[error("region exporter: {0}")]
    MetricsListen(#[from] crate::metrics::ListenError),
}

impl ServePreloadError {
    /// Exit status: 2 for an invalid `--hook-path`, 1 for everything else.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::HookPath(e) => e.exit_code(),
            _ => 1,
        }
    }
}

/// The plugin `args` describe, its hook folder checked.
///
/// # Errors
/// [`ServePreloadError`] for an invalid `--hook-path` or a hook folder [`inspect_hook`] refuses.
pub fn preload_plugin(args: &ServePreloadArgs) -> Result<PreloadPlugin, ServePreloadError> {
    let vgpu_dir = normalise_hook_path(&args.hook_path)?.join(VGPU_DIR);
    let hook = inspect_hook(&vgpu_dir)?;
    tracing::info!(
        folder = %vgpu_dir.display(),
        node_gpus = hook.node_gpus,
        slots = args.slots,
        "hook folder checked"
    );
    let regions = if args.regions {
        let hook = normalise_hook_path(&args.hook_path)?;
        let dir = hook.join(names::REGIONS_DIR);
        crate::regions::slots::ensure_regions_dir(&dir).map_err(ServePreloadError::RegionsDir)?;
        Some(Arc::new(crate::regions::slots::SlotFolders::new(
            dir,
            args.slots,
            vgpu_dir.join(names::NODE_GPUS_FILE),
        )))
    } else {
        None
    };
    Ok(PreloadPlugin {
        vgpu_dir,
        slots: args.slots,
        regions,
    })
}

/// Where the plugin meets kubelet: `<kubelet-dir>/hami-preload.sock`, resource `hami.io/preload`.
#[must_use]
pub fn lifecycle(args: &ServePreloadArgs) -> Lifecycle {
    let mut lifecycle = Lifecycle::new(&args.kubelet_dir, RESOURCE_PRELOAD);
    PRELOAD_SOCKET.clone_into(&mut lifecycle.socket_name);
    lifecycle.watch_interval = Duration::from_secs(1);
    lifecycle
}

/// `serve-preload`: check the hook folder, then serve kubelet until `shutdown`.
///
/// # Errors
/// [`ServePreloadError`]: the hook path or folder at start, or the socket.
pub async fn serve_preload(
    args: &ServePreloadArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServePreloadError> {
    let plugin = Arc::new(preload_plugin(args)?);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let ops = start_exporter(args, &plugin, stop_rx).await?;
    let result = serve(lifecycle(args), plugin, shutdown).await;
    stop_tx.send_replace(true);
    if let Some(task) = ops {
        let _ = task.await;
    }
    result?;
    Ok(())
}

/// The region exporter over the slot folders: its scans (owners from kubelet's pod-resources
/// before each), its `/metrics` server, and, with `--pod-api`, the limits files and Events
/// through the API server. Returns the metrics server's task.
async fn start_exporter(
    args: &ServePreloadArgs,
    plugin: &Arc<PreloadPlugin>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Option<tokio::task::JoinHandle<std::io::Result<()>>>, ServePreloadError> {
    use crate::regions::{RegionExporter, events};
    let Some(slots) = plugin.regions.clone() else {
        return Ok(None);
    };
    let Some(settings) = args.region_export.settings()? else {
        return Ok(None);
    };
    let pods = if args.pod_api {
        let node = args
            .node_name
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or(ServePreloadError::PodApiWithoutNode)?;
        // The exporter is not worth the preload plugin: without a client it runs without the
        // limits files and Events, and says so.
        match kube::Client::try_default().await {
            Ok(client) => Some((client, node)),
            Err(error) => {
                tracing::error!(%error, "--pod-api: no API server client; KAI regions are exported without their limits files and Events");
                None
            }
        }
    } else {
        None
    };
    let until = |mut stop: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let events = pods.as_ref().map(|(client, node)| {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        // The metrics registry keeps the exporter, and so the sender, alive: stop on the signal.
        let publish = events::publish(crate::node_register::recorder(client.clone(), node), rx);
        let stopped = until(stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = stopped => {}
                () = publish => {}
            }
        });
        tx
    });
    let node = args.node_name.clone().unwrap_or_default();
    let exporter = RegionExporter::new(&node, slots.clone(), settings, events);
    let socket = args.pod_resources_socket.clone();
    let before = move || {
        let (slots, socket, pods) = (slots.clone(), socket.clone(), pods.clone());
        async move {
            slots
                .refresh(&socket, pods.as_ref(), Duration::from_secs(5))
                .await;
        }
    };
    tokio::spawn(Arc::clone(&exporter).run(before, until(stop.clone())));
    let Some(addr) = crate::metrics::parse_listen(&args.metrics_listen)? else {
        return Ok(None);
    };
    let listener = crate::metrics::bind_listen(addr).await?;
    tracing::info!(%addr, "serving /healthz, /readyz, /metrics");
    let mut registry = exporter.registry();
    hami_ops::register_build_info(
        &mut registry,
        "hami-device-plugin serve-preload",
        env!("CARGO_PKG_VERSION"),
    );
    let registry = Arc::new(registry);
    let renderer: hami_ops::MetricsRenderer =
        Arc::new(move |format| hami_ops::encode(&registry, format));
    let router = hami_ops::router(renderer, hami_ops::Readiness::new(&[]));
    Ok(Some(tokio::spawn(hami_ops::serve(
        listener,
        router,
        until(stop),
    ))))
}
