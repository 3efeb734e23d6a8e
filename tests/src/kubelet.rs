//! A fake kubelet for device plugin tests: a `Registration` server on `<dir>/kubelet.sock` that
//! records each registration, dials the plugin back (as kubelet does), asks for its options and
//! consumes `ListAndWatch`; helpers to call `GetPreferredAllocation` and `Allocate`; and
//! [`FakeKubelet::restart`], which behaves like a kubelet restart: the plugin sockets and
//! `kubelet.sock` are deleted, and a new `kubelet.sock` appears.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hami_device_plugin::kubelet::api::{self, v1beta1};
use tokio::net::UnixListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// kubelet keeps this file across restarts; the other sockets of the directory are removed.
const CHECKPOINT: &str = "kubelet_internal_checkpoint";

/// Errors of the fake kubelet (and of a test's wait).
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// Binding `kubelet.sock` or clearing the directory failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A wait ran out.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, String),
    /// Dialling the plugin failed.
    #[error("cannot connect to the plugin at {path}: {source}")]
    Connect {
        /// The plugin socket.
        path: PathBuf,
        /// The transport error.
        source: tonic::transport::Error,
    },
    /// A plugin call failed.
    #[error("plugin call failed: {0}")]
    Call(#[from] Status),
    /// No plugin has registered yet.
    #[error("no plugin has registered")]
    NoPlugin,
}

/// One registration as the fake kubelet saw it, and what it learnt from the plugin afterwards.
#[derive(Debug, Clone)]
pub struct Registration {
    /// The request as received.
    pub request: v1beta1::RegisterRequest,
    /// When it arrived.
    pub received_at: Instant,
    /// Which kubelet instance received it (0 at start, +1 per restart).
    pub generation: u64,
    /// What `GetDevicePluginOptions` answered on dial-back.
    pub options: Option<v1beta1::DevicePluginOptions>,
    /// Every list received on `ListAndWatch`, in order.
    pub device_lists: Vec<Vec<v1beta1::Device>>,
    /// Set when the dial-back failed or the stream ended with an error.
    pub error: Option<String>,
}

impl Registration {
    /// The latest device list.
    pub fn devices(&self) -> Option<&[v1beta1::Device]> {
        self.device_lists.last().map(Vec::as_slice)
    }
}

type State = Vec<Registration>;

#[derive(Debug, Clone)]
struct RegistrationService {
    dir: PathBuf,
    generation: u64,
    state: watch::Sender<State>,
    dialers: std::sync::Arc<std::sync::Mutex<Vec<JoinHandle<()>>>>,
}

#[tonic::async_trait]
impl v1beta1::registration_server::Registration for RegistrationService {
    async fn register(
        &self,
        request: Request<v1beta1::RegisterRequest>,
    ) -> Result<Response<v1beta1::Empty>, Status> {
        let request = request.into_inner();
        // kubelet's own checks: supported version, a socket name (not a path), a resource name.
        if request.version != api::VERSION {
            return Err(Status::invalid_argument(format!(
                "unsupported device plugin API version {:?}",
                request.version
            )));
        }
        if request.endpoint.is_empty() || request.endpoint.contains('/') {
            return Err(Status::invalid_argument(format!(
                "invalid endpoint {:?}",
                request.endpoint
            )));
        }
        if !request.resource_name.contains('/') {
            return Err(Status::invalid_argument(format!(
                "invalid resource name {:?}",
                request.resource_name
            )));
        }
        let endpoint = self.dir.join(&request.endpoint);
        let mut index = 0;
        self.state.send_modify(|s| {
            index = s.len();
            s.push(Registration {
                request,
                received_at: Instant::now(),
                generation: self.generation,
                options: None,
                device_lists: Vec::new(),
                error: None,
            });
        });
        let state = self.state.clone();
        let dialer = tokio::spawn(dial_back(endpoint, index, state));
        if let Ok(mut dialers) = self.dialers.lock() {
            dialers.push(dialer);
        }
        Ok(Response::new(v1beta1::Empty {}))
    }
}

/// What kubelet does after a registration: options, then the device stream until it ends.
async fn dial_back(endpoint: PathBuf, index: usize, state: watch::Sender<State>) {
    let fail = |message: String| {
        state.send_modify(|s| s[index].error = Some(message));
    };
    let channel = match api::connect_unix(&endpoint).await {
        Ok(c) => c,
        Err(e) => return fail(format!("dial {}: {e}", endpoint.display())),
    };
    let mut client = v1beta1::device_plugin_client::DevicePluginClient::new(channel);
    match client.get_device_plugin_options(v1beta1::Empty {}).await {
        Ok(options) => {
            let options = options.into_inner();
            state.send_modify(|s| s[index].options = Some(options));
        }
        Err(e) => return fail(format!("GetDevicePluginOptions: {e}")),
    }
    let mut stream = match client.list_and_watch(v1beta1::Empty {}).await {
        Ok(s) => s.into_inner(),
        Err(e) => return fail(format!("ListAndWatch: {e}")),
    };
    loop {
        match stream.message().await {
            Ok(Some(list)) => state.send_modify(|s| s[index].device_lists.push(list.devices)),
            Ok(None) => return,
            Err(e) => return fail(format!("ListAndWatch stream: {e}")),
        }
    }
}

