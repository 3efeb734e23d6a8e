//! An in-process Kubernetes API server: real HTTP on `127.0.0.1`, in-memory objects, the REST
//! protocol the `kube` client speaks (get, list, watch, create, update, patch, delete, discovery),
//! with fault injection for tests. See `tests/README.md` for what it supports.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use hami_tests::apiserver::ApiServer;
//! use k8s_openapi::api::core::v1::Node;
//! let server = ApiServer::start().await?;
//! server.seed(&hami_tests::apiserver::fixtures::gpu_node("gpu-0", 0)?)?;
//! let nodes: kube::Api<Node> = kube::Api::all(server.client());
//! assert_eq!(nodes.list(&Default::default()).await?.items.len(), 1);
//! # Ok(()) }
//! ```

mod defaults;
mod discovery;
mod faults;
pub mod fixtures;
mod handlers;
mod patch;
mod resources;
mod selector;
mod status;
mod store;
mod watch;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::{JoinHandle, JoinSet};
use tower::ServiceExt;

pub use faults::{Fault, RequestMatch, RequestRecord, Verb};
pub use patch::PatchKind;
pub use resources::{RESOURCES, ResourceType, lookup, resource_of};
use selector::Filter;

use faults::Faults;
use status::ApiError;
use store::Store;

/// Errors of the test apiserver's handle.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    /// The listening socket could not be set up.
    #[error("binding the test apiserver to {addr}: {source}")]
    Bind {
        /// Address tried.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// The kube client for the server could not be built.
    #[error("building a kube client for {url}: {source}")]
    Client {
        /// Server URL.
        url: String,
        /// Cause.
        source: Box<kube::Error>,
    },
    /// The type is not one the server serves.
    #[error("the test apiserver does not serve {api_version} {kind}")]
    UnknownType {
        /// apiVersion of the type.
        api_version: String,
        /// Kind of the type.
        kind: String,
    },
    /// The store rejected the object.
    #[error("the test apiserver rejected the object: {reason} ({code}): {message}")]
    Rejected {
        /// HTTP code the API would answer.
        code: u16,
        /// `metav1.Status` reason.
        reason: &'static str,
        /// Message.
        message: String,
    },
    /// An object could not be converted to or from JSON.
    #[error("converting {kind} to or from JSON: {source}")]
    Json {
        /// Kind of the object.
        kind: String,
        /// Cause.
        source: serde_json::Error,
    },
    /// A fixture could not be read.
    #[error("fixture {name}: {source}")]
    Fixture {
        /// Fixture file name.
        name: &'static str,
        /// What is wrong (shared: the parse is done once and its outcome kept).
        source: std::sync::Arc<serde_json::Error>,
    },
}

impl From<ApiError> for ApiServerError {
    fn from(e: ApiError) -> Self {
        Self::Rejected {
            code: e.code,
            reason: e.reason,
            message: e.message,
        }
    }
}

/// Settings of a test apiserver.
#[derive(Debug, Clone)]
pub struct ApiServerBuilder {
    history_limit: usize,
    bookmark_interval: Duration,
    port: u16,
}

impl Default for ApiServerBuilder {
    fn default() -> Self {
        Self {
            history_limit: 1024,
            bookmark_interval: Duration::from_secs(10),
            port: 0,
        }
    }
}

impl ApiServerBuilder {
    /// Changes kept per resource for watches that resume from a resourceVersion (default 1024); a
    /// watch from before the oldest kept change gets `410 Expired`.
    pub fn history_limit(mut self, changes: usize) -> Self {
        self.history_limit = changes;
        self
    }

    /// How often an idle watch with `allowWatchBookmarks` gets a BOOKMARK (default 10 s; the
    /// real apiserver sends one about every minute).
    pub fn bookmark_interval(mut self, every: Duration) -> Self {
        self.bookmark_interval = every;
        self
    }

