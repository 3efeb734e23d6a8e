//! `hami-limits`' integration tests, one binary: one module per subject.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

mod cli;
mod node_gpus;
mod region;
