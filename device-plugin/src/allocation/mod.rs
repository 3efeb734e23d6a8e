//! `Allocate` for HAMi-core: find the pod the HAMi scheduler bound, decode its devices, plan the
//! container (envs, mounts, limits file), publish the limits file, update the pod; and collect
//! the files of pods that are gone.
//!
//! The two folders are the two layers, as the webhook's `policy` and `shell` are:
//!
//! - [`plan`]: the pure decision. The pod's devices annotation ([`plan::codec`]), the container's
//!   device list ([`plan::device_list`]), the spec checks ([`plan::spec_guard`]), the entry check
//!   against the node's GPUs ([`plan::entry_check`]), what makes a pod the one being allocated
//!   ([`plan::pod`]) and the [`plan::AllocationPlan`] itself. No file, socket, clock or client:
//!   `tests/tests/it/module_graph.rs` keeps it so.
//! - [`shell`]: the I/O around it. The [`shell::executor::Allocator`] (the kubelet handler:
//!   disk, pod patch, Events), the pod lookup ([`shell::pod_lookup`]), the hook folder as read
//!   from disk ([`shell::hook`]), the host's IMEX channels and CDI specs
//!   ([`shell::host_checks`]), the collector of dead pods' files ([`shell::collector`]) and the
//!   static MIG handler ([`shell::mig`]).

pub mod plan;
pub mod shell;