    /// Listen on this port instead of an ephemeral one.
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Starts the server.
    pub async fn start(self) -> Result<ApiServer, ApiServerError> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let listener = bind(addr)?;
        let addr = listener
            .local_addr()
            .map_err(|source| ApiServerError::Bind { addr, source })?;
        let (watch_tx, _) = tokio::sync::watch::channel(0u64);
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(self.history_limit)),
            faults: Mutex::new(Faults::default()),
            log: Mutex::new(VecDeque::new()),
            bookmark_interval: self.bookmark_interval,
            watch_events: watch_tx,
            addr,
        });
        let url = format!("http://{addr}");
        let client = build_client(&url)?;
        let task = Some(tokio::spawn(serve(listener, shared.clone())));
        Ok(ApiServer {
            shared,
            url,
            client,
            task,
        })
    }
}

fn bind(addr: SocketAddr) -> Result<TcpListener, ApiServerError> {
    let err = |source| ApiServerError::Bind { addr, source };
    let socket = TcpSocket::new_v4().map_err(err)?;
    // Restart binds the same port again while old connections may sit in TIME_WAIT.
    socket.set_reuseaddr(true).map_err(err)?;
    socket.bind(addr).map_err(err)?;
    socket.listen(1024).map_err(err)
}

fn build_client(url: &str) -> Result<kube::Client, ApiServerError> {
    let uri: http::Uri =
        url.parse()
            .map_err(|e: http::uri::InvalidUri| ApiServerError::Client {
                url: url.to_string(),
                source: Box::new(kube::Error::Service(Box::new(e))),
            })?;
    let config = kube::Config::new(uri);
    kube::Client::try_from(config).map_err(|source| ApiServerError::Client {
        url: url.to_string(),
        source: Box::new(source),
    })
}

/// State shared by the handle and the request handlers.
#[derive(Debug)]
pub(crate) struct Shared {
    store: Mutex<Store>,
    faults: Mutex<Faults>,
    log: Mutex<VecDeque<RequestRecord>>,
    bookmark_interval: Duration,
    watch_events: tokio::sync::watch::Sender<u64>,
    addr: SocketAddr,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    pub(crate) fn log(&self, record: RequestRecord) {
        let mut log = lock(&self.log);
        log.push_back(record);
        while log.len() > faults::REQUEST_LOG_LIMIT {
            log.pop_front();
        }
    }

    pub(crate) fn watch_registered(&self) {
        self.watch_events.send_modify(|n| *n += 1);
    }
}

/// Why a connection was closed without an answer (an injected fault).
#[derive(Debug, thiserror::Error)]
#[error("connection dropped by fault injection")]
struct Dropped;

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let router = Router::new()
        .fallback(handlers::dispatch)
        .with_state(shared.clone());
    // Connection tasks live in this set: aborting `serve` drops it and with it every connection,
    // which is how `stop()` takes the server down.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let router = router.clone();
                let shared = shared.clone();
                let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let router = router.clone();
                    let shared = shared.clone();
                    async move { handle(shared, router, req).await }
                });
                connections.spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn handle(
    shared: Arc<Shared>,
    router: Router,
    req: http::Request<Incoming>,
) -> Result<axum::response::Response, Dropped> {
    let (verb, route) = handlers::classify(req.method(), req.uri());
    let resource = match &route {
        handlers::Route::Resource(p) => Some(p.rt.plural),
        _ => None,
    };
    let (fault, delay) = {
        let mut f = lock(&shared.faults);
        (f.take(verb, resource), f.latency(verb, resource))
    };
    if let Some(fault) = fault {
        let mut rec = handlers::record(req.method(), req.uri(), req.headers(), bytes::Bytes::new());
        rec.fault = Some(fault);
        shared.log(rec);
        return match fault {
            Fault::DropConnection => Err(Dropped),
            Fault::Status(code) => Ok(axum::response::IntoResponse::into_response(
                ApiError::injected(code),
            )),
        };
    }
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    match router.oneshot(req.map(axum::body::Body::new)).await {
        Ok(resp) => Ok(resp),
        Err(never) => match never {},
    }
}

/// A running test apiserver. Dropping it (or [`ApiServer::shutdown`]) stops it.
pub struct ApiServer {
    shared: Arc<Shared>,
    url: String,
    client: kube::Client,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("url", &self.url)
            .field("running", &self.is_running())
            .finish_non_exhaustive()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

fn type_of<K: k8s_openapi::Resource>() -> Result<&'static ResourceType, ApiServerError> {
    resource_of::<K>().ok_or_else(|| ApiServerError::UnknownType {
        api_version: K::API_VERSION.to_string(),
        kind: K::KIND.to_string(),
    })
}

