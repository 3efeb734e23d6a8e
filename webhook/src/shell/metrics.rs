//! The server's Prometheus metrics (readiness and the ops routes are `hami_ops`'s).
//!
//! Labels are low-cardinality by construction: outcomes, HTTP codes and reload results are fixed
//! sets. Per-request counters are created once and kept, so a request costs a few atomic adds.

use std::time::Duration;

use hami_ops::Exposed;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::policy::mutation::Outcome;

type Label = [(&'static str, &'static str); 1];

/// Every metric of the webhook.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reviews: ReviewMetrics,
    connections: ConnectionMetrics,
    certificates: CertificateMetrics,
}

/// The reviews: answered by outcome, refused before review, latency, in flight.
#[derive(Debug)]
struct ReviewMetrics {
    allowed: Counter,
    patched: Counter,
    denied: Counter,
    invalid: Counter,
    http_errors: Family<Label, Counter>,
    latency: Histogram,
    in_flight: Gauge,
}

/// The admission connections: failed handshakes, open now, closed by the server.
#[derive(Debug)]
struct ConnectionMetrics {
    tls_handshake_failures: Counter,
    open: Gauge,
    closed: Family<Label, Counter>,
}

/// The serving certificate: loads by result, expiry of the one in use.
#[derive(Debug)]
struct CertificateMetrics {
    reload_success: Counter,
    reload_failure: Counter,
    expiry: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ReviewMetrics {
    fn register(registry: &mut Registry) -> Self {
        let requests = Family::<Label, Counter>::default();
        registry.register(
            "admission_requests",
            "Admission reviews answered, by outcome (allowed, patched, denied, invalid)",
            requests.clone(),
        );
        // Each guard returned by `get_or_create` must be dropped before the next call (a missing
        // entry takes the family's write lock), hence one statement per counter.
        let outcome = |o: Outcome| requests.get_or_create(&[("outcome", o.as_str())]).clone();
        let http_errors = Family::<Label, Counter>::default();
        registry.register(
            "http_errors",
            "Requests refused before review, by HTTP status (400, 408, 413, 415)",
            http_errors.clone(),
        );
        let latency = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        registry.register(
            "admission_duration_seconds",
            "Time from request start to response, for answered reviews",
            latency.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "admission_in_flight",
            "Reviews being processed now",
            in_flight.clone(),
        );
        let allowed = outcome(Outcome::Allowed);
        let patched = outcome(Outcome::Patched);
        let denied = outcome(Outcome::Denied);
        let invalid = outcome(Outcome::Invalid);
        Self {
            allowed,
            patched,
            denied,
            invalid,
            http_errors,
            latency,
            in_flight,
        }
    }

    fn counter(&self, outcome: Outcome) -> &Counter {
        match outcome {
            Outcome::Allowed => &self.allowed,
            Outcome::Patched => &self.patched,
            Outcome::Denied => &self.denied,
            Outcome::Invalid => &self.invalid,
        }
    }
}

impl ConnectionMetrics {
    fn register(registry: &mut Registry) -> Self {
        let tls_handshake_failures = Counter::default();
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes that failed or timed out",
            tls_handshake_failures.clone(),
        );
        let open = Gauge::default();
        registry.register(
            "connections_open",
            "Admission (HTTPS) connections open now",
            open.clone(),
        );
        let closed = Family::<Label, Counter>::default();
        registry.register(
            "connections_closed",
            "Admission connections closed by the server, by reason (idle: idle timeout; evicted: at maxConnections, the idlest; shutdown: idle or over the grace period at shutdown)",
            closed.clone(),
        );
        for reason in ["idle", "evicted", "shutdown"] {
            let _ = closed.get_or_create(&[("reason", reason)]);
        }
        Self {
            tls_handshake_failures,
            open,
            closed,
        }
    }
}

