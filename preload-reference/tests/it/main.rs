//! The preload reference's integration tests, one binary.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

mod preload_differential;
