//! Which GPUs a container sees belongs to the device plugin (and, in a KAI fraction container, to
//! KAI): a pod may not name its own.
//!
//! The NVIDIA container runtime (nvidia-container-toolkit, `internal/config/image/cuda_image.go`
//! `VisibleDevices`) gives an unprivileged container the GPUs its environment's
//! `NVIDIA_VISIBLE_DEVICES` names (`all`, UUIDs, indices) while the node's
//! `accept-nvidia-visible-devices-envvar-when-unprivileged` is `true` — the toolkit's default —
//! whatever the container asked of the scheduler: a container with no GPU request gets every GPU
//! of the node, uncapped. With `accept-nvidia-visible-devices-as-volume-mounts = true` it also
//! reads a device list from the container's mounts of host `/dev/null` whose destination starts
//! with `/var/run/nvidia-container-devices` (a string prefix; the device is the rest of the path).
//!
//! So, in every container and init container of every pod reviewed:
//!
//! - an `env` entry `NVIDIA_VISIBLE_DEVICES` is refused, unless its literal value names no GPU
//!   (`none`: no GPU, driver libraries mounted; `void` or empty: nothing — values that only narrow,
//!   and what HAMi's `overwriteEnv` and KAI's `deviceaccess` plugin themselves set) or it is
//!   exactly KAI's own entry in the KAI fraction container (`valueFrom.configMapKeyRef`, ConfigMap
//!   `<runai/shared-gpu-configmap>-<index>`, key `NVIDIA_VISIBLE_DEVICES`, which KAI v0.17's
//!   gpusharing admission adds and its binder fills with the reserved GPU). Any other `valueFrom`
//!   is refused: its value is known only when the container starts, and can change after;
//! - a mount at or under `/var/run/nvidia-container-devices` (the path cleaned as kubelet cleans
//!   it, compared as a string prefix as the runtime compares it) is refused: no workload needs
//!   one, and with host `/dev/null` behind it the runtime reads it as a device request;
//! - in a GPU container ([`check_env_from`]), an `envFrom` whose prefix could produce the variable:
//!   kubelet applies it after the device plugin's list, which it would replace.
//!
//! Not checkable here, and closed only by the node's runtime setting
//! (`accept-nvidia-visible-devices-envvar-when-unprivileged = false`, see the operator guide):
//! `envFrom` of a ConfigMap or Secret in a container without a GPU (its keys are unknown at
//! admission and can change after),
//! the image's own `ENV` (`nvidia/cuda` images set `NVIDIA_VISIBLE_DEVICES=all`), and an image
//! that is "legacy" to the runtime (`CUDA_VERSION` set, `NVIDIA_REQUIRE_CUDA` not: the variable
//! unset means `all`).
//!
//! `NVIDIA_DRIVER_CAPABILITIES` is not refused: it selects which driver libraries and device
//! nodes (compute, utility, video, graphics, display) come with the GPUs a container already
//! gets, and names no GPU.
//!
//! In the namespaces of `tenancy.allowVisibleDevicesNamespaces` nothing here applies.

use hami_shared::names::ENV_NVIDIA_VISIBLE_DEVICES;

use crate::policy::mutation::{Denial, PodMutation};
use crate::policy::tenancy::hami_core_env::KaiEntries;
use crate::wire::mountpath::resolve;
use crate::wire::pod::{Container, ContainerRef, EnvVar};

/// The setting that lifts these rules, named in every denial.
pub const SETTING: &str = "tenancy.allowVisibleDevicesNamespaces";

/// Where the NVIDIA container runtime reads a device list from mounts
/// (`DeviceListAsVolumeMountsRoot`).
pub const DEVICE_LIST_MOUNT_ROOT: &str = "/var/run/nvidia-container-devices";

/// Literal values of `NVIDIA_VISIBLE_DEVICES` that name no GPU.
pub const NO_GPU_VALUES: [&str; 3] = ["", "none", "void"];

/// Refuse a pod whose containers name their own GPUs, unless `allowed` (the pod's namespace is in
/// [`SETTING`]). `kai` is the KAI fraction container of a KAI pod and its ConfigMaps, where KAI's
/// own `NVIDIA_VISIBLE_DEVICES` entry is accepted.
///
/// # Errors
/// [`Denial`] naming the pod, the container, the variable or mount, and [`SETTING`].
pub fn check(
    m: &PodMutation<'_, '_>,
    kai: Option<&(ContainerRef, KaiEntries)>,
    allowed: bool,
) -> Result<(), Denial> {
    if allowed {
        return Ok(());
    }
    for (at, container) in m.pod().all_containers() {
        let kai_here = kai.filter(|(c, _)| *c == at).map(|(_, e)| e);
        for e in container.env.as_deref().unwrap_or_default() {
            if e.name == ENV_NVIDIA_VISIBLE_DEVICES {
                check_entry(m, container, e, kai_here)?;
            }
        }
        check_mounts(m, container)?;
    }
    Ok(())
}

