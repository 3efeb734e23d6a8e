//! The I/O around [`super::plan`]: what `Allocate` reads and writes, and the tasks beside it.
//!
//! - [`executor`]: [`executor::Allocator`], the [`crate::kubelet::service::AllocateHandler`]
//!   for HAMi-core containers (plan, disk, pod patch);
//! - [`pod_lookup`]: the pod being allocated (node lock, else the pending pod; the watch-fed
//!   view of this node's pods read first), for `Allocate` and `GetPreferredAllocation`;
//! - [`hook`]: the hook folder (which file is HAMi-core; does a plan get every file its
//!   `ld.so.preload` names);
//! - [`host_checks`]: the device list settings checked against this host (IMEX channels, CDI
//!   specs);
//! - [`collector`]: removal of dead pods' directories and limits files;
//! - [`mig`]: `Allocate` for static MIG devices (no HAMi-core).

pub mod collector;
pub mod executor;
pub mod hook;
pub mod host_checks;
pub mod mig;
pub mod pod_lookup;
