//! The HTTPS admission server and the plain-HTTP health/metrics server, by concern:
//!
//! - [`state`]: what the handler shares between requests;
//! - [`body`]: a request body read under its limit, its deadline and the shared body budget;
//! - [`handler`]: `POST /mutate`, phase by phase;
//! - [`accept`]: the TLS accept loop, the connection limit and the drain at shutdown;
//! - [`connection`]: one connection's life (busy or idle, eviction, closing) and its serving;
//! - here, [`run`]: the whole webhook wired (certificates, node watch, ops server, admission).
//!
//! [`accept::serve_tls`] takes an already-bound listener and a shutdown future (tests bind port 0
//! and run the real server in process). Each accepted connection is TLS-terminated with rustls and
//! served by hyper's HTTP/1.1 + h2 connection builder running the axum router. On shutdown the
//! listener closes, every connection finishes its in-flight requests (HTTP/1.1: then closes; h2:
//! GOAWAY), and the call returns when all are done or the grace period ends.

pub mod accept;
pub mod body;
pub mod connection;
pub mod handler;
pub mod state;

use std::future::Future;
use std::sync::Arc;

use hami_ops::{Exposed, Readiness};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::policy::settings::Settings;
use crate::shell::metrics::{Metrics, READY_CERTIFICATE};
use crate::shell::tls::{CertStore, LoadedCert, TlsError, server_config};
use crate::shell::vram::metrics::KaiMetrics;
use crate::shell::vram::source::VramSource;
use crate::shell::vram::watch::watch_cluster;

pub use accept::{TlsServeOptions, serve_tls};
pub use body::FREE_BODY_BYTES;
pub use handler::admission_router;
pub use state::AppState;

/// Where the serving certificate comes from.
#[derive(Debug)]
pub enum CertSource {
    /// PEM files, reloaded when they change.
    Files {
        cert: std::path::PathBuf,
        key: std::path::PathBuf,
    },
    /// A fixed certificate (`--dev`).
    Fixed(LoadedCert),
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
) -> Result<(), TlsError> {
    let mut metrics = Metrics::new();
    kai_metrics.register(metrics.registry_mut());
    let metrics = Arc::new(metrics);
    // Ready = a certificate is loaded (the listener is bound before `run`). The KAI node watch
    // is not a condition: while nodes cannot be listed, pods are still reviewed (a gpu-fraction
    // pod then has no basis: warned or denied per pod, `kai.missingBasis`), and the watch's state
    // is in the metrics (`kai_node_watch_synced`, `kai_node_watch_failing`) and the log.
    let readiness = Readiness::new(&[READY_CERTIFICATE]);
    let store = match certs {
        CertSource::Files { cert, key } => {
            CertStore::from_files(cert, key, Arc::clone(&metrics), readiness.clone())
        }
        CertSource::Fixed(loaded) => {
            CertStore::fixed(loaded, Arc::clone(&metrics), readiness.clone())
        }
    };
    let tls = server_config(Arc::clone(&store))?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let background = Background::start(
        &settings,
        &vram,
        &store,
        &metrics,
        readiness,
        ops_listener,
        &stop_rx,
    );
    let state = AppState::new(
        Arc::clone(&settings),
        Arc::clone(&metrics),
        vram,
        kai_metrics,
    );
    let options = TlsServeOptions::from_settings(&settings);
    let result = serve_tls(
        listener,
        tls,
        admission_router(state),
        metrics,
        options,
        async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        },
    )
    .await;
    background.join().await;
    if let Err(e) = result {
        warn!(error = %e, "admission server ended with an error");
    }
    Ok(())
}

/// Completes once `stop` says true: the shutdown of the tasks beside the admission server.
fn stopped(stop: &watch::Receiver<bool>) -> impl Future<Output = ()> + Send + 'static {
    let mut rx = stop.clone();
    async move {
        let _ = rx.wait_for(|s| *s).await;
    }
}

/// The tasks beside the admission server, each ending when the server stops.
struct Background {
    cert_reload: JoinHandle<()>,
    node_watch: Option<JoinHandle<()>>,
    ops: JoinHandle<std::io::Result<()>>,
}

impl Background {
    /// Start the certificate reload, the node watch (when `vram` is a watched index) and the
    /// health and metrics server.
    fn start(
        settings: &Settings,
        vram: &VramSource,
        store: &Arc<CertStore>,
        metrics: &Arc<Metrics>,
        readiness: Readiness,
        ops_listener: TcpListener,
        stop: &watch::Receiver<bool>,
    ) -> Self {
        let cert_reload = tokio::spawn(
            Arc::clone(store).watch(settings.server.cert_reload_interval(), stopped(stop)),
        );
        let node_watch = vram.index_to_watch().cloned().map(|index| {
            tokio::spawn(watch_cluster(
                index,
                settings.kai.node_label_selector.clone(),
                stopped(stop),
            ))
        });
        let render = {
            let metrics = Arc::clone(metrics);
            Arc::new(move |format| metrics.encode_as(format))
        };
        let ops = tokio::spawn(hami_ops::serve(
            ops_listener,
            hami_ops::router(render, readiness),
            stopped(stop),
        ));
        Self {
            cert_reload,
            node_watch,
            ops,
        }
    }

    /// Wait for every task to end, logging how the ops server ended.
    async fn join(self) {
        let _ = self.cert_reload.await;
        if let Some(w) = self.node_watch {
            let _ = w.await;
        }
        match self.ops.await {
            Ok(Err(e)) => warn!(error = %e, "metrics server ended with an error"),
            Err(e) => warn!(error = %e, "metrics server task failed"),
            Ok(Ok(())) => {}
        }
    }
}
