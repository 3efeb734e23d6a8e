//! The kubelet side: the device plugin API and the gRPC server kubelet calls.
//!
//! - [`api`]: the kubelet device plugin API `v1beta1` (generated; public for tests and tools);
//! - [`device_list`]: the `ListAndWatch` list of the device table;
//! - [`service`]: the `DevicePlugin` gRPC service and its extension points
//!   ([`service::AllocateHandler`], [`service::PendingPodDevices`]);
//! - [`plugin`]: socket, registration, kubelet restarts, shutdown (for any [`plugin::ServedPlugin`]);
//! - [`preload`]: the `hami.io/preload` plugin, whose `Allocate` mounts the HAMi-core hook
//!   folder into KAI containers (served by `serve-preload`).

pub mod api;
pub mod device_list;
pub mod plugin;
pub mod preload;
pub mod service;
