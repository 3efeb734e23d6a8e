//! KAI fractional-sharing pods: HAMi-core injection and `CUDA_DEVICE_MEMORY_LIMIT` from
//! `gpu-memory` / `gpu-fraction`, with the limits file projected through a downward-API volume.
//!
//! Steps, each in its own module:
//!
//! 1. [`select`]: is this a KAI pod (annotation + scheduler), does its own opt-out count (only in
//!    the namespaces of `tenancy.kaiOptOutNamespaces`), and is its request valid?
//! 2. [`quantity`]: the request in MiB, with exact decimal arithmetic; a fraction needs the
//!    per-GPU VRAM basis ([`crate::policy::basis::VramBasis`], passed in by the caller) narrowed to the
//!    nodes the pod can land on ([`crate::policy::placement`]).
//! 3. [`inject`]: the HAMi-core preload into the target containers (`kai.hookDelivery`: one
//!    `hami.io/preload`, whose device plugin mounts the hook; or the hostPath volume and two
//!    mounts), which may not set HAMi-core's variables themselves
//!    ([`crate::policy::tenancy::hami_core_env`]; KAI's own entries excepted), and the limit
//!    variable into each of them that does not set one (no other container gets a GPU or
//!    HAMi-core, so none gets a cap).
//! 4. [`downward`]: in `file` delivery mode, the per-container limits file as a webhook-owned
//!    annotation, projected read-only at `/overrideEnv`; for `gpu-fraction` it also carries the
//!    fraction and the node GPU file's path (the preload library's exact per-node cap), and for a
//!    pod admitted without a cap (`kai.missingBasis: warn`) it says so (`HAMI_UNCAPPED`).
//!
//! [`settings`] holds the `kai:` section. Nothing here imports this module back.

pub mod downward;
pub mod inject;
pub mod quantity;
pub mod select;
pub mod settings;

use hami_preload_core::fraction::MAX_PLACES;
use hami_shared::limits_file::{GpuFraction, LimitsFileError, NodeGpusPath};
use hami_shared::names::{ENV_HAMI_GPU_FRACTION, ENV_HAMI_NODE_GPUS, NODE_GPUS_FILE};
use hami_shared::values::LimitDelivery;

use crate::policy::basis::{Basis, SkipReason, VramBasis};
use crate::policy::mutation::{Denial, KaiLimit, Observation, PodMutation};
use crate::policy::placement::Placement;
use crate::policy::settings::Settings;
use crate::policy::tenancy::hami_core_env::{self, Expected, KaiEntries};
use crate::policy::tenancy::visible_devices;
use crate::wire::pod::{ContainerRef, Pod};
use downward::FileCap;

pub use select::KaiRequest;
pub use settings::{HookDelivery, KaiSettings, MissingBasis, PreloadContainers};

/// Apply the KAI mutations to a pod (`settings.kai`, and `settings.tenancy` for the pod's own
/// opt-out and HAMi-core's variables). `vram` is the per-GPU VRAM basis for `gpu-fraction` pods,
/// used when `kai.perGpuVramMib` is not set; `annotation_delivery` is the pod's parsed
/// `hami.io/limit-delivery`; what happened is recorded as observations.
///
/// # Errors
/// [`Denial`] for an invalid KAI request (bad or conflicting annotations, a container name that
/// matches nothing, a cap below 1 MiB), a pod that would bypass the limits file, a target
/// container that sets HAMi-core's variables itself, or (with `kai.missingBasis: deny`, the
/// default) a `gpu-fraction` pod whose cap cannot be computed.
pub fn mutate(
    m: &mut PodMutation<'_, '_>,
    settings: &Settings,
    vram: &dyn VramBasis,
    annotation_delivery: Option<LimitDelivery>,
) -> Result<(), Denial> {
    let (kai, tenancy) = (&settings.kai, &settings.tenancy);
    let Some(raw) = select::select(m.pod(), kai) else {
        return Ok(());
    };
    if let Some(how) = select::opt_out(m.pod()) {
        if tenancy.honours_kai_opt_out(m.namespace()) {
            return Ok(());
        }
        m.warn(format!(
            "the pod's opt-out {how} is ignored: in namespace {:?} only the operator turns HAMi-core and the GPU memory cap off (tenancy.kaiOptOutNamespaces)",
            m.namespace().unwrap_or("")
        ));
    }
    let request = select::validate(m, &raw)?;
    let cap = memory_cap(m, kai, vram, &request, &raw)?;
    let targets = select::preload_targets(m, kai.preload_containers)?;
    let fraction = select::fraction_container(m.pod());
    let kai_entries = fraction.and_then(|at| KaiEntries::of(m.pod(), at).map(|e| (at, e)));
    check_variables(m, settings, &targets, &cap, kai_entries.as_ref())?;
    let devices_allowed = tenancy.allows_visible_devices(m.namespace());
    for &at in &targets {
        if let Some(container) = m.pod().container(at) {
            visible_devices::check_env_from(m, container, devices_allowed)?;
        }
    }
    inject::preload(m, &targets, &kai.hook_path, kai.hook_delivery)?;
    // The pod's annotation (validated and parsed once, by `delivery::validate`), else the
    // webhook's `kai.limitDelivery`: KAI pods have no node config.
    let delivery = annotation_delivery.unwrap_or(kai.limit_delivery);
    let kai_cm = kai_entries
        .as_ref()
        .map(|(at, e)| (*at, e.capabilities.as_str()));
    match cap {
        Ok(mib) => deliver_capped(m, kai, &request, &targets, mib, delivery, kai_cm),
        Err(reason) => deliver_uncapped(m, &targets, reason, delivery, kai_cm),
    }
}

