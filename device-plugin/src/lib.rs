//! hami-device-plugin: the kubelet device plugin of hami-limits, a drop-in for HAMi's NVIDIA
//! device plugin as seen by kubelet and by the HAMi scheduler.
//!
//! The folders show the split (shell at the top, the rest by the side it talks to):
//!
//! - [`kubelet`]: the device plugin API, the gRPC service kubelet calls, socket and registration;
//! - [`gpu`]: the GPUs (NVML or an inventory file), the advertised device table, MIG, health,
//!   topology scores;
//! - [`allocation`]: `Allocate` for HAMi-core and static MIG (pure plan and device list; the
//!   allocator, pod lookup and collector around them);
//! - [`commands`]: the one-shot commands `install-hook` and `plan`;
//! - at the top, the shell of `run`: [`app`] (the composition root of `run` and `inventory`),
//!   [`cli`] (the command line, parsing only), [`settings`] (configuration, read once at start),
//!   [`node_register`] (the `hami.io/node-nvidia-register` handshake with the HAMi scheduler),
//!   [`metrics`] (Prometheus metrics, served with `/healthz` and `/readyz` by `hami_ops`).

pub mod allocation;
pub mod app;
pub mod cli;
pub mod commands;
pub mod gpu;
pub mod kubelet;
pub mod metrics;
pub mod node_register;
pub mod regions;
pub mod settings;
