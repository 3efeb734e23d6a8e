//! The HTTPS admission server and the plain-HTTP health/metrics server.
//!
//! [`serve_tls`] takes an already-bound listener and a shutdown future (tests bind port 0 and run
//! the real server in process). Each accepted connection is TLS-terminated with rustls and served
//! by hyper's HTTP/1.1 + h2 connection builder running the axum router. On shutdown the listener
//! closes, every connection finishes its in-flight requests (HTTP/1.1: then closes; h2: GOAWAY),
//! and the call returns when all are done or the grace period ends.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use hami_ops::Readiness;

use crate::metrics::Metrics;
use crate::mutation::Outcome;
use crate::settings::Settings;
use crate::vram::metrics::KaiMetrics;
use crate::vram::source::VramSource;

/// What the `/mutate` handler needs.
#[derive(Debug)]
pub struct AppState {
    pub settings: Arc<Settings>,
    pub metrics: Arc<Metrics>,
    /// Where the per-GPU VRAM basis comes from; read as a snapshot per review.
    pub vram: VramSource,
    /// Counts what the decisions observed.
    pub kai_metrics: KaiMetrics,
    limiter: Semaphore,
    /// Room for request bodies, in bytes past each body's first [`FREE_BODY_BYTES`].
    body_budget: Semaphore,
}

impl AppState {
    /// State for `settings`, with its concurrency bound.
    #[must_use]
    pub fn new(
        settings: Arc<Settings>,
        metrics: Arc<Metrics>,
        vram: VramSource,
        kai_metrics: KaiMetrics,
    ) -> Arc<Self> {
        let permits = settings.server.max_concurrent_requests.max(1);
        // Bounded so that `acquire_many` (u32) can always take a whole body.
        let budget = settings
            .server
            .body_memory()
            .min(u32::MAX as usize)
            .min(Semaphore::MAX_PERMITS);
        Arc::new(Self {
            settings,
            metrics,
            vram,
            kai_metrics,
            limiter: Semaphore::new(permits),
            body_budget: Semaphore::new(budget),
        })
    }

    /// Review one body with the current VRAM basis.
    fn review(&self, body: &[u8]) -> Result<crate::review::Reviewed, crate::review::BodyError> {
        // The basis snapshot (a read lock on a watched index) is held for the decision only.
        crate::review::review_with(body, |request| {
            self.vram
                .with_basis(|vram| crate::decide::decide(request, &self.settings, vram))
        })
    }
}

/// The admission router: `POST /mutate`.
pub fn admission_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .with_state(state)
}

fn plain(code: StatusCode, message: String) -> Response {
    (
        code,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        message + "\n",
    )
        .into_response()
}

/// Whether the Content-Type is `application/json` (parameters such as `charset` allowed).
fn is_json(content_type: Option<&HeaderValue>) -> bool {
    content_type
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight().dec();
    }
}

/// The first bytes of every body, read without asking the shared body budget: small reviews (a
/// pod is a few KiB) never wait behind large or stalled bodies.
pub const FREE_BODY_BYTES: usize = 64 * 1024;

/// Bodies from this size on are reviewed on the blocking pool, off the runtime's workers, so a
/// large review never delays the handshakes and small reviews of other clients.
const BLOCKING_REVIEW_BYTES: usize = 256 * 1024;

/// Why a body was not read.
enum BodyFailure {
    TooLarge,
    Read(String),
    /// The deadline passed while the client was sending.
    TimedOut,
    /// The deadline passed while waiting for room in the body budget.
    NoRoom,
}

/// Read the body into one buffer (sized from `Content-Length` when given), at most `limit`
/// bytes, before `deadline`; every byte past [`FREE_BODY_BYTES`] takes room in `budget` first.
/// Returns the body and the room it holds (released when dropped).
async fn read_body<'a>(
    mut body: Body,
    declared: Option<u64>,
    limit: usize,
    budget: &'a Semaphore,
    deadline: tokio::time::Instant,
) -> Result<(Vec<u8>, Option<tokio::sync::SemaphorePermit<'a>>), BodyFailure> {
    let capacity = declared
        .and_then(|n| usize::try_from(n).ok())
        .map_or(FREE_BODY_BYTES.min(limit), |n| n.min(limit));
    let mut buf: Vec<u8> = Vec::with_capacity(capacity.min(FREE_BODY_BYTES));
    let mut room: Option<tokio::sync::SemaphorePermit<'a>> = None;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(BodyFailure::TimedOut),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(BodyFailure::Read(e.to_string())),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let len = buf.len() + data.len();
        if len > limit {
            return Err(BodyFailure::TooLarge);
        }
        let counted =
            len.saturating_sub(FREE_BODY_BYTES) - buf.len().saturating_sub(FREE_BODY_BYTES);
        if counted > 0 {
            // `limit` fits the budget (see `ServerSettings::body_memory`) and a u32.
            let n = u32::try_from(counted).map_err(|_| BodyFailure::TooLarge)?;
            let more = match tokio::time::timeout_at(deadline, budget.acquire_many(n)).await {
                Ok(Ok(p)) => p,
                // The semaphore is never closed.
                Ok(Err(_)) | Err(_) => return Err(BodyFailure::NoRoom),
            };
            match &mut room {
                Some(r) => r.merge(more),
                None => room = Some(more),
            }
            if buf.capacity() < capacity {
                buf.reserve_exact(capacity - buf.len());
            }
        }
        buf.extend_from_slice(&data);
    }
    Ok((buf, room))
}

