//! hami-webhook: the mutating admission webhook of hami-limits.
//!
//! - [`decide`]: the pure decision over one AdmissionRequest ([`decide::decide`]), built from
//!   modules: [`delivery`] (the `hami.io/limit-delivery` annotation) and [`hami`] (HAMi GPU pods).
//! - [`pod`]: the minimal borrowed Pod view decisions read; [`patch`]: JSONPatch building;
//!   [`review`]: AdmissionReview parsing and the response.
//! - [`server`]: axum on rustls, `/mutate`; [`tls`]: certificate loading and hot reload;
//!   [`metrics`]: Prometheus metrics, health and readiness; [`dev`]: throwaway certificates.
//! - [`settings`]: every setting with its default.
#![forbid(unsafe_code)]

pub mod cli;
pub mod decide;
pub mod delivery;
pub mod dev;
pub mod hami;
pub mod kai;
pub mod metrics;
pub mod patch;
pub mod placement;
pub mod pod;
pub mod review;
pub mod server;
pub mod settings;
pub mod tls;
pub mod vram;

pub use decide::{Decision, Denial, PodMutation, decide, decide_pod};
pub use review::{AdmissionRequest, AdmissionReview, BodyError, Outcome, Reviewed};
pub use settings::Settings;

/// Review one AdmissionReview body with `settings`: the function the server, `hami-webhook review`
/// and the benchmarks share.
///
/// # Errors
/// [`BodyError`] when the body is empty or not JSON.
pub fn review(body: &[u8], settings: &Settings) -> Result<Reviewed, BodyError> {
    review::review_with(body, |request| decide(request, settings))
}
