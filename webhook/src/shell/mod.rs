//! The shell around the pure core: everything that touches a process, a file, the environment, a
//! socket or the cluster.
//!
//! - [`app`]: the command line and the wiring (what `main` calls);
//! - [`settings_load`]: the settings from defaults, a file and `HAMI_*` variables;
//! - [`server`]: axum on rustls, `/mutate` (state, body budget, handler, accept loop, connections);
//! - [`tls`]: certificate loading and hot reload; [`metrics`]: the server's metrics;
//! - [`vram`]: the per-GPU VRAM basis from the cluster's nodes (index, watch, metrics, sources);
//! - [`offline_commands`]: `review` and `mutate`, as functions over bytes;
//! - [`pod_manifest`]: a Pod manifest (YAML or JSON) read as `review` reads `request.object`;
//! - [`dev_mode`]: `serve --dev`'s throwaway certificates and example review;
//! - [`error`]: [`error::WebhookError`], what a command reports when it cannot run.

pub mod app;
pub mod dev_mode;
pub mod error;
pub mod metrics;
pub mod offline_commands;
pub mod pod_manifest;
pub mod server;
pub mod settings_load;
pub mod tls;
pub mod vram;
