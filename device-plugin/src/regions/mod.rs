//! Is the cap in force on this node? Every GPU container's shared region (`usage.cache`), read
//! and judged against its limits file ([`hami_shared::region`]) and exported as Prometheus
//! metrics, with a Warning Event on the pod the first time a container turns `uncapped` or
//! `mismatch`.
//!
//! - [`observe`]: the pure part — folders read, owners and PID oracle in; samples and Events out.
//! - [`export`]: the scans (timer, and bounded on scrape) and the Prometheus collector.
//! - [`hami`]: the device plugin's folders, `<HOOK>/vgpu/containers/<pod-uid>_<container>`, owned
//!   as its pod cache says.
//! - [`slots`]: `serve-preload`'s per-slot folders for KAI containers, `<HOOK>/regions/preload-<n>`,
//!   owned as kubelet's pod-resources API says.
//!
//! Cardinality: per container and GPU it uses, one series of each of `cap_verdict`,
//! `stamped_limit_bytes`, `file_limit_bytes`, `used_bytes`, `processes`,
//! `stamped_sm_limit_percent` (one `cap_verdict` only for a container without a readable region),
//! plus four node series; the containers are the node's GPU containers, so a node exports at most
//! 6 × containers × GPUs + 4 series. Labels: `node`, `podnamespace`, `podname`, `ctrname` (HAMi's
//! vGPU monitor's names: a scrape's own `namespace`/`pod`/`container` would rename ours), `gpu`,
//! and `verdict` on `cap_verdict`. No label value comes from a file a tenant writes but the GPU
//! index (0 to 15).

pub mod events;
pub mod export;
pub mod hami;
pub mod observe;
pub mod podresources;
pub mod slot_id;
pub mod slots;

#[cfg(test)]
mod tests;

pub use export::{
    ExportSettings, Folder, FolderSource, LimitsAt, PidView, RegionExporter, ScanBound,
};
pub use observe::{CapEvent, ContainerSample, Owner, observe};
