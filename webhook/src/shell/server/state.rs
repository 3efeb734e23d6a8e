//! What the `/mutate` handler shares between requests: the settings, the metrics, the VRAM basis
//! source, the review slots and the body budget.

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::policy::settings::Settings;
use crate::shell::metrics::Metrics;
use crate::shell::vram::metrics::KaiMetrics;
use crate::shell::vram::source::VramSource;

/// What the `/mutate` handler needs.
#[derive(Debug)]
pub struct AppState {
    pub settings: Arc<Settings>,
    pub metrics: Arc<Metrics>,
    /// Where the per-GPU VRAM basis comes from; read as a snapshot per review.
    pub vram: VramSource,
    /// Counts what the decisions observed.
    pub kai_metrics: KaiMetrics,
    /// Review slots ([`crate::policy::settings::ServerSettings::max_concurrent_requests`]).
    pub(super) limiter: Semaphore,
    /// Room for request bodies, in bytes past each body's first [`super::body::FREE_BODY_BYTES`].
    pub(super) body_budget: Semaphore,
}

impl AppState {
    /// State for `settings`, with its concurrency bound.
    #[must_use]
    pub fn new(
        settings: Arc<Settings>,
        metrics: Arc<Metrics>,
        vram: VramSource,
        kai_metrics: KaiMetrics,
    ) -> Arc<Self> {
        let permits = settings.server.max_concurrent_requests.max(1);
        // Bounded so that `acquire_many` (u32) can always take a whole body.
        let budget = settings
            .server
            .body_memory()
            .min(u32::MAX as usize)
            .min(Semaphore::MAX_PERMITS);
        Arc::new(Self {
            settings,
            metrics,
            vram,
            kai_metrics,
            limiter: Semaphore::new(permits),
            body_budget: Semaphore::new(budget),
        })
    }

    /// Review one body with the current VRAM basis.
    pub(super) fn review(&self, body: &[u8]) -> Result<crate::Reviewed, crate::BodyError> {
        // The basis snapshot (a read lock on a watched index) is held for the decision only.
        crate::policy::admission::review_with(body, |request| {
            self.vram
                .with_basis(|vram| crate::policy::decide::decide(request, &self.settings, vram))
        })
    }
}
