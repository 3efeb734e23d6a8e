//! Where an allocation spends its time, as `tracing` spans: each call runs in an `allocate` span
//! (fields `from_cache`, `retries`, `api_round_trips`, and `ok` recorded last, when the call ends) with one child span per phase
//! (`queued`, `locate`, `disk`, `publish`, `node_get`, `patch_pod`, `release_lock`). The spans are
//! at `debug` level: a log subscriber shows them (`RUST_LOG=hami_device_plugin=debug`, JSON logs
//! carry the current span), and [`TimingLog`] — a `tracing-subscriber` layer — turns them into one
//! [`AllocateTiming`] per call for tests and the benchmark.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The root span's name.
pub const ALLOCATE_SPAN: &str = "allocate";

/// Where one allocation spent its time (read from its spans by [`TimingLog`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AllocateTiming {
    /// Waiting for the node-wide allocation lock (and for another call's claim on the pod).
    pub queued: Duration,
    /// Reading the node lock (node GET, concurrent with the disk work).
    pub node_get: Duration,
    /// Finding the pod (the cache, else a pod GET or LIST; every attempt).
    pub locate: Duration,
    /// Directory creation and limits file publication (includes the fsyncs).
    pub disk: Duration,
    /// Of `disk`: `publish_atomic` (write, chmod, fsync file, rename, fsync directory).
    pub publish: Duration,
    /// Patching the pod's annotations.
    pub patch_pod: Duration,
    /// Releasing the node lock.
    pub release_lock: Duration,
    /// The whole call, queueing included.
    pub total: Duration,
    /// API round trips made.
    pub api_round_trips: u32,
    /// The pod selected was read from the watch-fed cache (not the API server).
    pub from_cache: bool,
    /// Selections redone because the pod read had changed.
    pub retries: u32,
    /// Whether the call succeeded.
    pub ok: bool,
}

impl AllocateTiming {
    fn phase(&mut self, name: &str) -> Option<&mut Duration> {
        Some(match name {
            "queued" => &mut self.queued,
            "node_get" => &mut self.node_get,
            "locate" => &mut self.locate,
            "disk" => &mut self.disk,
            "publish" => &mut self.publish,
            "patch_pod" => &mut self.patch_pod,
            "release_lock" => &mut self.release_lock,
            _ => return None,
        })
    }
}

impl Visit for AllocateTiming {
    fn record_bool(&mut self, field: &Field, value: bool) {
        match field.name() {
            "from_cache" => self.from_cache = value,
            "ok" => self.ok = value,
            _ => {}
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        let value = u32::try_from(value).unwrap_or(u32::MAX);
        match field.name() {
            "retries" => self.retries = value,
            "api_round_trips" => self.api_round_trips = value,
            _ => {}
        }
    }

    fn record_debug(&mut self, _field: &Field, _value: &dyn std::fmt::Debug) {}
}

/// Collects one [`AllocateTiming`] per `allocate` span (the benchmark and tests read them; the
/// plugin keeps none). A `tracing-subscriber` layer: see [`TimingLog::dispatch`].
#[derive(Debug, Default)]
pub struct TimingLog {
    entries: Mutex<Vec<AllocateTiming>>,
}

impl TimingLog {
    /// Appends one record.
    pub fn push(&self, timing: AllocateTiming) {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(timing);
    }

    /// Takes every record so far.
    pub fn take(&self) -> Vec<AllocateTiming> {
        std::mem::take(&mut *self.entries.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// A subscriber that records the allocation spans into `log` (and nothing else: the calls
    /// it is used for write no log lines).
    pub fn dispatch(log: Arc<TimingLog>) -> tracing::Dispatch {
        use tracing_subscriber::layer::SubscriberExt as _;
        tracing::Dispatch::new(tracing_subscriber::registry().with(TimingLayer(log)))
    }
}

/// The layer behind [`TimingLog::dispatch`].
#[derive(Debug, Clone)]
pub struct TimingLayer(pub Arc<TimingLog>);

/// When a span opened.
struct Opened(Instant);

impl<S> tracing_subscriber::Layer<S> for TimingLayer
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        extensions.insert(Opened(Instant::now()));
        if span.name() == ALLOCATE_SPAN {
            let mut timing = AllocateTiming::default();
            attrs.record(&mut timing);
            extensions.insert(timing);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        // `ok` is recorded last, when the call ends: the record is taken then, not when the span
        // closes (a client's background task may hold a child of it a little longer).
        let ends = span.name() == ALLOCATE_SPAN
            && span
                .metadata()
                .fields()
                .field("ok")
                .is_some_and(|ok| values.contains(&ok));
        let mut extensions = span.extensions_mut();
        let opened = extensions.get_mut::<Opened>().map(|o| o.0);
        if let Some(timing) = extensions.get_mut::<AllocateTiming>() {
            values.record(timing);
            if ends {
                timing.total = opened.map_or(Duration::ZERO, |o| o.elapsed());
                self.0.push(*timing);
            }
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(elapsed) = span.extensions().get::<Opened>().map(|o| o.0.elapsed()) else {
            return;
        };
        if span.name() == ALLOCATE_SPAN {
            // Taken when `ok` was recorded.
            return;
        }
        if let Some(root) = span.scope().skip(1).find(|s| s.name() == ALLOCATE_SPAN)
            && let Some(timing) = root.extensions_mut().get_mut::<AllocateTiming>()
            && let Some(phase) = timing.phase(span.name())
        {
            *phase += elapsed;
        }
    }
}
