//! The limits file for KAI pods, delivered through a downward-API volume: no host writes.
//!
//! KAI binds its fractional pods with NVIDIA's device plugin, so ours never sees them and cannot
//! publish a limits file on the host. Kubernetes can: the file's text is stored in a pod
//! annotation the webhook owns, and a `downwardAPI` volume projects that annotation as a file,
//! written by kubelet (atomically, root-owned, mode 0444) and mounted read-only at `/overrideEnv`
//! with `subPath`.
//!
//! Key scheme: `limits.hami.io/<container name>`. An annotation key is an optional DNS-subdomain
//! prefix, `/`, and a name of at most 63 characters (`[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`).
//! A container name is a DNS-1123 label (at most 63 characters, `[a-z0-9]([-a-z0-9]*[a-z0-9])?`),
//! so it is always a valid name part on its own, and the prefix says which container it is for:
//! `hami.io/limits-<container>` would exceed 63 characters for a 57-character container name.
//! The webhook owns every key under `limits.hami.io/`: on CREATE each is set to what it computed,
//! and any other key under that prefix is removed, so a user cannot supply their own file.
//!
//! What a file holds ([`FileCap`]): the admission-time `CUDA_DEVICE_MEMORY_LIMIT`; for
//! `gpu-fraction` in a preloaded container also `HAMI_GPU_FRACTION` and `HAMI_NODE_GPUS`, from
//! which the preload library computes the exact cap of the GPU the container sees on its node; and
//! for a pod admitted without a cap (`kai.missingBasis: warn`) only `HAMI_UNCAPPED=<reason>`.

use std::collections::{HashMap, HashSet};

use hami_shared::container::{LimitsBuilder, PlanWarning};
use hami_shared::limits_file::{GpuFraction, LimitsFile, LimitsFileError, NodeGpusPath};
use hami_shared::names::{ANNOTATION_LIMIT_DELIVERY, OVERRIDE_ENV_PATH};
use hami_shared::values::{LimitDelivery, MemoryLimitMib};
use serde_json::Value;

use crate::policy::basis::SkipReason;
use crate::policy::kai::inject::{MountSource, OurMount, check_mounts};
use crate::policy::mutation::{Denial, PodMutation, ProjectedFile};
use crate::wire::patch::{DownwardApi, DownwardItem, DownwardVolume, FieldRef, NewMount};
use crate::wire::pod::ContainerRef;

/// Prefix of the webhook-owned annotation keys (`limits.hami.io/<container>`).
pub const ANNOTATION_PREFIX: &str = "limits.hami.io/";
/// The downward-API volume projecting them.
pub const LIMITS_VOLUME: &str = "hami-limits";
/// `defaultMode` of the projected files: 0444.
pub const FILE_MODE: u32 = 0o444;
/// The API server's limit on all annotations of one object, keys and values
/// (`TotalAnnotationSizeLimitB`, 256 KiB).
pub const MAX_ANNOTATION_BYTES: usize = 256 * 1024;

/// `limits.hami.io/<container>`.
#[must_use]
pub fn annotation_key(container: &str) -> String {
    format!("{ANNOTATION_PREFIX}{container}")
}

/// The `fieldPath` projecting a container's annotation.
#[must_use]
pub fn field_path(container: &str) -> String {
    format!("metadata.annotations['{ANNOTATION_PREFIX}{container}']")
}

/// What one container's limits file says about its GPU memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileCap<'s> {
    /// The admission-time cap alone: `CUDA_DEVICE_MEMORY_LIMIT=<N>m` (`gpu-memory`; a
    /// `gpu-fraction` container without the preload, or whose fraction the file cannot hold).
    Limit(MemoryLimitMib),
    /// `gpu-fraction` in a container with the preload: the admission-time cap, and
    /// `HAMI_GPU_FRACTION` / `HAMI_NODE_GPUS` from which the preload library computes the exact
    /// cap of the GPU(s) the container sees on its node.
    PerNode {
        /// The admission-time cap (the fraction of the smallest GPU the pod could land on).
        limit: MemoryLimitMib,
        /// The fraction, canonical (`0.25`).
        fraction: &'s GpuFraction,
        /// The node GPU file's container path (`<kai.hookPath>/node-gpus`).
        node_gpus: &'s NodeGpusPath,
    },
    /// No cap (`kai.missingBasis: warn`, no basis): `HAMI_UNCAPPED=<reason>`, for
    /// `hami-limits check` in the container to say so.
    Uncapped(SkipReason),
}