fn to_value<K: k8s_openapi::Resource + Serialize>(obj: &K) -> Result<Value, ApiServerError> {
    serde_json::to_value(obj).map_err(|source| ApiServerError::Json {
        kind: K::KIND.to_string(),
        source,
    })
}

fn from_value<K: k8s_openapi::Resource + DeserializeOwned>(v: &Value) -> Result<K, ApiServerError> {
    K::deserialize(v).map_err(|source| ApiServerError::Json {
        kind: K::KIND.to_string(),
        source,
    })
}

impl ApiServer {
    /// Starts a server on an ephemeral port of 127.0.0.1 with default settings.
    pub async fn start() -> Result<Self, ApiServerError> {
        ApiServerBuilder::default().start().await
    }

    /// Settings for a server to start.
    pub fn builder() -> ApiServerBuilder {
        ApiServerBuilder::default()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// A kube client for this server (default namespace `default`). Clones share a connection
    /// pool; the client keeps working across [`ApiServer::stop`] / [`ApiServer::restart`].
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// A fresh `kube::Config` for this server, for components that build their own client.
    pub fn kube_config(&self) -> Result<kube::Config, ApiServerError> {
        let uri: http::Uri =
            self.url
                .parse()
                .map_err(|e: http::uri::InvalidUri| ApiServerError::Client {
                    url: self.url.clone(),
                    source: Box::new(kube::Error::Service(Box::new(e))),
                })?;
        Ok(kube::Config::new(uri))
    }

    // ---- seeding and inspection ----

    /// Stores an object directly (no create-time defaults or validation; server fields are filled
    /// when missing), replacing one with the same name. Watchers see ADDED or MODIFIED. Returns the
    /// stored object.
    pub fn seed<K>(&self, obj: &K) -> Result<K, ApiServerError>
    where
        K: k8s_openapi::Resource + Serialize + DeserializeOwned,
    {
        let rt = type_of::<K>()?;
        let mut value = to_value(obj)?;
        if let Some(m) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        let stored = self.shared.store().seed(rt, value)?;
        from_value(&stored.value)
    }

    /// Seeds many objects under one lock; returns how many were stored.
    pub fn seed_all<K>(&self, objs: impl IntoIterator<Item = K>) -> Result<usize, ApiServerError>
    where
        K: k8s_openapi::Resource + Serialize + DeserializeOwned,
    {
        let rt = type_of::<K>()?;
        let values = objs
            .into_iter()
            .map(|o| to_value(&o))
            .collect::<Result<Vec<_>, _>>()?;
        let mut store = self.shared.store();
        let n = values.len();
        for mut v in values {
            if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("resourceVersion");
            }
            store.seed(rt, v)?;
        }
        Ok(n)
    }

    /// Stores a JSON object directly; its `apiVersion` and `kind` pick the resource.
    pub fn seed_json(&self, mut value: Value) -> Result<Value, ApiServerError> {
        let api_version = value
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let kind = value
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", &api_version));
        let rt = RESOURCES
            .iter()
            .find(|r| r.group == group && r.version == version && r.kind == kind)
            .ok_or_else(|| ApiServerError::UnknownType {
                api_version: api_version.clone(),
                kind: kind.clone(),
            })?;
        if let Some(m) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        Ok(self.shared.store().seed(rt, value)?.value.clone())
    }

