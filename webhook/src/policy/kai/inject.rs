//! HAMi-core preload injection (a `hami.io/preload` device plugin resource, or the hostPath
//! volume KAI-resource-isolator adds) and the memory-limit variable.

use hami_shared::names::{ENV_CUDA_DEVICE_MEMORY_LIMIT, RESOURCE_PRELOAD};
use hami_shared::values::MemoryLimitMib;
use serde_json::json;

use crate::policy::kai::settings::HookDelivery;
use crate::policy::mutation::{Denial, PodMutation};
use crate::wire::mountpath::{Overlap, overlap, resolve};
use crate::wire::patch::NewMount;
use crate::wire::pod::{Container, ContainerRef};

/// The hostPath volume holding HAMi-core; the same name KAI-resource-isolator uses, so that the
/// two never add it twice.
pub const PRELOAD_VOLUME: &str = "kai-resource-isolator-vgpu";
/// Where the dynamic loader reads the preload list.
pub const LD_SO_PRELOAD: &str = "/etc/ld.so.preload";
/// The file in the hook folder that becomes `/etc/ld.so.preload`.
pub const LD_SO_PRELOAD_SUBPATH: &str = "ld.so.preload";

/// Bring HAMi-core into each target container, as `delivery` says:
///
/// - [`HookDelivery::DevicePlugin`]: one `hami.io/preload` in the container's limits and
///   requests. The hook installer serves that resource as a kubelet device plugin whose
///   `Allocate` mounts the hook folder's files (at `hook_path`) and `/etc/ld.so.preload`
///   read-only: no pod volume, so Pod Security `baseline` admits the pod, and only a node that
///   serves the hook can take it.
/// - [`HookDelivery::HostPath`]: the HAMi-core volume (a `hostPath` of `hook_path`) mounted at
///   `hook_path` and at `/etc/ld.so.preload` (subPath `ld.so.preload`), as KAI-resource-isolator
///   adds it. Both mounts are read-only: a writable hostPath of the library folder would let one
///   pod replace `libvgpu.so` for every pod on the node. An existing volume of that name must be
///   the same hostPath.
///
/// Nothing is added twice.
///
/// # Errors
/// [`Denial`] when a target container has a mount of its own at, above or inside one of the two
/// paths (HAMi-core would not be loaded, or not from the host's folder: see [`check_mounts`]); in
/// `device-plugin` delivery, when a container asks for `hami.io/preload` itself; in `hostPath`
/// delivery, when the pod already defines the volume differently.
pub fn preload(
    m: &mut PodMutation<'_, '_>,
    targets: &[ContainerRef],
    hook_path: &str,
    delivery: HookDelivery,
) -> Result<(), Denial> {
    if delivery == HookDelivery::DevicePlugin {
        // Checked even when nothing is preloaded: the resource is the webhook's to give.
        check_preload_requests(m, targets)?;
    }
    if targets.is_empty() {
        return Ok(());
    }
    if delivery == HookDelivery::HostPath {
        add_hook_volume(m, hook_path)?;
    }
    let hook = resolve(hook_path);
    let source = match delivery {
        HookDelivery::DevicePlugin => MountSource::Resource(RESOURCE_PRELOAD),
        HookDelivery::HostPath => MountSource::Volume(PRELOAD_VOLUME),
    };
    let ours = [
        OurMount {
            source,
            path: &hook,
            sub_path: None,
            what: "the HAMi-core library folder",
        },
        OurMount {
            source,
            path: LD_SO_PRELOAD,
            sub_path: Some(LD_SO_PRELOAD_SUBPATH),
            what: "the preload list that loads HAMi-core",
        },
    ];
    let pod = m.pod();
    for &at in targets {
        let Some(container) = pod.container(at) else {
            continue;
        };
        check_mounts(m, container, &ours)?;
        m.check_patch_size()?;
        match delivery {
            HookDelivery::DevicePlugin => {
                if container.limit(RESOURCE_PRELOAD).is_none() {
                    m.patch
                        .set_container_resource(at, RESOURCE_PRELOAD, PRELOAD_COUNT);
                }
            }
            HookDelivery::HostPath => {
                for our in &ours {
                    if m.patch.container_has_mount_path(at, our.path) {
                        continue;
                    }
                    m.patch.add_volume_mount(
                        at,
                        NewMount {
                            name: PRELOAD_VOLUME.to_owned(),
                            mount_path: our.path.to_owned(),
                            sub_path: our.sub_path.map(str::to_owned),
                            read_only: true,
                        },
                    );
                }
            }
        }
    }
    Ok(())
}

