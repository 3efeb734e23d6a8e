//! The per-GPU VRAM basis for `gpu-fraction` pods, from the cluster's nodes: the minimum
//! `nvidia.com/gpu.memory` over the GPU nodes a pod can be placed on.
//!
//! - [`index`]: the pure index (label parsing, node selection); implements
//!   [`crate::policy::basis::VramBasis`].
//! - [`live`]: the index shared between the watch and the server, read through snapshots.
//! - [`watch`]: the metadata-only node watch (kube) that keeps the live index current.
//! - [`metrics`]: the KAI metrics, fed by the live index and by the decisions' observations.
//! - [`source`]: the command-line flags, the NodeList file and the choice of basis.
//!
//! Children import each other, never this module, so the module graph stays acyclic.

pub mod index;
pub mod live;
pub mod metrics;
pub mod source;
pub mod watch;

pub use index::{IndexChange, NodeMeta, VramIndex, parse_gpu_memory_label};
pub use live::{LiveVramIndex, VramSnapshot};
pub use metrics::KaiMetrics;
pub use source::{VramArgs, VramSource};
pub use watch::{run_node_watch, watch_cluster};
