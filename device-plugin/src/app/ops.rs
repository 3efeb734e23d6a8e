//! The ops server of `run` (`/healthz`, `/readyz`, `/metrics`, started first so that its probes
//! answer while the plugin waits for GPUs) and the stop signal every task of the run watches.

use std::future::Future;
use std::sync::Arc;

use hami_ops::Readiness;
use tokio::task::JoinHandle;

use super::tasks::StopSignal;
use crate::kubelet::plugin;
use crate::metrics::Metrics;

/// The ops server (`/healthz`, `/readyz`, `/metrics`) and the stop signal every task of the run
/// watches.
pub(super) struct OpsServer {
    stopping: StopSignal,
    /// What `/readyz` probes beyond the first plugin's registration.
    pub(super) probes: Arc<ReadinessProbes>,
    /// `/readyz`, handed to the first plugin.
    pub(super) readiness: Readiness,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl OpsServer {
    pub(super) fn start(listener: Option<tokio::net::TcpListener>, metrics: &Arc<Metrics>) -> Self {
        let stopping = StopSignal::new();
        let probes = Arc::new(ReadinessProbes::default());
        let readiness = {
            let probes = Arc::clone(&probes);
            Readiness::new(&[plugin::READY_REGISTERED])
                .with_probe(plugin::READY_SOCKET, move || probes.sockets_ready())
        };
        let mut ops = Self {
            stopping,
            probes,
            readiness,
            task: None,
        };
        ops.task = listener.map(|listener| {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, "serving /healthz, /readyz, /metrics");
            }
            let router = hami_ops::router(
                crate::metrics::renderer(Arc::clone(metrics)),
                ops.readiness.clone(),
            );
            tokio::spawn(hami_ops::serve(listener, router, ops.until_stopped()))
        });
        ops
    }

    /// Completes once [`Self::signal_stop`] is called.
    pub(super) fn until_stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        self.stopping.until_stopped()
    }

    pub(super) fn signal_stop(&self) {
        self.stopping.fire();
    }

    /// Stops every task watching the signal and waits for the ops server.
    pub(super) async fn stop(self) {
        self.signal_stop();
        if let Some(task) = self.task {
            match task.await {
                Ok(Err(error)) => tracing::warn!(%error, "metrics server ended with an error"),
                Err(error) => tracing::warn!(%error, "metrics server task failed"),
                Ok(Ok(())) => {}
            }
        }
    }
}

/// What `/readyz` probes beyond the first plugin's registration: every plugin socket present,
/// the other resources' plugins registered; or, while waiting for GPUs, nothing (the plugin is
/// where it should be, and a DaemonSet rollout must not stall on a node without GPUs).
#[derive(Debug, Default)]
pub(super) struct ReadinessProbes {
    waiting: std::sync::atomic::AtomicBool,
    plugins: std::sync::OnceLock<(Vec<std::path::PathBuf>, Vec<Readiness>)>,
}

impl ReadinessProbes {
    pub(super) fn set_waiting(&self, waiting: bool) {
        self.waiting
            .store(waiting, std::sync::atomic::Ordering::Release);
    }

    pub(super) fn set_plugins(&self, sockets: Vec<std::path::PathBuf>, others: Vec<Readiness>) {
        let _ = self.plugins.set((sockets, others));
    }

    pub(super) fn sockets_ready(&self) -> bool {
        if self.waiting.load(std::sync::atomic::Ordering::Acquire) {
            return true;
        }
        self.plugins.get().is_some_and(|(sockets, others)| {
            sockets.iter().all(|s| s.exists()) && others.iter().all(Readiness::is_ready)
        })
    }
}
