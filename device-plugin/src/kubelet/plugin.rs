//! The kubelet lifecycle: serve `DevicePlugin` on `<kubelet-dir>/<socket>`, `Register` with
//! `<kubelet-dir>/kubelet.sock`, and watch both: when kubelet restarts (it deletes the plugin
//! sockets and recreates `kubelet.sock`) or our socket disappears, bind again and register again,
//! with backoff while kubelet is not there. On shutdown the socket is removed.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;

use crate::kubelet::api::{self, v1beta1};
use crate::kubelet::service::{DevicePluginService, SharedState};
use crate::metrics::{Metrics, ReregisterReason};
use hami_ops::Readiness;
use v1beta1::device_plugin_server::DevicePlugin;

/// Where and how the plugin meets kubelet.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    /// kubelet's device-plugin directory (`/var/lib/kubelet/device-plugins`).
    pub kubelet_dir: PathBuf,
    /// The plugin socket's file name, e.g. `nvidia-gpu.sock`.
    pub socket_name: String,
    /// The extended resource, e.g. `nvidia.com/gpu`.
    pub resource_name: String,
    /// How often the directory is checked for a kubelet restart or a lost socket.
    pub watch_interval: Duration,
    /// First wait after a failed registration; doubled up to `backoff_max`.
    pub backoff_min: Duration,
    /// Longest wait between registration attempts.
    pub backoff_max: Duration,
}

impl Lifecycle {
    /// Defaults: check every 250 ms, back off 100 ms … 2 s (a re-registration lands within 5 s
    /// of kubelet coming back).
    pub fn new(kubelet_dir: impl Into<PathBuf>, resource_name: &str) -> Self {
        Self {
            kubelet_dir: kubelet_dir.into(),
            socket_name: socket_name(resource_name),
            resource_name: resource_name.to_owned(),
            watch_interval: Duration::from_millis(250),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
        }
    }

    /// Full path of the plugin socket.
    pub fn socket_path(&self) -> PathBuf {
        self.kubelet_dir.join(&self.socket_name)
    }

    /// Full path of kubelet's registration socket.
    pub fn kubelet_socket(&self) -> PathBuf {
        self.kubelet_dir.join(api::KUBELET_SOCKET)
    }
}

/// `nvidia-<name>.sock` for resource `<domain>/<name>` (HAMi: `nvidia.com/gpu` → `nvidia-gpu.sock`).
pub fn socket_name(resource_name: &str) -> String {
    let name = resource_name.rsplit('/').next().unwrap_or(resource_name);
    format!("nvidia-{name}.sock")
}

/// A device plugin this lifecycle can serve: what it tells kubelet at registration, and the
/// gRPC service of one bound socket (stopped when `stop` becomes true, so that its
/// `ListAndWatch` streams end and a graceful shutdown does not wait for them).
pub trait ServedPlugin: Send + Sync + 'static {
    /// The service kubelet calls.
    type Service: DevicePlugin;
    /// What `Register` and `GetDevicePluginOptions` announce.
    fn options(&self) -> v1beta1::DevicePluginOptions;
    /// The service of one bound socket.
    fn service(self: &Arc<Self>, stop: watch::Receiver<bool>) -> Self::Service;
}

impl ServedPlugin for SharedState {
    type Service = DevicePluginService;

    fn options(&self) -> v1beta1::DevicePluginOptions {
        self.options
    }

    fn service(self: &Arc<Self>, stop: watch::Receiver<bool>) -> DevicePluginService {
        DevicePluginService::new(Arc::clone(self), stop)
    }
}

/// Lifecycle failures that stop the plugin.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// The socket could not be created.
    #[error("cannot listen on {path}: {source}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A stale socket file could not be removed.
    #[error("cannot remove stale socket {path}: {source}")]
    RemoveStale {
        /// The socket path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Failure of one registration attempt.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// kubelet's socket could not be reached.
    #[error("cannot connect to kubelet at {path}: {source}")]
    Connect {
        /// kubelet.sock.
        path: PathBuf,
        /// The transport error.
        source: tonic::transport::Error,
    },
    /// kubelet refused the registration.
    #[error("kubelet refused the registration: {0}")]
    Refused(tonic::Status),
}

/// Registers once with kubelet.
pub async fn register(
    lifecycle: &Lifecycle,
    options: v1beta1::DevicePluginOptions,
) -> Result<(), RegisterError> {
    let path = lifecycle.kubelet_socket();
    let channel = api::connect_unix(&path)
        .await
        .map_err(|source| RegisterError::Connect {
            path: path.clone(),
            source,
        })?;
    let mut client = v1beta1::registration_client::RegistrationClient::new(channel);
    client
        .register(v1beta1::RegisterRequest {
            version: api::VERSION.to_owned(),
            endpoint: lifecycle.socket_name.clone(),
            resource_name: lifecycle.resource_name.clone(),
            options: Some(options),
        })
        .await
        .map_err(RegisterError::Refused)?;
    Ok(())
}

/// Identity of a file: device and inode, to tell a recreated file from the one we saw.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// One bound socket with its server task.
struct Bound {
    identity: Option<(u64, u64)>,
    stop: watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
}

impl Bound {
    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.server.await;
    }
}

