//! The pure core: every admission decision, synchronous and free of I/O (no file, no environment,
//! no socket, no lock, no counter). Nothing here imports [`crate::shell`]; it reads the Kubernetes
//! objects through [`crate::wire`] (the module-graph tests check both).
//!
//! - [`decide`]: one AdmissionRequest decided, running the policies [`delivery`] (the
//!   `hami.io/limit-delivery` annotation), [`hami`] (HAMi GPU pods) and [`kai`] (KAI fractional
//!   pods), or [`update`] for an UPDATE (the webhook-owned annotations are frozen);
//! - [`tenancy`]: what a tenant's pod may not do (the HAMi scheduler's annotations, HAMi-core's
//!   variables) and the operator's escape hatches;
//! - [`mutation`]: what a decision is made of, below the policies; [`basis`]: the per-GPU VRAM
//!   basis as a decision asks for it; [`placement`]: the nodes a pod can land on;
//! - [`admission`]: one review end to end (the body read, decided, answered);
//! - [`settings`]: every setting, as plain typed data (loaded by `crate::shell::settings_load`).

pub mod admission;
pub mod basis;
pub mod decide;
pub mod delivery;
pub mod hami;
pub mod kai;
pub mod mutation;
pub mod placement;
pub mod settings;
pub mod tenancy;
pub mod update;
