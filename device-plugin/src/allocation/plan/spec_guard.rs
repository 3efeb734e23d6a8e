//! What a GPU container's own spec may not do, checked at `Allocate` whether or not the webhook
//! reviewed the pod (pure: no I/O). The webhook is the first line; this is the backstop for a pod
//! admitted without it (`failurePolicy: Ignore` while it was down, a pod created before the
//! install, a bypass not yet found), so that such a pod fails to start instead of starting
//! uncapped:
//!
//! - **mounts**: a `volumeMounts[].mountPath` or `volumeDevices[].devicePath` at, above or below
//!   `/overrideEnv` (the limits file; HAMi-core and the preload library both read it),
//!   `/etc/ld.so.preload` (the list that loads HAMi-core; not checked when the container is
//!   allowed to turn it off with `CUDA_DISABLE_CONTROL`) or `<HOOK_PATH>/vgpu` (HAMi-core, the
//!   preload library, the per-container folder); at or below `/tmp/vgpulock` (not above: an
//!   `emptyDir` at `/tmp` is common and hides nothing, the runtime mounts the deeper path on
//!   top). Paths are compared cleaned as Go's `path.Clean` does ([`hami_shared::mountpath`]);
//!   `subPath` does not change where a mount lands.
//! - **privilege**: `securityContext.privileged: true` (every GPU of the node, and any mount can
//!   be undone), or `capabilities.add` naming `SYS_ADMIN` or `ALL` (a root process may unmount
//!   or cover `/overrideEnv` and `/etc/ld.so.preload`). Unless the namespace is in
//!   [`GuardSettings::privileged_namespaces`].
//! - **env**: HAMi-core's variables (memory limits, SM limits, shared cache, oversubscription,
//!   log level, host-PID broker, `CUDA_REDIRECT`, `ACTIVE_OOM_KILLER`, `RECORD_KERNEL_INTERVAL`)
//!   and `CUDA_DISABLE_CONTROL`, literal or `valueFrom`, the webhook's list: in `env` delivery
//!   kubelet lets the spec's value win over `Allocate`'s. `CUDA_TASK_PRIORITY` and
//!   `GPU_CORE_UTILIZATION_POLICY` are the webhook's to set: a value other than the one it sets
//!   (from the priority limit, from `gpuCorePolicy`) is refused, except HAMi-core's default
//!   priority `1` where no limit is set and the strictest policy `force`. Unless the namespace
//!   is in [`GuardSettings::hami_core_env_namespaces`].
//!
//! Not seen here: `envFrom` (the ConfigMap or Secret is not read at `Allocate`; in `file` mode
//! the preload library replaces inherited HAMi-core variables with the file's in every
//! dynamically linked process, in `env` mode the webhook refuses it); `allowPrivilegeEscalation`
//! (it gains no capability outside the container's bounding set).

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

use hami_shared::mountpath::{Overlap, overlap, resolve};
use hami_shared::names::{
    ENV_CUDA_DISABLE_CONTROL, ENV_CUDA_TASK_PRIORITY, ENV_GPU_CORE_UTILIZATION_POLICY,
    LD_SO_PRELOAD_PATH, OVERRIDE_ENV_PATH, VGPU_LOCK_PATH,
};
use hami_shared::preload::is_system_variable;
use hami_shared::values::{CorePolicy, TaskPriority};
use k8s_openapi::api::core::v1::Container;
use serde::Serialize;

use super::codec::ContainerSlot;

/// The operator's escape hatches and what the webhook sets, for the checks of this module.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GuardSettings {
    /// Namespaces whose GPU containers may be privileged or add `SYS_ADMIN` (the webhook's
    /// `denyPrivilegedGpuContainers: false` has the same effect cluster-wide at admission).
    pub privileged_namespaces: BTreeSet<String>,
    /// Namespaces whose GPU containers may set HAMi-core's variables and `CUDA_DISABLE_CONTROL`
    /// in their spec, as HAMi lets every pod do.
    pub hami_core_env_namespaces: BTreeSet<String>,
    /// `resourcePriorityName`: the limit the webhook turns into `CUDA_TASK_PRIORITY`.
    pub priority_resource: String,
    /// `gpuCorePolicy`: what the webhook sets as `GPU_CORE_UTILIZATION_POLICY` (nothing for
    /// `default`).
    pub core_policy: CorePolicy,
}

