//! Watches through the real `kube::runtime` watcher and reflector: convergence after changes, a
//! dropped stream, a 410 after compaction, bookmarks, selector transitions, streaming lists.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use hami_tests::apiserver::{ApiServer, Verb, fixtures};
use hami_tests::reflector::reflect_nodes;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);

/// The store as name → `nvidia.com/gpu.product` label.
fn view(store: &Store<Node>) -> BTreeMap<String, String> {
    store
        .state()
        .iter()
        .map(|n| {
            let product = n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("nvidia.com/gpu.product").cloned())
                .unwrap_or_default();
            (n.metadata.name.clone().unwrap(), product)
        })
        .collect()
}

/// Waits until the reflector's view equals the server's objects.
async fn converged(server: &ApiServer, store: &Store<Node>) {
    let expected: BTreeMap<String, String> = server
        .list::<Node>()
        .unwrap()
        .into_iter()
        .map(|n| {
            let p = n
                .metadata
                .labels
                .unwrap_or_default()
                .get("nvidia.com/gpu.product")
                .cloned()
                .unwrap_or_default();
            (n.metadata.name.unwrap(), p)
        })
        .collect();
    let wait = async {
        while view(store) != expected {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    if tokio::time::timeout(WAIT, wait).await.is_err() {
        panic!(
            "reflector did not converge:\n  store:  {:?}\n  server: {expected:?}",
            view(store)
        );
    }
}

fn count(server: &ApiServer, verb: Verb) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.verb == verb && r.resource.as_deref() == Some("nodes"))
        .count()
}

#[tokio::test]
async fn reflector_converges_after_creates_updates_deletes() {
    let server = ApiServer::start().await.unwrap();
    server.seed_all(fixtures::gpu_nodes(3).unwrap()).unwrap();
    let store = reflect_nodes(&server, watcher::Config::default(), WAIT).await;
    converged(&server, &store).await;

    let nodes: Api<Node> = Api::all(server.client());
    nodes
        .create(
            &PostParams::default(),
            &fixtures::gpu_node("new", 2).unwrap(),
        )
        .await
        .unwrap();
    nodes
        .patch(
            &fixtures::node_name(0),
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"nvidia.com/gpu.product": "NVIDIA-B200"}}}),
            ),
        )
        .await
        .unwrap();
    nodes
        .delete(&fixtures::node_name(1), &Default::default())
        .await
        .unwrap();
    converged(&server, &store).await;
    assert_eq!(view(&store)[&fixtures::node_name(0)], "NVIDIA-B200");
    assert_eq!(store.state().len(), 3);
}

#[tokio::test]
async fn dropped_stream_resumes_without_relisting() {
    let server = ApiServer::start().await.unwrap();
    server.seed_all(fixtures::gpu_nodes(3).unwrap()).unwrap();
    let store = reflect_nodes(&server, watcher::Config::default(), WAIT).await;
    tokio::time::timeout(WAIT, server.wait_for_watchers::<Node>(1))
        .await
        .unwrap();
    let lists_before = count(&server, Verb::List);
    server.clear_requests();

    assert_eq!(server.close_watches(), 1);
    server.remove::<Node>(None, &fixtures::node_name(2));
    server
        .seed(&fixtures::gpu_node("late", 4).unwrap())
        .unwrap();
    converged(&server, &store).await;

    // The watcher came back with a watch from its last resourceVersion, not a new list.
    assert_eq!(
        count(&server, Verb::List),
        0,
        "lists before: {lists_before}"
    );
    let rewatch = server
        .requests()
        .into_iter()
        .find(|r| r.verb == Verb::Watch)
        .unwrap();
    let query = rewatch.query.unwrap();
    assert!(
        query.contains("resourceVersion=") && !query.contains("resourceVersion=0&"),
        "{query}"
    );
}

#[tokio::test]
async fn expired_resource_version_makes_the_watcher_relist() {
    let mut server = ApiServer::start().await.unwrap();
    server.seed_all(fixtures::gpu_nodes(4).unwrap()).unwrap();
    let store = reflect_nodes(&server, watcher::Config::default(), WAIT).await;
    tokio::time::timeout(WAIT, server.wait_for_watchers::<Node>(1))
        .await
        .unwrap();

    // While the server is down, objects change and the history is compacted: the watcher's
    // resourceVersion is then too old, the watch answers an ERROR 410 event and the watcher re-lists.
    server.stop().await;
    server.remove::<Node>(None, &fixtures::node_name(0));
    server
        .seed(&fixtures::gpu_node("after-compaction", 5).unwrap())
        .unwrap();
    server.compact();
    server.clear_requests();
    server.restart().await.unwrap();
    converged(&server, &store).await;
    assert!(
        count(&server, Verb::List) >= 1,
        "the watcher re-listed after 410"
    );
    assert!(!view(&store).contains_key(&fixtures::node_name(0)));
}

