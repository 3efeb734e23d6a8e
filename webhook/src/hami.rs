//! HAMi GPU pods: what HAMi's own webhook does, made strict.
//!
//! A container is a GPU container when its limits or requests name a configured HAMi resource.
//! For those containers (init containers included: the device plugin serves them too):
//! `CUDA_TASK_PRIORITY` from the priority limit, `GPU_CORE_UTILIZATION_POLICY` when the policy is
//! not `default`; a variable the container already sets is left alone (with a warning when it
//! differs). The pod goes to the HAMi scheduler unless it names another scheduler, in which case it
//! is not a HAMi pod and nothing is changed. A privileged GPU container sees every GPU of the node,
//! so it is denied (configurable).

use hami_shared::names::{ENV_CUDA_TASK_PRIORITY, ENV_GPU_CORE_UTILIZATION_POLICY};
use hami_shared::values::{CorePolicy, TaskPriority};

use crate::mutation::{Denial, PodMutation};
use crate::pod::{Container, ContainerRef, DEFAULT_SCHEDULER};
use crate::settings::Settings;

/// Apply HAMi's GPU-pod mutations.
///
/// # Errors
/// [`Denial`] for a privileged GPU container (when configured) or a priority limit that is not an
/// integer.
pub fn mutate(m: &mut PodMutation<'_, '_>, settings: &Settings) -> Result<(), Denial> {
    let pod = m.pod();
    let scheduler = pod.spec.scheduler_name.as_deref().unwrap_or("");
    let retarget = scheduler.is_empty() || scheduler == DEFAULT_SCHEDULER;
    if !retarget && scheduler != settings.scheduler_name {
        return Ok(());
    }
    let gpu_names = settings.nvidia.gpu_resource_names();
    let mut any_gpu = false;
    for (at, container) in pod.all_containers() {
        let Some(resource) = gpu_names
            .iter()
            .copied()
            .find(|n| container.names_resource(n))
        else {
            continue;
        };
        any_gpu = true;
        m.check_patch_size()?;
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
        if let Some(raw) = container.limit(priority_name) {
            let priority: TaskPriority = raw.parse().map_err(|_| {
                m.deny(format_args!(
                    "container {:?}: limit {priority_name}={raw:?} is not an integer",
                    container.name
                ))
            })?;
            set_env(
                m,
                at,
                container,
                ENV_CUDA_TASK_PRIORITY,
                &priority.to_string(),
            );
        }
        let policy = settings.nvidia.gpu_core_policy;
        if policy != CorePolicy::Default {
            set_env(
                m,
                at,
                container,
                ENV_GPU_CORE_UTILIZATION_POLICY,
                policy.as_str(),
            );
        }
    }
    if any_gpu && retarget {
        m.patch.set_scheduler_name(&settings.scheduler_name);
    }
    Ok(())
}

/// Add `name=value` unless the container defines `name`; a definition with another value (or a
/// `valueFrom`) is left alone with a warning. The same literal value is silent, so reviewing an
/// already-mutated pod changes nothing and warns about nothing.
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
