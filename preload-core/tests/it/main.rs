//! The preload decision's integration tests, one binary.
#![allow(clippy::unwrap_used)]

mod fraction;
