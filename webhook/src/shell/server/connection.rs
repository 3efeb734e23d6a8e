//! The life of one admission connection: what it is doing, when it must close, which one gives
//! way when the server is full, and [`serve_connection`], which drives it from accept to close.
//!
//! A connection is *busy* while a request on it is being handled (from its headers to its
//! response) and *idle* otherwise, from accept on: during the TLS handshake, while the server
//! reads the bytes that tell HTTP/1.1 from HTTP/2, while request headers trickle in, and between
//! requests. An idle connection is closed once it has been idle for the idle timeout (it is first
//! asked to close gracefully: HTTP/2 gets a GOAWAY, an idle HTTP/1.1 connection closes at once), so
//! a client that completes the handshake and then sends nothing, `P`, or 23 of the 24 preface
//! bytes cannot hold a connection for longer than that. At `maxConnections`, a new connection
//! closes the connection idle the longest, so idle connections never lock a client out.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::response::Response;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpStream;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tracing::debug;

use crate::shell::metrics::Metrics;

/// How long an idle connection may take to close gracefully (GOAWAY and its PING on HTTP/2)
/// before it is dropped; also taken off the idle timeout, so that the drop lands on time.
pub const GRACEFUL_CLOSE: Duration = Duration::from_millis(500);

/// What the server knows of one connection.
#[derive(Debug)]
pub struct Tracker {
    /// Requests being handled on it.
    busy: AtomicUsize,
    /// When it last became idle (or was accepted), in milliseconds since the registry's epoch.
    idle_since_ms: AtomicU64,
    epoch: Instant,
    /// Set when the server needs its slot.
    evict: Notify,
}

impl Tracker {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Mark a request as started; the returned guard marks it finished when dropped.
    #[must_use]
    pub fn begin(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::AcqRel);
        Busy(Arc::clone(self))
    }

    /// Whether no request is in progress.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.busy.load(Ordering::Acquire) == 0
    }

    /// When the connection became idle (meaningful while [`Self::is_idle`]).
    #[must_use]
    pub fn idle_since(&self) -> Instant {
        self.epoch + Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire))
    }

    /// Completes when the server has asked this connection to give its slot up.
    pub async fn evicted(&self) {
        self.evict.notified().await;
    }
}

/// A request in progress on a connection (see [`Tracker::begin`]).
#[derive(Debug)]
pub struct Busy(Arc<Tracker>);

impl Drop for Busy {
    fn drop(&mut self) {
        let t = &self.0;
        // Stamp first: a reader that sees the connection idle then sees the new stamp.
        t.idle_since_ms.store(t.now_ms(), Ordering::Release);
        t.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Every open connection, for eviction.
#[derive(Debug)]
pub struct Registry {
    epoch: Instant,
    next: AtomicU64,
    open: Mutex<BTreeMap<u64, Arc<Tracker>>>,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            next: AtomicU64::new(0),
            open: Mutex::new(BTreeMap::new()),
        }
    }
}

/// A connection's place in the [`Registry`]; leaves it when dropped.
#[derive(Debug)]
pub struct Registered {
    registry: Arc<Registry>,
    id: u64,
    /// The connection's tracker.
    pub tracker: Arc<Tracker>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

impl Registry {
    /// Register a connection accepted now (idle from now on).
    #[must_use]
    pub fn register(self: &Arc<Self>) -> Registered {
        let tracker = Arc::new(Tracker {
            busy: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            epoch: self.epoch,
            evict: Notify::new(),
        });
        tracker
            .idle_since_ms
            .store(tracker.now_ms(), Ordering::Release);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, Arc::clone(&tracker));
        Registered {
            registry: Arc::clone(self),
            id,
            tracker,
        }
    }

    /// Ask the connection idle the longest to close now. False when every connection is busy.
    pub fn evict_idlest(&self) -> bool {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let victim = open
            .values()
            .filter(|t| t.is_idle())
            .min_by_key(|t| t.idle_since_ms.load(Ordering::Acquire));
        match victim {
            Some(t) => {
                // `notify_one` keeps the wake-up for a task not waiting yet.
                t.evict.notify_one();
                true
            }
            None => false,
        }
    }

