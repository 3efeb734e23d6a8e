//! The workspace-level integration tests, one binary (each test binary links the whole workspace):
//! one module per subject, `allocate_support` for the harness of the `Allocate` tests (the Allocate
//! benchmark includes it too). The real control plane and the real node have their own binaries
//! (`real_cluster`, `real_node`).
#![allow(
    clippy::expect_used,
    clippy::large_enum_variant,
    clippy::panic,
    clippy::print_stderr,
    clippy::unwrap_used
)]

mod allocate_concurrency;
mod allocate_e2e;
mod allocate_pod_cache;
mod allocate_refusals;
// Some of its fields only keep a task alive, and the benchmark uses what these tests do not.
#[allow(dead_code)]
mod allocate_support;
mod apiserver_crud;
mod apiserver_faults;
mod apiserver_resources;
mod apiserver_scale;
mod apiserver_selectors;
mod apiserver_watch;
mod chart;
mod chart_live;
mod device_plugin_kubelet;
mod device_plugin_metrics;
mod device_plugin_mig;
mod device_plugin_node;
mod docs_config_reference;
mod docs_links;
mod images_layout;
mod module_graph;
mod preload_plugin_kubelet;
mod preload_reach;
mod readme_commands;
