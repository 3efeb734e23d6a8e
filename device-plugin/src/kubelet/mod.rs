//! The kubelet side: the device plugin API and the gRPC server kubelet calls.
//!
//! - [`api`]: the kubelet device plugin API `v1beta1` (generated; public for tests and tools);
//! - [`device_list`]: the `ListAndWatch` list of the device table;
//! - [`service`]: the `DevicePlugin` gRPC service and its extension points
//!   ([`service::AllocateHandler`], [`service::PendingPodDevices`]);
//! - [`plugin`]: socket, registration, kubelet restarts, shutdown.

pub mod api;
pub mod device_list;
pub mod plugin;
pub mod service;
