//! Prometheus metrics of the plugin (served by `hami_ops::router` with `/healthz` and `/readyz`).
//!
//! Labels are low-cardinality by construction: outcomes, kinds, health, delivery mode and source
//! are fixed sets. Counters are created once, so an observation costs a few atomic adds. The
//! pure plan code knows nothing of this; the executor, collector, lifecycle and node handshake
//! report to a shared [`Metrics`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hami_ops::Exposed;
use hami_shared::values::{DeliverySource, LimitDelivery};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Label = [(&'static str, &'static str); 1];
type Label2 = [(&'static str, &'static str); 2];

/// How one `Allocate` call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocateOutcome {
    /// Answered with envs, mounts and (file mode) a published limits file.
    Success,
    /// The pod was found but the allocation failed (plan, disk or API error).
    Failed,
    /// No pod is being allocated on the node.
    NoPod,
    /// The API server could not be asked which pod it is.
    LookupError,
}

impl AllocateOutcome {
    /// The `outcome` label.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Failed => "failed",
            Self::NoPod => "no_pod",
            Self::LookupError => "lookup_error",
        }
    }
}

/// Why the plugin registers again with kubelet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReregisterReason {
    /// Our socket file disappeared.
    SocketGone,
    /// `kubelet.sock` was recreated (kubelet restarted).
    KubeletRestarted,
}

/// The `source` label of a delivery source.
#[must_use]
pub fn delivery_source_label(source: DeliverySource) -> &'static str {
    match source {
        DeliverySource::PodAnnotation => "annotation",
        DeliverySource::NodeConfig => "node",
        DeliverySource::GlobalConfig => "global",
        DeliverySource::Default => "default",
    }
}