/// How many `hami.io/preload` a preloaded container gets: one (the mounts are the same for any
/// number, and each one held is a slot of the node's plugin).
pub const PRELOAD_COUNT: &str = "1";

/// `hami.io/preload` is the webhook's to give: a container it preloads may carry exactly
/// `1` (an earlier review's), and no other container may ask for it — each one held is a slot of
/// the node's plugin, and a container that takes HAMi-core on its own escapes the mount checks
/// the webhook makes for the ones it preloads.
fn check_preload_requests(m: &PodMutation<'_, '_>, targets: &[ContainerRef]) -> Result<(), Denial> {
    let pod = m.pod();
    for (at, container) in pod.all_containers() {
        if !container.names_resource(RESOURCE_PRELOAD) {
            continue;
        }
        if !targets.contains(&at) {
            return Err(m.deny(format_args!(
                "container {:?} requests {RESOURCE_PRELOAD}, which hami-limits gives only to the containers it preloads HAMi-core into (kai.preloadContainers); remove it",
                container.name
            )));
        }
        let limit = container.limit(RESOURCE_PRELOAD);
        let request = container.request(RESOURCE_PRELOAD);
        let ours = |v: Option<&str>| v.is_none_or(|v| v == PRELOAD_COUNT);
        if limit.is_none() || !ours(limit) || !ours(request) {
            return Err(m.deny(format_args!(
                "container {:?} sets {RESOURCE_PRELOAD} to limit {:?}, request {:?}; hami-limits sets it (limit and request {PRELOAD_COUNT}) on the containers it preloads: remove it",
                container.name,
                limit.unwrap_or(""),
                request.unwrap_or("")
            )));
        }
    }
    Ok(())
}

/// The `hostPath` volume of the hook folder, added unless the pod has it; a pod-defined volume of
/// that name must be the same hostPath.
fn add_hook_volume(m: &mut PodMutation<'_, '_>, hook_path: &str) -> Result<(), Denial> {
    let pod = m.pod();
    match pod
        .spec
        .volumes
        .as_deref()
        .and_then(|v| v.iter().find(|v| v.name == PRELOAD_VOLUME))
    {
        Some(existing) => {
            let path = existing
                .host_path
                .and_then(|raw| serde_json::from_str::<serde_json::Value>(raw.get()).ok())
                .and_then(|v| v.get("path").and_then(|p| p.as_str()).map(str::to_owned));
            if path.as_deref() != Some(hook_path) {
                return Err(m.deny(format_args!(
                    "volume {PRELOAD_VOLUME:?} is reserved for the HAMi-core preload and must be hostPath {hook_path:?}"
                )));
            }
        }
        None => {
            if !m.patch.has_volume(PRELOAD_VOLUME) {
                m.patch.add_volume(json!({
                    "name": PRELOAD_VOLUME,
                    "hostPath": {"path": hook_path, "type": "DirectoryOrCreate"}
                }));
            }
        }
    }
    Ok(())
}

/// What provides one of the webhook's mounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountSource<'s> {
    /// A volume of the pod, by name.
    Volume(&'s str),
    /// A device plugin resource whose `Allocate` mounts it (no volume in the pod).
    Resource(&'s str),
}

impl std::fmt::Display for MountSource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Volume(name) => write!(f, "volume {name:?}"),
            Self::Resource(name) => write!(f, "resource {name:?} (kubelet mounts it)"),
        }
    }
}

