//! hami-device-plugin: the kubelet device plugin of hami-limits, a drop-in for HAMi's NVIDIA
//! device plugin as seen by kubelet and by the HAMi scheduler.
//!
//! The folders show the split (shell at the top, the rest by the side it talks to):
//!
//! - [`kubelet`]: the device plugin API, the gRPC service kubelet calls, socket and registration;
//! - [`gpu`]: the GPUs (NVML or an inventory file), the advertised device table, MIG, health,
//!   topology scores;
//! - [`allocation`]: `Allocate` for HAMi-core and static MIG: the pure plan (`allocation/plan`)
//!   and the I/O around it (`allocation/shell`: the allocator, pod lookup, hook folder,
//!   collector);
//! - [`commands`]: the one-shot commands `install-hook` and `plan`;
//! - at the top, the shell of `run`: [`app`] (the composition root of `run` and `inventory`),
//!   [`cli`] (every flag of every command: the modules below take plain structs),
//!   [`settings`] (configuration, read once at start, one loader for every command),
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

/// The result of the program's top-level functions; modules below name their own error.
pub type Result<T, E = app::AppError> = std::result::Result<T, E>;