/// The fraction container of a KAI pod and KAI's ConfigMaps for it (the pod's
/// `runai/shared-gpu-configmap` annotation), where KAI's own entries are accepted; `None` for a
/// pod that is not a KAI pod or carries no such annotation yet.
#[must_use]
pub fn fraction_entries(pod: &Pod<'_>, kai: &KaiSettings) -> Option<(ContainerRef, KaiEntries)> {
    select::select(pod, kai)?;
    let at = select::fraction_container(pod)?;
    KaiEntries::of(pod, at).map(|e| (at, e))
}

/// The preloaded containers may not set HAMi-core's variables, but for the memory limit the
/// webhook adds (`cap`) and KAI's own entries in its fraction container.
fn check_variables(
    m: &PodMutation<'_, '_>,
    settings: &Settings,
    targets: &[ContainerRef],
    cap: &Result<u64, SkipReason>,
    kai_entries: Option<&(ContainerRef, KaiEntries)>,
) -> Result<(), Denial> {
    let allowed = settings.tenancy.allows_hami_core_env(m.namespace());
    if allowed {
        return Ok(());
    }
    let memory_limit = cap
        .as_ref()
        .ok()
        .and_then(|&mib| hami_shared::values::MemoryLimitMib::new(mib).ok())
        .map(|l| l.to_string());
    let pod = m.pod();
    for &at in targets {
        let Some(container) = pod.container(at) else {
            continue;
        };
        let expected = Expected {
            memory_limit: memory_limit.clone(),
            kai: kai_entries
                .filter(|(c, _)| *c == at)
                .map(|(_, e)| e.clone()),
            ..Expected::default()
        };
        hami_core_env::check(m, container, &expected, allowed)?;
    }
    Ok(())
}

/// The pod's GPU memory cap in MiB: `gpu-memory` as asked, `gpu-fraction` of the per-GPU VRAM
/// basis (`kai.perGpuVramMib`, else `vram` narrowed to where the pod can land). `Ok(Err(reason))`
/// when there is no basis and `kai.missingBasis` is warn (observed and warned here).
///
/// # Errors
/// [`Denial`] for a fraction of the basis below 1 MiB, or no basis with `kai.missingBasis: deny`.
fn memory_cap(
    m: &mut PodMutation<'_, '_>,
    kai: &KaiSettings,
    vram: &dyn VramBasis,
    request: &KaiRequest,
    raw: &select::RawRequest<'_>,
) -> Result<Result<u64, SkipReason>, Denial> {
    let f = match request {
        KaiRequest::Memory(mib) => return Ok(Ok(*mib)),
        KaiRequest::Fraction(f) => f,
    };
    let basis = match kai.per_gpu_vram_mib {
        Some(mib) if mib > 0 => Ok(Basis { mib }),
        _ => {
            // The affinity is the tenant's: bounded before the index is searched with it.
            let placement =
                Placement::of_pod_within(m.pod(), &kai.affinity_limits()).map_err(|e| m.deny(e))?;
            vram.basis(&placement)
        }
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
            Ok(Ok(mib))
        }
        Err(reason) if kai.missing_basis == MissingBasis::Deny => Err(m.deny(format_args!(
            "annotation gpu-fraction={:?} needs the per-GPU VRAM to set its GPU memory cap, and none is known: {reason}. kai.missingBasis is deny, so the pod is refused rather than run uncapped. To fix: label the GPU nodes this pod can land on with nvidia.com/gpu.memory=<MiB> (GPU Feature Discovery does), set kai.perGpuVramMib (HAMI_KAI__PER_GPU_VRAM_MIB), or request gpu-memory=<MiB> instead of gpu-fraction",
            raw.value
        ))),
        Err(reason) => {
            m.observe(Observation::KaiCapSkipped(reason));
            m.warn(format!(
                "gpu-fraction={:?}: GPU memory cap skipped (kai.missingBasis is warn), HAMi-core is injected without CUDA_DEVICE_MEMORY_LIMIT: {reason}",
                raw.value
            ));
            Ok(Err(reason))
        }
    }
}

