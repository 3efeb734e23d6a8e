//! Label and field selectors and paginated lists through `kube::Api::list`.

use hami_tests::apiserver::{ApiServer, fixtures};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};

async fn names<K>(api: &Api<K>, lp: &ListParams) -> Vec<String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut out: Vec<String> = api
        .list(lp)
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| o.meta().name.clone().unwrap())
        .collect();
    out.sort();
    out
}

async fn node_server() -> (ApiServer, Api<Node>) {
    let server = ApiServer::start().await.unwrap();
    // Profiles: 0 A100 (8), 1 H100 (8), 2 T4 (4), 3 A10G (4).
    for i in 0..4 {
        server
            .seed(&fixtures::gpu_node(&format!("n{i}"), i).unwrap())
            .unwrap();
    }
    let mut plain = fixtures::gpu_node("cpu-only", 0).unwrap();
    plain.metadata.labels = Some([("kubernetes.io/os".to_string(), "linux".to_string())].into());
    server.seed(&plain).unwrap();
    let api = Api::all(server.client());
    (server, api)
}

#[tokio::test]
async fn label_selector_operators() {
    let (_server, nodes) = node_server().await;
    let sel = |s: &str| ListParams::default().labels(s);
    assert_eq!(
        names(&nodes, &sel("nvidia.com/gpu.product=Tesla-T4")).await,
        ["n2"]
    );
    assert_eq!(
        names(&nodes, &sel("nvidia.com/gpu.count==8")).await,
        ["n0", "n1"]
    );
    // `!=` also selects objects without the label.
    assert_eq!(
        names(&nodes, &sel("nvidia.com/gpu.count!=8")).await,
        ["cpu-only", "n2", "n3"]
    );
    assert_eq!(
        names(
            &nodes,
            &sel("nvidia.com/gpu.product in (NVIDIA-A10G, Tesla-T4)")
        )
        .await,
        ["n2", "n3"]
    );
    assert_eq!(
        names(&nodes, &sel("nvidia.com/gpu.family notin (ampere)")).await,
        ["cpu-only", "n1", "n2"]
    );
    assert_eq!(
        names(&nodes, &sel("nvidia.com/gpu.memory")).await,
        ["n0", "n1", "n2", "n3"]
    );
    assert_eq!(
        names(&nodes, &sel("!nvidia.com/gpu.memory")).await,
        ["cpu-only"]
    );
    assert_eq!(
        names(
            &nodes,
            &sel("nvidia.com/gpu.present=true,nvidia.com/gpu.count=4,!missing")
        )
        .await,
        ["n2", "n3"]
    );
}

#[tokio::test]
async fn invalid_selectors_are_bad_requests() {
    let (_server, nodes) = node_server().await;
    for lp in [
        ListParams::default().labels("a in (b"),
        ListParams::default().labels("-bad=x"),
        ListParams::default().fields("spec.nodeName=x"), // not a Node field
        ListParams::default().fields("status.capacity=1"),
    ] {
        match nodes.list(&lp).await.unwrap_err() {
            kube::Error::Api(s) => {
                assert_eq!((s.code, s.reason.as_str()), (400, "BadRequest"), "{lp:?}")
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn field_selectors_on_pods() {
    let server = ApiServer::start().await.unwrap();
    server
        .seed(&fixtures::gpu_pod("ml-team", "running-a", Some("node-a")).unwrap())
        .unwrap();
    server
        .seed(&fixtures::gpu_pod("ml-team", "running-b", Some("node-b")).unwrap())
        .unwrap();
    server
        .seed(&fixtures::gpu_pod("ml-team", "pending", None).unwrap())
        .unwrap();
    server
        .seed(&fixtures::gpu_pod("other", "running-a", Some("node-a")).unwrap())
        .unwrap();
    let all: Api<Pod> = Api::all(server.client());
    let ml: Api<Pod> = Api::namespaced(server.client(), "ml-team");
    let f = |s: &str| ListParams::default().fields(s);

    assert_eq!(
        names(&all, &f("spec.nodeName=node-a")).await,
        ["running-a", "running-a"]
    );
    assert_eq!(names(&ml, &f("spec.nodeName=node-a")).await, ["running-a"]);
    assert_eq!(names(&all, &f("status.phase=Pending")).await, ["pending"]);
    assert_eq!(
        names(&ml, &f("status.phase!=Pending")).await,
        ["running-a", "running-b"]
    );
    // An unscheduled pod has spec.nodeName "" (how the scheduler finds pending pods).
    assert_eq!(names(&all, &f("spec.nodeName=")).await, ["pending"]);
    assert_eq!(
        names(&all, &f("metadata.name=running-b")).await,
        ["running-b"]
    );
    assert_eq!(
        names(&all, &f("metadata.namespace=other")).await,
        ["running-a"]
    );
    assert_eq!(
        names(
            &all,
            &f("metadata.namespace=ml-team,spec.nodeName!=node-b,status.phase=Running")
        )
        .await,
        ["running-a"]
    );
    // Labels and fields together.
    let both = ListParams::default()
        .labels("app=train")
        .fields("spec.nodeName=node-b");
    assert_eq!(names(&all, &both).await, ["running-b"]);
}

#[tokio::test]
async fn pagination_with_limit_and_continue_is_a_consistent_snapshot() {
    let server = ApiServer::start().await.unwrap();
    server.seed_all(fixtures::gpu_nodes(25).unwrap()).unwrap();
    let nodes: Api<Node> = Api::all(server.client());

    let first = nodes.list(&ListParams::default().limit(10)).await.unwrap();
    assert_eq!(first.items.len(), 10);
    assert_eq!(first.metadata.remaining_item_count, Some(15));
    let snapshot_rv = first.metadata.resource_version.clone().unwrap();
    let token = first.metadata.continue_.clone().unwrap();

    // Changes after the first page are not visible in later pages of the same list.
    server.remove::<Node>(None, &fixtures::node_name(24));
    let mut seen: Vec<String> = first
        .items
        .iter()
        .map(|n| n.metadata.name.clone().unwrap())
        .collect();
    let mut cont = Some(token);
    while let Some(c) = cont {
        let page = nodes
            .list(&ListParams::default().limit(10).continue_token(&c))
            .await
            .unwrap();
        assert_eq!(
            page.metadata.resource_version.as_deref(),
            Some(snapshot_rv.as_str())
        );
        seen.extend(page.items.iter().map(|n| n.metadata.name.clone().unwrap()));
        cont = page.metadata.continue_.filter(|c| !c.is_empty());
    }
    let expected: Vec<String> = (0..25).map(fixtures::node_name).collect();
    assert_eq!(seen, expected);

    // A fresh list sees the deletion; with a selector no remainingItemCount is given.
    assert_eq!(
        nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        24
    );
    let filtered = nodes
        .list(
            &ListParams::default()
                .labels("nvidia.com/gpu.count=8")
                .limit(2),
        )
        .await
        .unwrap();
    assert_eq!(filtered.items.len(), 2);
    assert!(filtered.metadata.continue_.is_some());
    assert_eq!(filtered.metadata.remaining_item_count, None);

    // A continue token older than the kept history answers 410 Expired.
    let token = nodes
        .list(&ListParams::default().limit(5))
        .await
        .unwrap()
        .metadata
        .continue_
        .unwrap();
    server.compact();
    match nodes
        .list(&ListParams::default().limit(5).continue_token(&token))
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (410, "Expired")),
        other => panic!("{other:?}"),
    }
}
