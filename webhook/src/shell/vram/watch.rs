//! The node watch: keeps a [`LiveVramIndex`] current from the cluster's GPU Nodes.
//!
//! The watch is metadata-only (`PartialObjectMetadata`) with the GFD label selector, so it needs
//! `list`/`watch` on nodes and transfers neither status nor spec. A lost watch resumes or re-lists
//! on its own (kube's watcher, with backoff); a re-list builds a fresh index and swaps it in when
//! complete, so lookups never see a half-listed cluster.

use std::sync::Arc;

use crate::shell::vram::index::{IndexChange, VramIndex};
use crate::shell::vram::live::LiveVramIndex;

/// The server's node watch: build a client from the environment (in-cluster service account or
/// kubeconfig), retrying with backoff until it works, then [`run_node_watch`] until `shutdown`.
/// Readiness does not wait for it: its state is in the metrics (`kai_node_watch_synced`,
/// `kai_node_watch_failing`) and the log, and a pod reviewed before the first list has no basis.
pub async fn watch_cluster(
    index: Arc<LiveVramIndex>,
    label_selector: String,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut backoff = hami_ops::Backoff::new(
        std::time::Duration::from_millis(500),
        std::time::Duration::from_secs(30),
    );
    let client = loop {
        match kube::Client::try_default().await {
            Ok(c) => break c,
            Err(e) => {
                index.metrics().watch_errors.inc();
                index.metrics().failing.set(1);
                tracing::error!(error = %e, retry_in_ms = backoff.delay().as_millis() as u64, "no Kubernetes client for the node watch; until it works gpu-fraction pods have no VRAM basis and are refused (admitted uncapped with kai.missingBasis: warn); or set HAMI_KAI__PER_GPU_VRAM_MIB");
                tokio::select! {
                    () = &mut shutdown => return,
                    () = tokio::time::sleep(backoff.delay()) => {}
                }
                backoff.fail();
            }
        }
    };
    tracing::info!(label_selector = %label_selector, "watching GPU nodes (metadata only)");
    run_node_watch(client, index, &label_selector, shutdown).await;
}

/// Keep `index` current from the cluster's Nodes carrying `label_selector` (metadata only) until
/// `shutdown`. Errors are logged and counted, and `kai_node_watch_failing` is 1 from an error to
/// the next event read (each change of state is logged once); the watch resumes or re-lists with
/// backoff.
pub async fn run_node_watch(
    client: kube::Client,
    index: Arc<LiveVramIndex>,
    label_selector: &str,
    shutdown: impl std::future::Future<Output = ()>,
) {
    use futures::StreamExt as _;
    use k8s_openapi::api::core::v1::Node as K8sNode;
    use kube::core::PartialObjectMeta;
    use kube::runtime::{WatchStreamExt as _, watcher};

    // `PartialObjectMeta` makes every list and watch request metadata-only.
    let api: kube::Api<PartialObjectMeta<K8sNode>> = kube::Api::all(client);
    let config = watcher::Config::default().labels(label_selector);
    // `take_until` polls `shutdown` before each event: the watch ends as soon as it completes.
    let stream = watcher(api, config).default_backoff().take_until(shutdown);
    tokio::pin!(stream);
    let mut pending: Option<VramIndex> = None;
    while let Some(event) = stream.next().await {
        let failing = event.is_err();
        if index.metrics().failing.get() != i64::from(failing) {
            index.metrics().failing.set(i64::from(failing));
            if !failing {
                tracing::info!(synced = index.is_synced(), "node watch working again");
            }
        }
        match event {
            Ok(watcher::Event::Init) => pending = Some(VramIndex::new()),
            Ok(watcher::Event::InitApply(obj)) => {
                let p = pending.get_or_insert_with(VramIndex::new);
                apply(p, &obj.metadata);
            }
            Ok(watcher::Event::InitDone) => {
                let fresh = pending.take().unwrap_or_default();
                tracing::info!(
                    nodes = fresh.len(),
                    min_mib = fresh.min_mib().unwrap_or(0),
                    invalid_labels = fresh.invalid_labels(),
                    "GPU node list read"
                );
                index.replace(fresh);
            }
            Ok(watcher::Event::Apply(obj)) => {
                index.update(|i| apply(i, &obj.metadata));
            }
            Ok(watcher::Event::Delete(obj)) => {
                let name = obj.metadata.name.as_deref().unwrap_or("");
                index.update(|i| i.remove(name));
            }
            Err(e) => {
                index.metrics().watch_errors.inc();
                tracing::warn!(
                    error = %e,
                    synced = index.is_synced(),
                    "node watch error; resuming (gpu-fraction pods get no basis until the first list is read)"
                );
            }
        }
    }
}

fn apply(
    index: &mut VramIndex,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> IndexChange {
    let name = meta.name.as_deref().unwrap_or("");
    let (change, label_error) = index.upsert_reporting(
        name,
        meta.labels
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.as_str())),
    );
    if let Some(e) = label_error {
        tracing::warn!(node = name, error = %e, "GPU memory label ignored");
    }
    change
}