struct Running {
    stop: oneshot::Sender<()>,
    server: JoinHandle<()>,
}

/// The fake kubelet.
#[derive(Debug)]
pub struct FakeKubelet {
    dir: PathBuf,
    generation: u64,
    state: watch::Sender<State>,
    dialers: std::sync::Arc<std::sync::Mutex<Vec<JoinHandle<()>>>>,
    running: Option<Running>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Running")
    }
}

impl FakeKubelet {
    /// Starts serving `Registration` on `<dir>/kubelet.sock`.
    pub async fn start(dir: impl Into<PathBuf>) -> Result<Self, KubeletError> {
        let (state, _) = watch::channel(Vec::new());
        let mut kubelet = Self {
            dir: dir.into(),
            generation: 0,
            state,
            dialers: std::sync::Arc::default(),
            running: None,
        };
        kubelet.cleanup_plugin_directory()?;
        kubelet.serve()?;
        Ok(kubelet)
    }

    /// What kubelet v1.34 does when its registration server starts (`CleanupPluginDirectory`,
    /// seen on the real node of tests/tests/real_node/main.rs): every **socket** of the folder is
    /// removed, the checkpoint kept; folders and other files stay.
    fn cleanup_plugin_directory(&self) -> Result<(), KubeletError> {
        use std::os::unix::fs::FileTypeExt;
        let entries = std::fs::read_dir(&self.dir).map_err(|source| KubeletError::Io {
            what: "read dir",
            path: self.dir.clone(),
            source,
        })?;
        for entry in entries.flatten() {
            let path = entry.path();
            let is_socket = std::fs::metadata(&path).is_ok_and(|m| m.file_type().is_socket());
            if entry.file_name() == CHECKPOINT || !is_socket {
                continue;
            }
            std::fs::remove_file(&path).map_err(|source| KubeletError::Io {
                what: "remove",
                path,
                source,
            })?;
        }
        Ok(())
    }

    fn serve(&mut self) -> Result<(), KubeletError> {
        let path = self.socket();
        let listener = UnixListener::bind(&path).map_err(|source| KubeletError::Io {
            what: "bind",
            path,
            source,
        })?;
        let service = RegistrationService {
            dir: self.dir.clone(),
            generation: self.generation,
            state: self.state.clone(),
            dialers: self.dialers.clone(),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(v1beta1::registration_server::RegistrationServer::new(
                    service,
                ))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
        });
        self.running = Some(Running { stop, server });
        Ok(())
    }

    async fn shut_down(&mut self) {
        if let Some(running) = self.running.take() {
            let _ = running.stop.send(());
            let _ = running.server.await;
        }
        if let Ok(mut dialers) = self.dialers.lock() {
            for dialer in dialers.drain(..) {
                dialer.abort();
            }
        }
    }

    /// The device-plugin directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<dir>/kubelet.sock`.
    pub fn socket(&self) -> PathBuf {
        self.dir.join(api::KUBELET_SOCKET)
    }

    /// Every registration so far.
    pub fn registrations(&self) -> Vec<Registration> {
        self.state.borrow().clone()
    }

    /// Waits until `pred` holds for the registrations, at most `timeout`.
    pub async fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        mut pred: impl FnMut(&[Registration]) -> bool,
    ) -> Result<Vec<Registration>, KubeletError> {
        let mut rx = self.state.subscribe();
        match tokio::time::timeout(timeout, rx.wait_for(|s| pred(s))).await {
            Ok(Ok(state)) => Ok(state.clone()),
            _ => Err(KubeletError::Timeout(
                timeout,
                format!("{what}; registrations: {:?}", self.registrations()),
            )),
        }
    }

    /// Waits for the `n`-th registration (1-based) and its first device list.
    pub async fn wait_for_registration(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Registration, KubeletError> {
        let state = self
            .wait_until(
                &format!("registration #{n} with a device list"),
                timeout,
                |s| {
                    s.get(n - 1)
                        .is_some_and(|r| !r.device_lists.is_empty() || r.error.is_some())
                },
            )
            .await?;
        Ok(state[n - 1].clone())
    }

    /// Waits until registration `n` (1-based) has received at least `lists` device lists.
    pub async fn wait_for_device_lists(
        &self,
        n: usize,
        lists: usize,
        timeout: Duration,
    ) -> Result<Registration, KubeletError> {
        let state = self
            .wait_until(
                &format!("{lists} device lists on registration #{n}"),
                timeout,
                |s| s.get(n - 1).is_some_and(|r| r.device_lists.len() >= lists),
            )
            .await?;
        Ok(state[n - 1].clone())
    }

    /// Restarts like kubelet: stops serving, removes `kubelet.sock` and every plugin socket (the
    /// sockets of the folder; the checkpoint, folders and other files stay), and serves again on a new `kubelet.sock`. Returns when the new
    /// socket is listening (the instant to measure re-registration from).
    pub async fn restart(&mut self) -> Result<Instant, KubeletError> {
        self.shut_down().await;
        self.cleanup_plugin_directory()?;
        self.generation += 1;
        self.serve()?;
        Ok(Instant::now())
    }

    /// Stops serving and removes `kubelet.sock` (kubelet going away).
    pub async fn stop(&mut self) {
        self.shut_down().await;
        let _ = std::fs::remove_file(self.socket());
    }

    /// A client of the latest registered plugin.
    pub async fn plugin(&self) -> Result<PluginClient, KubeletError> {
        let endpoint = self
            .registrations()
            .last()
            .map(|r| r.request.endpoint.clone())
            .ok_or(KubeletError::NoPlugin)?;
        PluginClient::connect(&self.dir.join(endpoint)).await
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            let _ = running.stop.send(());
            running.server.abort();
        }
        if let Ok(mut dialers) = self.dialers.lock() {
            for dialer in dialers.drain(..) {
                dialer.abort();
            }
        }
    }
}

