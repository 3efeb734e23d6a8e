//! `kube::Api` CRUD against the in-process apiserver: get, list, create, replace (with a stale
//! resourceVersion → 409), patch (merge, JSON with `test`, strategic), delete.

use hami_tests::apiserver::{ApiServer, fixtures};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn api_status(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(s) => (s.code, s.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn get_list_and_not_found() {
    let server = ApiServer::start().await.unwrap();
    server
        .seed(&fixtures::gpu_node("gpu-a", 0).unwrap())
        .unwrap();
    server
        .seed(&fixtures::gpu_node("gpu-b", 1).unwrap())
        .unwrap();
    let nodes: Api<Node> = Api::all(server.client());

    let a = nodes.get("gpu-a").await.unwrap();
    let labels = a.metadata.labels.unwrap();
    assert_eq!(labels["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-80GB");
    assert_eq!(labels["nvidia.com/gpu.memory"], "81920");
    assert!(a.metadata.uid.is_some());
    assert!(a.metadata.creation_timestamp.is_some());

    let list = nodes.list(&ListParams::default()).await.unwrap();
    let names: Vec<_> = list
        .items
        .iter()
        .map(|n| n.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["gpu-a", "gpu-b"]);
    let list_rv: u64 = list.metadata.resource_version.unwrap().parse().unwrap();
    assert_eq!(list_rv, server.resource_version());

    let (code, reason) = api_status(nodes.get("missing").await.unwrap_err());
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
    assert!(nodes.get_opt("missing").await.unwrap().is_none());
}

#[tokio::test]
async fn create_sets_server_fields_and_defaults() {
    let server = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "ml-team");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "generateName": "train-", "labels": { "app": "train" } },
        "spec": { "containers": [{ "name": "c", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                  "resources": { "limits": { "nvidia.com/gpu": "1" } } }] }
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    let name = created.metadata.name.clone().unwrap();
    assert!(
        name.starts_with("train-") && name.len() == "train-".len() + 5,
        "{name}"
    );
    assert_eq!(created.metadata.namespace.as_deref(), Some("ml-team"));
    assert_eq!(created.metadata.generation, Some(1));
    let spec = created.spec.unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
    assert_eq!(
        spec.containers[0].image_pull_policy.as_deref(),
        Some("IfNotPresent")
    );
    let status = created.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));

    // Creating the same name again is a 409 AlreadyExists.
    let mut again = pod.clone();
    again.metadata.generate_name = None;
    again.metadata.name = Some(name.clone());
    let (code, reason) = api_status(
        pods.create(&PostParams::default(), &again)
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));

    // An invalid name is a 422 Invalid.
    again.metadata.name = Some("Not_Valid".into());
    let (code, reason) = api_status(
        pods.create(&PostParams::default(), &again)
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(server.count::<Pod>(), 1);
}