async fn mutate(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let start = Instant::now();
    state.metrics.in_flight().inc();
    let _in_flight = InFlight(&state.metrics);
    let server = &state.settings.server;
    let deadline = tokio::time::Instant::now() + server.request_timeout();
    let refuse = |code: StatusCode, message: String| {
        state.metrics.observe_http_error(code.as_u16());
        // The access log of a request refused before any review (no uid read yet).
        debug!(
            code = code.as_u16(),
            reason = message.as_str(),
            elapsed_us = start.elapsed().as_micros() as u64,
            "admission request refused"
        );
        plain(code, message)
    };
    if !is_json(request.headers().get(header::CONTENT_TYPE)) {
        let got = request
            .headers()
            .get(header::CONTENT_TYPE)
            .map_or("none".to_owned(), |v| format!("{v:?}"));
        return refuse(
            StatusCode::BAD_REQUEST,
            format!("Content-Type must be application/json (got {got})"),
        );
    }
    let limit = server.body_limit_bytes;
    let too_large =
        || format!("request body exceeds the limit of {limit} bytes (server.bodyLimitBytes)");
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return refuse(StatusCode::PAYLOAD_TOO_LARGE, too_large());
    }
    let seconds = server.request_timeout().as_secs();
    // The body first, with no review slot held: stalled bodies never hold the slots that
    // complete reviews need.
    let (body, _room) = match read_body(
        request.into_body(),
        declared,
        limit,
        &state.body_budget,
        deadline,
    )
    .await
    {
        Ok(b) => b,
        Err(BodyFailure::TooLarge) => return refuse(StatusCode::PAYLOAD_TOO_LARGE, too_large()),
        Err(BodyFailure::Read(e)) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("cannot read the request body: {e}"),
            );
        }
        Err(BodyFailure::TimedOut) => {
            return refuse(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "request body not received within {seconds} s (server.requestTimeoutSeconds)"
                ),
            );
        }
        Err(BodyFailure::NoRoom) => {
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "no room for the request body within {seconds} s: bodies in memory are at server.bodyMemoryBytes"
                ),
            );
        }
    };
    // The semaphore is never closed, so acquiring only waits.
    let Ok(Ok(_permit)) = tokio::time::timeout_at(deadline, state.limiter.acquire()).await else {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "no review slot free within {seconds} s (server.maxConcurrentRequests = {})",
                server.max_concurrent_requests
            ),
        );
    };
    let body_len = body.len();
    let reviewed = if body.len() >= BLOCKING_REVIEW_BYTES {
        let worker = Arc::clone(&state);
        match tokio::task::spawn_blocking(move || worker.review(&body)).await {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "review task failed");
                return refuse(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the review failed; see the webhook's log".to_owned(),
                );
            }
        }
    } else {
        state.review(&body)
    };
    match reviewed {
        Err(e) => refuse(StatusCode::BAD_REQUEST, e.to_string()),
        Ok(reviewed) => {
            state
                .metrics
                .observe_review(reviewed.outcome, start.elapsed());
            state.kai_metrics.observe(&reviewed.observations);
            let uid = reviewed.uid.as_str();
            match reviewed.outcome {
                Outcome::Denied => warn!(
                    uid,
                    pod = reviewed.pod.as_deref().unwrap_or(""),
                    reason = reviewed.message.as_deref().unwrap_or(""),
                    "admission denied"
                ),
                Outcome::Invalid => warn!(
                    uid,
                    reason = reviewed.message.as_deref().unwrap_or(""),
                    "invalid admission review"
                ),
                Outcome::Allowed | Outcome::Patched => {}
            }
            // The access log: one line per answered review, at debug level.
            debug!(
                uid,
                outcome = reviewed.outcome.as_str(),
                request_bytes = body_len,
                response_bytes = reviewed.body.len(),
                elapsed_us = start.elapsed().as_micros() as u64,
                "admission review"
            );
            (
                StatusCode::OK,
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                Body::from(reviewed.body),
            )
                .into_response()
        }
    }
}

