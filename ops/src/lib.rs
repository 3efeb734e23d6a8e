//! The operations layer of both servers (`hami-webhook`, `hami-device-plugin`): what an operator
//! and kubelet expect of any long-running program, written once.
//!
//! - [`Readiness`]: named conditions (and live probes); `/readyz` is 200 when all hold.
//! - [`router`]: `GET /healthz`, `GET /readyz`, `GET /metrics` on a plain-HTTP port.
//! - [`LogFormat`] and [`log_subscriber`]: structured logs to stderr, text or JSON with the fields
//!   at the top level, level from `RUST_LOG` (default `info`).
//! - [`shutdown_signal`]: SIGTERM/SIGINT handlers installed **at once** (a signal during start-up
//!   must not kill the process with its socket left behind), and a future for the first of them.
//! - [`Backoff`]: the doubling retry delay both programs use (the webhook's node-watch client, the
//!   device plugin's kubelet registration).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::routing::get;
use prometheus_client::registry::Registry;

pub mod process;

/// A retry delay that doubles after each failure, from `min` up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    next: std::time::Duration,
    max: std::time::Duration,
}

impl Backoff {
    /// Starts at `min` (never above `max`).
    #[must_use]
    pub fn new(min: std::time::Duration, max: std::time::Duration) -> Self {
        Self {
            next: min.min(max),
            max,
        }
    }

    /// The delay to wait now.
    #[must_use]
    pub fn delay(&self) -> std::time::Duration {
        self.next
    }

    /// After a failed retry: the next delay doubles, capped at `max`.
    pub fn fail(&mut self) {
        self.next = self.next.saturating_mul(2).min(self.max);
    }
}

type Probe = Arc<dyn Fn() -> bool + Send + Sync>;

/// Named readiness conditions; `/readyz` is 200 when every condition and every probe holds.
#[derive(Clone)]
pub struct Readiness {
    conditions: Arc<Vec<(&'static str, AtomicBool)>>,
    probes: Arc<Vec<(&'static str, Probe)>>,
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readiness")
            .field("pending", &self.pending())
            .finish()
    }
}

impl Readiness {
    /// Conditions, all initially false.
    #[must_use]
    pub fn new(names: &[&'static str]) -> Self {
        Self {
            conditions: Arc::new(names.iter().map(|n| (*n, AtomicBool::new(false))).collect()),
            probes: Arc::new(Vec::new()),
        }
    }

    /// Add a live probe, evaluated on every `/readyz` (e.g. "the plugin socket exists").
    #[must_use]
    pub fn with_probe(
        mut self,
        name: &'static str,
        probe: impl Fn() -> bool + Send + Sync + 'static,
    ) -> Self {
        let mut probes: Vec<(&'static str, Probe)> = self.probes.iter().cloned().collect();
        probes.push((name, Arc::new(probe)));
        self.probes = Arc::new(probes);
        self
    }

    /// Mark `name` as holding or not. Unknown names are ignored.
    pub fn set(&self, name: &str, ready: bool) {
        if let Some((_, flag)) = self.conditions.iter().find(|(n, _)| *n == name) {
            flag.store(ready, Ordering::Release);
        }
    }

    /// The names of the conditions and probes that do not hold; empty when ready.
    #[must_use]
    pub fn pending(&self) -> Vec<&'static str> {
        self.conditions
            .iter()
            .filter(|(_, f)| !f.load(Ordering::Acquire))
            .map(|(n, _)| *n)
            .chain(self.probes.iter().filter(|(_, p)| !p()).map(|(n, _)| *n))
            .collect()
    }

    /// Whether everything holds.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.pending().is_empty()
    }
}

/// Renders the metrics exposition in the format asked for (see [`encode`]).
pub type MetricsRenderer = Arc<dyn Fn(Exposition) -> String + Send + Sync>;

/// The two text formats `/metrics` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposition {
    /// OpenMetrics 1.0 text (counters' families without `_total`, `# EOF` at the end): when the
    /// scraper's `Accept` names `application/openmetrics-text`.
    OpenMetrics,
    /// The Prometheus text format 0.0.4 (what `curl` and older scrapers get).
    Prometheus,
}

/// A program's metrics: its registry, exposed in either text format with the `process_*` metrics
/// (the webhook's and the device plugin's `Metrics` implement it; one definition of both
/// expositions).
pub trait Exposed {
    /// The registry the program's metrics are registered in.
    fn registry(&self) -> &Registry;

