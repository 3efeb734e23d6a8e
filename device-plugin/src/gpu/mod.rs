//! The GPU side: what GPUs the node has and what is advertised of them.
//!
//! - [`inventory`]: the GPU source ([`inventory::GpuInventory`]) and the inventory file;
//! - [`nvml`]: the NVML source (discovery, links, Xid events);
//! - [`devices`]: the device table advertised to kubelet (GPU shares or static MIG devices);
//! - [`mig`]: the MIG strategy and profile names;
//! - [`health`]: GPU health from Xid events (HAMi's `rm/health.go`);
//! - [`topology`]: `hami.io/node-nvidia-score`, the GPU-pair scores of `ENABLE_TOPOLOGY_SCORE`.

pub mod devices;
pub mod health;
pub mod inventory;
pub mod mig;
pub mod nvml;
pub mod topology;