/// Limits of the TLS server.
#[derive(Debug, Clone)]
pub struct TlsServeOptions {
    pub handshake_timeout: Duration,
    pub max_connections: usize,
    pub shutdown_grace: Duration,
    /// Time allowed to receive request headers on an HTTP/1.1 connection.
    pub header_read_timeout: Duration,
    /// A connection with no request in progress is closed after this long (see [`crate::conn`]).
    pub idle_timeout: Duration,
}

impl TlsServeOptions {
    /// From the server settings.
    #[must_use]
    pub fn from_settings(settings: &Settings) -> Self {
        let s = &settings.server;
        Self {
            handshake_timeout: s.tls_handshake_timeout(),
            // Counted by a semaphore (and awaited whole at shutdown, as a u32).
            max_connections: s.max_connections.clamp(1, u32::MAX as usize >> 4),
            shutdown_grace: s.shutdown_grace(),
            header_read_timeout: s.request_timeout(),
            idle_timeout: s.idle_timeout(),
        }
    }
}

/// HTTP/2 flow-control windows: what a client may send ahead of the server reading it. Small, so
/// that stalled streams hold little memory; ample for reviews on a cluster network.
const H2_STREAM_WINDOW: u32 = 128 * 1024;
const H2_CONNECTION_WINDOW: u32 = 256 * 1024;
/// Streams one HTTP/2 connection may have open (hyper's default is 200); clients open another
/// connection for more. Bounds what one connection holds in bodies' free bytes.
const H2_MAX_STREAMS: u32 = 64;
/// HTTP/1.1 read buffer limit (hyper's default is about 400 KiB): request headers larger than
/// this are refused; bodies are read through it in pieces.
const H1_MAX_BUF: usize = 64 * 1024;

/// The router as a hyper service that marks its connection busy while a request is handled.
#[derive(Clone)]
struct Tracked {
    inner: TowerToHyperService<Router>,
    tracker: Arc<crate::conn::Tracker>,
}

impl hyper::service::Service<Request<hyper::body::Incoming>> for Tracked {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<Response, std::convert::Infallible>> + Send>>;

    fn call(&self, request: Request<hyper::body::Incoming>) -> Self::Future {
        let busy = self.tracker.begin();
        let response = self.inner.call(request);
        Box::pin(async move {
            let r = response.await;
            drop(busy);
            r
        })
    }
}

/// Serve `app` over TLS on `listener` until `shutdown` completes, then drain.
///
/// Each connection is bounded in time (TLS handshake timeout, idle timeout, HTTP/1.1 header
/// timeout, HTTP/2 keep-alive pings) and in number (`max_connections`, where a new connection
/// closes the idlest one). On shutdown the listener closes, idle connections close at once
/// (HTTP/2 after a GOAWAY, at most [`crate::conn::GRACEFUL_CLOSE`]), busy ones finish their
/// requests and then close, and whatever is left at the end of the grace period is dropped.
///
/// # Errors
/// Never at present; accept errors (e.g. too many open files) are logged and retried.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    metrics: Arc<Metrics>,
    options: TlsServeOptions,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let acceptor = TlsAcceptor::from(tls);
    let registry = Arc::new(crate::conn::Registry::default());
    let connections = Arc::new(Semaphore::new(options.max_connections));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel::<Option<tokio::time::Instant>>(None);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .max_buf_size(H1_MAX_BUF)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_concurrent_streams(H2_MAX_STREAMS)
        .keep_alive_interval(options.idle_timeout)
        .keep_alive_timeout(options.idle_timeout);
    let builder = Arc::new(builder);
    let service = TowerToHyperService::new(app);
    tokio::pin!(shutdown);
    'accept: loop {
        let (tcp, peer) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let permit = match Arc::clone(&connections).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => loop {
                // Full: the connection idle the longest gives way; if all are busy, the new
                // one waits (and the listen backlog fills behind it).
                if registry.evict_idlest() {
                    debug!("at maxConnections: closing the idlest connection");
                }
                tokio::select! {
                    biased;
                    () = &mut shutdown => break 'accept,
                    p = Arc::clone(&connections).acquire_owned() => match p {
                        Ok(p) => break p,
                        Err(_) => break 'accept,
                    },
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let registered = registry.register();
        let acceptor = acceptor.clone();
        let service = Tracked {
            inner: service.clone(),
            tracker: Arc::clone(&registered.tracker),
        };
        let builder = Arc::clone(&builder);
        let metrics = Arc::clone(&metrics);
        let options = options.clone();
        let stop = stop_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            metrics.connections_open().inc();
            let closed = serve_connection(
                tcp, peer, acceptor, &builder, service, registered, &metrics, &options, stop,
            )
            .await;
            metrics.connections_open().dec();
            if let Some(reason) = closed {
                metrics.observe_connection_closed(reason);
            }
        });
    }
    drop(listener);
    let end = tokio::time::Instant::now() + options.shutdown_grace;
    info!(
        open = registry.len(),
        "shutting down: no new connections; closing idle ones, finishing in-flight requests"
    );
    let _ = stop_tx.send(Some(end));
    // Every connection task gives its permit back when it ends.
    let all = u32::try_from(options.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout_at(end + Duration::from_secs(1), connections.acquire_many(all))
        .await
        .is_err()
    {
        warn!(
            grace_seconds = options.shutdown_grace.as_secs(),
            open = registry.len(),
            "grace period over; connections left open are closed"
        );
    }
    Ok(())
}