/// A mount the webhook adds to a container, at a clean absolute `path`.
#[derive(Debug, Clone, Copy)]
pub struct OurMount<'s> {
    /// What provides it.
    pub source: MountSource<'s>,
    /// Where, cleaned.
    pub path: &'s str,
    /// Its `subPath`, if any.
    pub sub_path: Option<&'s str>,
    /// What it provides, for messages.
    pub what: &'s str,
}

/// Refuse a container whose own mounts would clash with one of `ours`: a mount at the same path
/// once cleaned (`/overrideEnv/`, `//overrideEnv`, `/tmp/../overrideEnv`), a mount above it that
/// could hide it (`/etc`, `/`) or one inside it that would replace part of it. A mount that is
/// exactly ours (same volume, path and `subPath`: an earlier review added it) is fine; a mount
/// kubelet makes for a device plugin resource is never in the spec, so nothing there is ours.
///
/// # Errors
/// [`Denial`] naming the container, both mounts and the fix.
pub fn check_mounts(
    m: &PodMutation<'_, '_>,
    container: &Container<'_>,
    ours: &[OurMount<'_>],
) -> Result<(), Denial> {
    for mnt in container.volume_mounts.as_deref().unwrap_or_default() {
        let theirs = resolve(&mnt.mount_path);
        for our in ours {
            let Some(overlap) = overlap(&theirs, our.path) else {
                continue;
            };
            if overlap == Overlap::Same
                && our.source == MountSource::Volume(&mnt.name)
                && mnt.sub_path.as_deref() == our.sub_path
            {
                continue;
            }
            return Err(m.deny(format_args!(
                "container {:?} mounts volume {:?} at {:?} ({theirs}), {} the mount hami-limits adds: {} at {} ({}); remove or move that mount",
                container.name,
                mnt.name,
                mnt.mount_path,
                overlap.describe(),
                our.source,
                our.path,
                our.what
            )));
        }
    }
    Ok(())
}

/// Whether `name` is `CUDA_DEVICE_MEMORY_LIMIT` or `CUDA_DEVICE_MEMORY_LIMIT_<digits>`.
#[must_use]
pub fn is_memory_limit_var(name: &str) -> bool {
    match name.strip_prefix(ENV_CUDA_DEVICE_MEMORY_LIMIT) {
        Some("") => true,
        Some(rest) => rest
            .strip_prefix('_')
            .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit())),
        None => false,
    }
}

/// How a container stands with respect to the memory limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitState {
    /// It sets no memory-limit variable: the webhook adds one.
    Unset,
    /// It sets exactly the variable the webhook would add (an already-mutated pod).
    Ours,
    /// KAI's `hamicore` admission replaced the webhook's variable by its own
    /// (`valueFrom.configMapKeyRef` of `kai_config_map`): the webhook's limits file still applies
    /// in `file` delivery, and adding the variable again would only make KAI replace it again.
    Kai,
    /// It sets its own (`valueFrom`, another value, or a per-device `_<i>`): left alone.
    Own(String),
}

/// Classify `container` for a limit of `value` (`<N>m`); `kai_config_map` is the ConfigMap of
/// KAI's own `CUDA_DEVICE_MEMORY_LIMIT` when `container` is KAI's fraction container.
#[must_use]
pub fn limit_state(
    container: &Container<'_>,
    value: &str,
    kai_config_map: Option<&str>,
) -> LimitState {
    let mut vars = container
        .env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|e| is_memory_limit_var(&e.name));
    let Some(first) = vars.next() else {
        return LimitState::Unset;
    };
    let only = vars.next().is_none();
    // Kubernetes: the last entry of a name wins; show the value that takes effect.
    let shown = container.env_var(&first.name).unwrap_or(first);
    if only
        && first.name == ENV_CUDA_DEVICE_MEMORY_LIMIT
        && !first.is_value_from()
        && first.value.as_deref() == Some(value)
    {
        return LimitState::Ours;
    }
    if only
        && first.name == ENV_CUDA_DEVICE_MEMORY_LIMIT
        && kai_config_map.is_some()
        && first.config_map_key_ref() == kai_config_map
    {
        return LimitState::Kai;
    }
    let how = if shown.is_value_from() {
        "from valueFrom".to_owned()
    } else {
        format!("to {:?}", shown.value.as_deref().unwrap_or(""))
    };
    LimitState::Own(format!("{} {how}", shown.name))
}