/// The limits file for one container, built by the shared [`LimitsBuilder`] as the device plugin
/// builds its own: what `cap` says, the format line, and the variables of
/// [`hami_shared::container::COPIED_FROM_SPEC`] copied from the container's `env` (the last entry
/// of a name wins, as in Kubernetes) when HAMi-core reads them as meant. Returns the file and a
/// warning per variable left out.
#[must_use]
///
/// `shared_cache`: the container path of the region file every process of the container is to
/// join (`hami.io/preload` delivery: the slot folder `serve-preload` mounts), written as
/// `CUDA_DEVICE_MEMORY_SHARED_CACHE` beside a memory limit.
pub fn limits_file(
    container: &crate::wire::pod::Container<'_>,
    cap: FileCap<'_>,
    shared_cache: Option<&str>,
) -> (LimitsFile, Vec<PlanWarning>) {
    let mut builder = LimitsBuilder::new(&container.name);
    if let Some(path) = shared_cache
        && !matches!(cap, FileCap::Uncapped(_))
    {
        // A constant absolute path: the builder cannot refuse it.
        let _ = builder.shared_cache(path);
    }
    let refused = match cap {
        FileCap::Limit(limit) => {
            // `None`: `CUDA_DEVICE_MEMORY_LIMIT`, every GPU of the container; cannot fail.
            let _ = builder.memory_limit(None, limit);
            None
        }
        FileCap::PerNode {
            limit,
            fraction,
            node_gpus,
        } => {
            let _ = builder.memory_limit(None, limit);
            // Both checked when they were made (typed): nothing to refuse here.
            builder.per_node(fraction.clone(), node_gpus.clone());
            None
        }
        FileCap::Uncapped(reason) => builder.uncapped(reason.as_str()).err(),
    };
    // A file without a memory limit leaves the environment alone in the preload library: nothing
    // else is worth copying into it.
    if !matches!(cap, FileCap::Uncapped(_)) {
        builder.copy_from_spec(&container.spec_env());
    }
    let (file, mut warnings) = builder.finish();
    warnings.extend(refused.map(|e| refusal(container, e)));
    (file, warnings)
}

/// A key the builder refused, as the warning the user sees.
fn refusal(container: &crate::wire::pod::Container<'_>, e: LimitsFileError) -> PlanWarning {
    let (key, value, reason) = match e {
        LimitsFileError::UnsafeValue { key, value, reason } => (key, value, reason),
        other => (String::new(), String::new(), other.to_string()),
    };
    PlanWarning::NotCopied {
        container: container.name.to_string(),
        key,
        value,
        reason,
    }
}