/// Where a container mount lands, and why there is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Protected<'a> {
    path: &'a str,
    what: &'static str,
    /// Whether a mount above it is refused too.
    above: bool,
}

/// The spec field a refusal names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field(String);

impl Field {
    fn new(slot: ContainerSlot, rest: fmt::Arguments<'_>) -> Self {
        let base = match slot {
            ContainerSlot::Init(i) => format!("spec.initContainers[{i}]"),
            ContainerSlot::App(i) => format!("spec.containers[{i}]"),
        };
        Self(format!("{base}.{rest}"))
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a GPU container's own spec is refused at `Allocate`; each names the field and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecRefusal {
    /// A mount or block device at, above or below a path the device plugin provides.
    #[error(
        "{field}={path:?} (cleaned {resolved}) is {} {protected}, where the device plugin mounts {what}: the container's mount would replace or hide it; remove or move the mount",
        overlap.describe()
    )]
    Mount {
        /// `spec.containers[i].volumeMounts[j].mountPath` or `...volumeDevices[j].devicePath`.
        field: Field,
        /// The path as written.
        path: String,
        /// The path as the runtime resolves it.
        resolved: String,
        /// How it stands to the protected path.
        overlap: Overlap,
        /// The protected path.
        protected: String,
        /// What the device plugin mounts there.
        what: &'static str,
    },
    /// `securityContext.privileged: true`.
    #[error(
        "{field}=true: a privileged container sees every GPU of the node and can undo the device plugin's mounts; allowed only in the namespaces of the device plugin's --allow-privileged-namespaces"
    )]
    Privileged {
        /// `spec.containers[i].securityContext.privileged`.
        field: Field,
    },
    /// `securityContext.capabilities.add` names `SYS_ADMIN` or `ALL`.
    #[error(
        "{field} adds {capability:?}: a root process with it can unmount or cover /overrideEnv and /etc/ld.so.preload; allowed only in the namespaces of the device plugin's --allow-privileged-namespaces"
    )]
    Capability {
        /// `spec.containers[i].securityContext.capabilities.add[j]`.
        field: Field,
        /// The capability as written.
        capability: String,
    },
    /// The container's own env sets a variable the system owns.
    #[error(
        "{field} sets {name} ({value}): HAMi-core's variables and {ENV_CUDA_DISABLE_CONTROL} are the device plugin's to set (in env delivery the spec's value would win over the granted one); remove it, or list the namespace in the device plugin's --allow-hami-core-env-namespaces"
    )]
    Env {
        /// `spec.containers[i].env[j]`.
        field: Field,
        /// The variable.
        name: String,
        /// `"value"` or `from valueFrom`.
        value: SpecEnvValue,
    },
    /// `CUDA_TASK_PRIORITY` or `GPU_CORE_UTILIZATION_POLICY` other than what the webhook sets.
    #[error(
        "{field} sets {name} ({value}) but the webhook sets {}: it is set from {source_of}; remove it, or list the namespace in the device plugin's --allow-hami-core-env-namespaces",
        expected.as_deref().map_or_else(|| "nothing".to_owned(), |e| format!("{e:?}"))
    )]
    WebhookEnv {
        /// `spec.containers[i].env[j]`.
        field: Field,
        /// The variable.
        name: String,
        /// The spec's value.
        value: SpecEnvValue,
        /// What the webhook sets (`None`: nothing).
        expected: Option<String>,
        /// The setting or limit it comes from.
        source_of: String,
    },
}

/// An env entry's value, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecEnvValue {
    /// A literal value.
    Literal(String),
    /// `valueFrom` (known only when the container starts).
    ValueFrom,
}

impl fmt::Display for SpecEnvValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Literal(v) => write!(f, "{v:?}"),
            Self::ValueFrom => f.write_str("from valueFrom"),
        }
    }
}