/// One connection from accept to close. Returns why the server closed it (`idle`, `evicted`,
/// `shutdown`), or `None` when it ended by itself (client close, error, failed handshake).
#[allow(clippy::too_many_arguments)]
async fn serve_connection(
    tcp: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    acceptor: TlsAcceptor,
    builder: &auto::Builder<TokioExecutor>,
    service: Tracked,
    registered: crate::conn::Registered,
    metrics: &Metrics,
    options: &TlsServeOptions,
    mut stop: tokio::sync::watch::Receiver<Option<tokio::time::Instant>>,
) -> Option<&'static str> {
    use crate::conn::{GRACEFUL_CLOSE, Step, next_step};
    let tracker = Arc::clone(&registered.tracker);
    let handshake = tokio::time::timeout(options.handshake_timeout, acceptor.accept(tcp));
    let stream = tokio::select! {
        r = handshake => match r {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                metrics.observe_handshake_failure();
                debug!(%peer, error = %e, "TLS handshake failed");
                return None;
            }
            Err(_) => {
                metrics.observe_handshake_failure();
                debug!(%peer, "TLS handshake timed out");
                return Some("idle");
            }
        },
        () = tracker.evicted() => return Some("evicted"),
        _ = stop.wait_for(Option::is_some) => return Some("shutdown"),
    };
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let mut asked = false;
    let mut hard_deadline: Option<tokio::time::Instant> = None;
    loop {
        let idle_limit = if hard_deadline.is_some() {
            GRACEFUL_CLOSE.min(options.idle_timeout)
        } else {
            options.idle_timeout
        };
        let now = tokio::time::Instant::now();
        let idle_since = tracker.is_idle().then(|| tracker.idle_since());
        let wake = match next_step(now, idle_since, idle_limit, hard_deadline, asked) {
            Step::Drop => {
                let reason = if hard_deadline.is_some() {
                    "shutdown"
                } else {
                    "idle"
                };
                debug!(%peer, reason, "closing the connection");
                return Some(reason);
            }
            Step::CloseGracefully => {
                conn.as_mut().graceful_shutdown();
                asked = true;
                continue;
            }
            Step::WaitUntil(t) => t,
        };
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    debug!(%peer, error = %e, "connection ended with an error");
                }
                // After a graceful close that the server asked for, the close is the server's.
                return match (asked, hard_deadline) {
                    (false, _) => None,
                    (true, None) => Some("idle"),
                    (true, Some(_)) => Some("shutdown"),
                };
            }
            () = tracker.evicted() => {
                debug!(%peer, "closing the connection: at maxConnections and idle the longest");
                return Some("evicted");
            }
            r = stop.wait_for(Option::is_some), if hard_deadline.is_none() => {
                hard_deadline = r.ok().and_then(|end| *end).or(Some(now));
                if !asked {
                    conn.as_mut().graceful_shutdown();
                    asked = true;
                }
            }
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Where the serving certificate comes from.
#[derive(Debug)]
pub enum CertSource {
    /// PEM files, reloaded when they change.
    Files {
        cert: std::path::PathBuf,
        key: std::path::PathBuf,
    },
    /// A fixed certificate (`--dev`).
    Fixed(crate::tls::LoadedCert),
}

