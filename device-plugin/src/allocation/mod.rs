//! `Allocate` for HAMi-core: find the pod the HAMi scheduler bound, decode its devices, plan the
//! container (envs, mounts, limits file), publish the limits file, update the pod; and collect
//! the files of pods that are gone.
//!
//! - [`codec`]: `hami.io/vgpu-devices-to-allocate`, decoded and encoded as HAMi does;
//! - [`pod_lookup`]: the pod being allocated (node lock, else the pending pod; the watch-fed
//!   view of this node's pods read first), for `Allocate` and `GetPreferredAllocation`;
//! - [`plan`]: the pure [`plan::AllocationPlan`];
//! - [`device_list`]: how the container learns its devices (device list and ID strategies,
//!   device specs, CDI, GDS/MOFED/GDRCopy, IMEX), pure, under HAMi's setting names;
//! - [`container_response`]: the mounts and device specs both of them build;
//! - [`executor`]: [`executor::Allocator`], the [`crate::kubelet::service::AllocateHandler`];
//! - [`hook`]: the hook folder (which file is HAMi-core; does a plan get every file its
//!   `ld.so.preload` names);
//! - [`collector`]: removal of dead pods' directories and limits files;
//! - [`config`]: the settings the plan needs, from the device and node config files;
//! - [`mig`]: `Allocate` for static MIG devices (no HAMi-core).

pub mod codec;
pub mod collector;
pub mod config;
pub mod container_response;
pub mod device_list;
pub mod entry_check;
pub mod executor;
pub mod hook;
pub mod mig;
pub mod plan;
pub mod pod_lookup;
pub mod spec_guard;
