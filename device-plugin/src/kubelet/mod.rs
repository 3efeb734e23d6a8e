//! The kubelet side: the device plugin API and the gRPC server kubelet calls.
//!
//! - [`api`]: the kubelet device plugin API `v1beta1` (generated; public for tests and tools);
//! - [`device_list`]: the `ListAndWatch` list of the device table;
//! - [`service`]: the `DevicePlugin` gRPC service and its extension points
//!   ([`service::AllocateHandler`], [`service::PendingPodDevices`]);
//! - [`plugin`]: socket, registration, kubelet restarts, shutdown (for any
//!   [`plugin::ServedPlugin`]: the GPU plugin here, `serve-preload`'s in
//!   [`crate::commands::serve_preload`]).

pub mod api;
pub mod device_list;
pub mod plugin;
pub mod service;
