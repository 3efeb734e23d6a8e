//! The `kai:` settings section: plain data (the basis the decision uses is passed beside it, see
//! [`crate::policy::basis`]).

use hami_shared::values::LimitDelivery;
use serde::{Deserialize, Serialize};

use crate::policy::placement::AffinityLimits;

/// Which containers get the HAMi-core preload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PreloadContainers {
    /// The container named by `gpu-fraction-container-name` (init containers searched first),
    /// else `containers[0]`: the one container that has the GPU. Preloading HAMi-core into a
    /// container without GPU driver libraries is fatal, which is why KAI-resource-isolator moved
    /// to this (default).
    #[default]
    Fraction,
    /// Every container and init container, as the hami_kai seed fork does.
    All,
}

/// What a `gpu-fraction` pod gets when no per-GPU VRAM basis is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MissingBasis {
    /// The explicit opt-out: admit it with HAMi-core but without a memory cap, with a warning, a
    /// metric and (file delivery) a limits file saying `HAMI_UNCAPPED=<reason>`.
    Warn,
    /// Refuse it, saying why and how to provide a basis (fail closed; default: a GPU share is
    /// never run uncapped unless an operator asked for it).
    #[default]
    Deny,
}

impl MissingBasis {
    /// The accepted values, for messages.
    pub const ACCEPTED: &'static str = "warn, deny";
}

impl<'de> Deserialize<'de> for MissingBasis {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = String::deserialize(deserializer)?;
        match value.as_str() {
            "warn" => Ok(Self::Warn),
            "deny" => Ok(Self::Deny),
            _ => Err(serde::de::Error::custom(format_args!(
                "{value:?} is not one of: {}",
                Self::ACCEPTED
            ))),
        }
    }
}

/// How HAMi-core reaches a KAI pod's preloaded containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum HookDelivery {
    /// The container requests one `hami.io/preload`, an extended resource the hook installer
    /// serves as a kubelet device plugin; its `Allocate` mounts the hook folder's files read-only.
    /// Device-plugin mounts are not pod volumes, so the pod passes Pod Security `baseline` and
    /// `restricted`, and it can only be scheduled to a node that serves the hook (default).
    #[default]
    #[serde(rename = "device-plugin")]
    DevicePlugin,
    /// A `hostPath` volume of the hook folder in the pod, as KAI-resource-isolator adds it: the
    /// layout of earlier releases, which Pod Security `baseline` refuses.
    #[serde(rename = "hostPath")]
    HostPath,
}

impl HookDelivery {
    /// The accepted values, for messages.
    pub const ACCEPTED: &'static str = "device-plugin, hostPath";
}

impl<'de> Deserialize<'de> for HookDelivery {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = String::deserialize(deserializer)?;
        match value.as_str() {
            "device-plugin" => Ok(Self::DevicePlugin),
            "hostPath" => Ok(Self::HostPath),
            _ => Err(serde::de::Error::custom(format_args!(
                "{value:?} is not one of: {}",
                Self::ACCEPTED
            ))),
        }
    }
}

/// The `kai:` settings section. Unknown keys are refused (the message names the key): this
/// section is ours, not HAMi's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct KaiSettings {
    /// Schedulers whose pods are KAI pods; empty means any. Default `[kai-scheduler]`.
    #[serde(alias = "schedulernames")]
    pub scheduler_names: Vec<String>,
    /// `fraction` (default) or `all`.
    #[serde(alias = "preloadcontainers")]
    pub preload_containers: PreloadContainers,
    /// The host folder holding `libvgpu.so` and `ld.so.preload`, mounted at the same path.
    /// Default `/usr/local/vgpu`.
    #[serde(alias = "hookpath")]
    pub hook_path: String,
    /// Per-GPU VRAM in MiB for `gpu-fraction` pods; when set, authoritative and node detection is
    /// off. Env `HAMI_KAI__PER_GPU_VRAM_MIB`. Default: unset (detect from node labels).
    #[serde(alias = "pergpuvrammib")]
    pub per_gpu_vram_mib: Option<u64>,
    /// Label selector of the node watch. Default `nvidia.com/gpu.memory` (GFD's label).
    #[serde(alias = "nodelabelselector")]
    pub node_label_selector: String,
    /// Delivery mode when the pod has no `hami.io/limit-delivery`: `file` (default) or `env`.
    #[serde(alias = "limitdelivery")]
    pub limit_delivery: LimitDelivery,
    /// A `gpu-fraction` pod without a per-GPU VRAM basis: `deny` (default: refused, fail closed)
    /// or `warn` (the opt-out: admitted uncapped, with a warning). Env `HAMI_KAI__MISSINGBASIS`.
    /// `gpu-memory` pods need no basis.
    #[serde(alias = "missingbasis")]
    pub missing_basis: MissingBasis,
    /// How the preloaded containers get HAMi-core: `device-plugin` (default: one
    /// `hami.io/preload` per container, served by the hook installer; no `hostPath` in the pod)
    /// or `hostPath` (the volume of earlier releases). Env `HAMI_KAI__HOOKDELIVERY`.
    #[serde(alias = "hookdelivery")]
    pub hook_delivery: HookDelivery,
    /// The most `nodeSelectorTerms` a `gpu-fraction` pod's required node affinity may have when its
    /// basis is looked up in the node index (each term costs a pass over the index). Default 64.
    #[serde(alias = "maxaffinityterms")]
    pub max_affinity_terms: usize,
    /// The most `matchExpressions` and `matchFields` over all of those terms. Default 256.
    #[serde(alias = "maxaffinityexpressions")]
    pub max_affinity_expressions: usize,
    /// The most `values` in one expression, and over all of them. Default 10,000.
    #[serde(alias = "maxaffinityvalues")]
    pub max_affinity_values: usize,
    /// The namespace where KAI's binder creates its GPU reservation pods (`gpu-reservation-*`,
    /// `nvidia.com/gpu: 1`, `nodeName` preset). Pods there are KAI's own and are never changed:
    /// KAI's binding must not depend on this webhook. Empty: none. Default
    /// `kai-resource-reservation`; env `HAMI_KAI__RESERVATIONNAMESPACE`.
    #[serde(alias = "reservationnamespace")]
    pub reservation_namespace: String,
}

impl KaiSettings {
    /// The `maxAffinity*` settings, as placement reads them.
    #[must_use]
    pub fn affinity_limits(&self) -> AffinityLimits {
        AffinityLimits {
            terms: self.max_affinity_terms,
            expressions: self.max_affinity_expressions,
            values: self.max_affinity_values,
        }
    }
}

impl Default for KaiSettings {
    fn default() -> Self {
        Self {
            scheduler_names: vec![hami_shared::names::KAI_SCHEDULER_NAME.to_owned()],
            preload_containers: PreloadContainers::Fraction,
            hook_path: "/usr/local/vgpu".to_owned(),
            per_gpu_vram_mib: None,
            node_label_selector: hami_shared::names::LABEL_GPU_MEMORY.to_owned(),
            limit_delivery: LimitDelivery::File,
            missing_basis: MissingBasis::Deny,
            hook_delivery: HookDelivery::DevicePlugin,
            max_affinity_terms: 64,
            max_affinity_expressions: 256,
            max_affinity_values: 10_000,
            reservation_namespace: hami_shared::names::KAI_RESERVATION_NAMESPACE.to_owned(),
        }
    }
}
