//! Watch streams: newline-delimited `{"type":..,"object":..}` events, bookmarks, `timeoutSeconds`,
//! selector transitions and streaming lists (`sendInitialEvents`).

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::resources::ResourceType;
use super::selector::Filter;
use super::status::ApiError;
use super::store::{Change, ChangeKind, Stored, WatchStart};

/// How objects are rendered: whole, or as `PartialObjectMetadata` (metadata-only clients).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Projection {
    Full,
    Metadata,
}

impl Projection {
    /// The object bytes as this projection shows them.
    pub fn render(self, s: &Stored) -> Bytes {
        match self {
            Self::Full => s.bytes.clone(),
            Self::Metadata => s
                .metadata_bytes
                .get_or_init(|| Bytes::from(partial_metadata(&s.value).to_string()))
                .clone(),
        }
    }
}

/// `meta.k8s.io/v1 PartialObjectMetadata` of an object.
pub(crate) fn partial_metadata(v: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": v.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// Options of one watch request.
#[derive(Debug, Clone)]
pub(crate) struct WatchOptions {
    pub filter: Filter,
    pub bookmarks: bool,
    pub send_initial_events: bool,
    pub timeout: Option<Duration>,
    pub bookmark_interval: Duration,
    pub projection: Projection,
}

fn event_line(buf: &mut BytesMut, kind: &str, object: &[u8]) {
    buf.extend_from_slice(b"{\"type\":\"");
    buf.extend_from_slice(kind.as_bytes());
    buf.extend_from_slice(b"\",\"object\":");
    buf.extend_from_slice(object);
    buf.extend_from_slice(b"}\n");
}

fn bookmark(rt: &ResourceType, projection: Projection, rv: u64, initial_end: bool) -> Vec<u8> {
    let (kind, api_version) = match projection {
        Projection::Full => (rt.kind.to_string(), rt.api_version()),
        Projection::Metadata => ("PartialObjectMetadata".into(), "meta.k8s.io/v1".into()),
    };
    let mut metadata = json!({ "resourceVersion": rv.to_string() });
    if initial_end {
        metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
    }
    json!({ "kind": kind, "apiVersion": api_version, "metadata": metadata })
        .to_string()
        .into_bytes()
}

/// The single `ERROR` event a watch gets when it cannot start (e.g. 410 for a too-old
/// resourceVersion): the real watch cache answers HTTP 200 with this event, and kube's watcher
/// re-lists on it (an HTTP 410 at watch start would make it retry the same resourceVersion).
pub(crate) fn error_stream(err: &ApiError) -> Body {
    let mut buf = BytesMut::new();
    event_line(&mut buf, "ERROR", err.to_status().to_string().as_bytes());
    Body::from(buf.freeze())
}

/// What a change looks like to a watch with this filter: `None` when it does not see it.
fn visible(filter: &Filter, change: &Change) -> Option<&'static str> {
    let now = filter.matches(&change.object.value);
    match change.kind {
        ChangeKind::Added => now.then_some("ADDED"),
        ChangeKind::Deleted => now.then_some("DELETED"),
        ChangeKind::Modified => {
            let before = change
                .previous
                .as_ref()
                .is_some_and(|p| filter.matches(&p.value));
            match (before, now) {
                (true, true) => Some("MODIFIED"),
                (false, true) => Some("ADDED"),
                (true, false) => Some("DELETED"),
                (false, false) => None,
            }
        }
    }
}

const FLUSH_AT: usize = 256 * 1024;

/// The response body of a watch; events are produced by a task that ends when the client goes,
/// the timeout passes, or the server closes the watch (fault injection, shutdown).
pub(crate) fn stream(rt: &'static ResourceType, start: WatchStart, opts: WatchOptions) -> Body {
    let (out, out_rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(run(rt, start, opts, out));
    Body::from_stream(ReceiverStream::new(out_rx).map(Ok::<_, Infallible>))
}

async fn run(
    rt: &'static ResourceType,
    start: WatchStart,
    opts: WatchOptions,
    out: mpsc::Sender<Bytes>,
) {
    let WatchStart {
        rv,
        initial,
        backlog,
        mut rx,
    } = start;
    let mut last_rv = rv;
    let mut buf = BytesMut::new();
    for obj in &initial {
        event_line(&mut buf, "ADDED", &opts.projection.render(obj));
        if buf.len() >= FLUSH_AT && out.send(buf.split().freeze()).await.is_err() {
            return;
        }
    }
    if opts.send_initial_events {
        event_line(
            &mut buf,
            "BOOKMARK",
            &bookmark(rt, opts.projection, rv, true),
        );
    }
    for change in &backlog {
        if let Some(kind) = visible(&opts.filter, change) {
            event_line(&mut buf, kind, &opts.projection.render(&change.object));
        }
        last_rv = last_rv.max(change.object.rv);
    }
    if !buf.is_empty() && out.send(buf.split().freeze()).await.is_err() {
        return;
    }
    drop((initial, backlog));

    let deadline = opts.timeout.map(|t| tokio::time::Instant::now() + t);
    let sleep_until = async move {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => futures::future::pending::<()>().await,
        }
    };
    tokio::pin!(sleep_until);
    let mut ticker = tokio::time::interval(opts.bookmark_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            change = rx.recv() => {
                let Some(change) = change else { break };
                last_rv = last_rv.max(change.object.rv);
                if let Some(kind) = visible(&opts.filter, &change) {
                    let mut b = BytesMut::new();
                    event_line(&mut b, kind, &opts.projection.render(&change.object));
                    drop(change);
                    if out.send(b.freeze()).await.is_err() {
                        break;
                    }
                }
            }
            () = &mut sleep_until => {
                if opts.bookmarks {
                    let mut b = BytesMut::new();
                    event_line(&mut b, "BOOKMARK", &bookmark(rt, opts.projection, last_rv, false));
                    let _ = out.send(b.freeze()).await;
                }
                break;
            }
            _ = ticker.tick(), if opts.bookmarks => {
                let mut b = BytesMut::new();
                event_line(&mut b, "BOOKMARK", &bookmark(rt, opts.projection, last_rv, false));
                if out.send(b.freeze()).await.is_err() {
                    break;
                }
            }
            () = out.closed() => break,
        }
    }
}
