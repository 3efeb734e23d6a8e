//! hami-device-plugin: the kubelet device plugin of hami-limits, a drop-in for HAMi's NVIDIA
//! device plugin as seen by kubelet and by the HAMi scheduler.
//!
//! - [`api`]: the kubelet device plugin API `v1beta1` (generated; public for tests and tools);
//! - [`inventory`] / [`nvml`]: what GPUs the node has ([`inventory::GpuInventory`]);
//! - [`devices`]: the device list advertised to kubelet;
//! - [`service`]: the `DevicePlugin` gRPC service and its extension points
//!   ([`service::AllocateHandler`], [`service::PendingPodDevices`]);
//! - [`plugin`]: socket, registration, kubelet restarts, shutdown;
//! - [`node_register`]: the `hami.io/node-nvidia-register` handshake with the HAMi scheduler;
//! - [`settings`]: configuration, read once at start; [`cli`]: the command line (parsing only);
//! - [`app`]: the composition root of `run` and `inventory`;
//! - [`metrics`]: Prometheus metrics (served with `/healthz` and `/readyz` by `hami_ops`);
//! - [`allocation`]: `Allocate` for HAMi-core (pod locator, device codec, plan, limits file,
//!   collector of dead pods' files, the `plan` dry run);
//! - [`install_hook`]: `install-hook`, HAMi-core and the preload library into the hook path;
//! - [`topology`]: `hami.io/node-nvidia-score`, the GPU-pair scores of `ENABLE_TOPOLOGY_SCORE`.

pub mod allocation;
pub mod api;
pub mod app;
pub mod cli;
pub mod devices;
pub mod health;
pub mod install_hook;
pub mod inventory;
pub mod metrics;
pub mod mig;
pub mod node_register;
pub mod nvml;
pub mod plugin;
pub mod service;
pub mod settings;
pub mod topology;