#[tokio::test]
async fn watch_from_compacted_version_is_an_error_event_410() {
    let server = ApiServer::start().await.unwrap();
    server.seed(&fixtures::gpu_node("a", 0).unwrap()).unwrap();
    let old = server.resource_version().to_string();
    server.seed(&fixtures::gpu_node("b", 1).unwrap()).unwrap();
    server.compact();
    let nodes: Api<Node> = Api::all(server.client());
    let mut events = nodes
        .watch(&WatchParams::default(), &old)
        .await
        .unwrap()
        .boxed();
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected an ERROR 410 event, got {other:?}"),
    }
    assert!(events.try_next().await.unwrap().is_none());

    // From a kept resourceVersion, the watch replays what happened after it.
    let rv = server.resource_version().to_string();
    server.seed(&fixtures::gpu_node("c", 2).unwrap()).unwrap();
    let mut events = nodes
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Added(n)) => assert_eq!(n.metadata.name.as_deref(), Some("c")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn watch_from_zero_sends_current_objects_then_changes() {
    let server = ApiServer::start().await.unwrap();
    server.seed_all(fixtures::gpu_nodes(2).unwrap()).unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    let mut events = nodes
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    for i in 0..2 {
        match events.try_next().await.unwrap() {
            Some(WatchEvent::Added(n)) => assert_eq!(n.metadata.name, Some(fixtures::node_name(i))),
            other => panic!("{other:?}"),
        }
    }
    server.remove::<Node>(None, &fixtures::node_name(0));
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Deleted(n)) => {
            assert_eq!(n.metadata.name, Some(fixtures::node_name(0)));
            assert_eq!(
                n.metadata.resource_version,
                Some(server.resource_version().to_string())
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn label_selector_watch_turns_matching_changes_into_added_and_deleted() {
    let server = ApiServer::start().await.unwrap();
    server.seed(&fixtures::gpu_node("n", 0).unwrap()).unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    let rv = server.resource_version().to_string();
    let wp = WatchParams::default().labels("hami.io/webhook!=ignore");
    let mut events = nodes.watch(&wp, &rv).await.unwrap().boxed();
    let set = |v: serde_json::Value| {
        let nodes = nodes.clone();
        async move {
            nodes
                .patch(
                    "n",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"hami.io/webhook": v}}})),
                )
                .await
                .unwrap()
        }
    };
    set(json!("ignore")).await;
    assert!(matches!(
        events.try_next().await.unwrap(),
        Some(WatchEvent::Deleted(_))
    ));
    set(json!("other")).await;
    assert!(matches!(
        events.try_next().await.unwrap(),
        Some(WatchEvent::Added(_))
    ));
    set(json!(null)).await;
    assert!(matches!(
        events.try_next().await.unwrap(),
        Some(WatchEvent::Modified(_))
    ));
}

#[tokio::test]
async fn bookmarks_and_timeout_seconds() {
    let server = ApiServer::builder()
        .bookmark_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    server.seed(&fixtures::gpu_node("n", 0).unwrap()).unwrap();
    let rv = server.resource_version();
    let nodes: Api<Node> = Api::all(server.client());
    let mut events = nodes
        .watch(&WatchParams::default().timeout(1), &rv.to_string())
        .await
        .unwrap()
        .boxed();
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Bookmark(b)) => {
            assert_eq!(b.metadata.resource_version, rv.to_string());
            assert_eq!(b.types.kind, "Node");
        }
        other => panic!("{other:?}"),
    }
    // After timeoutSeconds the server ends the stream.
    let rest: Vec<_> = tokio::time::timeout(WAIT, events.try_collect::<Vec<_>>())
        .await
        .unwrap()
        .unwrap();
    assert!(rest.iter().all(|e| matches!(e, WatchEvent::Bookmark(_))));

    // Without allowWatchBookmarks, no bookmarks.
    let mut quiet = nodes
        .watch(
            &WatchParams::default().disable_bookmarks().timeout(1),
            &rv.to_string(),
        )
        .await
        .unwrap()
        .boxed();
    assert!(
        tokio::time::timeout(WAIT, quiet.try_next())
            .await
            .unwrap()
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn streaming_list_initial_events() {
    let server = ApiServer::start().await.unwrap();
    server.seed_all(fixtures::gpu_nodes(5).unwrap()).unwrap();
    let store = reflect_nodes(&server, watcher::Config::default().streaming_lists(), WAIT).await;
    converged(&server, &store).await;
    assert_eq!(count(&server, Verb::List), 0);
    let w = server
        .requests()
        .into_iter()
        .find(|r| r.verb == Verb::Watch)
        .unwrap();
    assert!(w.query.unwrap().contains("sendInitialEvents=true"));
    server.remove::<Node>(None, &fixtures::node_name(3));
    converged(&server, &store).await;
}

/// Why the server answers an expired watch with an ERROR event rather than an HTTP 410: kube's
/// watcher treats a failed watch start as transient and retries the same resourceVersion (it does
/// not re-list), so only the in-stream 410 makes it re-list.
#[tokio::test]
async fn http_410_at_watch_start_is_retried_with_the_same_version() {
    use hami_tests::apiserver::{Fault, RequestMatch};
    let server = ApiServer::start().await.unwrap();
    server.seed_all(fixtures::gpu_nodes(2).unwrap()).unwrap();
    let store = reflect_nodes(&server, watcher::Config::default(), WAIT).await;
    tokio::time::timeout(WAIT, server.wait_for_watchers::<Node>(1))
        .await
        .unwrap();
    server.clear_requests();
    server.fail_next(
        RequestMatch::new(Verb::Watch, "nodes"),
        1,
        Fault::Status(410),
    );
    server.close_watches();
    server
        .seed(&fixtures::gpu_node("later", 2).unwrap())
        .unwrap();
    converged(&server, &store).await;
    let watches: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| r.verb == Verb::Watch)
        .map(|r| r.query.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        count(&server, Verb::List),
        0,
        "no re-list after an HTTP 410"
    );
    assert!(watches.len() >= 2, "{watches:?}");
    let rv = |q: &str| {
        q.split('&')
            .find(|kv| kv.starts_with("resourceVersion="))
            .map(str::to_string)
    };
    assert_eq!(
        rv(&watches[0]),
        rv(&watches[1]),
        "the failed watch was retried with the same version"
    );
}
