//! The Warning Events of the region exporter, raised on the pod through kube's `Recorder` (the
//! device plugin's reporter), best effort: a failure is logged.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::mpsc;

use super::observe::CapEvent;
use crate::node_register::truncate_note;

/// The pod an Event is about.
fn reference(event: &CapEvent) -> ObjectReference {
    let o = &event.key.owner;
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(o.pod.clone()),
        namespace: Some(o.namespace.clone()),
        uid: o.uid.clone(),
        ..ObjectReference::default()
    }
}

/// Publishes every Event received until the senders are gone.
pub async fn publish(recorder: Recorder, mut events: mpsc::UnboundedReceiver<CapEvent>) {
    while let Some(event) = events.recv().await {
        let e = Event {
            type_: EventType::Warning,
            reason: event.reason.to_owned(),
            note: Some(truncate_note(&event.message, 1024)),
            action: "ReadRegion".to_owned(),
            secondary: None,
        };
        if let Err(error) = recorder.publish(&e, &reference(&event)).await {
            tracing::warn!(%error, pod = %event.key.owner.pod, reason = event.reason, "cannot record the Event");
        }
    }
}
