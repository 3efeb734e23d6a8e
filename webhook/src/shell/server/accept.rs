//! The TLS accept loop: connections accepted up to `maxConnections` (the idlest gives way), each
//! served on its own task, and the drain at shutdown.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use crate::policy::settings::Settings;
use crate::shell::metrics::Metrics;
use crate::shell::server::connection::{ConnectionLimits, Registry, Served, serve_connection};

/// Limits of the TLS server.
#[derive(Debug, Clone)]
pub struct TlsServeOptions {
    pub handshake_timeout: Duration,
    pub max_connections: usize,
    pub shutdown_grace: Duration,
    /// Time allowed to receive request headers on an HTTP/1.1 connection.
    pub header_read_timeout: Duration,
    /// A connection with no request in progress is closed after this long (see [`super::connection`]).
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

/// Serve `app` over TLS on `listener` until `shutdown` completes, then drain.
///
/// Each connection is bounded in time (TLS handshake timeout, idle timeout, HTTP/1.1 header
/// timeout, HTTP/2 keep-alive pings) and in number (`max_connections`, where a new connection
/// closes the idlest one). On shutdown the listener closes, idle connections close at once
/// (HTTP/2 after a GOAWAY, at most [`super::connection::GRACEFUL_CLOSE`]), busy ones finish their
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
    let registry = Arc::new(Registry::default());
    let connections = Arc::new(Semaphore::new(options.max_connections));
    let (stop_tx, stop_rx) = watch::channel::<Option<Instant>>(None);
    let served = Served {
        acceptor: TlsAcceptor::from(tls),
        builder: Arc::new(http_builder(&options)),
        service: TowerToHyperService::new(app),
        metrics,
        limits: ConnectionLimits {
            handshake_timeout: options.handshake_timeout,
            idle_timeout: options.idle_timeout,
        },
        stop: stop_rx,
    };
    tokio::pin!(shutdown);
    loop {
        let Some((tcp, peer)) = next_connection(&listener, shutdown.as_mut()).await else {
            break;
        };
        let Some(permit) = connection_slot(&connections, &registry, shutdown.as_mut()).await else {
            break;
        };
        let _ = tcp.set_nodelay(true);
        let registered = registry.register();
        let served = served.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let metrics = Arc::clone(&served.metrics);
            metrics.connections_open().inc();
            let closed = serve_connection(tcp, peer, served, registered).await;
            metrics.connections_open().dec();
            if let Some(reason) = closed {
                metrics.observe_connection_closed(reason);
            }
        });
    }
    drop(listener);
    drain(&registry, &connections, &stop_tx, &options).await;
    Ok(())
}

/// hyper's HTTP/1.1 + HTTP/2 connection builder with the server's limits.
fn http_builder(options: &TlsServeOptions) -> auto::Builder<TokioExecutor> {
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
    builder
}

/// The next accepted connection, or `None` once `shutdown` completes. Accept errors (e.g. too
/// many open files) are logged and retried after a pause.
async fn next_connection(
    listener: &TcpListener,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Option<(TcpStream, std::net::SocketAddr)> {
    loop {
        tokio::select! {
            biased;
            () = shutdown.as_mut() => return None,
            accepted = listener.accept() => match accepted {
                Ok(a) => return Some(a),
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// A connection slot, or `None` once `shutdown` completes. When the server is full, the
/// connection idle the longest gives way; if all are busy, the new one waits (and the listen
/// backlog fills behind it).
async fn connection_slot(
    connections: &Arc<Semaphore>,
    registry: &Registry,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Option<OwnedSemaphorePermit> {
    if let Ok(p) = Arc::clone(connections).try_acquire_owned() {
        return Some(p);
    }
    loop {
        if registry.evict_idlest() {
            debug!("at maxConnections: closing the idlest connection");
        }
        tokio::select! {
            biased;
            () = shutdown.as_mut() => return None,
            p = Arc::clone(connections).acquire_owned() => return p.ok(),
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

/// After the listener closed: tell every connection the grace period's end, and wait until all
/// have given their slot back or the grace period is over.
async fn drain(
    registry: &Registry,
    connections: &Semaphore,
    stop: &watch::Sender<Option<Instant>>,
    options: &TlsServeOptions,
) {
    let end = Instant::now() + options.shutdown_grace;
    info!(
        open = registry.len(),
        "shutting down: no new connections; closing idle ones, finishing in-flight requests"
    );
    let _ = stop.send(Some(end));
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
}