/// A pod with a cap: the limit variable in every preloaded container without one of its own, and
/// (file delivery) each such container's limits file, with the per-node keys in the preloaded
/// containers of a `gpu-fraction` pod.
fn deliver_capped(
    m: &mut PodMutation<'_, '_>,
    kai: &KaiSettings,
    request: &KaiRequest,
    targets: &[ContainerRef],
    limit_mib: u64,
    delivery: LimitDelivery,
    kai_cm: Option<(ContainerRef, &str)>,
) -> Result<(), Denial> {
    let (limit, limited) = inject::memory_limit(m, limit_mib, targets, kai_cm)?;
    let per_node = match (request, delivery) {
        (KaiRequest::Fraction(f), LimitDelivery::File) => per_node_keys(m, f, &kai.hook_path),
        _ => None,
    };
    let files: Vec<(ContainerRef, FileCap<'_>)> = limited
        .iter()
        .map(|&at| {
            let cap = match &per_node {
                // The node GPU file is in the hook folder, mounted in the preloaded containers only.
                Some((fraction, node_gpus)) if targets.contains(&at) => FileCap::PerNode {
                    limit,
                    fraction,
                    node_gpus,
                },
                _ => FileCap::Limit(limit),
            };
            (at, cap)
        })
        .collect();
    // `hami.io/preload` delivery mounts each preloaded container's slot folder: its region goes
    // there, where the node reads it, and every process of the container joins it.
    let shared_cache: &[ContainerRef] = match kai.hook_delivery {
        HookDelivery::DevicePlugin => targets,
        HookDelivery::HostPath => &[],
    };
    downward::deliver(m, &files, delivery, shared_cache)?;
    m.observe(Observation::KaiPod(match request {
        KaiRequest::Memory(_) => KaiLimit::GpuMemory,
        KaiRequest::Fraction(_) => KaiLimit::GpuFraction,
    }));
    Ok(())
}

/// A pod admitted without a cap (`kai.missingBasis: warn`): the opt-out made visible where the
/// container runs. In file delivery each preloaded container without a limit of its own gets a
/// file saying why it has none.
fn deliver_uncapped(
    m: &mut PodMutation<'_, '_>,
    targets: &[ContainerRef],
    reason: SkipReason,
    delivery: LimitDelivery,
    kai_cm: Option<(ContainerRef, &str)>,
) -> Result<(), Denial> {
    let files: Vec<(ContainerRef, FileCap<'_>)> = if delivery == LimitDelivery::File {
        let pod = m.pod();
        targets
            .iter()
            .filter(|&&at| {
                pod.container(at)
                    .is_some_and(|c| !inject::sets_own_limit(at, c, kai_cm))
            })
            .map(|&at| (at, FileCap::Uncapped(reason)))
            .collect()
    } else {
        Vec::new()
    };
    downward::deliver(m, &files, delivery, &[])?;
    m.observe(Observation::KaiPod(KaiLimit::None));
    Ok(())
}

/// `HAMI_GPU_FRACTION` and `HAMI_NODE_GPUS` for a `gpu-fraction` pod in file delivery: the
/// canonical fraction and `<kai.hookPath, cleaned>/node-gpus` (the hook folder's files are
/// mounted at their own paths, read-only, as [`inject::preload`] arranges, and `install-hook`
/// publishes the node GPU file there). `None`, with a warning, when the file cannot hold them: the
/// admission-time cap then stands alone.
fn per_node_keys(
    m: &mut PodMutation<'_, '_>,
    fraction: &quantity::Fraction,
    hook_path: &str,
) -> Option<(GpuFraction, NodeGpusPath)> {
    let hook = crate::wire::mountpath::resolve(hook_path);
    let node_gpus = format!("{}/{NODE_GPUS_FILE}", hook.trim_end_matches('/'));
    let Some(canonical) = fraction.canonical() else {
        m.warn(format!(
            "gpu-fraction={fraction}: more than {MAX_PLACES} decimal places, more than the limits file's {ENV_HAMI_GPU_FRACTION} holds; the container keeps the admission-time cap (the fraction of the smallest GPU it could land on), not the exact cap of its node's GPU"
        ));
        return None;
    };
    let path = match NodeGpusPath::new(&node_gpus) {
        Ok(path) => path,
        Err(e) => {
            let problem = match e {
                LimitsFileError::UnsafeValue { reason, .. } => reason,
                other => other.to_string(),
            };
            m.warn(format!(
                "kai.hookPath {hook_path:?}: the node GPU file's path {node_gpus:?} is {problem}; the limits files carry the admission-time cap only (no {ENV_HAMI_GPU_FRACTION}, {ENV_HAMI_NODE_GPUS})"
            ));
            return None;
        }
    };
    Some((canonical, path))
}
