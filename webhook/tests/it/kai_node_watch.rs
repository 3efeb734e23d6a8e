//! The KAI per-GPU VRAM basis against the in-process Kubernetes API server: the node watch
//! (metadata only, GFD label selector) follows node add, relabel and delete; recovers from a
//! dropped watch and from `410 Expired`; and a failing list shows in the metrics (readiness does
//! not wait for the node list: the server's readiness is the certificate's alone).
//! Every wait awaits a change notification with a generous timeout; nothing sleeps and hopes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hami_tests::apiserver::{ApiServer, Fault, RequestMatch, Verb};
use hami_webhook::policy::basis::{Basis, SkipReason, VramBasis as _};
use hami_webhook::policy::placement::Placement;
use hami_webhook::shell::vram::{KaiMetrics, LiveVramIndex, run_node_watch};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::watch;

const SELECTOR: &str = "nvidia.com/gpu.memory";
const PATIENCE: Duration = Duration::from_secs(10);

fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

fn gpu(name: &str, mib: &str) -> Node {
    node(name, &[(SELECTOR, mib), ("kubernetes.io/hostname", name)])
}

struct Watch {
    index: Arc<LiveVramIndex>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn start(server: &ApiServer) -> Watch {
    let index = LiveVramIndex::new(KaiMetrics::default());
    let (stop, mut stopped) = watch::channel(false);
    let task = tokio::spawn({
        let index = Arc::clone(&index);
        let client = server.client();
        async move {
            run_node_watch(client, index, SELECTOR, async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await;
        }
    });
    Watch { index, stop, task }
}

impl Watch {
    /// Wait until the unconstrained basis satisfies `want` (or fail after PATIENCE).
    async fn until(&self, what: &str, want: impl Fn(Result<Basis, SkipReason>) -> bool) {
        let mut changes = self.index.subscribe();
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let now = self.index.snapshot().basis(&Placement::any());
            if want(now) {
                return;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                _ => panic!("{what}: basis is {now:?}"),
            }
        }
    }

    async fn until_mib(&self, mib: u64) {
        self.until(&format!("basis {mib}"), |b| b.map(|b| b.mib) == Ok(mib))
            .await;
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .unwrap()
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basis_follows_add_relabel_and_delete() {
    let server = ApiServer::start().await.unwrap();
    server.seed(&gpu("a100", "81920")).unwrap();
    server
        .seed(&node("cpu", &[("kubernetes.io/hostname", "cpu")]))
        .unwrap();
    let w = start(&server);
    w.until_mib(81920).await;
    assert_eq!(w.index.metrics().synced.get(), 1);
    assert_eq!(w.index.metrics().failing.get(), 0);
    // Only GPU nodes are listed (label selector), as metadata.
    assert_eq!(w.index.read().len(), 1);
    let lists: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.resource.as_deref() == Some("nodes"))
        .collect();
    assert!(!lists.is_empty());
    assert!(
        lists.iter().all(|r| r
            .query
            .as_deref()
            .is_some_and(|q| q.contains("labelSelector=nvidia.com%2Fgpu.memory"))),
        "{:?}",
        lists.iter().map(|r| &r.query).collect::<Vec<_>>()
    );
    assert!(
        lists
            .iter()
            .all(|r| matches!(r.verb, Verb::List | Verb::Watch))
    );

    // Add a smaller GPU node: the minimum follows.
    server.seed(&gpu("t4", "15360")).unwrap();
    w.until_mib(15360).await;
    // Relabel it: the minimum follows.
    server.seed(&gpu("t4", "40960")).unwrap();
    w.until_mib(40960).await;
    // A broken label: the node is ignored, counted, and the basis comes from the rest.
    server.seed(&gpu("t4", "lots")).unwrap();
    w.until_mib(81920).await;
    assert_eq!(w.index.read().invalid_labels(), 1);
    assert_eq!(w.index.metrics().label_invalid.get(), 1);
    // The label goes away: the node leaves the selector (DELETED for the watch).
    server
        .seed(&node("t4", &[("kubernetes.io/hostname", "t4")]))
        .unwrap();
    let mut changes = w.index.subscribe();
    while w.index.read().len() != 1 {
        tokio::time::timeout(PATIENCE, changes.changed())
            .await
            .unwrap()
            .unwrap();
    }
    // Delete the last GPU node: no basis, never a guess.
    assert!(server.remove::<Node>(None, "a100"));
    w.until("no GPU nodes", |b| b == Err(SkipReason::NoMatchingNode))
        .await;
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrowing_uses_live_labels() {
    let server = ApiServer::start().await.unwrap();
    server
        .seed(&node("a", &[(SELECTOR, "81920"), ("pool", "train")]))
        .unwrap();
    server
        .seed(&node("b", &[(SELECTOR, "15360"), ("pool", "infer")]))
        .unwrap();
    let w = start(&server);
    w.until_mib(15360).await;
    let train = Placement {
        node_selector: vec![("pool".into(), "train".into())],
        ..Placement::default()
    };
    assert_eq!(w.index.snapshot().basis(&train).map(|b| b.mib), Ok(81920));
    // Move b into the train pool: the constrained basis follows.
    server
        .seed(&node("b", &[(SELECTOR, "15360"), ("pool", "train")]))
        .unwrap();
    let mut changes = w.index.subscribe();
    while w.index.snapshot().basis(&train).map(|b| b.mib) != Ok(15360) {
        tokio::time::timeout(PATIENCE, changes.changed())
            .await
            .unwrap()
            .unwrap();
    }
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_watch_resumes_and_410_relists() {
    let server = ApiServer::start().await.unwrap();
    server.seed(&gpu("a", "81920")).unwrap();
    let w = start(&server);
    w.until_mib(81920).await;
    let relists = w.index.metrics().relists.get();
    assert_eq!(relists, 1);

    // The apiserver ends the watch: the client resumes and sees later changes.
    server.wait_for_watchers::<Node>(1).await;
    assert!(server.close_watches() >= 1);
    server.seed(&gpu("b", "20480")).unwrap();
    w.until_mib(20480).await;

    // History compacted and the watch dropped: resuming gets 410 Expired, the watcher re-lists
    // and the index is rebuilt from the new list (a node deleted meanwhile is gone).
    // The re-watch is held back while the changes land and the history is compacted, so the
    // resourceVersion it resumes from is gone.
    server.wait_for_watchers::<Node>(1).await;
    server.add_latency(
        RequestMatch::new(Verb::Watch, "nodes"),
        Duration::from_millis(300),
    );
    server.close_watches();
    assert!(server.remove::<Node>(None, "b"));
    server.seed(&gpu("c", "30720")).unwrap();
    server.compact();
    w.until_mib(30720).await;
    server.clear_faults();
    let mut changes = w.index.subscribe();
    while w.index.metrics().relists.get() < 2 {
        tokio::time::timeout(PATIENCE, changes.changed())
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(w.index.read().len(), 2);
    assert_eq!(w.index.read().node_mib("b"), None);
    assert_eq!(w.index.metrics().synced.get(), 1);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_list_shows_in_the_metrics_and_the_basis() {
    let server = ApiServer::start().await.unwrap();
    server.seed(&gpu("a", "81920")).unwrap();
    // The first lists fail: the watch retries with backoff.
    server.fail_next(
        RequestMatch::new(Verb::List, "nodes"),
        2,
        Fault::Status(500),
    );
    let w = start(&server);
    // Wait until the watch has seen a refused list, then check: failing, not synced, no basis.
    let mut waited = Duration::ZERO;
    while w.index.metrics().failing.get() != 1 {
        assert!(waited < PATIENCE, "no failed list seen");
        let step = Duration::from_millis(10);
        tokio::time::sleep(step).await;
        waited += step;
    }
    assert!(server.requests().iter().any(|r| r.fault.is_some()));
    assert_eq!(w.index.metrics().synced.get(), 0);
    assert_eq!(
        w.index.snapshot().basis(&Placement::any()),
        Err(SkipReason::NotSynced)
    );
    // Then the list succeeds: synced, no longer failing.
    w.until_mib(81920).await;
    assert_eq!(w.index.metrics().synced.get(), 1);
    assert_eq!(w.index.metrics().failing.get(), 0);
    assert!(w.index.metrics().watch_errors.get() >= 1);
    w.stop().await;
}