impl SpecRefusal {
    /// The Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Mount { .. } => "GpuContainerMountRefused",
            Self::Privileged { .. } | Self::Capability { .. } => "GpuContainerPrivilegeRefused",
            Self::Env { .. } | Self::WebhookEnv { .. } => "GpuContainerEnvRefused",
        }
    }
}

/// Whether `name` is one of the system's variables the pod may never set (outside the allowed
/// namespaces): the webhook's list ([`hami_shared::preload::is_system_variable`]) but the two
/// the webhook sets itself, checked against its value.
pub fn is_system_owned(name: &str) -> bool {
    is_system_variable(name)
        && name != ENV_CUDA_TASK_PRIORITY
        && name != ENV_GPU_CORE_UTILIZATION_POLICY
}

/// What the spec guard needs to know about the container and its plan.
#[derive(Debug, Clone, Copy)]
pub struct GuardInput<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// Which container of the spec.
    pub slot: ContainerSlot,
    /// The container.
    pub container: &'a Container,
    /// `<HOOK_PATH>/vgpu` on the container side.
    pub vgpu_dir: &'a Path,
    /// Static MIG: no HAMi-core, so only privilege is checked.
    pub mig: bool,
    /// Whether the plan mounts the preload list (not when `CUDA_DISABLE_CONTROL` turns it off).
    pub preload: bool,
}

/// Every refusal of the container's spec, in spec order (privilege, env, mounts); empty when it
/// may start.
pub fn check(input: &GuardInput<'_>, settings: &GuardSettings) -> Vec<SpecRefusal> {
    let mut refusals = Vec::new();
    if !settings.privileged_namespaces.contains(input.namespace) {
        privilege(input, &mut refusals);
    }
    if input.mig {
        return refusals;
    }
    if !settings.hami_core_env_namespaces.contains(input.namespace) {
        env(input, settings, &mut refusals);
    }
    mounts(input, &mut refusals);
    refusals
}

fn privilege(input: &GuardInput<'_>, refusals: &mut Vec<SpecRefusal>) {
    let Some(sc) = &input.container.security_context else {
        return;
    };
    if sc.privileged == Some(true) {
        refusals.push(SpecRefusal::Privileged {
            field: Field::new(input.slot, format_args!("securityContext.privileged")),
        });
    }
    let added = sc.capabilities.as_ref().and_then(|c| c.add.as_ref());
    for (j, cap) in added.into_iter().flatten().enumerate() {
        // Kubernetes passes the name through to the runtime, which accepts it with or without
        // `CAP_` and in any case.
        let bare = cap.trim().to_ascii_uppercase();
        let bare = bare.strip_prefix("CAP_").unwrap_or(&bare);
        if bare == "SYS_ADMIN" || bare == "ALL" {
            refusals.push(SpecRefusal::Capability {
                field: Field::new(
                    input.slot,
                    format_args!("securityContext.capabilities.add[{j}]"),
                ),
                capability: cap.clone(),
            });
        }
    }
}

