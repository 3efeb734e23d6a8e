//! What an allocation tells the API server: the merge patch of the pod's annotations (with its
//! `resourceVersion` as a precondition), the release of the node lock, and Events on the pod
//! (through kube's [`Recorder`], `events.k8s.io/v1`).

use std::sync::Arc;

use hami_shared::names::ANNOTATION_MUTEX_LOCK;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};

use crate::allocation::shell::pod_lookup::cache::PodCache;

/// The component name on Events (the node handshake reports under the same name).
pub use crate::node_register::REPORTING_CONTROLLER;
use crate::node_register::truncate_note;

/// The pod and node writes of one node's allocator.
#[derive(Clone)]
pub struct PodApi {
    client: kube::Client,
    node_name: String,
    recorder: Recorder,
    cache: Option<Arc<PodCache>>,
}

impl std::fmt::Debug for PodApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodApi")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

impl PodApi {
    /// For `node_name`; Events are reported by `hami-device-plugin` from that node.
    pub fn new(client: kube::Client, node_name: String) -> Self {
        let recorder = crate::node_register::recorder(client.clone(), &node_name);
        Self {
            client,
            node_name,
            recorder,
            cache: None,
        }
    }

    /// Puts every patched pod back into `cache` at once (before the watch event arrives).
    pub fn set_cache(&mut self, cache: Arc<PodCache>) {
        self.cache = Some(cache);
    }

    /// The API client.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// This node.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Merge-patches the pod's annotations. With `precondition`, the patch carries the pod's
    /// `resourceVersion`: the API server answers 409 unless `pod` is its current version. The
    /// patched pod goes back into the cache.
    pub async fn patch_annotations(
        &self,
        pod: &Pod,
        annotations: serde_json::Value,
        precondition: bool,
    ) -> Result<Pod, kube::Error> {
        let api: Api<Pod> = Api::namespaced(
            self.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or("default"),
        );
        let mut metadata = serde_json::json!({ "annotations": annotations });
        if precondition && let Some(rv) = &pod.metadata.resource_version {
            metadata["resourceVersion"] = serde_json::Value::String(rv.clone());
        }
        let patch = serde_json::json!({ "metadata": metadata });
        let patched = api
            .patch(
                pod.metadata.name.as_deref().unwrap_or(""),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        if let Some(cache) = &self.cache {
            cache.observe(&patched);
        }
        Ok(patched)
    }

    /// Removes the node lock if it still has the value that named this pod (a JSON patch `test`
    /// makes the check and the removal one atomic step).
    pub async fn release_lock(&self, lock: &str) -> Result<(), kube::Error> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let path = format!(
            "/metadata/annotations/{}",
            ANNOTATION_MUTEX_LOCK.replace('~', "~0").replace('/', "~1")
        );
        let patch = test_and_remove(&path, lock).map_err(kube::Error::SerdeError)?;
        match nodes
            .patch(
                &self.node_name,
                &PatchParams::default(),
                &Patch::Json::<()>(patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            // 422: the test failed — the lock was released or taken by another pod meanwhile.
            Err(kube::Error::Api(e)) if e.code == 422 => {
                tracing::info!(node = %self.node_name, "node lock no longer names this pod; left as is");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// A Warning Event on `pod` (best effort: a failure is logged). `action` says what the plugin
    /// was doing (`Allocate`).
    pub async fn warn(&self, pod: &Pod, reason: &str, message: &str) {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: pod.metadata.name.clone(),
            namespace: Some(
                pod.metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
            ),
            uid: pod.metadata.uid.clone(),
            resource_version: pod.metadata.resource_version.clone(),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: reason.to_owned(),
            note: Some(truncate_note(message, 1024)),
            action: "Allocate".to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(%error, pod = ?reference.name, %reason, "cannot record an Event");
        }
    }
}

/// The JSON patch that removes the annotation at `path` only while it still holds `value`.
fn test_and_remove(path: &str, value: &str) -> Result<json_patch::Patch, serde_json::Error> {
    serde_json::from_value(serde_json::json!([
        { "op": "test", "path": path, "value": value },
        { "op": "remove", "path": path },
    ]))
}
