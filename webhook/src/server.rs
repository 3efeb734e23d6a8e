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
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
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
        Arc::new(Self {
            settings,
            metrics,
            vram,
            kai_metrics,
            limiter: Semaphore::new(permits),
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

async fn mutate(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let start = Instant::now();
    // The semaphore is never closed, so acquiring only waits.
    let _permit = state.limiter.acquire().await;
    state.metrics.in_flight().inc();
    let _in_flight = InFlight(&state.metrics);
    let server = &state.settings.server;
    let refuse = |code: StatusCode, message: String| {
        state.metrics.observe_http_error(code.as_u16());
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
    let collected = tokio::time::timeout(
        server.request_timeout(),
        Limited::new(request.into_body(), limit).collect(),
    )
    .await;
    let body = match collected {
        Ok(Ok(c)) => c.to_bytes(),
        Ok(Err(e)) if e.is::<LengthLimitError>() => {
            return refuse(StatusCode::PAYLOAD_TOO_LARGE, too_large());
        }
        Ok(Err(e)) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("cannot read the request body: {e}"),
            );
        }
        Err(_) => {
            return refuse(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "request body not received within {} s (server.requestTimeoutSeconds)",
                    server.request_timeout().as_secs()
                ),
            );
        }
    };
    // The basis snapshot (a read lock on a watched index) is held for the decision only.
    let reviewed = crate::review::review_with(&body, |request| {
        state
            .vram
            .with_basis(|vram| crate::decide::decide(request, &state.settings, vram))
    });
    match reviewed {
        Err(e) => refuse(StatusCode::BAD_REQUEST, e.to_string()),
        Ok(reviewed) => {
            state
                .metrics
                .observe_review(reviewed.outcome, start.elapsed());
            state.kai_metrics.observe(&reviewed.observations);
            match reviewed.outcome {
                Outcome::Denied => warn!(
                    pod = reviewed.pod.as_deref().unwrap_or(""),
                    reason = reviewed.message.as_deref().unwrap_or(""),
                    "admission denied"
                ),
                Outcome::Invalid => warn!(
                    reason = reviewed.message.as_deref().unwrap_or(""),
                    "invalid admission review"
                ),
                Outcome::Allowed | Outcome::Patched => {}
            }
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
}

impl TlsServeOptions {
    /// From the server settings.
    #[must_use]
    pub fn from_settings(settings: &Settings) -> Self {
        let s = &settings.server;
        Self {
            handshake_timeout: s.tls_handshake_timeout(),
            max_connections: s.max_connections.max(1),
            shutdown_grace: s.shutdown_grace(),
            header_read_timeout: s.request_timeout(),
        }
    }
}

/// Serve `app` over TLS on `listener` until `shutdown` completes, then drain.
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
    let graceful = GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(options.max_connections));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            biased;
            () = &mut shutdown => break,
            p = Arc::clone(&connections).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
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
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(app.clone());
        let builder = Arc::clone(&builder);
        let watcher = graceful.watcher();
        let metrics = Arc::clone(&metrics);
        let handshake_timeout = options.handshake_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            let stream = match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    metrics.observe_handshake_failure();
                    debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    metrics.observe_handshake_failure();
                    debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    info!("shutting down: no new connections; finishing in-flight requests");
    if tokio::time::timeout(options.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        warn!(
            grace_seconds = options.shutdown_grace.as_secs(),
            "grace period over; closing remaining connections"
        );
    }
    Ok(())
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
    // KAI: the node watch, when the per-GPU VRAM is detected; not ready before the first list.
    let node_index = vram.index_to_watch().cloned();
    let mut conditions = vec![crate::metrics::READY_CERTIFICATE];
    if node_index.is_some() {
        conditions.push(crate::vram::watch::READY_NODES);
    }
    let readiness = Readiness::new(&conditions);
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
            readiness.clone(),
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