    /// The exposition in `format`, followed by the `process_*` metrics.
    #[must_use]
    fn encode_as(&self, format: Exposition) -> String {
        encode(self.registry(), format)
    }

    /// The OpenMetrics text exposition (with the `process_*` metrics); the servers answer
    /// through [`Self::encode_as`], the tests read this.
    #[must_use]
    fn encode(&self) -> String {
        self.encode_as(Exposition::OpenMetrics)
    }
}

/// A program's registry in `format`, followed by the standard `process_*` metrics
/// ([`process::ProcessCollector`], unprefixed, as every Prometheus client library names them).
#[must_use]
pub fn encode(registry: &Registry, format: Exposition) -> String {
    encode_all(&[registry], format)
}

/// [`encode`] of several registries (a program's own and, e.g., one of collectors with another
/// prefix), in order, followed by the `process_*` metrics.
#[must_use]
pub fn encode_all(registries: &[&Registry], format: Exposition) -> String {
    // Unprefixed, and built once: the collector reads `/proc/self` at each encoding.
    static PROCESS: std::sync::LazyLock<Registry> = std::sync::LazyLock::new(|| {
        let mut process = Registry::default();
        process.register_collector(Box::new(process::ProcessCollector));
        process
    });
    let process = &*PROCESS;
    let mut out = String::with_capacity(8192);
    // Writing into a String cannot fail.
    match format {
        Exposition::OpenMetrics => {
            for registry in registries {
                let _ = prometheus_client::encoding::text::encode_registry(&mut out, registry);
            }
            let _ = prometheus_client::encoding::text::encode_registry(&mut out, process);
            let _ = prometheus_client::encoding::text::encode_eof(&mut out);
        }
        Exposition::Prometheus => {
            for registry in registries {
                let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, registry);
            }
            let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, process);
        }
    }
    out
}

/// Registers `build_info{version, program}` = 1 in `registry` (with the registry's prefix:
/// `hami_webhook_build_info`), so that dashboards can tell which release runs where.
pub fn register_build_info(registry: &mut Registry, program: &'static str, version: &'static str) {
    registry.register(
        "build",
        "The program's name and version (always 1)",
        prometheus_client::metrics::info::Info::new([("program", program), ("version", version)]),
    );
}

/// The OpenMetrics content type.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The Prometheus text content type.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `/healthz` (always `ok`: the process serves), `/readyz` (200 or 503 naming what is pending),
/// `/metrics` (OpenMetrics when the scraper asks for it in `Accept`, else the Prometheus text
/// content type: the body is valid in both).
pub fn router(metrics: MetricsRenderer, readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let readiness = readiness.clone();
                async move {
                    let pending = readiness.pending();
                    if pending.is_empty() {
                        (StatusCode::OK, "ready\n".to_owned())
                    } else {
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("not ready: waiting for {}\n", pending.join(", ")),
                        )
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move |headers: HeaderMap| {
                let metrics = Arc::clone(&metrics);
                async move {
                    let openmetrics = headers
                        .get(header::ACCEPT)
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|v| v.contains("application/openmetrics-text"));
                    let content_type = if openmetrics {
                        OPENMETRICS
                    } else {
                        PROMETHEUS_TEXT
                    };
                    let format = if openmetrics {
                        Exposition::OpenMetrics
                    } else {
                        Exposition::Prometheus
                    };
                    (
                        [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
                        metrics(format),
                    )
                }
            }),
        )
}

/// Serve `router` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Log output format: the `--log-format` flag (clap) and the settings files' `logFormat` (serde)
/// of every hami-limits program, spelled `text` and `json` in both.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, event fields at the top level (as log pipelines expect).
    Json,
}

/// `HAMI_LOG_FORMAT`: the [`LogFormat`] variable every hami-limits program reads (declared here,
/// beside the type, because `hami-certgen` depends on this crate and not on `hami-shared`).
pub const ENV_LOG_FORMAT: &str = "HAMI_LOG_FORMAT";

/// The log subscriber for `format`: level from `RUST_LOG` (default `info`), written to `writer`
/// (the binaries pass stderr), ANSI colours only when `ansi` and the format is text.
pub fn log_subscriber<W>(
    format: LogFormat,
    writer: W,
    ansi: bool,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Json => Box::new(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .finish(),
        ),
        LogFormat::Text => Box::new(builder.with_ansi(ansi).finish()),
    }
}

