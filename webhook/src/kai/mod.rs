//! KAI fractional-sharing pods: HAMi-core injection and `CUDA_DEVICE_MEMORY_LIMIT` from
//! `gpu-memory` / `gpu-fraction`, with the limits file projected through a downward-API volume.
//!
//! Steps, each in its own module:
//!
//! 1. [`select`]: is this a KAI pod (annotation + scheduler, opt-outs), and is its request valid?
//! 2. [`quantity`]: the request in MiB, with exact decimal arithmetic; a fraction needs the
//!    per-GPU VRAM basis ([`crate::vram`]) narrowed to the nodes the pod can land on
//!    ([`crate::placement`]).
//! 3. [`inject`]: the HAMi-core preload (hostPath volume, two mounts) into the target containers,
//!    and the limit variable into every container that does not set one.
//! 4. [`downward`]: in `file` delivery mode, the per-container limits file as a webhook-owned
//!    annotation, projected read-only at `/overrideEnv`.

pub mod downward;
pub mod inject;
pub mod quantity;
pub mod select;

use hami_shared::values::LimitDelivery;
use serde::{Deserialize, Serialize};

use crate::decide::{Denial, PodMutation};
use crate::placement::Placement;
use crate::vram::{KaiMetrics, VramBasisSource, VramSource};

pub use select::KaiRequest;

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

/// The `kai:` settings section.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
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
    /// off. Env `PER_GPU_VRAM_MIB`. Default: unset (detect from node labels).
    #[serde(alias = "pergpuvrammib")]
    pub per_gpu_vram_mib: Option<u64>,
    /// Label selector of the node watch. Default `nvidia.com/gpu.memory` (GFD's label).
    #[serde(alias = "nodelabelselector")]
    pub node_label_selector: String,
    /// Delivery mode when the pod has no `hami.io/limit-delivery`: `file` (default) or `env`.
    #[serde(alias = "limitdelivery")]
    pub limit_delivery: LimitDelivery,
    /// Where the basis comes from at run time (set by the commands, not a file key).
    #[serde(skip)]
    pub vram: VramSource,
    /// KAI metrics (shared handles; registered by the server).
    #[serde(skip)]
    pub metrics: KaiMetrics,
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
            vram: VramSource::None,
            metrics: KaiMetrics::default(),
        }
    }
}

impl PartialEq for KaiSettings {
    fn eq(&self, other: &Self) -> bool {
        self.scheduler_names == other.scheduler_names
            && self.preload_containers == other.preload_containers
            && self.hook_path == other.hook_path
            && self.per_gpu_vram_mib == other.per_gpu_vram_mib
            && self.node_label_selector == other.node_label_selector
            && self.limit_delivery == other.limit_delivery
            && self.vram == other.vram
    }
}

impl KaiSettings {
    /// The basis source to use: `per_gpu_vram_mib` when set, else `vram`.
    fn basis(&self, placement: &Placement) -> Result<crate::vram::Basis, crate::vram::SkipReason> {
        match self.per_gpu_vram_mib {
            Some(mib) if mib > 0 => Ok(crate::vram::Basis { mib }),
            _ => self.vram.basis(placement),
        }
    }
}

/// Apply the KAI mutations to a pod.
///
/// # Errors
/// [`Denial`] for an invalid KAI request (bad or conflicting annotations, a container name that
/// matches nothing, a cap below 1 MiB) or a pod that would bypass the limits file.
pub fn mutate(
    m: &mut PodMutation<'_, '_>,
    settings: &crate::settings::Settings,
) -> Result<(), Denial> {
    let kai = &settings.kai;
    let Some(raw) = select::select(m.pod(), kai) else {
        return Ok(());
    };
    let request = select::validate(m, &raw)?;
    let limit_mib = match &request {
        KaiRequest::Memory(mib) => Some(*mib),
        KaiRequest::Fraction(f) => {
            let placement = Placement::of_pod(m.pod());
            match kai.basis(&placement) {
                Ok(basis) => {
                    let mib = f.of(basis.mib);
                    if mib == 0 {
                        return Err(m.deny(format_args!(
                            "annotation gpu-fraction={:?} of the per-GPU VRAM ({} MiB) is below 1 MiB; a limit of 0 would mean unlimited to HAMi-core",
                            raw.value, basis.mib
                        )));
                    }
                    Some(mib)
                }
                Err(reason) => {
                    kai.metrics.skipped(reason);
                    m.warn(format!(
                        "gpu-fraction={:?}: GPU memory cap skipped, HAMi-core is injected without CUDA_DEVICE_MEMORY_LIMIT: {reason}",
                        raw.value
                    ));
                    None
                }
            }
        }
    };
    let targets = select::preload_targets(m, kai.preload_containers)?;
    inject::preload(m, &targets, &kai.hook_path)?;
    let Some(limit_mib) = limit_mib else {
        downward::remove_owned_annotations(m, &[]);
        kai.metrics.pod("none");
        return Ok(());
    };
    let limited = inject::memory_limit(m, limit_mib)?;
    let resolved = hami_shared::values::resolve_limit_delivery(
        m.pod()
            .annotation(hami_shared::names::ANNOTATION_LIMIT_DELIVERY),
        None,
        Some(kai.limit_delivery),
    );
    downward::deliver(m, &limited, limit_mib, resolved.delivery)?;
    kai.metrics.pod(match request {
        KaiRequest::Memory(_) => "gpu-memory",
        KaiRequest::Fraction(_) => "gpu-fraction",
    });
    Ok(())
}
