//! What the contract says about the preload library (`libhami_preload.so`): the variables it owns,
//! the keys of `/overrideEnv` it exports, the bounds of its reads, and the variables a pod may not
//! set in a GPU container.
//!
//! The library itself decides with `hami_preload_core::decide` (no `std`, no allocation); the
//! reference decision it is tested against, written with `std` over this crate's parsers, is the
//! dev-only crate `hami-preload-reference`.

use crate::hami_core::{KeyKind, key_kind};
use crate::names::ENV_CUDA_OVERSUBSCRIBE;

pub use hami_preload_core::keys::{
    CONTRACT_VARIABLE_PREFIXES, CONTRACT_VARIABLES, is_contract_variable,
};
pub use hami_preload_core::names::{
    ENV_PRELOAD_DEBUG, NODE_GPUS_READ_LIMIT_BYTES, READ_LIMIT_BYTES,
};

/// True for a file key the library may export: a contract variable under a name HAMi-core reads
/// (device indexes 0..=15 without leading zero).
pub fn is_exported_key(key: &str) -> bool {
    match key_kind(key) {
        KeyKind::Memory(_)
        | KeyKind::Sm(_)
        | KeyKind::CorePolicy
        | KeyKind::TaskPriority
        | KeyKind::LogLevel
        | KeyKind::HostPidBroker
        | KeyKind::SharedCache => true,
        KeyKind::UnreadIndex => false,
        KeyKind::Other => key == ENV_CUDA_OVERSUBSCRIBE,
    }
}

/// Variables HAMi-core reads (or the device plugin acts on) besides the limits-file contract's:
/// `CUDA_DISABLE_CONTROL` (the device plugin's switch that leaves the preload list out),
/// `CUDA_REDIRECT` (swaps the library HAMi-core's hooks resolve through), `ACTIVE_OOM_KILLER`,
/// `RECORD_KERNEL_INTERVAL`.
pub const OTHER_SYSTEM_VARIABLES: [&str; 4] = [
    crate::names::ENV_CUDA_DISABLE_CONTROL,
    crate::names::ENV_CUDA_REDIRECT,
    crate::names::ENV_ACTIVE_OOM_KILLER,
    crate::names::ENV_RECORD_KERNEL_INTERVAL,
];

/// Whether a pod may not set `name` in a GPU container unless an operator allows it: every
/// contract variable ([`is_contract_variable`]) and
/// [`OTHER_SYSTEM_VARIABLES`]. The webhook refuses them at admission, the device plugin at
/// `Allocate` (both accept `CUDA_TASK_PRIORITY` and `GPU_CORE_UTILIZATION_POLICY` as the webhook
/// sets them).
#[must_use]
pub fn is_system_variable(name: &str) -> bool {
    is_contract_variable(name.as_bytes()) || OTHER_SYSTEM_VARIABLES.contains(&name)
}
