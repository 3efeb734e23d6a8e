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

use clap::Args;
use hami_shared::names::{self, DEFAULT_HOOK_PATH, PRELOAD_SOCKET, RESOURCE_PRELOAD, VGPU_DIR};

use crate::commands::install_hook::{InstallHookError, normalise_hook_path};
use crate::kubelet::api;
use crate::kubelet::plugin::{Lifecycle, LifecycleError, serve};
pub mod plugin;

use plugin::{DEFAULT_SLOTS, HookError, PreloadPlugin, inspect_hook};

/// `serve-preload` flags.
#[derive(Debug, Clone, Args)]
pub struct ServePreloadArgs {
    /// HAMi's hook path on the host, `HOOK` (the value `install-hook` was given): the files are
    /// mounted from `HOOK/vgpu/`, at the same paths in the container.
    #[arg(long = "hook-path", env = names::ENV_HAMI_HOOK_PATH, default_value = DEFAULT_HOOK_PATH, value_name = "HOOK")]
    pub hook_path: PathBuf,
    /// kubelet's device-plugin directory.
    #[arg(long = "kubelet-dir", env = names::ENV_HAMI_KUBELET_DIR, default_value = api::DEFAULT_KUBELET_DIR, value_name = "DIR")]
    pub kubelet_dir: PathBuf,
    /// How many containers of the node may hold `hami.io/preload` at once (1 to 100000).
    #[arg(long = "slots", default_value_t = DEFAULT_SLOTS, value_parser = clap::value_parser!(u32).range(1..=100_000), value_name = "N")]
    pub slots: u32,
}

/// Why `serve-preload` stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServePreloadError {
    /// `--hook-path` is not usable.
    #[error(transparent)]
    HookPath(#[from] InstallHookError),
    /// The hook folder is not what `install-hook` leaves.
    #[error("the hook folder cannot be handed to containers: {0}")]
    Hook(#[from] HookError),
    /// The socket could not be served.
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
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
    Ok(PreloadPlugin {
        vgpu_dir,
        slots: args.slots,
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
    serve(lifecycle(args), plugin, shutdown).await?;
    Ok(())
}
