//! Scale: 10,000 GFD-labelled Nodes, full list + watch into a kube reflector. Prints the time it
//! takes (run with `--release -- --nocapture` for the figure in tests/README.md); asserts only
//! correctness.

use std::time::{Duration, Instant};

use futures::StreamExt;
use hami_tests::apiserver::{ApiServer, fixtures};
use hami_tests::reflector::reflect_nodes;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

const NODES: usize = 10_000;
const WAIT: Duration = Duration::from_secs(300);

async fn reflect(server: &ApiServer, config: watcher::Config) -> (Store<Node>, Duration) {
    let started = Instant::now();
    let reader = reflect_nodes(server, config, WAIT).await;
    tokio::time::timeout(WAIT, server.wait_for_watchers::<Node>(1))
        .await
        .unwrap();
    (reader, started.elapsed())
}

async fn check(server: &ApiServer, store: &Store<Node>, tag: &str) {
    assert_eq!(store.state().len(), NODES);
    let probe = fixtures::node_name(NODES - 1);
    let node = store.get(&reflector::ObjectRef::new(&probe)).unwrap();
    let labels = node.metadata.labels.as_ref().unwrap();
    let (model, zone) = fixtures::node_profile(NODES - 1);
    assert_eq!(labels["nvidia.com/gpu.product"], model.product);
    assert_eq!(
        labels["nvidia.com/gpu.memory"],
        model.memory_mib.to_string()
    );
    assert_eq!(labels["topology.kubernetes.io/zone"], zone);

    // The watch is live: a change reaches the store.
    let nodes: Api<Node> = Api::all(server.client());
    nodes
        .patch(
            &probe,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"scale-check": tag}}})),
        )
        .await
        .unwrap();
    let wait = async {
        loop {
            let n = store.get(&reflector::ObjectRef::new(&probe)).unwrap();
            if n.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("scale-check"))
                .map(String::as_str)
                == Some(tag)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(WAIT, wait).await.unwrap();
}

/// A metadata-only reflector (`Api<PartialObjectMeta<Node>>`), as a label index would use.
async fn reflect_metadata(server: &ApiServer) -> Duration {
    let started = Instant::now();
    let api: Api<PartialObjectMeta<Node>> = Api::all(server.client());
    let (reader, writer) = reflector::store::<PartialObjectMeta<Node>>();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while stream.next().await.is_some() {}
    });
    tokio::time::timeout(WAIT, reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(reader.state().len(), NODES);
    let probe = reader
        .get(&reflector::ObjectRef::new(&fixtures::node_name(7)))
        .unwrap();
    let (model, _) = fixtures::node_profile(7);
    assert_eq!(
        probe.metadata.labels.as_ref().unwrap()["nvidia.com/gpu.memory"],
        model.memory_mib.to_string()
    );
    elapsed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_gfd_nodes_list_and_watch_into_a_reflector() {
    let server = ApiServer::start().await.unwrap();
    let t = Instant::now();
    let nodes = fixtures::gpu_nodes(NODES).unwrap();
    let generated = t.elapsed();
    let t = Instant::now();
    assert_eq!(server.seed_all(nodes).unwrap(), NODES);
    let seeded = t.elapsed();
    let bytes: usize = server
        .get_json::<Node>(None, &fixtures::node_name(0))
        .map(|v| v.to_string().len())
        .unwrap();

    let (store, list_watch) = reflect(&server, watcher::Config::default()).await;
    check(&server, &store, "list-watch").await;
    let (store2, streaming) = reflect(&server, watcher::Config::default().streaming_lists()).await;
    check(&server, &store2, "streaming").await;

    let metadata_only = reflect_metadata(&server).await;

    println!(
        "scale: {NODES} nodes (~{bytes} bytes JSON each): generated in {generated:?}, seeded in {seeded:?}; \
         reflector ready with watch open: list+watch (500/page) {list_watch:?}, streaming list {streaming:?}, \
         metadata-only list+watch {metadata_only:?}"
    );
}
