//! The preload library's decision, without `std` and without allocation, so that
//! `libhami_preload.so` can be built from `core` and raw libc calls alone (small, cheap to load).
//!
//! - [`names`]: every name the library reads (re-exported by `hami_shared::names`).
//! - [`grammar`]: HAMi-core's value grammar (`strtoul`, the suffix), re-exported by
//!   `hami_shared::hami_core`.
//! - [`fraction`]: exact `floor(fraction × MiB)`, used by the webhook too.
//! - [`lines`], [`keys`]: the `KEY=VALUE` line grammar and which keys are exported.
//! - [`decide`]: the decision: the limits file, then the per-node cap of a `gpu-fraction` container.
//!
//! `hami_preload_reference` holds the reference decision, written with `std` over the contract's
//! own parser; the `preload_differential` fuzz target feeds both the same bytes and compares the
//! environments they produce.
#![no_std]
#![forbid(unsafe_code)]

/// This crate's results: a decision, or why the environment stays as it was
/// ([`decide::Untouched`]); the per-node step names its own reason ([`decide::Kept`]).
pub type Result<T, E = decide::Untouched> = core::result::Result<T, E>;

pub mod decide;
pub mod fraction;
pub mod grammar;
pub mod keys;
pub mod lines;
pub mod names;