/// Run the whole webhook: the TLS admission server on `listener`, health and metrics on
/// `ops_listener`, certificate reload and (when `vram` is a watched index) the node watch, until
/// `shutdown` completes and in-flight requests finish. `kai_metrics` must be the handles `vram`
/// reports to.
///
/// # Errors
/// TLS configuration or listener I/O errors.
pub async fn run(
    settings: Arc<Settings>,
    vram: VramSource,
    kai_metrics: KaiMetrics,
    listener: TcpListener,
    ops_listener: TcpListener,
    certs: CertSource,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), crate::tls::TlsError> {
    let mut metrics = Metrics::new();
    kai_metrics.register(metrics.registry_mut());
    let metrics = Arc::new(metrics);
    // Ready = a certificate is loaded (the listener is bound before `run`). The KAI node watch
    // is not a condition: while nodes cannot be listed, pods are still reviewed (a gpu-fraction
    // pod then has no basis: warned or denied per pod, `kai.missingBasis`), and the watch's state
    // is in the metrics (`kai_node_watch_synced`, `kai_node_watch_failing`) and the log.
    let node_index = vram.index_to_watch().cloned();
    let readiness = Readiness::new(&[crate::metrics::READY_CERTIFICATE]);
    let store = match certs {
        CertSource::Files { cert, key } => {
            crate::tls::CertStore::from_files(cert, key, Arc::clone(&metrics), readiness.clone())
        }
        CertSource::Fixed(loaded) => {
            crate::tls::CertStore::fixed(loaded, Arc::clone(&metrics), readiness.clone())
        }
    };
    let tls = crate::tls::server_config(Arc::clone(&store))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let reload =
        tokio::spawn(Arc::clone(&store).watch(settings.server.cert_reload_interval(), stopped()));
    let node_watch = node_index.map(|index| {
        tokio::spawn(crate::vram::watch::watch_cluster(
            index,
            settings.kai.node_label_selector.clone(),
            stopped(),
        ))
    });
    let render = {
        let metrics = Arc::clone(&metrics);
        Arc::new(move |format| metrics.encode_as(format))
    };
    let ops = tokio::spawn(hami_ops::serve(
        ops_listener,
        hami_ops::router(render, readiness),
        stopped(),
    ));
    let state = AppState::new(
        Arc::clone(&settings),
        Arc::clone(&metrics),
        vram,
        kai_metrics,
    );
    let options = TlsServeOptions::from_settings(&settings);
    let admission = serve_tls(
        listener,
        tls,
        admission_router(state),
        metrics,
        options,
        async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        },
    );
    let result = admission.await;
    let _ = reload.await;
    if let Some(w) = node_watch {
        let _ = w.await;
    }
    match ops.await {
        Ok(Err(e)) => warn!(error = %e, "metrics server ended with an error"),
        Err(e) => warn!(error = %e, "metrics server task failed"),
        Ok(Ok(())) => {}
    }
    if let Err(e) = result {
        warn!(error = %e, "admission server ended with an error");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;

    fn body(parts: &[usize]) -> Body {
        let chunks: Vec<Result<Bytes, std::io::Error>> = parts
            .iter()
            .map(|&n| Ok(Bytes::from(vec![b' '; n])))
            .collect();
        Body::from_stream(futures::stream::iter(chunks))
    }

    fn soon() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_millis(50)
    }

    #[tokio::test]
    async fn bodies_take_room_past_the_free_bytes_and_give_it_back() {
        let budget = Semaphore::new(1000);
        // Within the free bytes: no room taken.
        let (b, room) = read_body(body(&[100, 200]), None, 1 << 20, &budget, soon())
            .await
            .ok()
            .unwrap();
        assert_eq!((b.len(), room.is_none()), (300, true));
        // 200 bytes past the free ones: held until the body is dropped.
        let parts = [FREE_BODY_BYTES - 100, 300];
        let (b, room) = read_body(
            body(&parts),
            Some(FREE_BODY_BYTES as u64 + 200),
            1 << 20,
            &budget,
            soon(),
        )
        .await
        .ok()
        .unwrap();
        assert_eq!(b.len(), FREE_BODY_BYTES + 200);
        assert_eq!(budget.available_permits(), 800);
        // A second body needing 900 finds no room before its deadline.
        let parts = [FREE_BODY_BYTES, 900];
        assert!(matches!(
            read_body(body(&parts), None, 1 << 20, &budget, soon()).await,
            Err(BodyFailure::NoRoom)
        ));
        drop(room);
        assert_eq!(budget.available_permits(), 1000);
        let (b, _room) = read_body(body(&parts), None, 1 << 20, &budget, soon())
            .await
            .ok()
            .unwrap();
        assert_eq!(b.len(), FREE_BODY_BYTES + 900);
        // Over the limit, however it arrives.
        assert!(matches!(
            read_body(body(&[10, 10]), None, 15, &budget, soon()).await,
            Err(BodyFailure::TooLarge)
        ));
    }
}