/// What the operations layer can fail at.
#[derive(Debug)]
#[non_exhaustive]
pub enum OpsError {
    /// A process-wide log subscriber is installed already.
    Logging(tracing::subscriber::SetGlobalDefaultError),
}

impl std::fmt::Display for OpsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Logging(e) => write!(f, "cannot install logging: {e}"),
        }
    }
}

impl std::error::Error for OpsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Logging(e) => Some(e),
        }
    }
}

/// This crate's results.
pub type Result<T, E = OpsError> = std::result::Result<T, E>;

/// Install the process-wide subscriber for `format` on stderr.
///
/// # Errors
/// [`OpsError::Logging`] when one is already installed.
pub fn init_logging(format: LogFormat) -> Result<()> {
    let stderr = std::io::stderr();
    let ansi = std::io::IsTerminal::is_terminal(&stderr);
    tracing::subscriber::set_global_default(log_subscriber(format, std::io::stderr, ansi))
        .map_err(OpsError::Logging)
}

/// Install the SIGTERM and SIGINT handlers now and return a future that completes on the first
/// of them. Call it first thing in the async runtime, before binding sockets or connecting to
/// anything. Needs a Tokio runtime with signals enabled.
pub fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static>
{
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "shutting down"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "shutting down"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    #[test]
    fn backoff_doubles_up_to_its_max() {
        use std::time::Duration;
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(3));
        let mut seen = Vec::new();
        for _ in 0..5 {
            seen.push(b.delay().as_millis());
            b.fail();
        }
        assert_eq!(seen, [500, 1000, 2000, 3000, 3000]);
        // A minimum above the maximum starts at the maximum.
        let b = Backoff::new(Duration::from_secs(9), Duration::from_secs(3));
        assert_eq!(b.delay(), Duration::from_secs(3));
    }

    async fn get(router: &Router, path: &str, accept: Option<&str>) -> (u16, String, String) {
        let mut req = Request::get(path);
        if let Some(a) = accept {
            req = req.header(header::ACCEPT, a);
        }
        let resp = router
            .clone()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let ct = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, ct, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn probes_and_metrics() {
        let socket = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&socket);
        let readiness = Readiness::new(&["certificate"])
            .with_probe("socket", move || s.load(Ordering::Acquire));
        let mut registry = Registry::with_prefix("hami_test");
        let requests = prometheus_client::metrics::counter::Counter::<u64>::default();
        registry.register("requests", "Requests", requests.clone());
        register_build_info(&mut registry, "hami-test", "1.2.3");
        requests.inc();
        let registry = Arc::new(registry);
        let router = router(
            Arc::new(move |format| encode(&registry, format)),
            readiness.clone(),
        );
        assert_eq!(get(&router, "/healthz", None).await.0, 200);
        let (code, _, body) = get(&router, "/readyz", None).await;
        assert_eq!(
            (code, body.as_str()),
            (503, "not ready: waiting for certificate, socket\n")
        );
        readiness.set("certificate", true);
        socket.store(true, Ordering::Release);
        assert_eq!(get(&router, "/readyz", None).await.0, 200);
        assert!(readiness.is_ready());
        // Prometheus text 0.0.4 by default: the counter's family is `_total`, no `# EOF`.
        let (_, ct, body) = get(&router, "/metrics", None).await;
        assert_eq!(ct, PROMETHEUS_TEXT);
        assert!(
            body.contains("# TYPE hami_test_requests_total counter\nhami_test_requests_total 1\n"),
            "{body}"
        );
        assert!(
            body.contains("hami_test_build_info{program=\"hami-test\",version=\"1.2.3\"} 1"),
            "{body}"
        );
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            assert!(
                body.contains(&format!("\n{name} ")),
                "{name} missing: {body}"
            );
        }
        assert!(!body.contains("# EOF"), "{body}");
        // OpenMetrics when asked: one `# EOF`, at the end, after the process metrics.
        let (_, ct, body) = get(
            &router,
            "/metrics",
            Some("application/openmetrics-text;version=1.0.0"),
        )
        .await;
        assert_eq!(ct, OPENMETRICS);
        assert!(
            body.contains("# TYPE hami_test_requests counter\nhami_test_requests_total 1\n"),
            "{body}"
        );
        assert!(body.contains("process_resident_memory_bytes "), "{body}");
        assert_eq!(body.matches("# EOF").count(), 1, "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");
    }
}