/// Every metric of the device plugin (prefix `hami_device_plugin`).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    allocations: Family<Label, Counter>,
    allocate_latency: Histogram,
    limits_files_published: Counter,
    limits_file_publish_failures: Counter,
    collector_removed: Family<Label, Counter>,
    collector_errors: Family<Label, Counter>,
    collector_passes: Counter,
    registrations: Family<Label, Counter>,
    reregistrations: Family<Label, Counter>,
    devices: Family<Label, Gauge>,
    node_patches: Counter,
    node_patch_errors: Counter,
    delivery: Family<Label2, Counter>,
    pod_lookups: Family<Label, Counter>,
    stale_pod_retries: Counter,
    /// The region exporter's metrics (their own prefix), once it runs.
    regions: std::sync::OnceLock<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Register every metric in a fresh registry.
    #[must_use]
    pub fn new() -> Self {
        let mut metrics = Self {
            registry: Registry::with_prefix("hami_device_plugin"),
            allocations: Family::default(),
            allocate_latency: Histogram::new(exponential_buckets(0.000_5, 2.0, 16)),
            limits_files_published: Counter::default(),
            limits_file_publish_failures: Counter::default(),
            collector_removed: Family::default(),
            collector_errors: Family::default(),
            collector_passes: Counter::default(),
            registrations: Family::default(),
            reregistrations: Family::default(),
            devices: Family::default(),
            node_patches: Counter::default(),
            node_patch_errors: Counter::default(),
            delivery: Family::default(),
            pod_lookups: Family::default(),
            stale_pod_retries: Counter::default(),
            regions: std::sync::OnceLock::new(),
        };
        hami_ops::register_build_info(
            &mut metrics.registry,
            "hami-device-plugin",
            env!("CARGO_PKG_VERSION"),
        );
        // In this order: the exposition lists the metrics as they were registered.
        metrics.register_allocation();
        metrics.register_collector();
        metrics.register_kubelet();
        metrics.register_node_annotation();
        metrics.register_delivery_and_lookups();
        metrics.create_fixed_series();
        metrics
    }

    /// `Allocate` calls and the limits files they publish.
    fn register_allocation(&mut self) {
        let r = &mut self.registry;
        r.register(
            "allocations",
            "Allocate calls, by outcome (success, failed, no_pod, lookup_error)",
            self.allocations.clone(),
        );
        r.register(
            "allocate_duration_seconds",
            "Time to answer an Allocate call, any outcome",
            self.allocate_latency.clone(),
        );
        r.register(
            "limits_files_published",
            "Limits files published (file delivery)",
            self.limits_files_published.clone(),
        );
        r.register(
            "limits_file_publish_failures",
            "Allocations whose directory or limits file could not be written",
            self.limits_file_publish_failures.clone(),
        );
    }

    /// The collector of dead pods' entries.
    fn register_collector(&mut self) {
        let r = &mut self.registry;
        r.register(
            "collector_removed",
            "Dead pods' entries removed by the collector, by kind (directory, file)",
            self.collector_removed.clone(),
        );
        r.register(
            "collector_errors",
            "Collector errors, by kind (pass: pass skipped; remove: an entry not removed)",
            self.collector_errors.clone(),
        );
        r.register(
            "collector_passes",
            "Collector passes completed",
            self.collector_passes.clone(),
        );
    }

    /// Registration with kubelet and the devices advertised to it.
    fn register_kubelet(&mut self) {
        let r = &mut self.registry;
        r.register(
            "kubelet_registrations",
            "Registration attempts with kubelet, by result (success, failure)",
            self.registrations.clone(),
        );
        r.register(
            "kubelet_reregistrations",
            "Re-binds and re-registrations, by reason (socket_gone, kubelet_restarted)",
            self.reregistrations.clone(),
        );
        r.register(
            "devices",
            "Devices advertised to kubelet, by health (healthy, unhealthy)",
            self.devices.clone(),
        );
    }

    /// The node annotation the HAMi scheduler reads.
    fn register_node_annotation(&mut self) {
        let r = &mut self.registry;
        r.register(
            "node_annotation_patches",
            "Patches of the node annotation hami.io/node-nvidia-register",
            self.node_patches.clone(),
        );
        r.register(
            "node_annotation_patch_errors",
            "Failed checks or patches of the node annotation",
            self.node_patch_errors.clone(),
        );
    }

    /// How limits are delivered, and where `Allocate` read its pods.
    fn register_delivery_and_lookups(&mut self) {
        let r = &mut self.registry;
        r.register(
            "limit_delivery",
            "Containers allocated, by delivery mode (file, env) and where it came from (annotation, node, global, default)",
            self.delivery.clone(),
        );
        r.register(
            "allocate_pod_lookups",
            "Pods selected by Allocate, by where they were read (cache: the watch-fed view of the node's pods; api: a GET or LIST)",
            self.pod_lookups.clone(),
        );
        r.register(
            "allocate_stale_pod_retries",
            "Allocate selections refused by the API server because the pod had changed (409) or was gone, then retried from the API server",
            self.stale_pod_retries.clone(),
        );
    }

    /// Create the fixed series up front so that they read 0 before the first event. One
    /// statement each: a guard from `get_or_create` must be dropped before the next call.
    fn create_fixed_series(&self) {
        for o in [
            AllocateOutcome::Success,
            AllocateOutcome::Failed,
            AllocateOutcome::NoPod,
            AllocateOutcome::LookupError,
        ] {
            drop(self.allocations.get_or_create(&[("outcome", o.as_str())]));
        }
        for source in ["cache", "api"] {
            drop(self.pod_lookups.get_or_create(&[("source", source)]));
        }
        for k in ["directory", "file"] {
            drop(self.collector_removed.get_or_create(&[("kind", k)]));
        }
        for k in ["pass", "remove"] {
            drop(self.collector_errors.get_or_create(&[("kind", k)]));
        }
        for r in ["success", "failure"] {
            drop(self.registrations.get_or_create(&[("result", r)]));
        }
        for h in ["healthy", "unhealthy"] {
            drop(self.devices.get_or_create(&[("health", h)]));
        }
    }

    /// Count one pod selected by Allocate, read from the cache or the API server.
    pub fn observe_pod_lookup(&self, from_cache: bool) {
        let source = if from_cache { "cache" } else { "api" };
        self.pod_lookups.get_or_create(&[("source", source)]).inc();
    }

    /// Count one selection retried because the pod read was stale.
    pub fn observe_stale_pod_retry(&self) {
        self.stale_pod_retries.inc();
    }

    /// Pods selected so far from the cache (`true`) or the API server.
    #[must_use]
    pub fn pod_lookups(&self, from_cache: bool) -> u64 {
        let source = if from_cache { "cache" } else { "api" };
        self.pod_lookups.get_or_create(&[("source", source)]).get()
    }

    /// Selections retried so far because the pod read was stale.
    #[must_use]
    pub fn stale_pod_retries(&self) -> u64 {
        self.stale_pod_retries.get()
    }

    /// Count one `Allocate` call and its latency.
    pub fn observe_allocate(&self, outcome: AllocateOutcome, elapsed: Duration) {
        self.allocations
            .get_or_create(&[("outcome", outcome.as_str())])
            .inc();
        self.allocate_latency.observe(elapsed.as_secs_f64());
    }

    /// Allocate calls that ended with `outcome` so far.
    #[must_use]
    pub fn allocations(&self, outcome: AllocateOutcome) -> u64 {
        self.allocations
            .get_or_create(&[("outcome", outcome.as_str())])
            .get()
    }

    /// Count `n` published limits files.
    pub fn observe_published(&self, n: u64) {
        self.limits_files_published.inc_by(n);
    }

    /// Count an allocation whose files could not be written.
    pub fn observe_publish_failure(&self) {
        self.limits_file_publish_failures.inc();
    }

    /// Count one container's delivery mode and its source.
    pub fn observe_delivery(&self, mode: LimitDelivery, source: DeliverySource) {
        self.delivery
            .get_or_create(&[
                ("mode", mode.as_str()),
                ("source", delivery_source_label(source)),
            ])
            .inc();
    }

    /// Count one completed collector pass.
    pub fn observe_collector_pass(&self, directories: u64, files: u64, errors: u64) {
        self.collector_passes.inc();
        self.collector_removed
            .get_or_create(&[("kind", "directory")])
            .inc_by(directories);
        self.collector_removed
            .get_or_create(&[("kind", "file")])
            .inc_by(files);
        self.collector_errors
            .get_or_create(&[("kind", "remove")])
            .inc_by(errors);
    }

    /// Count a skipped collector pass.
    pub fn observe_collector_failure(&self) {
        self.collector_errors
            .get_or_create(&[("kind", "pass")])
            .inc();
    }

    /// Count a registration attempt.
    pub fn observe_registration(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.registrations
            .get_or_create(&[("result", result)])
            .inc();
    }

    /// Count a re-bind and re-registration.
    pub fn observe_reregistration(&self, reason: ReregisterReason) {
        let reason = match reason {
            ReregisterReason::SocketGone => "socket_gone",
            ReregisterReason::KubeletRestarted => "kubelet_restarted",
        };
        self.reregistrations
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// Set the advertised device counts.
    pub fn set_devices(&self, healthy: usize, unhealthy: usize) {
        let as_i64 = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.devices
            .get_or_create(&[("health", "healthy")])
            .set(as_i64(healthy));
        self.devices
            .get_or_create(&[("health", "unhealthy")])
            .set(as_i64(unhealthy));
    }

    /// Count a node annotation check: `Ok(true)` patched, `Ok(false)` unchanged, `Err` failed.
    pub fn observe_node_patch(&self, result: Result<bool, ()>) {
        match result {
            Ok(true) => self.node_patches.inc(),
            Ok(false) => 0,
            Err(()) => self.node_patch_errors.inc(),
        };
    }
}

