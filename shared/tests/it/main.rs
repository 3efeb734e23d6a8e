//! The contract's integration tests, one binary: one module per subject.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

mod hami_core;
mod limits_file;
