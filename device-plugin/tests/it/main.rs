//! The device plugin's integration tests, one binary (each test binary links the whole crate and its
//! dependencies): one module per subject.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

mod allocate_cli;
mod allocate_guard;
mod allocate_plan;
mod allocate_strategies;
mod cli;
mod install_hook;
mod mig;
mod vgpu_monitor_layout;
