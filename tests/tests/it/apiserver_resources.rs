//! Discovery and the other served resources through the real kube client: secrets, events
//! (core/v1 and events.k8s.io/v1 via kube's `Recorder`), mutatingwebhookconfigurations, the status
//! subresource, finalizers, delete preconditions, deletecollection and metadata-only requests.

use std::collections::BTreeMap;

use hami_tests::apiserver::{ApiServer, fixtures};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Event, Node, ObjectReference, Pod, Secret};
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions,
};
use kube::core::GroupVersionKind;
use kube::discovery::{self, Discovery, Scope, verbs};
use kube::runtime::events::{Event as RecordedEvent, EventType, Recorder, Reporter};
use serde_json::json;

fn api_error(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(s) => (s.code, s.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn discovery_finds_every_served_resource() {
    let server = ApiServer::start().await.unwrap();
    let client = server.client();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "34")
    );

    let expected = [
        ("", "Pod", "pods", Scope::Namespaced),
        ("", "Node", "nodes", Scope::Cluster),
        ("", "Secret", "secrets", Scope::Namespaced),
        ("", "Event", "events", Scope::Namespaced),
        ("events.k8s.io", "Event", "events", Scope::Namespaced),
        (
            "admissionregistration.k8s.io",
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
            Scope::Cluster,
        ),
    ];
    let legacy = Discovery::new(client.clone()).run().await.unwrap();
    let aggregated = Discovery::new(client.clone())
        .run_aggregated()
        .await
        .unwrap();
    for d in [&legacy, &aggregated] {
        for (group, kind, plural, scope) in &expected {
            let gvk = GroupVersionKind::gvk(group, "v1", kind);
            let (ar, caps) = d
                .resolve_gvk(&gvk)
                .unwrap_or_else(|| panic!("{gvk:?} not discovered"));
            assert_eq!(ar.plural, *plural);
            assert_eq!(&caps.scope, scope);
            for verb in [
                verbs::GET,
                verbs::LIST,
                verbs::WATCH,
                verbs::CREATE,
                verbs::PATCH,
                verbs::DELETE,
            ] {
                assert!(caps.supports_operation(verb), "{kind} {verb}");
            }
        }
        let (_, pod_caps) = d
            .resolve_gvk(&GroupVersionKind::gvk("", "v1", "Pod"))
            .unwrap();
        assert!(
            pod_caps
                .subresources
                .iter()
                .any(|(ar, _)| ar.plural == "pods/status" || ar.plural == "status"),
            "{pod_caps:?}"
        );
    }

    // A oneshot lookup, then a dynamic Api over what discovery returned.
    let gvk = GroupVersionKind::gvk("", "v1", "Node");
    let (ar, _) = discovery::pinned_kind(&client, &gvk).await.unwrap();
    server.seed(&fixtures::gpu_node("n", 0).unwrap()).unwrap();
    let dynamic: Api<DynamicObject> = Api::all_with(client, &ar);
    let listed = dynamic.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(
        listed.items[0].data["status"]["nodeInfo"]["kubeletVersion"],
        "v1.34.1-eks-1c8ebd2"
    );
}

#[tokio::test]
async fn secrets_crud_and_string_data() {
    let server = ApiServer::start().await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(server.client(), "hami-system");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "hami-webhook-tls" },
        "type": "kubernetes.io/tls",
        "stringData": { "tls.crt": "CERT", "tls.key": "KEY" }
    }))
    .unwrap();
    let created = secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    assert!(created.string_data.is_none());
    let data = created.data.clone().unwrap();
    assert_eq!(data["tls.crt"], ByteString(b"CERT".to_vec()));
    assert_eq!(created.type_.as_deref(), Some("kubernetes.io/tls"));

    let mut updated = created.clone();
    updated.data = Some(BTreeMap::from([(
        "tls.crt".into(),
        ByteString(b"NEW".to_vec()),
    )]));
    let replaced = secrets
        .replace("hami-webhook-tls", &PostParams::default(), &updated)
        .await
        .unwrap();
    assert_eq!(
        replaced.data.unwrap()["tls.crt"],
        ByteString(b"NEW".to_vec())
    );

    let typed = secrets
        .list(&ListParams::default().fields("type=kubernetes.io/tls"))
        .await
        .unwrap();
    assert_eq!(typed.items.len(), 1);

    // Secrets answer DELETE with a Success Status, not the object.
    let status = secrets
        .delete("hami-webhook-tls", &DeleteParams::default())
        .await
        .unwrap()
        .right()
        .unwrap();
    assert_eq!(
        status.status,
        Some(kube::core::response::StatusSummary::Success)
    );
    assert!(secrets.get_opt("hami-webhook-tls").await.unwrap().is_none());
}