/// kubelet's side of the `DevicePlugin` service.
#[derive(Debug, Clone)]
pub struct PluginClient {
    client: v1beta1::device_plugin_client::DevicePluginClient<tonic::transport::Channel>,
}

impl PluginClient {
    /// Dials a plugin socket.
    pub async fn connect(path: &Path) -> Result<Self, KubeletError> {
        let channel = api::connect_unix(path)
            .await
            .map_err(|source| KubeletError::Connect {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Self {
            client: v1beta1::device_plugin_client::DevicePluginClient::new(channel),
        })
    }

    /// `GetDevicePluginOptions`.
    pub async fn options(&mut self) -> Result<v1beta1::DevicePluginOptions, KubeletError> {
        Ok(self
            .client
            .get_device_plugin_options(v1beta1::Empty {})
            .await?
            .into_inner())
    }

    /// `ListAndWatch`.
    pub async fn list_and_watch(
        &mut self,
    ) -> Result<tonic::Streaming<v1beta1::ListAndWatchResponse>, KubeletError> {
        Ok(self
            .client
            .list_and_watch(v1beta1::Empty {})
            .await?
            .into_inner())
    }

    /// `GetPreferredAllocation` for one container.
    pub async fn preferred(
        &mut self,
        available: &[String],
        must_include: &[String],
        size: i32,
    ) -> Result<Vec<String>, KubeletError> {
        let request = v1beta1::PreferredAllocationRequest {
            container_requests: vec![v1beta1::ContainerPreferredAllocationRequest {
                available_device_i_ds: available.to_vec(),
                must_include_device_i_ds: must_include.to_vec(),
                allocation_size: size,
            }],
        };
        let response = self
            .client
            .get_preferred_allocation(request)
            .await?
            .into_inner();
        Ok(response
            .container_responses
            .into_iter()
            .next()
            .map(|c| c.device_i_ds)
            .unwrap_or_default())
    }

    /// `Allocate` for the given containers' device IDs.
    pub async fn allocate(
        &mut self,
        containers: &[Vec<String>],
    ) -> Result<v1beta1::AllocateResponse, Status> {
        let request = v1beta1::AllocateRequest {
            container_requests: containers
                .iter()
                .map(|ids| v1beta1::ContainerAllocateRequest {
                    devices_ids: ids.clone(),
                })
                .collect(),
        };
        Ok(self.client.allocate(request).await?.into_inner())
    }
}

/// A device plugin served in process (the library's real lifecycle) for tests.
#[derive(Debug)]
pub struct RunningPlugin {
    /// The plugin's state (device table, options, handlers).
    pub state: std::sync::Arc<hami_device_plugin::kubelet::service::SharedState>,
    /// Where it serves.
    pub lifecycle: hami_device_plugin::kubelet::plugin::Lifecycle,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), hami_device_plugin::kubelet::plugin::LifecycleError>>>,
}

impl RunningPlugin {
    /// Starts serving `state` as `lifecycle` says.
    pub fn start(
        lifecycle: hami_device_plugin::kubelet::plugin::Lifecycle,
        state: std::sync::Arc<hami_device_plugin::kubelet::service::SharedState>,
    ) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(hami_device_plugin::kubelet::plugin::serve(
            lifecycle.clone(),
            state.clone(),
            async {
                let _ = stopped.await;
            },
        ));
        Self {
            state,
            lifecycle,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops it (as SIGTERM does) and returns the lifecycle's result.
    pub async fn shutdown(
        mut self,
    ) -> Result<(), hami_device_plugin::kubelet::plugin::LifecycleError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await.unwrap_or(Ok(())),
            None => Ok(()),
        }
    }
}

impl Drop for RunningPlugin {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