impl Metrics {
    /// Exposes `registry` (the region exporter's, prefix `hami_limits_region`) after the
    /// plugin's own metrics; the first one set stays.
    pub fn set_regions(&self, registry: Registry) {
        let _ = self.regions.set(registry);
    }
}

impl Exposed for Metrics {
    fn registry(&self) -> &Registry {
        &self.registry
    }

    fn encode_as(&self, format: hami_ops::Exposition) -> String {
        match self.regions.get() {
            Some(regions) => hami_ops::encode_all(&[&self.registry, regions], format),
            None => hami_ops::encode(&self.registry, format),
        }
    }
}

/// Where `--metrics-listen` says to serve: `None` for an empty value or `off`.
///
/// # Errors
/// A value that is neither empty, `off`, nor `HOST:PORT`.
pub fn parse_listen(value: &str) -> Result<Option<SocketAddr>, ListenError> {
    let v = value.trim();
    if v.is_empty() || v.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    v.parse().map(Some).map_err(|source| ListenError::Address {
        value: value.to_owned(),
        source,
    })
}

/// Binds `addr` for the ops server.
///
/// # Errors
/// The address cannot be bound (in use, not local, not permitted).
pub async fn bind_listen(addr: SocketAddr) -> Result<tokio::net::TcpListener, ListenError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ListenError::Bind { addr, source })
}

