//! Fault injection (HTTP errors, dropped connections, latency) and taking the server down and
//! back up on the same port, as the real kube client and watcher experience them.

use std::time::{Duration, Instant};

use hami_tests::apiserver::{ApiServer, Fault, RequestMatch, Verb, fixtures};
use hami_tests::reflector::reflect_nodes;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

async fn store_has(store: &Store<Node>, names: &[String]) {
    let wait = async {
        loop {
            let mut have: Vec<String> = store
                .state()
                .iter()
                .map(|n| n.metadata.name.clone().unwrap())
                .collect();
            have.sort();
            if have == names {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(WAIT, wait).await.unwrap();
}

#[tokio::test]
async fn next_n_requests_fail_with_500() {
    let server = ApiServer::start().await.unwrap();
    server
        .seed(&fixtures::gpu_pod("ml-team", "p", None).unwrap())
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "ml-team");
    server.fail_next(RequestMatch::new(Verb::Get, "pods"), 2, Fault::Status(500));
    assert_eq!(server.pending_faults(), 2);
    // Other verbs and resources are not affected.
    pods.list(&Default::default()).await.unwrap();
    for _ in 0..2 {
        match pods.get("p").await.unwrap_err() {
            kube::Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (500, "InternalError")),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(server.pending_faults(), 0);
    pods.get("p").await.unwrap();
    let faulted = server
        .requests()
        .iter()
        .filter(|r| r.fault.is_some())
        .count();
    assert_eq!(faulted, 2);
}

#[tokio::test]
async fn dropped_connection_is_a_transport_error_and_changes_nothing() {
    let server = ApiServer::start().await.unwrap();
    server.seed(&fixtures::gpu_node("n", 0).unwrap()).unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    server.fail_next(
        RequestMatch::new(Verb::Patch, "nodes"),
        1,
        Fault::DropConnection,
    );
    let patch = Patch::Merge(json!({"metadata": {"annotations": {"hami.io/mutex.lock": "x"}}}));
    let err = nodes
        .patch("n", &PatchParams::default(), &patch)
        .await
        .unwrap_err();
    assert!(
        !matches!(err, kube::Error::Api(_)),
        "expected a transport error, got {err:?}"
    );
    let stored: Node = server.get(None, "n").unwrap().unwrap();
    assert!(
        !stored
            .metadata
            .annotations
            .unwrap()
            .contains_key("hami.io/mutex.lock")
    );
    let patched = nodes
        .patch("n", &PatchParams::default(), &patch)
        .await
        .unwrap();
    assert_eq!(
        patched.metadata.annotations.unwrap()["hami.io/mutex.lock"],
        "x"
    );
}

#[tokio::test]
async fn kube_client_retries_503_by_itself() {
    let server = ApiServer::start().await.unwrap();
    server.seed(&fixtures::gpu_node("n", 0).unwrap()).unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    server.fail_next(RequestMatch::verb(Verb::Get), 2, Fault::Status(503));
    nodes.get("n").await.unwrap();
    assert_eq!(server.pending_faults(), 0);
    let gets = server
        .requests()
        .iter()
        .filter(|r| r.verb == Verb::Get)
        .count();
    assert_eq!(gets, 3);
}

#[tokio::test]
async fn latency_delays_matching_requests() {
    let server = ApiServer::start().await.unwrap();
    server.seed(&fixtures::gpu_node("n", 0).unwrap()).unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    server.add_latency(RequestMatch::resource("nodes"), Duration::from_millis(300));
    let t = Instant::now();
    nodes.get("n").await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(300));
    server.clear_faults();
    nodes.get("n").await.unwrap();
}

#[tokio::test]
async fn watcher_recovers_from_failed_lists_and_dropped_watches() {
    let server = ApiServer::start().await.unwrap();
    server.seed_all(fixtures::gpu_nodes(3).unwrap()).unwrap();
    server.fail_next(
        RequestMatch::new(Verb::List, "nodes"),
        2,
        Fault::Status(500),
    );
    server.fail_next(
        RequestMatch::new(Verb::Watch, "nodes"),
        1,
        Fault::DropConnection,
    );
    let store = reflect_nodes(&server, watcher::Config::default(), WAIT).await;
    let mut names: Vec<String> = (0..3).map(fixtures::node_name).collect();
    store_has(&store, &names).await;
    server
        .seed(&fixtures::gpu_node("late", 3).unwrap())
        .unwrap();
    names.push("late".into());
    store_has(&store, &names).await;
    assert_eq!(server.pending_faults(), 0);
}

#[tokio::test]
async fn stop_and_restart_on_the_same_port_keeps_data_and_watchers_resume() {
    let mut server = ApiServer::start().await.unwrap();
    let url = server.url().to_string();
    server.seed_all(fixtures::gpu_nodes(2).unwrap()).unwrap();
    let store = reflect_nodes(&server, watcher::Config::default(), WAIT).await;
    tokio::time::timeout(WAIT, server.wait_for_watchers::<Node>(1))
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(server.client());

    server.stop().await;
    assert!(!server.is_running());
    let err = nodes.get(&fixtures::node_name(0)).await.unwrap_err();
    assert!(
        !matches!(err, kube::Error::Api(_)),
        "expected connection refused, got {err:?}"
    );

    // Changes while down (as if another apiserver replica took them).
    server
        .seed(&fixtures::gpu_node("while-down", 2).unwrap())
        .unwrap();
    server.clear_requests();
    server.restart().await.unwrap();
    assert!(server.is_running());
    assert_eq!(server.url(), url);

    assert_eq!(
        nodes
            .get("while-down")
            .await
            .unwrap()
            .metadata
            .name
            .as_deref(),
        Some("while-down")
    );
    let mut names: Vec<String> = (0..2).map(fixtures::node_name).collect();
    names.push("while-down".into());
    names.sort();
    store_has(&store, &names).await;
    // The history survived the restart, so the watcher resumed without a new list.
    let lists = server
        .requests()
        .iter()
        .filter(|r| r.verb == Verb::List)
        .count();
    assert_eq!(lists, 0);
    server.shutdown().await;
}
