//! The project's own optional keys of a limits file (`HAMI_GPU_FRACTION`, `HAMI_NODE_GPUS`,
//! `HAMI_UNCAPPED`): the forms the webhook writes, and what `hami-limits check` says about others.
//!
//! HAMi-core reads none of them and older preload libraries ignore keys they do not know (a
//! format-1 reader keeps unknown keys and exports only the contract's variables), so they need no
//! new `HAMI_LIMITS_FORMAT`.

use hami_preload_core::fraction::{MAX_PLACES, parse_canonical};

use crate::names::{
    ENV_HAMI_GPU_FRACTION, ENV_HAMI_NODE_GPUS, ENV_HAMI_UNCAPPED, UNCAPPED_NO_MATCHING_NODE,
    UNCAPPED_NO_SOURCE, UNCAPPED_NOT_SYNCED,
};

/// The accepted form of a `HAMI_GPU_FRACTION` value, for messages (see
/// [`hami_preload_core::fraction::parse_canonical`]).
pub const GPU_FRACTION_FORM: &str = "0.<1..=64 digits, last not 0>";

/// What `hami-limits check` suggests for a container without a cap: the fixes of the webhook's
/// `kai.missingBasis: deny` message.
const UNCAPPED_FIX: &str = "label the GPU nodes it can land on with nvidia.com/gpu.memory=<MiB> (GPU Feature Discovery does), set kai.perGpuVramMib, or request gpu-memory=<MiB> instead of gpu-fraction";

/// True for a `HAMI_NODE_GPUS` value as the webhook writes it: a path the preload library opens
/// ([`hami_preload_core::decide::is_node_gpus_path`]: absolute, at most 4095 bytes) without white
/// space or control characters.
pub fn is_node_gpus_path(path: &str) -> bool {
    hami_preload_core::decide::is_node_gpus_path(path.as_bytes())
        && !path.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// True for a reason label: 1 to 63 characters of `a-z`, `0-9` and `-`, starting with a letter and
/// not ending with `-` (a Prometheus label value and a limits-file value alike).
fn is_reason_label(value: &str) -> bool {
    let b = value.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1] != b'-'
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// What is wrong with the value of one of the project's own keys (`HAMI_GPU_FRACTION`,
/// `HAMI_NODE_GPUS`, `HAMI_UNCAPPED`), measured against the form the webhook writes; `None` when
/// it is in that form, and for every other key. [`crate::limits_file::LimitsFile::insert`] refuses
/// such a value.
pub fn project_value_problem(key: &str, value: &str) -> Option<String> {
    match key {
        ENV_HAMI_GPU_FRACTION => parse_canonical(value.as_bytes()).is_none().then(|| {
            format!("not of the form {GPU_FRACTION_FORM} (e.g. 0.25; at most {MAX_PLACES} places)")
        }),
        ENV_HAMI_NODE_GPUS => (!is_node_gpus_path(value))
            .then(|| "not an absolute path without white space (at most 4095 bytes)".to_owned()),
        ENV_HAMI_UNCAPPED => (!is_reason_label(value)).then(|| {
            "not a reason label (a-z, 0-9 and '-', starting with a letter, at most 63 characters)"
                .to_owned()
        }),
        _ => None,
    }
}

/// Why the webhook admitted a `gpu-fraction` pod without a cap, for an [`ENV_HAMI_UNCAPPED`]
/// reason label; `None` for a label it never writes.
pub fn uncapped_reason(label: &str) -> Option<&'static str> {
    match label {
        UNCAPPED_NO_SOURCE => Some(
            "the webhook had no source of per-GPU VRAM: no kai.perGpuVramMib and no node watch or --nodes list",
        ),
        UNCAPPED_NOT_SYNCED => Some(
            "the webhook had not read the GPU node list yet (its node watch was starting or failing)",
        ),
        UNCAPPED_NO_MATCHING_NODE => Some(
            "no GPU node the pod can be placed on (nodeName, nodeSelector, required node affinity) carries a usable nvidia.com/gpu.memory label",
        ),
        _ => None,
    }
}

/// What `hami-limits check` says about one of the project's own keys: a value in another form
/// than the webhook writes, with what the preload library then does, and `HAMI_UNCAPPED` always
/// (the container runs without a GPU memory cap).
pub fn project_entry_warnings(key: &str, value: &str) -> Vec<String> {
    let problem = project_value_problem(key, value);
    match key {
        ENV_HAMI_GPU_FRACTION => problem
            .map(|p| {
                format!(
                    "{p}: the preload library ignores it, so the file's CUDA_DEVICE_MEMORY_LIMIT (the admission-time cap, from the smallest GPU the pod could land on) stands instead of the exact fraction of the GPU the container sees"
                )
            })
            .into_iter()
            .collect(),
        ENV_HAMI_NODE_GPUS => problem
            .map(|p| {
                format!(
                    "{p}: the preload library cannot read the node GPU file there, so the file's CUDA_DEVICE_MEMORY_LIMIT (the admission-time cap) stands"
                )
            })
            .into_iter()
            .collect(),
        ENV_HAMI_UNCAPPED => {
            let why = match (problem, uncapped_reason(value)) {
                (Some(p), _) => format!("reason {p}"),
                (None, Some(why)) => why.to_owned(),
                (None, None) => format!(
                    "reason {value:?} is not one the webhook writes ({UNCAPPED_NO_SOURCE}, {UNCAPPED_NOT_SYNCED}, {UNCAPPED_NO_MATCHING_NODE})"
                ),
            };
            vec![format!(
                "this container runs without a GPU memory cap: its KAI gpu-fraction pod was admitted uncapped because kai.missingBasis is warn and {why}; HAMi-core is loaded but limits no memory. To cap it: {UNCAPPED_FIX}, and recreate the pod (kai.missingBasis: deny, the default, refuses such pods instead)"
            )]
        }
        _ => Vec::new(),
    }
}
