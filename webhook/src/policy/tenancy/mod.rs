//! What a tenant's pod spec may not do, and the operator's escape hatches for it
//! (`tenancy:` settings, per namespace or per identity):
//!
//! - [`scheduler_owned`]: the HAMi scheduler's annotations are removed on CREATE, and written
//!   on UPDATE only by `tenancy.schedulerAnnotationWriters`;
//! - [`hami_core_env`]: a GPU container may not set HAMi-core's variables
//!   (`tenancy.allowHamiCoreEnvNamespaces` lifts it);
//! - `hami.io/limit-delivery: env` is refused in `tenancy.forbidEnvDeliveryNamespaces`
//!   ([`crate::policy::delivery`]), and a KAI pod's own opt-out is honoured only in
//!   `tenancy.kaiOptOutNamespaces` ([`crate::policy::kai`]).
//!
//! [`settings`] holds the section.

pub mod hami_core_env;
pub mod scheduler_owned;
pub mod settings;

pub use settings::TenancySettings;
