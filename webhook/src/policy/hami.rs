//! HAMi GPU pods: what HAMi's own webhook does, made strict.
//!
//! A container is a GPU container when its limits or requests name a configured HAMi resource.
//! For those containers (init containers included: the device plugin serves them too):
//! `CUDA_TASK_PRIORITY` from the priority limit, `GPU_CORE_UTILIZATION_POLICY` when the policy is
//! not `default`; a variable the container already sets is left alone (with a warning when it
//! differs). The pod goes to the HAMi scheduler unless it names another scheduler, in which case it
//! is not a HAMi pod and nothing is changed. A privileged GPU container sees every GPU of the node,
//! so it is denied (configurable). A GPU container's own mount at `/overrideEnv` or
//! `/etc/ld.so.preload` (where the device plugin mounts the limits file and the preload list) is
//! denied: it would replace them. A GPU container may not set HAMi-core's variables itself
//! ([`crate::policy::tenancy::hami_core_env`]; `tenancy.allowHamiCoreEnvNamespaces` lifts it):
//! `CUDA_TASK_PRIORITY` and `GPU_CORE_UTILIZATION_POLICY` only to the value set here.
//!
//! Two more of HAMi's webhook settings (HAMi v2.10.0 `pkg/device/nvidia/device.go`):
//! `defaultGPUNum` (`mutateContainerResource`, lines 398-415): a container whose **limits** name
//! the memory, memory-percentage or core resource but not the count resource gets
//! `<count>: defaultGPUNum` (not when 0, nor when its requests name the count); `overwriteEnv`
//! (lines 380-385): every container that gets no GPU gets `NVIDIA_VISIBLE_DEVICES=none`, except in
//! KAI pods (`gpu-memory` / `gpu-fraction`: their GPUs come from another device plugin).

use hami_shared::mountpath::{Overlap, overlap};
use hami_shared::names::{
    ANNOTATION_GPU_FRACTION, ANNOTATION_GPU_MEMORY, ENV_CUDA_DISABLE_CONTROL,
    ENV_CUDA_TASK_PRIORITY, ENV_GPU_CORE_UTILIZATION_POLICY, ENV_NVIDIA_VISIBLE_DEVICES,
    LD_SO_PRELOAD_PATH, OVERRIDE_ENV_PATH, VGPU_LOCK_PATH,
};
use hami_shared::values::{CorePolicy, TaskPriority};

use crate::policy::mutation::{Denial, PodMutation};
use crate::policy::settings::Settings;
use crate::policy::tenancy::hami_core_env::{self, Expected};
use crate::policy::tenancy::visible_devices;
use crate::wire::mountpath::resolve;
use crate::wire::pod::{Container, ContainerRef, DEFAULT_SCHEDULER};

/// Apply HAMi's GPU-pod mutations.
///
/// # Errors
/// [`Denial`] for a privileged GPU container (when configured), a priority limit that is not an
/// integer, a GPU container's own mount at `/overrideEnv` or `/etc/ld.so.preload`, or one of
/// HAMi-core's variables it sets itself.
pub fn mutate(m: &mut PodMutation<'_, '_>, settings: &Settings) -> Result<(), Denial> {
    let pod = m.pod();
    let scheduler = pod.spec.scheduler_name.as_deref().unwrap_or("");
    let retarget = scheduler.is_empty() || scheduler == DEFAULT_SCHEDULER;
    if !retarget && scheduler != settings.scheduler_name {
        return Ok(());
    }
    let nvidia = &settings.nvidia;
    let gpu_names = nvidia.gpu_resource_names();
    let kai_pod = pod.annotation(ANNOTATION_GPU_MEMORY).is_some()
        || pod.annotation(ANNOTATION_GPU_FRACTION).is_some();
    let env_allowed = settings.tenancy.allows_hami_core_env(m.namespace());
    let mut any_gpu = false;
    for (at, container) in pod.all_containers() {
        let gets_gpu = container.limit(&nvidia.resource_count_name).is_some()
            || (nvidia.default_gpu_num > 0 && names_share_limit(container, nvidia));
        if gets_gpu
            && container.limit(&nvidia.resource_count_name).is_none()
            && !container.names_resource(&nvidia.resource_count_name)
        {
            m.patch.set_container_limit(
                at,
                &nvidia.resource_count_name,
                nvidia.default_gpu_num.to_string(),
            );
        }
        if nvidia.overwrite_env && !gets_gpu && !kai_pod {
            set_env(m, at, container, ENV_NVIDIA_VISIBLE_DEVICES, "none");
        }
        let Some(resource) = gpu_names
            .iter()
            .copied()
            .find(|n| container.names_resource(n))
        else {
            continue;
        };
        any_gpu = true;
        m.check_patch_size()?;
        mutate_gpu_container(m, at, container, resource, settings, env_allowed)?;
    }
    if any_gpu && retarget {
        m.patch.set_scheduler_name(&settings.scheduler_name);
    }
    Ok(())
}

