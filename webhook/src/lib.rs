//! hami-webhook: the mutating admission webhook of hami-limits.
//!
//! Three folders, one per layer, each importing only the ones below it:
//!
//! - [`wire`]: the Kubernetes wire types (the Pod view, JSONPatch, AdmissionReview);
//! - [`policy`]: the pure core, every decision (`decide(request, settings, basis) -> Decision`),
//!   synchronous and free of I/O, and the typed settings it reads;
//! - [`shell`]: the command line and wiring, settings loading, the HTTPS server, TLS, metrics, the
//!   node watch, the offline commands.
//!
//! Modules form an acyclic graph and `policy`/`wire` import nothing from `shell` (the workspace's
//! `tests/tests/it/module_graph.rs` checks both).
#![forbid(unsafe_code)]

pub mod policy;
pub mod shell;
pub mod wire;

pub use policy::admission::Reviewed;
pub use policy::basis::VramBasis;
pub use policy::decide::{decide, decide_pod};
pub use policy::mutation::{Decision, Denial, Observation, Outcome, PodMutation};
pub use policy::settings::Settings;
pub use shell::error::WebhookError;
pub use wire::review::{AdmissionRequest, AdmissionReview, BodyError};

/// This crate's results; each room names its own error (`Result<T, SettingsLoadError>`), a
/// command's is [`WebhookError`]. The core (`policy`, `wire`) spells `std`'s: it imports nothing
/// from the shell, where [`WebhookError`] lives.
pub type Result<T, E = WebhookError> = std::result::Result<T, E>;

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
    policy::admission::review_with(body, |request| decide(request, settings, vram))
}
