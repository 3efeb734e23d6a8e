//! The contract's integration tests, one binary: one module per subject; `library_env` is shared with
//! the `preload_differential` fuzz target.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

mod config;
mod hami_core;
mod library_env;
mod limits_file;
mod preload_differential;
mod publish;