/// One GPU container (it names `resource`): the privileged check, HAMi-core's variables (unless
/// `env_allowed`), the device plugin's mount paths, `CUDA_TASK_PRIORITY` from the priority limit
/// and `GPU_CORE_UTILIZATION_POLICY`.
fn mutate_gpu_container(
    m: &mut PodMutation<'_, '_>,
    at: ContainerRef,
    container: &Container<'_>,
    resource: &str,
    settings: &Settings,
    env_allowed: bool,
) -> Result<(), Denial> {
    if container.is_privileged() {
        let why = format!(
            "container {:?} is privileged and requests {resource}: a privileged container sees every GPU on the node",
            container.name
        );
        if settings.deny_privileged_gpu_containers {
            return Err(m.deny(why));
        }
        m.warn(format!("{why}; its GPU limits cannot be enforced"));
    }
    let priority_name = settings.nvidia.resource_priority_name.as_str();
    let priority = match container.limit(priority_name) {
        Some(raw) => {
            let priority: TaskPriority = raw.parse().map_err(|_| {
                m.deny(format_args!(
                    "container {:?}: limit {priority_name}={raw:?} is not an integer",
                    container.name
                ))
            })?;
            Some((priority.to_string(), format!("limit {priority_name}={raw}")))
        }
        None => None,
    };
    let policy = settings.nvidia.gpu_core_policy;
    let expected = Expected {
        priority: priority.clone(),
        core_policy: (policy != CorePolicy::Default).then(|| {
            (
                policy.as_str().to_owned(),
                "nvidia.gpuCorePolicy".to_owned(),
            )
        }),
        ..Expected::default()
    };
    hami_core_env::check(m, container, &expected, env_allowed)?;
    visible_devices::check_env_from(
        m,
        container,
        settings.tenancy.allows_visible_devices(m.namespace()),
    )?;
    check_device_plugin_mounts(m, container, settings)?;
    if let Some((value, _)) = &priority {
        set_env(m, at, container, ENV_CUDA_TASK_PRIORITY, value);
    }
    if policy != CorePolicy::Default {
        set_env(
            m,
            at,
            container,
            ENV_GPU_CORE_UTILIZATION_POLICY,
            policy.as_str(),
        );
    }
    Ok(())
}