#[tokio::test]
async fn replace_with_stale_resource_version_conflicts() {
    let server = ApiServer::start().await.unwrap();
    server
        .seed(&fixtures::gpu_pod("ml-team", "p", Some("gpu-a")).unwrap())
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "ml-team");
    let mut first = pods.get("p").await.unwrap();
    let stale = first.clone();
    first
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("hami.io/limit-delivery".into(), "file".into());
    let replaced = pods
        .replace("p", &PostParams::default(), &first)
        .await
        .unwrap();
    assert_ne!(
        replaced.metadata.resource_version,
        stale.metadata.resource_version
    );
    assert_eq!(
        replaced.metadata.annotations.unwrap()["hami.io/limit-delivery"],
        "file"
    );

    let (code, reason) = api_status(
        pods.replace("p", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
}

#[tokio::test]
async fn patches_merge_json_and_strategic() {
    let server = ApiServer::start().await.unwrap();
    server
        .seed(&fixtures::gpu_node("gpu-a", 0).unwrap())
        .unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    let pp = PatchParams::default();

    // Merge patch: set one annotation, delete another with null.
    let merged = nodes
        .patch(
            "gpu-a",
            &pp,
            &Patch::Merge(json!({"metadata": {"annotations": {"hami.io/mutex.lock": "2026-11-29T09:00:00Z", "node.alpha.kubernetes.io/ttl": null}}})),
        )
        .await
        .unwrap();
    let ann = merged.metadata.annotations.unwrap();
    assert_eq!(ann["hami.io/mutex.lock"], "2026-11-29T09:00:00Z");
    assert!(!ann.contains_key("node.alpha.kubernetes.io/ttl"));

    // Strategic merge: labels map with null deletion; taints merged by key.
    let smp = nodes
        .patch(
            "gpu-a",
            &pp,
            &Patch::Strategic(json!({
                "metadata": {"labels": {"gpu": null, "hami.io/webhook": "ignore"}},
                "spec": {"taints": [{"key": "hami.io/maintenance", "effect": "NoSchedule"}]}
            })),
        )
        .await
        .unwrap();
    let labels = smp.metadata.labels.unwrap();
    assert!(!labels.contains_key("gpu"));
    assert_eq!(labels["hami.io/webhook"], "ignore");
    assert_eq!(labels["nvidia.com/gpu.count"], "8");
    assert_eq!(smp.spec.unwrap().taints.unwrap().len(), 2);

    // JSON patch guarded by `test`: passes once, then the same guard fails with 422 and changes nothing.
    let guarded = |value: &str| {
        json_patch::Patch(
            serde_json::from_value(json!([
                {"op": "test", "path": "/metadata/annotations/hami.io~1mutex.lock", "value": "2026-11-29T09:00:00Z"},
                {"op": "replace", "path": "/metadata/annotations/hami.io~1mutex.lock", "value": value}
            ]))
            .unwrap(),
        )
    };
    let jp = nodes
        .patch("gpu-a", &pp, &Patch::<()>::Json(guarded("taken")))
        .await
        .unwrap();
    assert_eq!(
        jp.metadata.annotations.unwrap()["hami.io/mutex.lock"],
        "taken"
    );
    let rv_before = server.resource_version();
    let (code, reason) = api_status(
        nodes
            .patch("gpu-a", &pp, &Patch::<()>::Json(guarded("again")))
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(server.resource_version(), rv_before);
    let stored: Node = server.get(None, "gpu-a").unwrap().unwrap();
    assert_eq!(
        stored.metadata.annotations.unwrap()["hami.io/mutex.lock"],
        "taken"
    );
}

#[tokio::test]
async fn delete_returns_object_and_removes_it() {
    let server = ApiServer::start().await.unwrap();
    server
        .seed(&fixtures::gpu_pod("ml-team", "p", None).unwrap())
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "ml-team");
    let deleted = pods.delete("p", &DeleteParams::default()).await.unwrap();
    let pod = deleted.left().expect("pods answer DELETE with the object");
    assert_eq!(pod.metadata.name.as_deref(), Some("p"));
    assert_eq!(server.count::<Pod>(), 0);
    let (code, _) = api_status(
        pods.delete("p", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 404);
}

#[tokio::test]
async fn one_cluster_wide_increasing_resource_version() {
    let server = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    let pods: Api<Pod> = Api::namespaced(server.client(), "ml-team");
    let n = nodes
        .create(&PostParams::default(), &fixtures::gpu_node("n", 0).unwrap())
        .await
        .unwrap();
    let mut p = fixtures::gpu_pod("ml-team", "p", None).unwrap();
    p.metadata.uid = None;
    let p = pods.create(&PostParams::default(), &p).await.unwrap();
    let rv =
        |m: &kube::api::ObjectMeta| m.resource_version.clone().unwrap().parse::<u64>().unwrap();
    assert!(rv(&p.metadata) > rv(&n.metadata));
    // A patch that changes nothing writes nothing: same resourceVersion, no event.
    let same = nodes
        .patch(
            "n",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"gpu": "on"}}})),
        )
        .await
        .unwrap();
    assert_eq!(same.metadata.resource_version, n.metadata.resource_version);
    let changed = nodes
        .patch(
            "n",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"gpu": "off"}}})),
        )
        .await
        .unwrap();
    assert!(rv(&changed.metadata) > rv(&p.metadata));
    assert_eq!(changed.metadata.uid, n.metadata.uid);
    assert_eq!(
        changed.metadata.creation_timestamp,
        n.metadata.creation_timestamp
    );
}

