//! The tasks `run` starts beside the kubelet side (the pod cache's watch, the collector, the
//! region exporter and its Events): each watches one stop signal, fired when `run` stops (on
//! SIGTERM, through the shutdown future `main.rs` hands it), and `run` waits for every one of
//! them before it returns.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A stop signal: fired once, seen by every future taken from it, before or after the firing.
/// Clones share the signal.
#[derive(Clone, Debug)]
pub(crate) struct StopSignal(Arc<watch::Sender<bool>>);

impl StopSignal {
    /// Not fired.
    pub(crate) fn new() -> Self {
        Self(Arc::new(watch::channel(false).0))
    }

    /// Completes once [`Self::fire`] is called (at once if it was).
    pub(crate) fn until_stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut stopped = self.0.subscribe();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    }

    /// Fires the signal.
    pub(crate) fn fire(&self) {
        self.0.send_replace(true);
    }
}

/// A handle on the run's background tasks: spawn one that stops when [`Self::stop`] is called,
/// and wait for all of them ([`Self::stop`]). Clones share the tasks and the signal.
#[derive(Clone, Debug)]
pub struct TaskStop {
    stopping: StopSignal,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Default for TaskStop {
    fn default() -> Self {
        Self::new()
    }
}

impl TaskStop {
    /// No task yet, not stopped.
    pub fn new() -> Self {
        Self {
            stopping: StopSignal::new(),
            tasks: Arc::default(),
        }
    }

    /// Completes once [`Self::stop`] is called (at once if it was).
    pub fn until_stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        self.stopping.until_stopped()
    }

    /// Spawns `task`, which must return once [`Self::until_stopped`] completes; [`Self::stop`]
    /// waits for it.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let task = tokio::spawn(task);
        self.tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(task);
    }

    /// Fires the signal and waits for every task spawned through this handle.
    pub async fn stop(&self) {
        self.stopping.fire();
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(PoisonError::into_inner));
        for task in tasks {
            if let Err(error) = task.await {
                tracing::warn!(%error, "background task failed");
            }
        }
    }

    /// How many tasks have been spawned and not yet waited for.
    pub fn len(&self) -> usize {
        self.tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no task waits to be stopped.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::allocation::shell::collector::{Collector, CollectorSettings};

    /// The collector stops when the run stops, even in the middle of a pass whose API server
    /// never answers.
    #[tokio::test]
    async fn the_collector_stops_with_the_run() {
        // An API server that accepts connections and never answers.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", silent.local_addr().unwrap());
        let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let collector = Collector::new(
            client,
            "node-a",
            dir.path(),
            CollectorSettings {
                interval: Duration::from_millis(10),
                grace: Duration::from_secs(300),
            },
        );
        let stats = collector.stats();
        let tasks = TaskStop::new();
        tasks.spawn(collector.run(tasks.until_stopped()));
        assert_eq!(tasks.len(), 1);
        // Let the first pass start (and hang on the silent server).
        tokio::time::sleep(Duration::from_millis(50)).await;
        tokio::time::timeout(Duration::from_secs(5), tasks.stop())
            .await
            .expect("the collector did not stop");
        assert!(tasks.is_empty());
        assert_eq!(
            stats.passes.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "no pass can have completed against a silent server"
        );
    }

    #[tokio::test]
    async fn a_task_spawned_after_the_stop_sees_it() {
        let tasks = TaskStop::new();
        tasks.stop().await;
        tasks.spawn(tasks.until_stopped());
        tokio::time::timeout(Duration::from_secs(5), tasks.stop())
            .await
            .expect("the task did not see the stop");
    }
}