/// A GPU container may not mount its own volume at, above or inside what the device plugin's
/// `Allocate` mounts: the limits file (`/overrideEnv`), the preload list (`/etc/ld.so.preload`;
/// not when the container sets `CUDA_DISABLE_CONTROL=true` where that is allowed, which turns that
/// mount off), the hook folder `<hookPath>/vgpu` (HAMi-core, the preload library, the shared
/// region) and, inside only, HAMi-core's lock folder (`/tmp/vgpulock`; an `emptyDir` at `/tmp` is
/// common and hides nothing that matters). On a real node (`tests/tests/real_node/main.rs`) the pod's
/// mount is applied after the device plugin's: a file there would replace the limits in every
/// process (an empty one: no limit), a folder over the hook folder would hide HAMi-core. Paths are
/// compared cleaned, as the runtime reads them; the device plugin checks the same at `Allocate`
/// for pods that never came here.
fn check_device_plugin_mounts(
    m: &PodMutation<'_, '_>,
    container: &Container<'_>,
    settings: &Settings,
) -> Result<(), Denial> {
    let preload_off = container
        .env_var(ENV_CUDA_DISABLE_CONTROL)
        .is_some_and(|e| e.value.as_deref() == Some("true"));
    let vgpu = settings.device_plugin_hook_path.join("vgpu");
    let vgpu = resolve(&vgpu.display().to_string()).into_owned();
    let mut protected: Vec<(&str, &str, bool)> = vec![
        (OVERRIDE_ENV_PATH, "the limits file", true),
        (
            vgpu.as_str(),
            "HAMi-core, the preload library and the container's own folder",
            true,
        ),
        (VGPU_LOCK_PATH, "HAMi-core's lock folder", false),
    ];
    if !preload_off {
        protected.push((
            LD_SO_PRELOAD_PATH,
            "the preload list that loads HAMi-core",
            true,
        ));
    }
    for mnt in container.volume_mounts.as_deref().unwrap_or_default() {
        let path = resolve(&mnt.mount_path);
        let hit = protected.iter().find_map(|&(ours, what, above)| {
            overlap(&path, ours)
                .filter(|o| above || *o != Overlap::Above)
                .map(|o| (ours, what, o))
        });
        let Some((ours, what, o)) = hit else {
            continue;
        };
        return Err(m.deny(format_args!(
            "container {:?} mounts volume {:?} at {:?} ({path}), where the device plugin mounts {what} on allocation ({} {ours}): the container's mount would replace or hide it; remove or move that mount",
            container.name,
            mnt.name,
            mnt.mount_path,
            o.describe()
        )));
    }
    Ok(())
}

/// Whether the container's limits name the memory, memory-percentage or core resource (HAMi's
/// condition for `defaultGPUNum`).
fn names_share_limit(container: &Container<'_>, nvidia: &hami_config::NvidiaAdmission) -> bool {
    [
        &nvidia.resource_memory_name,
        &nvidia.resource_memory_percentage_name,
        &nvidia.resource_core_name,
    ]
    .into_iter()
    .any(|n| container.limit(n).is_some())
}

/// Add `name=value` unless the container defines `name`; a definition with another value (or a
/// `valueFrom`) is left alone with a warning. The same literal value is silent, so reviewing an
/// already-mutated pod changes nothing and warns about nothing.
/// HAMi's webhook appends its variables without looking: behind ours (its configuration name
/// sorts after the chart's), the pod would carry each twice and the API server warns that the
/// second "hides previous definition". On the reinvocation that follows, every repeat of an entry
/// that is exactly ours is removed, so that the stored pod has one entry per variable in either
/// order. Only identical literal repeats: anything else is left for the tenancy check to judge.
fn drop_repeats(
    m: &mut PodMutation<'_, '_>,
    at: ContainerRef,
    container: &Container<'_>,
    name: &str,
    value: &str,
) {
    let entries: Vec<(usize, &crate::wire::pod::EnvVar<'_>)> = container
        .env
        .iter()
        .flatten()
        .enumerate()
        .filter(|(_, e)| e.name == name)
        .collect();
    if entries.len() < 2
        || !entries
            .iter()
            .all(|(_, e)| !e.is_value_from() && e.value.as_deref() == Some(value))
    {
        return;
    }
    for (index, _) in entries.into_iter().skip(1) {
        m.patch.remove_env(at, index);
    }
}

fn set_env(
    m: &mut PodMutation<'_, '_>,
    at: ContainerRef,
    container: &Container<'_>,
    name: &str,
    value: &str,
) {
    match container.env_var(name) {
        None => {
            if !m.patch.container_has_env(at, name) {
                m.patch.add_env(at, name, value.to_owned());
            }
        }
        Some(existing) if !existing.is_value_from() && existing.value.as_deref() == Some(value) => {
            drop_repeats(m, at, container, name, value);
        }
        Some(existing) => {
            let current = if existing.is_value_from() {
                "from valueFrom".to_owned()
            } else {
                format!("to {:?}", existing.value.as_deref().unwrap_or(""))
            };
            m.warn(format!(
                "container {:?} already sets {name} {current}; left as is (HAMi would set {value:?})",
                container.name
            ));
        }
    }
}