#[tokio::test]
async fn events_core_and_recorder() {
    let server = ApiServer::start().await.unwrap();
    let pod = server
        .seed(&fixtures::gpu_pod("ml-team", "train-1", Some("n")).unwrap())
        .unwrap();

    let events: Api<Event> = Api::namespaced(server.client(), "ml-team");
    let ev: Event = serde_json::from_value(json!({
        "metadata": { "name": "train-1.18a2b3c4d5e6f708" },
        "involvedObject": { "kind": "Pod", "namespace": "ml-team", "name": "train-1", "uid": pod.metadata.uid },
        "reason": "LimitsPublished", "message": "limits file published", "type": "Normal",
        "source": { "component": "hami-device-plugin" }, "count": 1
    }))
    .unwrap();
    events.create(&PostParams::default(), &ev).await.unwrap();
    let found =
        events
            .list(&ListParams::default().fields(
                "involvedObject.name=train-1,reason=LimitsPublished,source=hami-device-plugin",
            ))
            .await
            .unwrap();
    assert_eq!(found.items.len(), 1);
    assert_eq!(
        found.items[0].message.as_deref(),
        Some("limits file published")
    );
    events
        .delete("train-1.18a2b3c4d5e6f708", &DeleteParams::default())
        .await
        .unwrap();

    // kube's Recorder writes events.k8s.io/v1 Events: create, then a merge patch for the series.
    let recorder = Recorder::new(
        server.client(),
        Reporter {
            controller: "hami-webhook".into(),
            instance: None,
        },
    );
    let reference = ObjectReference {
        kind: Some("Pod".into()),
        api_version: Some("v1".into()),
        namespace: Some("ml-team".into()),
        name: Some("train-1".into()),
        uid: pod.metadata.uid.clone(),
        ..Default::default()
    };
    let rec = RecordedEvent {
        type_: EventType::Warning,
        reason: "InvalidLimitDelivery".into(),
        note: Some("annotation hami.io/limit-delivery=\"FILE\" is not one of: env, file".into()),
        action: "Admit".into(),
        secondary: None,
    };
    recorder.publish(&rec, &reference).await.unwrap();
    recorder.publish(&rec, &reference).await.unwrap();
    let v1: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(server.client(), "ml-team");
    let list = v1
        .list(&ListParams::default().fields("regarding.name=train-1"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(
        list.items[0].reporting_controller.as_deref(),
        Some("hami-webhook")
    );
}

#[tokio::test]
async fn mutating_webhook_configuration_crud() {
    let server = ApiServer::start().await.unwrap();
    let mwcs: Api<MutatingWebhookConfiguration> = Api::all(server.client());
    let mwc: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": { "name": "hami-webhook" },
        "webhooks": [{
            "name": "vgpu.hami.io",
            "clientConfig": { "service": { "name": "hami-webhook", "namespace": "hami-system", "path": "/mutate", "port": 443 } },
            "rules": [{ "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "*" }],
            "failurePolicy": "Ignore", "sideEffects": "None", "admissionReviewVersions": ["v1"]
        }]
    }))
    .unwrap();
    mwcs.create(&PostParams::default(), &mwc).await.unwrap();

    // The certificate tool's patch: set caBundle, guarded by a test of the webhook name.
    let ca = "LS0tLS1CRUdJTi1DRVJUSUZJQ0FURS0tLS0t";
    let patch: json_patch::Patch = serde_json::from_value(json!([
        { "op": "test", "path": "/webhooks/0/name", "value": "vgpu.hami.io" },
        { "op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": ca }
    ]))
    .unwrap();
    let patched = mwcs
        .patch(
            "hami-webhook",
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
        .unwrap();
    let hook = &patched.webhooks.as_ref().unwrap()[0];
    assert_eq!(
        hook.client_config.ca_bundle.as_ref().unwrap().0,
        b"-----BEGIN-CERTIFICATE-----".to_vec()
    );

    // Strategic merge merges webhooks by name.
    let smp = mwcs
        .patch(
            "hami-webhook",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({ "webhooks": [{ "name": "vgpu.hami.io", "failurePolicy": "Fail" }] }),
            ),
        )
        .await
        .unwrap();
    let hooks = smp.webhooks.unwrap();
    assert_eq!(hooks.len(), 1);
    assert_eq!(hooks[0].failure_policy.as_deref(), Some("Fail"));
    assert!(hooks[0].client_config.ca_bundle.is_some());

    let status = mwcs
        .delete("hami-webhook", &DeleteParams::default())
        .await
        .unwrap()
        .right()
        .unwrap();
    assert_eq!(
        status.details.unwrap().group,
        "admissionregistration.k8s.io"
    );
    assert_eq!(server.count::<MutatingWebhookConfiguration>(), 0);
}

#[tokio::test]
async fn status_subresource_separates_spec_and_status() {
    let server = ApiServer::start().await.unwrap();
    server
        .seed(&fixtures::gpu_pod("ml-team", "p", None).unwrap())
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "ml-team");

    // The main resource ignores status changes...
    let main = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "Running"}, "spec": {"activeDeadlineSeconds": 60}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(main.status.unwrap().phase.as_deref(), Some("Pending"));
    assert_eq!(
        main.spec.as_ref().unwrap().active_deadline_seconds,
        Some(60)
    );
    assert_eq!(
        main.metadata.generation,
        Some(2),
        "a spec change bumps generation"
    );

    // ...and the status subresource ignores spec changes.
    let st = pods
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "Running"}, "spec": {"activeDeadlineSeconds": 5}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(st.status.unwrap().phase.as_deref(), Some("Running"));
    assert_eq!(st.spec.unwrap().active_deadline_seconds, Some(60));
    assert_eq!(st.metadata.generation, Some(2));
    assert_eq!(
        pods.get_status("p")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Running")
    );
}