/// In `file` mode, give each container in `files` its limits file (what its [`FileCap`] says;
/// for those in `shared_cache`, also `CUDA_DEVICE_MEMORY_SHARED_CACHE` at their slot's region):
/// the annotation, one item of the downward-API volume, and a read-only `subPath` mount at
/// `/overrideEnv`. In `env` mode nothing is added. In both modes, webhook-owned annotations the
/// pod should not carry are removed, and a container in `files` may not mount anything else at
/// `/overrideEnv` (HAMi-core would read that file instead of the cap).
///
/// # Errors
/// [`Denial`] for a mount of the container's own at, above or inside `/overrideEnv` (see
/// [`check_mounts`]), a pod-defined volume named `hami-limits` that
/// is not the webhook's, or a container name that is not a DNS-1123 label.
pub fn deliver(
    m: &mut PodMutation<'_, '_>,
    files: &[(ContainerRef, FileCap<'_>)],
    delivery: LimitDelivery,
    shared_cache: &[ContainerRef],
) -> Result<(), Denial> {
    check_override_env_mounts(m, files)?;
    let wanted = if delivery == LimitDelivery::File {
        wanted_files(m, files, shared_cache)?
    } else {
        Vec::new()
    };
    // Webhook-owned keys: set what is wanted, remove the rest.
    let names: Vec<&str> = wanted.iter().map(|w| w.container.as_str()).collect();
    remove_owned_annotations(m, &names);
    if wanted.is_empty() {
        return Ok(());
    }
    set_annotations(m, &wanted);
    m.check_patch_size()?;
    project_volume(m, &wanted)?;
    mount_files(m, &wanted);
    for w in wanted {
        m.project(ProjectedFile {
            container: w.container,
            text: w.text,
        });
    }
    Ok(())
}

/// One container's limits file, as the pod will carry it.
struct Wanted {
    at: ContainerRef,
    container: String,
    text: String,
}

/// A container in `files` may not mount anything of its own at `/overrideEnv`.
fn check_override_env_mounts(
    m: &PodMutation<'_, '_>,
    files: &[(ContainerRef, FileCap<'_>)],
) -> Result<(), Denial> {
    let pod = m.pod();
    for &(at, _) in files {
        let Some(c) = pod.container(at) else { continue };
        check_mounts(
            m,
            c,
            &[OurMount {
                source: MountSource::Volume(LIMITS_VOLUME),
                path: OVERRIDE_ENV_PATH,
                sub_path: Some(&c.name),
                what: "the limits file HAMi-core reads; the path is reserved for hami-limits",
            }],
        )?;
    }
    Ok(())
}

/// Each container's limits file (the builder's warnings go to the user), within the API server's
/// limit on one object's annotations.
fn wanted_files(
    m: &mut PodMutation<'_, '_>,
    files: &[(ContainerRef, FileCap<'_>)],
    shared_cache: &[ContainerRef],
) -> Result<Vec<Wanted>, Denial> {
    let pod = m.pod();
    // The API server refuses an object whose annotations (keys and values) pass 256 KiB: stop
    // as soon as the limits files would, rather than build a patch that cannot be stored.
    let mut annotation_bytes: usize = pod
        .metadata
        .annotations
        .iter()
        .flat_map(|a| a.iter())
        .filter(|(k, _)| !k.starts_with(ANNOTATION_PREFIX))
        .map(|(k, v)| k.len() + v.len())
        .sum();
    let mut wanted = Vec::with_capacity(files.len());
    for &(at, cap) in files {
        let Some(c) = pod.container(at) else { continue };
        if !hami_shared::container::is_dns1123_label(&c.name) {
            return Err(m.deny(format_args!(
                "container name {:?} is not a DNS-1123 label",
                c.name
            )));
        }
        let cache = shared_cache
            .contains(&at)
            .then_some(hami_shared::names::KAI_SHARED_CACHE);
        let (file, warnings) = limits_file(c, cap, cache);
        for w in warnings {
            m.warn(w.to_string());
        }
        let text = file.render();
        annotation_bytes += ANNOTATION_PREFIX.len() + c.name.len() + text.len();
        if annotation_bytes > MAX_ANNOTATION_BYTES {
            return Err(m.deny(format_args!(
                "the limits files of its {} containers would bring the pod's annotations past {} KiB, the API server's limit for one object; use fewer containers, or {ANNOTATION_LIMIT_DELIVERY}: env (the limit as a variable, no file)",
                files.len(),
                MAX_ANNOTATION_BYTES / 1024
            )));
        }
        wanted.push(Wanted {
            at,
            container: c.name.to_string(),
            text,
        });
    }
    Ok(wanted)
}

/// `limits.hami.io/<container>` set to each file's text, where the pod does not already carry it.
fn set_annotations(m: &mut PodMutation<'_, '_>, wanted: &[Wanted]) {
    let pod = m.pod();
    let current: HashMap<&str, &str> = pod
        .metadata
        .annotations
        .iter()
        .flat_map(|a| a.iter())
        .filter(|(k, _)| k.starts_with(ANNOTATION_PREFIX))
        .collect();
    for w in wanted {
        let key = annotation_key(&w.container);
        if current.get(key.as_str()) != Some(&w.text.as_str()) {
            m.patch.set_annotation_owned(key, w.text.clone());
        }
    }
}

/// The downward-API volume projecting the annotations: added, or (added by an earlier review)
/// checked to project exactly the wanted ones.
///
/// # Errors
/// [`Denial`] for a pod-defined volume named `hami-limits` that is not the webhook's.
fn project_volume(m: &mut PodMutation<'_, '_>, wanted: &[Wanted]) -> Result<(), Denial> {
    let existing = m
        .pod()
        .spec
        .volumes
        .as_deref()
        .and_then(|v| v.iter().find(|v| v.name == LIMITS_VOLUME));
    let Some(existing) = existing else {
        m.patch.add_downward_volume(DownwardVolume {
            name: LIMITS_VOLUME.to_owned(),
            downward_api: DownwardApi {
                default_mode: FILE_MODE,
                items: wanted
                    .iter()
                    .map(|w| DownwardItem {
                        path: w.container.clone(),
                        field_ref: FieldRef {
                            api_version: "v1",
                            field_path: field_path(&w.container),
                        },
                    })
                    .collect(),
            },
        });
        return Ok(());
    };
    let projected = existing
        .downward_api
        .and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok())
        .and_then(|v| v.get("items").cloned())
        .map(|items| item_pairs(&items));
    let mut expected: Vec<(String, String)> = wanted
        .iter()
        .map(|w| (w.container.clone(), field_path(&w.container)))
        .collect();
    expected.sort();
    if projected.as_ref() != Some(&expected) {
        return Err(m.deny(format_args!(
            "volume {LIMITS_VOLUME:?} is reserved for the hami-limits limits files and does not project them"
        )));
    }
    Ok(())
}

/// Each file mounted read-only at `/overrideEnv` (`subPath`: the container's name), unless the
/// patch already mounts something there.
fn mount_files(m: &mut PodMutation<'_, '_>, wanted: &[Wanted]) {
    for w in wanted {
        if m.patch.container_has_mount_path(w.at, OVERRIDE_ENV_PATH) {
            continue;
        }
        m.patch.add_volume_mount(
            w.at,
            NewMount {
                name: LIMITS_VOLUME.to_owned(),
                mount_path: OVERRIDE_ENV_PATH.to_owned(),
                sub_path: Some(w.container.clone()),
                read_only: true,
            },
        );
    }
}

/// Remove every webhook-owned annotation (`limits.hami.io/*`) except those of `keep` containers:
/// a user cannot supply a limits file of their own, in any delivery mode.
pub fn remove_owned_annotations(m: &mut PodMutation<'_, '_>, keep: &[&str]) {
    let keep: HashSet<&str> = keep.iter().copied().collect();
    let pod = m.pod();
    let stale = pod
        .metadata
        .annotations
        .iter()
        .flat_map(|a| a.iter())
        .map(|(k, _)| k)
        .filter(|k| {
            k.strip_prefix(ANNOTATION_PREFIX)
                .is_some_and(|name| !keep.contains(&name))
        });
    for key in stale {
        m.patch.remove_annotation(key);
    }
}

/// (path, fieldPath) of each downward-API item, sorted.
fn item_pairs(items: &Value) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = items
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| {
                    let s = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_owned();
                    (s(i.get("path")), s(i.pointer("/fieldRef/fieldPath")))
                })
                .collect()
        })
        .unwrap_or_default();
    pairs.sort();
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest valid annotation key name part is 63 characters; a prefix is separate.
    fn is_valid_annotation_key(key: &str) -> bool {
        let (prefix, name) = match key.rsplit_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, key),
        };
        let name_ok = !name.is_empty()
            && name.len() <= 63
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && name.as_bytes()[0].is_ascii_alphanumeric()
            && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
        let prefix_ok = prefix.is_none_or(|p| {
            p.len() <= 253
                && p.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                })
        });
        name_ok && prefix_ok
    }

    #[test]
    fn key_scheme_fits_every_container_name() {
        let longest = "a".repeat(63);
        let with_dashes = format!("a{}z", "-".repeat(61));
        for name in [
            "c",
            "0",
            "main",
            "worker-0",
            longest.as_str(),
            with_dashes.as_str(),
        ] {
            assert!(hami_shared::container::is_dns1123_label(name), "{name}");
            let key = annotation_key(name);
            assert!(is_valid_annotation_key(&key), "{key}");
        }
        // The scheme a naive reader might pick would not fit.
        assert!(!is_valid_annotation_key(&format!(
            "hami.io/limits-{longest}"
        )));
    }
}