/// In a GPU container (one the device plugin or KAI gives GPUs), refuse an `envFrom` whose
/// non-empty prefix could produce `NVIDIA_VISIBLE_DEVICES`: kubelet puts the spec's variables,
/// `envFrom`'s included, after the device plugin's, so such a source would replace the plugin's
/// list. (The empty prefix is refused there by [`crate::policy::tenancy::hami_core_env`]; in a
/// container without a GPU, `envFrom` is left to the node's runtime setting.)
///
/// # Errors
/// [`Denial`] naming the pod, the container, the source and [`SETTING`].
pub fn check_env_from(
    m: &PodMutation<'_, '_>,
    container: &Container<'_>,
    allowed: bool,
) -> Result<(), Denial> {
    if allowed {
        return Ok(());
    }
    for source in container.env_from.as_deref().unwrap_or_default() {
        let prefix = source.prefix.as_deref().unwrap_or("");
        if !prefix.is_empty()
            && prefix.len() < ENV_NVIDIA_VISIBLE_DEVICES.len()
            && ENV_NVIDIA_VISIBLE_DEVICES.starts_with(prefix)
        {
            return Err(m.deny(format_args!(
                "container {:?}: envFrom {} with prefix {prefix:?} could set {ENV_NVIDIA_VISIBLE_DEVICES} over the device plugin's list of the container's GPUs, and what it holds cannot be checked at admission; give it a prefix that variable does not start with (e.g. \"APP_\"), or allow it in this namespace with {SETTING}",
                container.name,
                source.describe()
            )));
        }
    }
    Ok(())
}

/// Whether `e` is KAI's own `NVIDIA_VISIBLE_DEVICES` entry for the fraction container of `kai`.
fn is_kais(e: &EnvVar<'_>, kai: &KaiEntries) -> bool {
    e.value_from
        .as_ref()
        .and_then(|v| v.config_map_key_ref.as_ref())
        .is_some_and(|r| {
            r.name == kai.capabilities && r.key.as_deref() == Some(ENV_NVIDIA_VISIBLE_DEVICES)
        })
}

/// One `NVIDIA_VISIBLE_DEVICES` entry.
fn check_entry(
    m: &PodMutation<'_, '_>,
    container: &Container<'_>,
    e: &EnvVar<'_>,
    kai: Option<&KaiEntries>,
) -> Result<(), Denial> {
    let shown = if e.is_value_from() {
        if kai.is_some_and(|k| is_kais(e, k)) {
            return Ok(());
        }
        "with valueFrom".to_owned()
    } else {
        let v = e.value.as_deref().unwrap_or("");
        if NO_GPU_VALUES.contains(&v) {
            return Ok(());
        }
        format!("to {v:?}")
    };
    Err(m.deny(format_args!(
        "container {:?}: env {ENV_NVIDIA_VISIBLE_DEVICES} is set by the pod {shown}; the NVIDIA container runtime gives a container the GPUs this variable names, outside HAMi's scheduler and the GPU caps, so only the device plugin (and KAI, in a KAI fraction container) sets it; remove it (or set it to \"none\" or \"void\"), or allow it in this namespace with {SETTING}",
        container.name
    )))
}

/// A mount at or under [`DEVICE_LIST_MOUNT_ROOT`].
fn check_mounts(m: &PodMutation<'_, '_>, container: &Container<'_>) -> Result<(), Denial> {
    for mnt in container.volume_mounts.as_deref().unwrap_or_default() {
        let path = resolve(&mnt.mount_path);
        if path.starts_with(DEVICE_LIST_MOUNT_ROOT) {
            return Err(m.deny(format_args!(
                "container {:?} mounts volume {:?} at {:?} ({path}): under {DEVICE_LIST_MOUNT_ROOT} the NVIDIA container runtime reads mounts as a list of GPUs to give the container, outside HAMi's scheduler and the GPU caps; remove or move that mount, or allow it in this namespace with {SETTING}",
                container.name, mnt.name, mnt.mount_path
            )));
        }
    }
    Ok(())
}