/// Why `--metrics-listen` cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Not an address.
    #[error("--metrics-listen={value}: not HOST:PORT, empty or off ({source})")]
    Address {
        /// The value given.
        value: String,
        /// Why it is not an address.
        source: std::net::AddrParseError,
    },
    /// The address cannot be bound.
    #[error("cannot listen on {addr} (--metrics-listen): {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The metrics renderer for [`hami_ops::router`].
pub fn renderer(metrics: Arc<Metrics>) -> hami_ops::MetricsRenderer {
    Arc::new(move |format| metrics.encode_as(format))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_every_family() {
        let m = Metrics::new();
        m.observe_allocate(AllocateOutcome::Success, Duration::from_millis(3));
        m.observe_allocate(AllocateOutcome::NoPod, Duration::from_millis(1));
        m.observe_published(2);
        m.observe_delivery(LimitDelivery::Env, DeliverySource::PodAnnotation);
        m.observe_collector_pass(1, 2, 0);
        m.observe_collector_failure();
        m.observe_registration(true);
        m.observe_reregistration(ReregisterReason::KubeletRestarted);
        m.set_devices(20, 10);
        m.observe_node_patch(Ok(true));
        m.observe_node_patch(Err(()));
        let text = m.encode();
        for line in [
            "hami_device_plugin_allocations_total{outcome=\"success\"} 1",
            "hami_device_plugin_allocations_total{outcome=\"no_pod\"} 1",
            "hami_device_plugin_allocations_total{outcome=\"failed\"} 0",
            "hami_device_plugin_allocate_duration_seconds_count 2",
            "hami_device_plugin_limits_files_published_total 2",
            "hami_device_plugin_limits_file_publish_failures_total 0",
            "hami_device_plugin_limit_delivery_total{mode=\"env\",source=\"annotation\"} 1",
            "hami_device_plugin_collector_removed_total{kind=\"directory\"} 1",
            "hami_device_plugin_collector_removed_total{kind=\"file\"} 2",
            "hami_device_plugin_collector_errors_total{kind=\"pass\"} 1",
            "hami_device_plugin_collector_passes_total 1",
            "hami_device_plugin_kubelet_registrations_total{result=\"success\"} 1",
            "hami_device_plugin_kubelet_reregistrations_total{reason=\"kubelet_restarted\"} 1",
            "hami_device_plugin_devices{health=\"healthy\"} 20",
            "hami_device_plugin_devices{health=\"unhealthy\"} 10",
            "hami_device_plugin_node_annotation_patches_total 1",
            "hami_device_plugin_node_annotation_patch_errors_total 1",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn listen_values() {
        assert_eq!(parse_listen("").unwrap(), None);
        assert_eq!(parse_listen("OFF").unwrap(), None);
        assert_eq!(
            parse_listen("0.0.0.0:9394").unwrap(),
            Some(SocketAddr::from(([0, 0, 0, 0], 9394)))
        );
        assert!(parse_listen("nope").is_err());
    }
}
