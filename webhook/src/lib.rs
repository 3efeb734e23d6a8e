//! hami-webhook: the mutating admission webhook of hami-limits.
//!
//! Pure core:
//! - [`decide`]: the decision over one AdmissionRequest ([`decide::decide`]), running the
//!   policies [`delivery`] (the `hami.io/limit-delivery` annotation), [`hami`] (HAMi GPU pods)
//!   and [`kai`] (KAI fractional pods) over a [`mutation::PodMutation`]; [`update`] for UPDATE
//!   (the webhook-owned annotations may not change);
//! - [`mutation`]: the decision's types, below the policies; [`basis`]: the per-GPU VRAM basis
//!   as the decision reads it; [`placement`]: where a pod can land;
//! - [`pod`]: the minimal borrowed Pod view; [`mountpath`]: mount paths compared cleaned;
//!   [`patch`]: JSONPatch building; [`review`]:
//!   AdmissionReview parsing and the response; [`settings`]: every setting with its default.
//!
//! Shell:
//! - [`app`]: the command line and the wiring (what `main` calls);
//! - [`server`]: axum on rustls, `/mutate`; [`tls`]: certificate loading and hot reload;
//!   [`metrics`]: the server's metrics; [`vram`]: the node index, its watch and metrics;
//!   [`cli`]: the offline commands; [`dev`]: throwaway certificates.
//!
//! Modules form an acyclic graph (the workspace's `tests/tests/module_graph.rs` checks it).
#![forbid(unsafe_code)]

pub mod app;
pub mod basis;
pub mod cli;
pub mod conn;
pub mod decide;
pub mod delivery;
pub mod dev;
pub mod hami;
pub mod kai;
pub mod metrics;
pub mod mountpath;
pub mod mutation;
pub mod patch;
pub mod placement;
pub mod pod;
pub mod review;
pub mod server;
pub mod settings;
pub mod tls;
pub mod update;
pub mod vram;

pub use basis::VramBasis;
pub use decide::{decide, decide_pod};
pub use mutation::{Decision, Denial, Observation, Outcome, PodMutation};
pub use review::{AdmissionRequest, AdmissionReview, BodyError, Reviewed};
pub use settings::Settings;

/// Review one AdmissionReview body with `settings` and the per-GPU VRAM basis `vram`: the
/// function the server, `hami-webhook review` and the benchmarks share.
///
/// # Errors
/// [`BodyError`] when the body is empty or not JSON.
pub fn review(
    body: &[u8],
    settings: &Settings,
    vram: &dyn VramBasis,
) -> Result<Reviewed, BodyError> {
    review::review_with(body, |request| decide(request, settings, vram))
}