fn bind<P: ServedPlugin>(lifecycle: &Lifecycle, state: &Arc<P>) -> Result<Bound, LifecycleError> {
    let path = lifecycle.socket_path();
    // A socket file left by an earlier run (crash, SIGKILL) makes bind fail with EADDRINUSE.
    match std::fs::remove_file(&path) {
        Ok(()) => tracing::info!(socket = %path.display(), "removed stale plugin socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(LifecycleError::RemoveStale { path, source }),
    }
    let listener = UnixListener::bind(&path).map_err(|source| LifecycleError::Bind {
        path: path.clone(),
        source,
    })?;
    let identity = identity(&path);
    let (stop, stopped) = watch::channel(false);
    let service = state.service(stopped.clone());
    let mut shutdown = stopped;
    let server = tokio::spawn(async move {
        let result = tonic::transport::Server::builder()
            .add_service(v1beta1::device_plugin_server::DevicePluginServer::new(
                service,
            ))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                let _ = shutdown.wait_for(|s| *s).await;
            })
            .await;
        if let Err(error) = result {
            tracing::error!(%error, "device plugin server failed");
        }
    });
    Ok(Bound {
        identity,
        stop,
        server,
    })
}

fn remove_socket(path: &Path, ours: Option<(u64, u64)>) {
    // Only our own file: a newer plugin instance may already own the name.
    if ours.is_some()
        && identity(path) == ours
        && let Err(error) = std::fs::remove_file(path)
    {
        tracing::warn!(socket = %path.display(), %error, "cannot remove plugin socket");
    }
}

/// What the watch loop saw.
enum Event {
    Shutdown,
    SocketGone,
    KubeletRestarted,
}

/// Serves kubelet until `shutdown` completes, re-binding and re-registering as needed.
pub async fn serve<P: ServedPlugin>(
    lifecycle: Lifecycle,
    state: Arc<P>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), LifecycleError> {
    let metrics = Arc::new(Metrics::new());
    let ready = readiness(lifecycle.socket_path());
    serve_observed(lifecycle, state, &metrics, &ready, shutdown).await
}

/// The readiness condition set while the plugin is registered with kubelet.
pub const READY_REGISTERED: &str = "registration with kubelet";
/// The readiness probe: the plugin's socket exists.
pub const READY_SOCKET: &str = "plugin socket";

/// The plugin's readiness: registered with kubelet (set by [`serve_observed`]) and its socket
/// `socket` present (probed on every `/readyz`).
pub fn readiness(socket: PathBuf) -> Readiness {
    Readiness::new(&[READY_REGISTERED]).with_probe(READY_SOCKET, move || socket.exists())
}

/// [`serve`], counting registrations in `metrics` and keeping `readiness` current (ready from a
/// successful registration until the next re-bind).
pub async fn serve_observed<P: ServedPlugin>(
    lifecycle: Lifecycle,
    state: Arc<P>,
    metrics: &Metrics,
    readiness: &Readiness,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), LifecycleError> {
    tokio::pin!(shutdown);
    let socket = lifecycle.socket_path();
    loop {
        readiness.set(READY_REGISTERED, false);
        let bound = bind(&lifecycle, &state)?;
        tracing::info!(socket = %socket.display(), resource = %lifecycle.resource_name, "serving the device plugin");
        // Register, with backoff, until kubelet accepts or something forces a re-bind.
        let mut backoff = hami_ops::Backoff::new(lifecycle.backoff_min, lifecycle.backoff_max);
        let mut kubelet = identity(&lifecycle.kubelet_socket());
        let event = loop {
            match register(&lifecycle, state.options()).await {
                Ok(()) => {
                    metrics.observe_registration(true);
                    readiness.set(READY_REGISTERED, true);
                    kubelet = identity(&lifecycle.kubelet_socket());
                    tracing::info!(kubelet = %lifecycle.kubelet_socket().display(), resource = %lifecycle.resource_name, "registered with kubelet");
                    break None;
                }
                Err(error) => {
                    metrics.observe_registration(false);
                    tracing::warn!(%error, retry_ms = backoff.delay().as_millis(), "registration failed");
                }
            }
            tokio::select! {
                () = &mut shutdown => break Some(Event::Shutdown),
                () = tokio::time::sleep(backoff.delay()) => {}
            }
            backoff.fail();
            if identity(&socket) != bound.identity {
                break Some(Event::SocketGone);
            }
        };
        let event = match event {
            Some(event) => event,
            None => loop {
                tokio::select! {
                    () = &mut shutdown => break Event::Shutdown,
                    () = tokio::time::sleep(lifecycle.watch_interval) => {}
                }
                if identity(&socket) != bound.identity {
                    break Event::SocketGone;
                }
                let now = identity(&lifecycle.kubelet_socket());
                if now.is_some() && now != kubelet {
                    break Event::KubeletRestarted;
                }
            },
        };
        let ours = bound.identity;
        readiness.set(READY_REGISTERED, false);
        bound.stop().await;
        match event {
            Event::Shutdown => {
                remove_socket(&socket, ours);
                tracing::info!(socket = %socket.display(), "device plugin stopped");
                return Ok(());
            }
            Event::SocketGone => {
                metrics.observe_reregistration(ReregisterReason::SocketGone);
                tracing::warn!(socket = %socket.display(), "plugin socket removed; binding again")
            }
            Event::KubeletRestarted => {
                metrics.observe_reregistration(ReregisterReason::KubeletRestarted);
                remove_socket(&socket, ours);
                tracing::warn!(
                    "kubelet.sock recreated (kubelet restarted); binding and registering again"
                );
            }
        }
    }
}