#[tokio::test]
async fn list_resource_version_semantics() {
    let server = ApiServer::start().await.unwrap();
    server.seed(&fixtures::gpu_node("n", 0).unwrap()).unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    let current = server.resource_version().to_string();
    let older = (server.resource_version() - 1).to_string();

    // Any (rv=0) and NotOlderThan an older version are served from the current state.
    assert_eq!(
        nodes
            .list(&ListParams::default().match_any())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let lp = ListParams::default()
        .at(&older)
        .matching(kube::api::VersionMatch::NotOlderThan);
    let l = nodes.list(&lp).await.unwrap();
    assert_eq!(
        l.metadata.resource_version.as_deref(),
        Some(current.as_str())
    );
    // Exact at the current version works; an exact read of an older state is not kept (410).
    let exact = |rv: &str| {
        ListParams::default()
            .at(rv)
            .matching(kube::api::VersionMatch::Exact)
    };
    nodes.list(&exact(&current)).await.unwrap();
    let (code, reason) = api_status(nodes.list(&exact(&older)).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn server_side_apply_creates_and_updates() {
    let server = ApiServer::start().await.unwrap();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(server.client(), "hami-system");
    let applied = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": "tls", "labels": { "app": "hami" } },
        "stringData": { "ca.crt": "CA" }
    });
    let pp = PatchParams::apply("hami-certgen");
    let created = secrets
        .patch("tls", &pp, &Patch::Apply(&applied))
        .await
        .unwrap();
    assert_eq!(created.data.unwrap()["ca.crt"].0, b"CA".to_vec());
    let mut again = applied.clone();
    again["metadata"]["labels"]["tier"] = json!("control");
    let updated = secrets
        .patch("tls", &pp, &Patch::Apply(&again))
        .await
        .unwrap();
    assert_eq!(updated.metadata.labels.unwrap()["tier"], "control");
    // Apply without a field manager is rejected, as by the apiserver.
    let (code, _) = api_status(
        secrets
            .patch("tls", &PatchParams::default(), &Patch::Apply(&applied))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 400);
}

/// As the real kube-apiserver (seen in `tests/tests/real_cluster/main.rs`): `spec.nodeName` is set by a
/// Binding, never by a patch; a second Binding is a 409 Conflict.
#[tokio::test]
async fn pods_are_bound_through_the_binding_subresource() {
    let server = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "x"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let patched = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": "n1"}})),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = patched else {
        panic!("{patched:?}")
    };
    assert_eq!(status.code, 422, "{status:?}");
    assert!(status.message.contains("spec.nodeName"), "{status:?}");
    let binding = |node: &str| {
        json!({
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}
        })
    };
    let _: serde_json::Value = pods
        .create_subresource("binding", "p", &PostParams::default(), &binding("n1"))
        .await
        .unwrap();
    assert_eq!(
        pods.get("p")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .as_deref(),
        Some("n1")
    );
    let again = pods
        .create_subresource::<serde_json::Value, serde_json::Value>(
            "binding",
            "p",
            &PostParams::default(),
            &binding("n2"),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = again else {
        panic!("{again:?}")
    };
    assert_eq!(status.code, 409, "{status:?}");
    assert!(
        status.message.contains("already assigned to node \"n1\""),
        "{status:?}"
    );
}
