//! KAI metrics (prefix `hami_webhook_kai_`): the basis in use, the node index and its watch, and
//! what admission decisions observed. The decisions never touch them: the server passes each
//! decision's observations to [`KaiMetrics::observe`].

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::policy::basis::SkipReason;
use crate::policy::mutation::{KaiLimit, Observation};
use crate::shell::vram::index::VramIndex;

/// KAI metrics: basis in use, nodes indexed, caps skipped by reason.
#[derive(Debug, Clone, Default)]
pub struct KaiMetrics {
    /// `hami_webhook_kai_vram_basis_bytes`: the basis for a pod without placement constraints
    /// (the override, or the smallest indexed GPU), in bytes (base units); 0 when there is none.
    /// Set it with [`KaiMetrics::set_basis_mib`].
    pub basis_bytes: Gauge,
    /// `hami_webhook_kai_vram_nodes_indexed`.
    pub nodes_indexed: Gauge,
    /// `hami_webhook_kai_vram_label_invalid`: nodes whose label is present but unusable.
    pub label_invalid: Gauge,
    /// `hami_webhook_kai_node_watch_synced`: 1 once the node list has been read.
    pub synced: Gauge,
    /// `hami_webhook_kai_node_watch_failing`: 1 from a failed list or watch (or no API client)
    /// until the watch reads again.
    pub failing: Gauge,
    /// `hami_webhook_kai_node_watch_errors_total`.
    pub watch_errors: Counter,
    /// `hami_webhook_kai_node_watch_relists_total`.
    pub relists: Counter,
    /// `hami_webhook_kai_fraction_caps_skipped_total{reason}`.
    pub caps_skipped: Family<[(&'static str, &'static str); 1], Counter>,
    /// `hami_webhook_kai_pods_total{limit}`: KAI pods mutated, by where the limit came from
    /// (`gpu-memory`, `gpu-fraction`, `none`).
    pub pods: Family<[(&'static str, &'static str); 1], Counter>,
}

impl KaiMetrics {
    /// Register every KAI metric in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        for r in SkipReason::ALL {
            let _ = self.caps_skipped.get_or_create(&[("reason", r.as_str())]);
        }
        for l in KaiLimit::ALL {
            let _ = self.pods.get_or_create(&[("limit", l.as_str())]);
        }
        registry.register(
            "kai_vram_basis_bytes",
            "Per-GPU VRAM basis in bytes for a gpu-fraction pod without placement constraints: kai.perGpuVramMib, or the smallest indexed GPU; 0 when none",
            self.basis_bytes.clone(),
        );
        registry.register(
            "kai_vram_nodes_indexed",
            "GPU nodes (GFD label selector) in the VRAM index",
            self.nodes_indexed.clone(),
        );
        registry.register(
            "kai_vram_label_invalid",
            "Indexed nodes whose nvidia.com/gpu.memory label is not a usable size (ignored)",
            self.label_invalid.clone(),
        );
        registry.register(
            "kai_node_watch_synced",
            "1 once the first node list has been read",
            self.synced.clone(),
        );
        registry.register(
            "kai_node_watch_failing",
            "1 while the node watch cannot list or watch nodes (readiness does not wait for it)",
            self.failing.clone(),
        );
        registry.register(
            "kai_node_watch_errors",
            "Node watch errors (the watch resumes or re-lists by itself)",
            self.watch_errors.clone(),
        );
        registry.register(
            "kai_node_watch_relists",
            "Complete node lists read (the first sync included)",
            self.relists.clone(),
        );
        registry.register(
            "kai_fraction_caps_skipped",
            "gpu-fraction pods admitted without CUDA_DEVICE_MEMORY_LIMIT, by reason",
            self.caps_skipped.clone(),
        );
        registry.register(
            "kai_pods",
            "KAI pods mutated, by the source of their memory limit",
            self.pods.clone(),
        );
    }

    /// Count one skipped cap.
    pub fn skipped(&self, reason: SkipReason) {
        self.caps_skipped
            .get_or_create(&[("reason", reason.as_str())])
            .inc();
    }

    /// Count one KAI pod by limit source.
    pub fn pod(&self, limit: KaiLimit) {
        self.pods.get_or_create(&[("limit", limit.as_str())]).inc();
    }

    /// Count what one admission decision observed.
    pub fn observe(&self, observations: &[Observation]) {
        for o in observations {
            match *o {
                Observation::KaiPod(limit) => self.pod(limit),
                Observation::KaiCapSkipped(reason) => self.skipped(reason),
            }
        }
    }

    /// Set the index gauges from `index`.
    pub fn index_changed(&self, index: &VramIndex) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.nodes_indexed.set(gauge(index.len()));
        self.label_invalid.set(gauge(index.invalid_labels()));
        self.set_basis_mib(index.min_mib().unwrap_or(0));
    }

    /// Sets the basis gauge from a size in MiB (saturating: a size beyond `i64` bytes is not a GPU).
    pub fn set_basis_mib(&self, mib: u64) {
        let bytes = mib.saturating_mul(1 << 20);
        self.basis_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
}