    /// Connections open now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no connection is open.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a connection should do next, given its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing yet; look again at this instant.
    WaitUntil(Instant),
    /// Ask it to close gracefully (then keep waiting).
    CloseGracefully,
    /// Drop it now.
    Drop,
}

/// The pure rule behind a connection's deadlines.
///
/// `idle_since` is `None` while a request is in progress. `idle_limit` is the idle timeout, or
/// [`GRACEFUL_CLOSE`] once the server is shutting down; `hard_deadline` is the end of the shutdown
/// grace period, if any; `asked` says whether a graceful close was already requested.
#[must_use]
pub fn next_step(
    now: Instant,
    idle_since: Option<Instant>,
    idle_limit: Duration,
    hard_deadline: Option<Instant>,
    asked: bool,
) -> Step {
    if hard_deadline.is_some_and(|d| now >= d) {
        return Step::Drop;
    }
    let lead = GRACEFUL_CLOSE.min(idle_limit / 2);
    let wake = match idle_since {
        // Busy: it cannot expire before a full idle period from now.
        None => now + idle_limit,
        Some(since) => {
            let close_at = since + idle_limit;
            let ask_at = close_at - lead;
            if now >= close_at {
                return Step::Drop;
            }
            if now >= ask_at && !asked {
                return Step::CloseGracefully;
            }
            if now >= ask_at { close_at } else { ask_at }
        }
    };
    Step::WaitUntil(hard_deadline.map_or(wake, |d| wake.min(d)))
}

// ---------------------------------------------------------------------------------------------
// One connection served
// ---------------------------------------------------------------------------------------------

/// The router as a hyper service that marks its connection busy while a request is handled.
#[derive(Clone)]
pub(super) struct Tracked {
    inner: TowerToHyperService<Router>,
    tracker: Arc<Tracker>,
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

/// hyper's HTTP/1.1-or-HTTP/2 connection over TLS, serving the tracked router.
type HttpConnection<'b> =
    auto::Connection<'b, TokioIo<TlsStream<TcpStream>>, Tracked, TokioExecutor>;

/// The time limits of one connection (from the server's options).
#[derive(Debug, Clone, Copy)]
pub(super) struct ConnectionLimits {
    pub handshake_timeout: Duration,
    pub idle_timeout: Duration,
}

/// What every connection of one server shares.
#[derive(Clone)]
pub(super) struct Served {
    pub acceptor: TlsAcceptor,
    pub builder: Arc<auto::Builder<TokioExecutor>>,
    pub service: TowerToHyperService<Router>,
    pub metrics: Arc<Metrics>,
    pub limits: ConnectionLimits,
    /// `Some(end of the grace period)` once the server is shutting down.
    pub stop: watch::Receiver<Option<Instant>>,
}

/// One connection from accept to close: the TLS handshake, then HTTP until it ends or the server
/// closes it. Returns why the server closed it (`idle`, `evicted`, `shutdown`), or `None` when it
/// ended by itself (client close, error, failed handshake).
pub(super) async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    served: Served,
    registered: Registered,
) -> Option<&'static str> {
    let tracker = Arc::clone(&registered.tracker);
    let mut stop = served.stop.clone();
    let stream = match handshake(tcp, peer, &served, &tracker, &mut stop).await {
        Ok(s) => s,
        Err(closed) => return closed,
    };
    let service = Tracked {
        inner: served.service.clone(),
        tracker: Arc::clone(&tracker),
    };
    let conn = served
        .builder
        .serve_connection(TokioIo::new(stream), service);
    let closed = drive(conn, peer, &tracker, served.limits, stop).await;
    drop(registered);
    closed
}