impl CertificateMetrics {
    fn register(registry: &mut Registry) -> Self {
        let reloads = Family::<Label, Counter>::default();
        registry.register(
            "certificate_reloads",
            "Certificate loads from files, by result (success, failure)",
            reloads.clone(),
        );
        let expiry = Gauge::default();
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate in use, Unix seconds",
            expiry.clone(),
        );
        let reload_success = reloads.get_or_create(&[("result", "success")]).clone();
        let reload_failure = reloads.get_or_create(&[("result", "failure")]).clone();
        Self {
            reload_success,
            reload_failure,
            expiry,
        }
    }
}

impl Metrics {
    /// Register every metric in a fresh registry (prefix `hami_webhook`).
    #[must_use]
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("hami_webhook");
        hami_ops::register_build_info(&mut registry, "hami-webhook", env!("CARGO_PKG_VERSION"));
        let reviews = ReviewMetrics::register(&mut registry);
        let connections = ConnectionMetrics::register(&mut registry);
        let certificates = CertificateMetrics::register(&mut registry);
        Self {
            registry,
            reviews,
            connections,
            certificates,
        }
    }

    /// The registry, for components that add their own metrics (KAI) before serving.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Count one answered review and its latency.
    pub fn observe_review(&self, outcome: Outcome, elapsed: Duration) {
        self.reviews.counter(outcome).inc();
        self.reviews.latency.observe(elapsed.as_secs_f64());
    }

    /// Count a request refused with HTTP `code` before any review.
    pub fn observe_http_error(&self, code: u16) {
        let label = match code {
            400 => "400",
            408 => "408",
            413 => "413",
            415 => "415",
            _ => "other",
        };
        self.reviews
            .http_errors
            .get_or_create(&[("code", label)])
            .inc();
    }

    /// The in-flight gauge.
    #[must_use]
    pub fn in_flight(&self) -> &Gauge {
        &self.reviews.in_flight
    }

    /// Count a failed or timed-out TLS handshake.
    pub fn observe_handshake_failure(&self) {
        self.connections.tls_handshake_failures.inc();
    }

    /// The open-connections gauge.
    #[must_use]
    pub fn connections_open(&self) -> &Gauge {
        &self.connections.open
    }

    /// Count a connection the server closed: `idle`, `evicted` or `shutdown`.
    pub fn observe_connection_closed(&self, reason: &'static str) {
        self.connections
            .closed
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// Count a certificate load; on success record the new expiry.
    pub fn observe_cert_reload(&self, ok: bool, not_after_unix: Option<i64>) {
        let c = &self.certificates;
        if ok {
            c.reload_success.inc();
            if let Some(t) = not_after_unix {
                c.expiry.set(t);
            }
        } else {
            c.reload_failure.inc();
        }
    }

    /// (successes, failures) of certificate loads so far (the certificate store's tests).
    #[cfg(test)]
    #[must_use]
    pub fn cert_reloads(&self) -> (u64, u64) {
        let c = &self.certificates;
        (c.reload_success.get(), c.reload_failure.get())
    }
}

impl Exposed for Metrics {
    fn registry(&self) -> &Registry {
        &self.registry
    }
}

/// The readiness condition the certificate store sets.
pub const READY_CERTIFICATE: &str = "certificate";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_outcomes_and_reloads() {
        let m = Metrics::new();
        m.observe_review(Outcome::Denied, Duration::from_micros(120));
        m.observe_cert_reload(true, Some(1_900_000_000));
        m.observe_http_error(413);
        let text = m.encode();
        assert!(text.contains("hami_webhook_admission_requests_total{outcome=\"denied\"} 1"));
        assert!(text.contains("hami_webhook_admission_requests_total{outcome=\"allowed\"} 0"));
        assert!(text.contains("hami_webhook_certificate_reloads_total{result=\"success\"} 1"));
        assert!(text.contains("hami_webhook_certificate_expiry_timestamp_seconds 1900000000"));
        assert!(text.contains("hami_webhook_http_errors_total{code=\"413\"} 1"));
        assert!(text.contains("hami_webhook_admission_duration_seconds_count 1"));
    }
}
