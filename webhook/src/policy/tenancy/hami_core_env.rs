//! HAMi-core's variables belong to the system: in a GPU container (a HAMi GPU container, or a
//! container a KAI pod's HAMi-core is preloaded into) the pod may not set them.
//!
//! The names: every variable of the limits-file contract (`CUDA_DEVICE_MEMORY_LIMIT` and
//! `CUDA_DEVICE_MEMORY_LIMIT_<anything>`, `CUDA_DEVICE_SM_LIMIT` and `_<anything>`,
//! `CUDA_DEVICE_MEMORY_SHARED_CACHE`, `CUDA_OVERSUBSCRIBE`, `LIBCUDA_LOG_LEVEL`,
//! `LIBVGPU_HOSTPID_BROKER`, `CUDA_TASK_PRIORITY`, `GPU_CORE_UTILIZATION_POLICY`), the other
//! variables HAMi-core reads (`CUDA_REDIRECT`, which swaps the library its hooks resolve through;
//! `ACTIVE_OOM_KILLER`; `RECORD_KERNEL_INTERVAL`), and `CUDA_DISABLE_CONTROL` (the device
//! plugin's switch that leaves the preload list out).
//!
//! Each route is refused: `env` with a value, with `valueFrom`, and `envFrom` with a prefix that
//! could produce one of them (the empty prefix included: what a ConfigMap or Secret holds is not
//! known at admission and can change after it). `CUDA_TASK_PRIORITY` and
//! `GPU_CORE_UTILIZATION_POLICY` are the webhook's to set: the exact value it sets is accepted (an
//! already-mutated pod), any other is refused. In the namespaces of
//! `tenancy.allowHamiCoreEnvNamespaces` nothing here applies (HAMi's behaviour).
//!
//! KAI's own entries, recognised exactly, are accepted in the KAI fraction container: the
//! `envFrom` ConfigMap `<runai/shared-gpu-configmap>-<index>-evar` (no prefix) that KAI's
//! admission adds, and (KAI's `hamicore` plugin) `CUDA_DEVICE_MEMORY_LIMIT` from
//! `valueFrom.configMapKeyRef` of ConfigMap `<runai/shared-gpu-configmap>-<index>`; both are
//! written by KAI's binder. In `file` delivery the limits file stays authoritative over any
//! memory limit they carry (the preload library drops inherited ones); in `env` delivery KAI's
//! value is the container's cap.

use hami_shared::names::{
    ANNOTATION_KAI_SHARED_GPU_CONFIGMAP, ENV_ACTIVE_OOM_KILLER, ENV_CUDA_DEVICE_MEMORY_LIMIT,
    ENV_CUDA_DISABLE_CONTROL, ENV_CUDA_REDIRECT, ENV_CUDA_TASK_PRIORITY,
    ENV_GPU_CORE_UTILIZATION_POLICY, ENV_RECORD_KERNEL_INTERVAL,
};
use hami_shared::preload::{CONTRACT_VARIABLE_PREFIXES, CONTRACT_VARIABLES, is_contract_variable};

use crate::policy::mutation::{Denial, PodMutation};
use crate::wire::pod::{Container, ContainerKind, ContainerRef, EnvFromSource, EnvVar, Pod};

/// The setting that lifts these rules, named in every denial.
pub const SETTING: &str = "tenancy.allowHamiCoreEnvNamespaces";

/// Variables HAMi-core reads (or the device plugin acts on) besides the contract's.
const OTHER_VARIABLES: [&str; 4] = [
    ENV_CUDA_DISABLE_CONTROL,
    ENV_CUDA_REDIRECT,
    ENV_ACTIVE_OOM_KILLER,
    ENV_RECORD_KERNEL_INTERVAL,
];

/// Whether a pod may not set `name` in a GPU container.
#[must_use]
pub fn is_protected(name: &str) -> bool {
    is_contract_variable(name.as_bytes()) || OTHER_VARIABLES.contains(&name)
}

/// Whether an `envFrom` source with `prefix` could produce a protected name: some protected name
/// starts with the prefix (and is longer: a key is never empty), or the prefix reaches into a
/// per-device family (`CUDA_DEVICE_MEMORY_LIMIT_1` + key `0`).
#[must_use]
pub fn prefix_could_produce(prefix: &str) -> Option<&'static str> {
    let exact = CONTRACT_VARIABLES
        .iter()
        .chain(OTHER_VARIABLES.iter())
        .find(|n| n.len() > prefix.len() && n.starts_with(prefix));
    if let Some(n) = exact {
        return Some(n);
    }
    CONTRACT_VARIABLE_PREFIXES
        .iter()
        .find(|f| f.starts_with(prefix) || prefix.starts_with(**f))
        .copied()
}

