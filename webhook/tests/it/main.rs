//! The webhook's integration tests, one binary (each test binary links the whole crate and its
//! dependencies): one module per subject, `support` for what the server tests share.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

mod cli;
mod decide_table;
mod hami_defaults;
mod hostile_clients;
mod kai_affinity_cost;
mod kai_fraction_reference;
mod kai_hook_delivery;
mod kai_node_watch;
mod kai_patch;
mod peers;
mod server_e2e;
mod support;
mod tenancy;