#[tokio::test]
async fn finalizers_preconditions_and_delete_collection() {
    let server = ApiServer::start().await.unwrap();
    // The fixture carries the Job tracking finalizer.
    let seeded = server
        .seed(&fixtures::gpu_pod("ml-team", "held", Some("n")).unwrap())
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "ml-team");

    let wrong_uid = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("not-the-uid".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    assert_eq!(
        api_error(pods.delete("held", &wrong_uid).await.unwrap_err()).0,
        409
    );

    let marked = pods
        .delete("held", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert!(pods.get_opt("held").await.unwrap().is_some());
    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(pods.get_opt("held").await.unwrap().is_none());
    assert!(seeded.metadata.uid.is_some());

    for name in ["a", "b", "c"] {
        let mut p = fixtures::gpu_pod("ml-team", name, None).unwrap();
        p.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(
                "batch".into(),
                if name == "c" { "keep" } else { "drop" }.into(),
            );
        server.seed(&p).unwrap();
    }
    let deleted = pods
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("batch=drop"),
        )
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(deleted.items.len(), 2);
    let left: Vec<_> = server
        .list::<Pod>()
        .unwrap()
        .into_iter()
        .map(|p| p.metadata.name.unwrap())
        .collect();
    assert_eq!(left, ["c"]);
}

#[tokio::test]
async fn metadata_only_requests() {
    let server = ApiServer::start().await.unwrap();
    server.seed_all(fixtures::gpu_nodes(3).unwrap()).unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    let meta = nodes
        .list_metadata(&ListParams::default().labels("nvidia.com/gpu.count=8"))
        .await
        .unwrap();
    assert_eq!(meta.items.len(), 2);
    assert_eq!(
        meta.items[0].types.as_ref().unwrap().kind,
        "PartialObjectMetadata"
    );
    assert_eq!(
        meta.items[0].metadata.labels.as_ref().unwrap()["nvidia.com/gpu.memory"],
        "81920"
    );
    let one = nodes.get_metadata(&fixtures::node_name(2)).await.unwrap();
    assert_eq!(
        one.metadata.labels.unwrap()["nvidia.com/gpu.product"],
        "Tesla-T4"
    );
}
