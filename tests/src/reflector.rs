//! A `kube::runtime` reflector of the Nodes of the in-process API server, as the webhook's node
//! watch builds one: what the API server's watch tests observe through.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::apiserver::ApiServer;

/// A reflector of every Node, driven by a spawned task; returned once its first list is in.
///
/// # Panics
/// When the store is not ready within `wait` (the test fails, naming the wait).
#[allow(clippy::expect_used)]
pub async fn reflect_nodes(
    server: &ApiServer,
    config: watcher::Config,
    wait: Duration,
) -> Store<Node> {
    let (reader, writer) = reflector::store::<Node>();
    let stream = watcher(Api::<Node>::all(server.client()), config)
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while stream.next().await.is_some() {}
    });
    tokio::time::timeout(wait, reader.wait_until_ready())
        .await
        .expect("the node reflector is ready in time")
        .expect("the node reflector's writer is alive");
    reader
}