    /// The stored object, if any (`namespace` is ignored for cluster-scoped types).
    pub fn get<K>(&self, namespace: Option<&str>, name: &str) -> Result<Option<K>, ApiServerError>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        let rt = type_of::<K>()?;
        let ns = if rt.namespaced {
            namespace.unwrap_or_default()
        } else {
            ""
        };
        let stored = self.shared.store().get(rt, ns, name);
        stored.map(|s| from_value(&s.value)).transpose()
    }

    /// The stored JSON of an object, exactly as the server serves it.
    pub fn get_json<K: k8s_openapi::Resource>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let rt = resource_of::<K>()?;
        let ns = if rt.namespaced {
            namespace.unwrap_or_default()
        } else {
            ""
        };
        let stored = self.shared.store().get(rt, ns, name);
        stored.map(|s| s.value.clone())
    }

    /// Every stored object of a type, in (namespace, name) order.
    pub fn list<K>(&self) -> Result<Vec<K>, ApiServerError>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        let rt = type_of::<K>()?;
        let (_, items) = self.shared.store().list(rt, &Filter::default());
        items.iter().map(|s| from_value(&s.value)).collect()
    }

    /// How many objects of a type are stored.
    pub fn count<K: k8s_openapi::Resource>(&self) -> usize {
        resource_of::<K>().map_or(0, |rt| {
            self.shared.store().list(rt, &Filter::default()).1.len()
        })
    }

    /// Removes an object directly (watchers see DELETED); false if it was not there.
    pub fn remove<K: k8s_openapi::Resource>(&self, namespace: Option<&str>, name: &str) -> bool {
        let Some(rt) = resource_of::<K>() else {
            return false;
        };
        let ns = if rt.namespaced {
            namespace.unwrap_or_default()
        } else {
            ""
        };
        self.shared.store().remove(rt, ns, name).is_some()
    }

    /// The cluster-wide resourceVersion of the last change.
    pub fn resource_version(&self) -> u64 {
        self.shared.store().current_rv()
    }

    /// Forgets the change history of every type (like etcd compaction): watches from an older
    /// resourceVersion get `410 Expired`, and open continue tokens expire.
    pub fn compact(&self) {
        self.shared.store().compact();
    }

    /// Requests seen so far (the last 10,000), oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.shared.log).iter().cloned().collect()
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        lock(&self.shared.log).clear();
    }

    // ---- watches ----

    /// Open watch streams on a type.
    pub fn watcher_count<K: k8s_openapi::Resource>(&self) -> usize {
        resource_of::<K>().map_or(0, |rt| self.shared.store().watcher_count(rt))
    }

    /// Waits until at least `n` watch streams are open on a type (wrap it in a timeout).
    pub async fn wait_for_watchers<K: k8s_openapi::Resource>(&self, n: usize) {
        let mut rx = self.shared.watch_events.subscribe();
        loop {
            if self.watcher_count::<K>() >= n {
                return;
            }
            // A closed watch does not notify; poll at a coarse interval as well.
            let _ = tokio::time::timeout(Duration::from_millis(50), rx.changed()).await;
        }
    }

    /// Ends every open watch stream cleanly (as an apiserver does at its timeout or on a
    /// restart); returns how many were open. Clients resume from their last resourceVersion.
    pub fn close_watches(&self) -> usize {
        self.shared.store().close_watches()
    }

    // ---- fault injection ----

    /// Makes the next `count` requests that match fail with `fault`.
    pub fn fail_next(&self, matcher: RequestMatch, count: usize, fault: Fault) {
        lock(&self.shared.faults).fail_next(matcher, count, fault);
    }

    /// Delays every matching request by `delay` (rules add up) until [`ApiServer::clear_faults`].
    pub fn add_latency(&self, matcher: RequestMatch, delay: Duration) {
        lock(&self.shared.faults).add_latency(matcher, delay);
    }

    /// Removes all fault and latency rules.
    pub fn clear_faults(&self) {
        lock(&self.shared.faults).clear();
    }

    /// Injected failures not yet used.
    pub fn pending_faults(&self) -> usize {
        lock(&self.shared.faults).pending()
    }

    /// Takes the server down: the port is closed and every connection (watches included) is
    /// dropped. Objects, history and the resourceVersion are kept for [`ApiServer::restart`].
    pub async fn stop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
        self.shared.store().close_watches();
    }

    /// Brings a stopped server back on the same port with the same data.
    pub async fn restart(&mut self) -> Result<(), ApiServerError> {
        self.stop().await;
        let listener = bind(self.shared.addr)?;
        self.task = Some(tokio::spawn(serve(listener, self.shared.clone())));
        Ok(())
    }

    /// Whether the server is accepting connections.
    pub fn is_running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops the server and waits until its connections are closed.
    pub async fn shutdown(mut self) {
        self.stop().await;
    }
}
