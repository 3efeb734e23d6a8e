//! Which keys HAMi-core reads, which inherited variables the contract owns, and when a memory
//! value is a limit.

use crate::grammar::read_limit_bytes;
use crate::names::{
    ENV_CUDA_DEVICE_MEMORY_LIMIT, ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE, ENV_CUDA_DEVICE_SM_LIMIT,
    ENV_CUDA_OVERSUBSCRIBE, ENV_CUDA_TASK_PRIORITY, ENV_GPU_CORE_UTILIZATION_POLICY,
    ENV_LIBCUDA_LOG_LEVEL, ENV_LIBVGPU_HOSTPID_BROKER, MAX_DEVICE_INDEX,
};

/// Every variable HAMi-core reads that the contract names, by exact name. The per-device forms
/// `CUDA_DEVICE_MEMORY_LIMIT_<i>` and `CUDA_DEVICE_SM_LIMIT_<i>` are covered by
/// [`CONTRACT_VARIABLE_PREFIXES`].
pub const CONTRACT_VARIABLES: &[&str] = &[
    ENV_CUDA_DEVICE_MEMORY_LIMIT,
    ENV_CUDA_DEVICE_SM_LIMIT,
    ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE,
    ENV_CUDA_OVERSUBSCRIBE,
    ENV_GPU_CORE_UTILIZATION_POLICY,
    ENV_CUDA_TASK_PRIORITY,
    ENV_LIBCUDA_LOG_LEVEL,
    ENV_LIBVGPU_HOSTPID_BROKER,
];

/// Prefixes of the per-device contract variables (`CUDA_DEVICE_MEMORY_LIMIT_<anything>`,
/// `CUDA_DEVICE_SM_LIMIT_<anything>`). Inherited variables with these prefixes are all removed when
/// the file counts, whatever follows the prefix.
pub const CONTRACT_VARIABLE_PREFIXES: &[&str] =
    &["CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT_"];

/// True for a variable of the contract: removed from the environment when the file counts.
#[must_use]
pub fn is_contract_variable(name: &[u8]) -> bool {
    CONTRACT_VARIABLES.iter().any(|v| v.as_bytes() == name)
        || CONTRACT_VARIABLE_PREFIXES
            .iter()
            .any(|p| name.starts_with(p.as_bytes()))
}

/// `base` or `base_<i>`: `Some(Ok(None))` for `base`, `Some(Ok(Some(i)))` for an index HAMi-core
/// reads (0..=15, built with `"%s_%d"`, so no leading zero), `Some(Err(()))` for any other digits
/// (`_01`, `_16`), `None` when the key is not of that shape.
#[allow(clippy::result_unit_err)]
#[must_use]
pub fn indexed(key: &[u8], base: &str) -> Option<Result<Option<usize>, ()>> {
    if key == base.as_bytes() {
        return Some(Ok(None));
    }
    let idx = key.strip_prefix(base.as_bytes())?.strip_prefix(b"_")?;
    if idx.is_empty() || !idx.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if idx.len() > 1 && idx.first() == Some(&b'0') {
        return Some(Err(()));
    }
    let mut value: usize = 0;
    for d in idx {
        value = match value
            .checked_mul(10)
            .and_then(|v| v.checked_add(usize::from(d.wrapping_sub(b'0'))))
        {
            Some(v) => v,
            None => return Some(Err(())),
        };
    }
    if value <= MAX_DEVICE_INDEX {
        Some(Ok(Some(value)))
    } else {
        Some(Err(()))
    }
}

/// A key the preload library exports, and whether it is a memory limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exported {
    /// `CUDA_DEVICE_MEMORY_LIMIT` (`None`) or `CUDA_DEVICE_MEMORY_LIMIT_<i>`.
    Memory(Option<usize>),
    /// Any other exported key.
    Other,
}

/// `Some` for a file key the library may export: a contract variable under a name HAMi-core reads
/// (device indexes 0..=15 without leading zero).
#[must_use]
pub fn exported(key: &[u8]) -> Option<Exported> {
    if let Some(r) = indexed(key, ENV_CUDA_DEVICE_MEMORY_LIMIT) {
        return r.ok().map(Exported::Memory);
    }
    if let Some(r) = indexed(key, ENV_CUDA_DEVICE_SM_LIMIT) {
        return r.ok().map(|_| Exported::Other);
    }
    [
        ENV_GPU_CORE_UTILIZATION_POLICY,
        ENV_CUDA_TASK_PRIORITY,
        ENV_LIBCUDA_LOG_LEVEL,
        ENV_LIBVGPU_HOSTPID_BROKER,
        ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE,
        ENV_CUDA_OVERSUBSCRIBE,
    ]
    .iter()
    .any(|k| k.as_bytes() == key)
    .then_some(Exported::Other)
}

/// True when HAMi-core reads a memory value as a limit (a positive byte count): not `0`, not
/// garbage, not negative (wraps to ~2^64), not overflowing.
#[must_use]
pub fn memory_is_limit(value: &[u8]) -> bool {
    let lv = read_limit_bytes(value);
    lv.result != 0 && !lv.number.negative
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        assert_eq!(
            exported(b"CUDA_DEVICE_MEMORY_LIMIT"),
            Some(Exported::Memory(None))
        );
        assert_eq!(
            exported(b"CUDA_DEVICE_MEMORY_LIMIT_15"),
            Some(Exported::Memory(Some(15)))
        );
        for no in [
            &b"CUDA_DEVICE_MEMORY_LIMIT_16"[..],
            b"CUDA_DEVICE_MEMORY_LIMIT_01",
            b"CUDA_DEVICE_SM_LIMIT_99999999999999999999999",
            b"HAMI_LIMITS_FORMAT",
            b"HAMI_GPU_FRACTION",
            b"LD_PRELOAD",
        ] {
            assert_eq!(exported(no), None);
        }
        assert_eq!(exported(b"CUDA_OVERSUBSCRIBE"), Some(Exported::Other));
        assert!(is_contract_variable(b"CUDA_DEVICE_SM_LIMIT_x"));
        assert!(!is_contract_variable(b"CUDA_VISIBLE_DEVICES"));
        assert!(memory_is_limit(b"3000m"));
        for no in [&b"0"[..], b"", b"lots", b"-1m", b"99999999999999999999g"] {
            assert!(!memory_is_limit(no));
        }
    }
}