/// Whether `container` sets a memory-limit variable of its own (KAI's entry in its fraction
/// container, `kai` = (container, ConfigMap), is not the container's own).
#[must_use]
pub fn sets_own_limit(
    at: ContainerRef,
    container: &Container<'_>,
    kai: Option<(ContainerRef, &str)>,
) -> bool {
    let kai_cm = kai.filter(|(c, _)| *c == at).map(|(_, cm)| cm);
    container
        .env
        .iter()
        .flatten()
        .filter(|e| is_memory_limit_var(&e.name))
        .any(|e| {
            !(e.name == ENV_CUDA_DEVICE_MEMORY_LIMIT
                && kai_cm.is_some()
                && e.config_map_key_ref() == kai_cm)
        })
}

/// Add `CUDA_DEVICE_MEMORY_LIMIT=<mib>m` to each of `targets` (the containers HAMi-core is
/// preloaded into) that does not set a memory-limit variable of its own. Returns the limit and the
/// containers whose limit is the webhook's (added now, or already present from an earlier review,
/// or replaced by KAI's own entry: `kai` = (KAI's fraction container, the ConfigMap of that
/// entry)). Other containers get no GPU from KAI (the runtime exposes it from the fraction
/// container's `NVIDIA_VISIBLE_DEVICES` only) and no HAMi-core: a cap there would cap nothing.
///
/// # Errors
/// [`Denial`] when `mib` is not a limit HAMi-core can hold (0 or too large).
pub fn memory_limit(
    m: &mut PodMutation<'_, '_>,
    mib: u64,
    targets: &[ContainerRef],
    kai: Option<(ContainerRef, &str)>,
) -> Result<(MemoryLimitMib, Vec<ContainerRef>), Denial> {
    let limit = MemoryLimitMib::new(mib)
        .map_err(|e| m.deny(format_args!("memory limit {mib} MiB: {e}")))?;
    // Re-formatted from the number: never the annotation's text (`04000m` would be octal).
    let value = limit.to_string();
    let pod = m.pod();
    let mut limited = Vec::new();
    for (at, container) in pod.all_containers().filter(|(at, _)| targets.contains(at)) {
        m.check_patch_size()?;
        let kai_cm = kai.filter(|(c, _)| *c == at).map(|(_, cm)| cm);
        match limit_state(container, &value, kai_cm) {
            LimitState::Unset => {
                if !m.patch.container_has_env(at, ENV_CUDA_DEVICE_MEMORY_LIMIT) {
                    m.patch
                        .add_env(at, ENV_CUDA_DEVICE_MEMORY_LIMIT, value.clone());
                }
                limited.push(at);
            }
            LimitState::Ours | LimitState::Kai => limited.push(at),
            LimitState::Own(how) => m.warn(format!(
                "container {:?} sets {how}; left as is (the KAI request would set {ENV_CUDA_DEVICE_MEMORY_LIMIT}={value})",
                container.name
            )),
        }
    }
    Ok((limit, limited))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::pod::Pod;

    #[test]
    fn memory_limit_var_names() {
        for yes in [
            "CUDA_DEVICE_MEMORY_LIMIT",
            "CUDA_DEVICE_MEMORY_LIMIT_0",
            "CUDA_DEVICE_MEMORY_LIMIT_15",
            "CUDA_DEVICE_MEMORY_LIMIT_99",
        ] {
            assert!(is_memory_limit_var(yes), "{yes}");
        }
        for no in [
            "CUDA_DEVICE_MEMORY_LIMITX",
            "CUDA_DEVICE_MEMORY_LIMIT_",
            "CUDA_DEVICE_MEMORY_LIMIT_a",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            "cuda_device_memory_limit",
            "CUDA_DEVICE_SM_LIMIT",
        ] {
            assert!(!is_memory_limit_var(no), "{no}");
        }
    }

    #[test]
    fn env_skipping_table() {
        // (env json, expected state)
        let cases: &[(&str, LimitState)] = &[
            ("null", LimitState::Unset),
            ("[]", LimitState::Unset),
            (r#"[{"name":"OTHER","value":"1"}]"#, LimitState::Unset),
            (
                r#"[{"name":"CUDA_DEVICE_MEMORY_LIMIT","value":"4096m"}]"#,
                LimitState::Ours,
            ),
            (
                r#"[{"name":"CUDA_DEVICE_MEMORY_LIMIT","value":"2000m"}]"#,
                LimitState::Own(r#"CUDA_DEVICE_MEMORY_LIMIT to "2000m""#.into()),
            ),
            (
                r#"[{"name":"CUDA_DEVICE_MEMORY_LIMIT","value":""}]"#,
                LimitState::Own(r#"CUDA_DEVICE_MEMORY_LIMIT to """#.into()),
            ),
            (
                r#"[{"name":"CUDA_DEVICE_MEMORY_LIMIT"}]"#,
                LimitState::Own(r#"CUDA_DEVICE_MEMORY_LIMIT to """#.into()),
            ),
            (
                r#"[{"name":"CUDA_DEVICE_MEMORY_LIMIT","valueFrom":{"configMapKeyRef":{"name":"x","key":"y"}}}]"#,
                LimitState::Own("CUDA_DEVICE_MEMORY_LIMIT from valueFrom".into()),
            ),
            (
                r#"[{"name":"CUDA_DEVICE_MEMORY_LIMIT","valueFrom":{"configMapKeyRef":{"name":"kai-cm-0","key":"k","optional":true}}}]"#,
                LimitState::Kai,
            ),
            (
                r#"[{"name":"CUDA_DEVICE_MEMORY_LIMIT_0","valueFrom":{"configMapKeyRef":{"name":"kai-cm-0","key":"k"}}}]"#,
                LimitState::Own("CUDA_DEVICE_MEMORY_LIMIT_0 from valueFrom".into()),
            ),
            (
                r#"[{"name":"CUDA_DEVICE_MEMORY_LIMIT","valueFrom":{"secretKeyRef":{"name":"kai-cm-0","key":"k"}}}]"#,
                LimitState::Own("CUDA_DEVICE_MEMORY_LIMIT from valueFrom".into()),
            ),
            (
                r#"[{"name":"CUDA_DEVICE_MEMORY_LIMIT_0","value":"4096m"}]"#,
                LimitState::Own(r#"CUDA_DEVICE_MEMORY_LIMIT_0 to "4096m""#.into()),
            ),
            (
                r#"[{"name":"CUDA_DEVICE_MEMORY_LIMIT_3","valueFrom":{"fieldRef":{"fieldPath":"x"}}}]"#,
                LimitState::Own("CUDA_DEVICE_MEMORY_LIMIT_3 from valueFrom".into()),
            ),
            (
                r#"[{"name":"CUDA_DEVICE_MEMORY_LIMIT","value":"4096m"},{"name":"CUDA_DEVICE_MEMORY_LIMIT_1","value":"1m"}]"#,
                LimitState::Own(r#"CUDA_DEVICE_MEMORY_LIMIT to "4096m""#.into()),
            ),
            (
                r#"[{"name":"CUDA_DEVICE_SM_LIMIT","value":"50"}]"#,
                LimitState::Unset,
            ),
        ];
        for (env, expected) in cases {
            let json = format!(r#"{{"spec":{{"containers":[{{"name":"c","env":{env}}}]}}}}"#);
            let pod: Pod<'_> = serde_json::from_str(&json).unwrap();
            assert_eq!(
                &limit_state(&pod.spec.containers[0], "4096m", Some("kai-cm-0")),
                expected,
                "{env}"
            );
        }
    }
}