/// The TLS handshake, within its timeout; `Err` with what [`serve_connection`] returns when it
/// did not complete (failed, timed out, evicted, shutdown).
async fn handshake(
    tcp: TcpStream,
    peer: SocketAddr,
    served: &Served,
    tracker: &Tracker,
    stop: &mut watch::Receiver<Option<Instant>>,
) -> Result<TlsStream<TcpStream>, Option<&'static str>> {
    let handshake =
        tokio::time::timeout(served.limits.handshake_timeout, served.acceptor.accept(tcp));
    tokio::select! {
        r = handshake => match r {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => {
                served.metrics.observe_handshake_failure();
                debug!(%peer, error = %e, "TLS handshake failed");
                Err(None)
            }
            Err(_) => {
                served.metrics.observe_handshake_failure();
                debug!(%peer, "TLS handshake timed out");
                Err(Some("idle"))
            }
        },
        () = tracker.evicted() => Err(Some("evicted")),
        _ = stop.wait_for(Option::is_some) => Err(Some("shutdown")),
    }
}

/// Serve HTTP on an established connection until it ends, or until the server closes it: idle
/// past the idle timeout, evicted, or at shutdown (gracefully first, dropped at the end of the
/// grace period). Returns as [`serve_connection`].
async fn drive(
    conn: HttpConnection<'_>,
    peer: SocketAddr,
    tracker: &Tracker,
    limits: ConnectionLimits,
    mut stop: watch::Receiver<Option<Instant>>,
) -> Option<&'static str> {
    tokio::pin!(conn);
    let mut asked = false;
    let mut hard_deadline: Option<Instant> = None;
    loop {
        let idle_limit = if hard_deadline.is_some() {
            GRACEFUL_CLOSE.min(limits.idle_timeout)
        } else {
            limits.idle_timeout
        };
        let now = Instant::now();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_connections_are_asked_then_dropped_on_time() {
        let t0 = Instant::now();
        let ten = Duration::from_secs(10);
        let ask = t0 + ten - GRACEFUL_CLOSE;
        assert_eq!(
            next_step(t0, Some(t0), ten, None, false),
            Step::WaitUntil(ask)
        );
        assert_eq!(
            next_step(ask, Some(t0), ten, None, false),
            Step::CloseGracefully
        );
        assert_eq!(
            next_step(ask, Some(t0), ten, None, true),
            Step::WaitUntil(t0 + ten)
        );
        assert_eq!(next_step(t0 + ten, Some(t0), ten, None, true), Step::Drop);
        // Busy: looked at again one idle period later, never dropped for being slow.
        assert_eq!(
            next_step(t0 + ten, None, ten, None, false),
            Step::WaitUntil(t0 + ten + ten)
        );
        // Shutting down: the grace period's end wins.
        let end = t0 + Duration::from_secs(3);
        assert_eq!(
            next_step(t0, None, GRACEFUL_CLOSE, Some(end), true),
            Step::WaitUntil(t0 + GRACEFUL_CLOSE)
        );
        assert_eq!(next_step(end, None, ten, Some(end), true), Step::Drop);
        // A 1 s limit asks at 0.5 s and drops at 1 s.
        let one = Duration::from_secs(1);
        assert_eq!(
            next_step(t0, Some(t0), one, None, false),
            Step::WaitUntil(t0 + Duration::from_millis(500))
        );
    }

    #[tokio::test]
    async fn eviction_picks_the_connection_idle_the_longest_and_never_a_busy_one() {
        let registry = Arc::new(Registry::default());
        let a = registry.register();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let b = registry.register();
        let busy = a.tracker.begin();
        assert_eq!(registry.len(), 2);
        assert!(registry.evict_idlest());
        // b was told (the wake-up is kept for it); a, busy, was not.
        tokio::time::timeout(Duration::from_secs(5), b.tracker.evicted())
            .await
            .unwrap();
        drop(b);
        assert!(!registry.evict_idlest());
        drop(busy);
        assert!(a.tracker.is_idle());
        assert!(registry.evict_idlest());
        drop(a);
        assert!(registry.is_empty());
    }
}
