//! KAI fractional-sharing pods: HAMi-core injection and `CUDA_DEVICE_MEMORY_LIMIT` from
//! `gpu-memory` / `gpu-fraction`, with the limits file projected through a downward-API volume.
//!
//! Steps, each in its own module:
//!
//! 1. [`select`]: is this a KAI pod (annotation + scheduler, opt-outs), and is its request valid?
//! 2. [`quantity`]: the request in MiB, with exact decimal arithmetic; a fraction needs the
//!    per-GPU VRAM basis ([`crate::basis::VramBasis`], passed in by the caller) narrowed to the
//!    nodes the pod can land on ([`crate::placement`]).
//! 3. [`inject`]: the HAMi-core preload (hostPath volume, two mounts) into the target containers,
//!    and the limit variable into every container that does not set one.
//! 4. [`downward`]: in `file` delivery mode, the per-container limits file as a webhook-owned
//!    annotation, projected read-only at `/overrideEnv`.
//!
//! [`settings`] holds the `kai:` section. Nothing here imports this module back.

pub mod downward;
pub mod inject;
pub mod quantity;
pub mod select;
pub mod settings;

use hami_shared::values::LimitDelivery;

use crate::basis::{Basis, VramBasis};
use crate::mutation::{Denial, KaiLimit, Observation, PodMutation};
use crate::placement::Placement;

pub use select::KaiRequest;
pub use settings::{KaiSettings, MissingBasis, PreloadContainers};

/// Apply the KAI mutations to a pod. `vram` is the per-GPU VRAM basis for `gpu-fraction` pods,
/// used when `kai.perGpuVramMib` is not set; `annotation_delivery` is the pod's parsed
/// `hami.io/limit-delivery`; what happened is recorded as observations.
///
/// # Errors
/// [`Denial`] for an invalid KAI request (bad or conflicting annotations, a container name that
/// matches nothing, a cap below 1 MiB), a pod that would bypass the limits file, or (with
/// `kai.missingBasis: deny`) a `gpu-fraction` pod whose cap cannot be computed.
pub fn mutate(
    m: &mut PodMutation<'_, '_>,
    kai: &KaiSettings,
    vram: &dyn VramBasis,
    annotation_delivery: Option<LimitDelivery>,
) -> Result<(), Denial> {
    let Some(raw) = select::select(m.pod(), kai) else {
        return Ok(());
    };
    let request = select::validate(m, &raw)?;
    let limit_mib = match &request {
        KaiRequest::Memory(mib) => Some(*mib),
        KaiRequest::Fraction(f) => {
            let basis = match kai.per_gpu_vram_mib {
                Some(mib) if mib > 0 => Ok(Basis { mib }),
                _ => vram.basis(&Placement::of_pod(m.pod())),
            };
            match basis {
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
                Err(reason) if kai.missing_basis == MissingBasis::Deny => {
                    return Err(m.deny(format_args!(
                        "annotation gpu-fraction={:?} needs the per-GPU VRAM to set its GPU memory cap, and none is known: {reason}. kai.missingBasis is deny, so the pod is refused rather than run uncapped. To fix: label the GPU nodes this pod can land on with nvidia.com/gpu.memory=<MiB> (GPU Feature Discovery does), set kai.perGpuVramMib (HAMI_KAI__PER_GPU_VRAM_MIB), or request gpu-memory=<MiB> instead of gpu-fraction",
                        raw.value
                    )));
                }
                Err(reason) => {
                    m.observe(Observation::KaiCapSkipped(reason));
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
        m.observe(Observation::KaiPod(KaiLimit::None));
        return Ok(());
    };
    let (limit, limited) = inject::memory_limit(m, limit_mib)?;
    // The pod's annotation (validated and parsed once, by `delivery::validate`), else the
    // webhook's `kai.limitDelivery`: KAI pods have no node config.
    let delivery = annotation_delivery.unwrap_or(kai.limit_delivery);
    downward::deliver(m, &limited, limit, delivery)?;
    m.observe(Observation::KaiPod(match request {
        KaiRequest::Memory(_) => KaiLimit::GpuMemory,
        KaiRequest::Fraction(_) => KaiLimit::GpuFraction,
    }));
    Ok(())
}