/// What the webhook itself sets in one container: the values the pod may carry for those names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expected {
    /// `CUDA_TASK_PRIORITY`, and where the value comes from (for messages).
    pub priority: Option<(String, String)>,
    /// `GPU_CORE_UTILIZATION_POLICY`, and where the value comes from.
    pub core_policy: Option<(String, String)>,
    /// `CUDA_DEVICE_MEMORY_LIMIT=<N>m` of a KAI pod's cap.
    pub memory_limit: Option<String>,
    /// KAI's own entries, in the KAI fraction container.
    pub kai: Option<KaiEntries>,
}

/// The ConfigMaps of KAI's own entries in the fraction container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KaiEntries {
    /// `<prefix>-<index>`: `valueFrom.configMapKeyRef` of KAI's `CUDA_DEVICE_MEMORY_LIMIT`.
    pub capabilities: String,
    /// `<prefix>-<index>-evar`: KAI's `envFrom`.
    pub direct_env: String,
}

impl KaiEntries {
    /// KAI's entries for the fraction container at `at`, when the pod carries KAI's ConfigMap
    /// prefix (`<index>` is `i<n>` for an init container, as KAI names it).
    #[must_use]
    pub fn of(pod: &Pod<'_>, at: ContainerRef) -> Option<Self> {
        let prefix = pod.annotation(ANNOTATION_KAI_SHARED_GPU_CONFIGMAP)?;
        let index = match at.kind {
            ContainerKind::Init => format!("i{}", at.index),
            ContainerKind::Regular => at.index.to_string(),
        };
        let capabilities = format!("{prefix}-{index}");
        Some(Self {
            direct_env: format!("{capabilities}-evar"),
            capabilities,
        })
    }
}

/// Refuse a GPU container that sets a protected variable other than as the webhook (or KAI)
/// sets it, unless the pod's namespace is in `allow`.
///
/// # Errors
/// [`Denial`] naming the pod, the container, the variable (or `envFrom` source) and [`SETTING`].
pub fn check(
    m: &PodMutation<'_, '_>,
    container: &Container<'_>,
    expected: &Expected,
    allowed: bool,
) -> Result<(), Denial> {
    if allowed {
        return Ok(());
    }
    for e in container.env.as_deref().unwrap_or_default() {
        if is_protected(&e.name) {
            check_entry(m, container, e, expected)?;
        }
    }
    for source in container.env_from.as_deref().unwrap_or_default() {
        check_env_from(m, container, source, expected)?;
    }
    Ok(())
}

/// One `env` entry of a protected name.
fn check_entry(
    m: &PodMutation<'_, '_>,
    container: &Container<'_>,
    e: &EnvVar<'_>,
    expected: &Expected,
) -> Result<(), Denial> {
    let literal = (!e.is_value_from()).then(|| e.value.as_deref().unwrap_or(""));
    let webhook_set = match e.name.as_ref() {
        ENV_CUDA_TASK_PRIORITY => Some((
            &expected.priority,
            "it sets one only from a HAMi container's priority limit, nvidia.com/priority by default",
        )),
        ENV_GPU_CORE_UTILIZATION_POLICY => Some((
            &expected.core_policy,
            "it sets one only from its nvidia.gpuCorePolicy setting",
        )),
        _ => None,
    };
    if let Some((ours, source_hint)) = webhook_set {
        if let (Some((value, _)), Some(v)) = (ours, literal)
            && value == v
        {
            return Ok(());
        }
        let what = match ours {
            Some((value, from)) => format!("hami-limits sets {value:?} (from {from})"),
            None => format!("hami-limits sets none here ({source_hint})"),
        };
        return Err(m.deny(format_args!(
            "container {:?}: env {} is set by the pod {}; {what}, and a GPU container may not set another value; remove it, or allow it in this namespace with {SETTING}",
            container.name,
            e.name,
            shown(literal)
        )));
    }
    if e.name == ENV_CUDA_DEVICE_MEMORY_LIMIT {
        if let (Some(ours), Some(v)) = (&expected.memory_limit, literal)
            && ours == v
        {
            return Ok(());
        }
        if let (Some(kai), Some(cm)) = (&expected.kai, e.config_map_key_ref())
            && cm == kai.capabilities
        {
            return Ok(());
        }
    }
    Err(m.deny(format_args!(
        "container {:?}: env {} is set by the pod {}; HAMi-core's variables in a GPU container belong to hami-limits (they set or lift its GPU limits); remove it, or allow it in this namespace with {SETTING}",
        container.name,
        e.name,
        shown(literal)
    )))
}