fn env(input: &GuardInput<'_>, settings: &GuardSettings, refusals: &mut Vec<SpecRefusal>) {
    for (j, e) in input.container.env.iter().flatten().enumerate() {
        let value = match (&e.value_from, &e.value) {
            (Some(_), _) => SpecEnvValue::ValueFrom,
            (None, v) => SpecEnvValue::Literal(v.clone().unwrap_or_default()),
        };
        let field = Field::new(input.slot, format_args!("env[{j}]"));
        if is_system_owned(&e.name) {
            refusals.push(SpecRefusal::Env {
                field,
                name: e.name.clone(),
                value,
            });
            continue;
        }
        let (expected, source_of) = if e.name == ENV_CUDA_TASK_PRIORITY {
            let limit = input
                .container
                .resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get(&settings.priority_resource));
            // The webhook's rendering of the limit (a limit that is not an integer is denied).
            let expected =
                limit.and_then(|q| q.0.parse::<TaskPriority>().ok().map(|p| p.to_string()));
            (
                expected,
                format!("the container's {} limit", settings.priority_resource),
            )
        } else if e.name == ENV_GPU_CORE_UTILIZATION_POLICY {
            let policy = settings.core_policy;
            (
                (policy != CorePolicy::Default).then(|| policy.as_str().to_owned()),
                format!("gpuCorePolicy ({})", policy.as_str()),
            )
        } else {
            continue;
        };
        // What the webhook sets, or what takes nothing from anyone: HAMi-core's own default
        // priority when no limit grants another, the strictest policy.
        let harmless = match &value {
            SpecEnvValue::Literal(v) => {
                expected.as_deref() == Some(v.as_str())
                    || (e.name == ENV_CUDA_TASK_PRIORITY
                        && expected.is_none()
                        && *v == TaskPriority::DEFAULT.to_string())
                    || (e.name == ENV_GPU_CORE_UTILIZATION_POLICY
                        && v == CorePolicy::Force.as_str())
            }
            SpecEnvValue::ValueFrom => false,
        };
        if !harmless {
            refusals.push(SpecRefusal::WebhookEnv {
                field,
                name: e.name.clone(),
                value,
                expected,
                source_of,
            });
        }
    }
}

fn mounts(input: &GuardInput<'_>, refusals: &mut Vec<SpecRefusal>) {
    let vgpu = resolve(&input.vgpu_dir.display().to_string()).into_owned();
    let mut protected = vec![
        Protected {
            path: OVERRIDE_ENV_PATH,
            what: "the limits file",
            above: true,
        },
        Protected {
            path: &vgpu,
            what: "HAMi-core, the preload library and the container's own folder",
            above: true,
        },
        Protected {
            path: VGPU_LOCK_PATH,
            what: "HAMi-core's lock folder",
            above: false,
        },
    ];
    if input.preload {
        protected.push(Protected {
            path: LD_SO_PRELOAD_PATH,
            what: "the preload list that loads HAMi-core",
            above: true,
        });
    }
    let c = input.container;
    let paths = c
        .volume_mounts
        .iter()
        .flatten()
        .enumerate()
        .map(|(j, m)| (format!("volumeMounts[{j}].mountPath"), &m.mount_path))
        .chain(
            c.volume_devices
                .iter()
                .flatten()
                .enumerate()
                .map(|(j, d)| (format!("volumeDevices[{j}].devicePath"), &d.device_path)),
        );
    for (field, path) in paths {
        let resolved = resolve(path);
        // One refusal per mount: the first protected path it overlaps.
        let hit = protected.iter().find_map(|p| {
            overlap(&resolved, p.path)
                .filter(|o| p.above || *o != Overlap::Above)
                .map(|o| (p, o))
        });
        if let Some((p, o)) = hit {
            refusals.push(SpecRefusal::Mount {
                field: Field::new(input.slot, format_args!("{field}")),
                path: path.clone(),
                resolved: resolved.into_owned(),
                overlap: o,
                protected: p.path.to_owned(),
                what: p.what,
            });
        }
    }
}

/// Namespaces exempt from parts of `Allocate`'s checks of a GPU container's own spec (default:
/// none). Shared by `run` and `plan`.
#[derive(Debug, Clone, Default)]
pub struct GuardArgs {
    /// Namespaces (comma-separated) whose GPU containers may be privileged or add SYS_ADMIN.
    pub allow_privileged_namespaces: Vec<String>,
    /// Namespaces (comma-separated) whose GPU containers may set HAMi-core's variables,
    /// CUDA_DISABLE_CONTROL, CUDA_TASK_PRIORITY and GPU_CORE_UTILIZATION_POLICY in their spec, as
    /// HAMi allows every pod.
    pub allow_hami_core_env_namespaces: Vec<String>,
}

impl GuardArgs {
    /// Applies the lists to the guard settings.
    pub fn apply(&self, guard: &mut GuardSettings) {
        guard
            .privileged_namespaces
            .extend(self.allow_privileged_namespaces.iter().cloned());
        guard
            .hami_core_env_namespaces
            .extend(self.allow_hami_core_env_namespaces.iter().cloned());
    }
}