/// `to "<value>"` or `with valueFrom`.
fn shown(literal: Option<&str>) -> String {
    match literal {
        Some(v) => format!("to {v:?}"),
        None => "with valueFrom".to_owned(),
    }
}

/// One `envFrom` source: refused when its prefix could produce a protected name, unless it is
/// KAI's own.
fn check_env_from(
    m: &PodMutation<'_, '_>,
    container: &Container<'_>,
    source: &EnvFromSource<'_>,
    expected: &Expected,
) -> Result<(), Denial> {
    let prefix = source.prefix.as_deref().unwrap_or("");
    let Some(example) = prefix_could_produce(prefix) else {
        return Ok(());
    };
    if prefix.is_empty()
        && let (Some(kai), Some(cm)) = (&expected.kai, &source.config_map_ref)
        && cm.name == kai.direct_env
    {
        return Ok(());
    }
    let example = if example.ends_with('_') {
        format!("{example}0")
    } else {
        example.to_owned()
    };
    Err(m.deny(format_args!(
        "container {:?}: envFrom {} with prefix {prefix:?} could set HAMi-core's variables (e.g. {example}), and what it holds cannot be checked at admission; give it a prefix no such variable starts with (e.g. \"APP_\"), or name the variables it needs with valueFrom, or allow it in this namespace with {SETTING}",
        container.name,
        source.describe()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protected_names() {
        for yes in [
            "CUDA_DEVICE_MEMORY_LIMIT",
            "CUDA_DEVICE_MEMORY_LIMIT_0",
            "CUDA_DEVICE_MEMORY_LIMIT_15",
            "CUDA_DEVICE_MEMORY_LIMIT_99",
            "CUDA_DEVICE_MEMORY_LIMIT_x",
            "CUDA_DEVICE_SM_LIMIT",
            "CUDA_DEVICE_SM_LIMIT_1",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            "CUDA_OVERSUBSCRIBE",
            "LIBCUDA_LOG_LEVEL",
            "LIBVGPU_HOSTPID_BROKER",
            "CUDA_TASK_PRIORITY",
            "GPU_CORE_UTILIZATION_POLICY",
            "CUDA_DISABLE_CONTROL",
            "CUDA_REDIRECT",
            "ACTIVE_OOM_KILLER",
            "RECORD_KERNEL_INTERVAL",
        ] {
            assert!(is_protected(yes), "{yes}");
        }
        for no in [
            "CUDA_VISIBLE_DEVICES",
            "NVIDIA_VISIBLE_DEVICES",
            "cuda_device_memory_limit",
            "CUDA_DEVICE_MEMORY_LIMITX",
            "PATH",
        ] {
            assert!(!is_protected(no), "{no}");
        }
    }

    #[test]
    fn prefixes_that_could_produce_a_protected_name() {
        for (prefix, example) in [
            ("", Some("CUDA_DEVICE_MEMORY_LIMIT")),
            ("C", Some("CUDA_DEVICE_MEMORY_LIMIT")),
            ("CUDA_", Some("CUDA_DEVICE_MEMORY_LIMIT")),
            (
                "CUDA_DEVICE_MEMORY_LIMIT",
                Some("CUDA_DEVICE_MEMORY_LIMIT_"),
            ),
            (
                "CUDA_DEVICE_MEMORY_LIMIT_",
                Some("CUDA_DEVICE_MEMORY_LIMIT_"),
            ),
            (
                "CUDA_DEVICE_MEMORY_LIMIT_1",
                Some("CUDA_DEVICE_MEMORY_LIMIT_"),
            ),
            ("CUDA_DEVICE_SM_LIMIT_", Some("CUDA_DEVICE_SM_LIMIT_")),
            ("LIBCUDA_", Some("LIBCUDA_LOG_LEVEL")),
            ("ACTIVE_", Some("ACTIVE_OOM_KILLER")),
            ("CUDA_DISABLE_", Some("CUDA_DISABLE_CONTROL")),
            ("GPU_CORE_", Some("GPU_CORE_UTILIZATION_POLICY")),
            ("APP_", None),
            ("CUDA_VISIBLE_", None),
            ("CUDA_REDIRECT", None),
            ("LIBCUDA_LOG_LEVEL", None),
            ("cuda_", None),
        ] {
            assert_eq!(prefix_could_produce(prefix), example, "{prefix:?}");
        }
    }
}
