//! One container's limits, as both programs build them: the [`ContainerKey`] that names its files,
//! and the [`LimitsBuilder`] that decides which variables go into its limits file and how.
//!
//! The device plugin (HAMi pods) and the webhook (KAI pods) both call the builder, so the two files
//! follow one rule:
//! - values the program computes go through typed setters ([`MemoryLimitMib`], [`SmLimit`],
//!   [`CorePolicy`]);
//! - the variables of [`COPIED_FROM_SPEC`] are copied from the container spec's `env`, where
//!   **the last entry of a name wins**, as in Kubernetes; a value the program set itself is never
//!   replaced by a copied one;
//! - a copied value is written only when HAMi-core reads it as meant, in the contract's canonical
//!   spelling (no whitespace, no leading zero, no unknown word); anything else is left out with a
//!   typed [`PlanWarning`] that names the container, the key and the value.

use std::fmt;

use serde::Serialize;

use crate::hami_core;
use crate::limits_file::{GpuFraction, LimitsFile, LimitsFileError, NodeGpusPath};
use crate::names::{
    ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE, ENV_CUDA_OVERSUBSCRIBE, ENV_CUDA_TASK_PRIORITY,
    ENV_GPU_CORE_UTILIZATION_POLICY, ENV_HAMI_UNCAPPED, ENV_LIBVGPU_HOSTPID_BROKER,
    container_dir_name, limits_file_name,
};
use crate::values::{CorePolicy, MemoryLimitMib, SmLimit, TaskPriority};

// ---------------------------------------------------------------------------------------------
// ContainerKey
// ---------------------------------------------------------------------------------------------

/// True for a DNS-1123 label: what Kubernetes requires of a container name (and what makes a
/// safe file-name part: no `/`, no `.`, at most 63 characters).
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// True for a UUID in the canonical 8-4-4-4-12 hexadecimal form Kubernetes uses for pod UIDs.
pub fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// What [`ContainerKey::new`] returns.
pub type Result<T, E = ContainerKeyError> = std::result::Result<T, E>;

/// Why a pod UID and container name cannot name a container's files.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContainerKeyError {
    /// The pod UID is not a UUID.
    #[error("pod UID {uid:?} is not a UUID (8-4-4-4-12 hexadecimal digits)")]
    PodUid {
        /// The value.
        uid: String,
    },
    /// The container name is not a DNS-1123 label.
    #[error(
        "container name {name:?} is not a DNS-1123 label (at most 63 characters of a-z, 0-9 and '-', starting and ending with a letter or digit)"
    )]
    ContainerName {
        /// The value.
        name: String,
    },
}

/// A pod UID and a container name, both validated: the only way to name a container's folder
/// and limits file, so that nothing can escape `<HOOK>/vgpu/containers`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerKey {
    pod_uid: String,
    container: String,
}

impl ContainerKey {
    /// Validate both parts.
    pub fn new(pod_uid: &str, container: &str) -> Result<Self> {
        if !is_uuid(pod_uid) {
            return Err(ContainerKeyError::PodUid {
                uid: pod_uid.to_owned(),
            });
        }
        if !is_dns1123_label(container) {
            return Err(ContainerKeyError::ContainerName {
                name: container.to_owned(),
            });
        }
        Ok(Self {
            pod_uid: pod_uid.to_owned(),
            container: container.to_owned(),
        })
    }

    /// The pod UID.
    pub fn pod_uid(&self) -> &str {
        &self.pod_uid
    }

    /// The container name.
    pub fn container(&self) -> &str {
        &self.container
    }

    /// `<podUID>_<container>`: the per-container folder under `<HOOK>/vgpu/containers`.
    pub fn dir_name(&self) -> String {
        container_dir_name(&self.pod_uid, &self.container)
    }

    /// `<podUID>_<container>.limits`: the limits file beside that folder.
    pub fn limits_file_name(&self) -> String {
        limits_file_name(&self.pod_uid, &self.container)
    }
}

impl fmt::Display for ContainerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.dir_name())
    }
}

// ---------------------------------------------------------------------------------------------
// The container spec's env
// ---------------------------------------------------------------------------------------------

/// Variables copied from the container spec's `env` into the limits file, when the program did
/// not set them itself: the webhook sets `CUDA_TASK_PRIORITY` and `GPU_CORE_UTILIZATION_POLICY`
/// on HAMi pods, and a user may set the others. HAMi-core reads all four.
pub const COPIED_FROM_SPEC: [&str; 4] = [
    ENV_CUDA_TASK_PRIORITY,
    ENV_GPU_CORE_UTILIZATION_POLICY,
    ENV_LIBVGPU_HOSTPID_BROKER,
    ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE,
];

/// One `env` entry of a container spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecEnv<'a> {
    /// The name.
    pub name: &'a str,
    /// The literal value; `None` for a `valueFrom` entry (known only when the container starts).
    pub value: Option<&'a str>,
}

/// What a container's `env` says about `name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecValue<'a> {
    /// No entry.
    Absent,
    /// The last entry is a literal value.
    Literal(&'a str),
    /// The last entry is a `valueFrom` (ConfigMap, Secret, field, resource).
    ValueFrom,
}

/// The value of `name` in `env`: the **last** entry of that name wins, as in Kubernetes.
pub fn spec_value<'a>(env: &[SpecEnv<'a>], name: &str) -> SpecValue<'a> {
    match env.iter().rev().find(|e| e.name == name) {
        None => SpecValue::Absent,
        Some(SpecEnv { value: Some(v), .. }) => SpecValue::Literal(v),
        Some(SpecEnv { value: None, .. }) => SpecValue::ValueFrom,
    }
}

// ---------------------------------------------------------------------------------------------
// Warnings
// ---------------------------------------------------------------------------------------------

/// Something the builder left out, and why. Shown to users as a warning (admission warning,
/// Event, log line); never an error: the container still gets its caps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum PlanWarning {
    /// A copied variable whose value HAMi-core would not read as meant, or that the contract
    /// refuses.
    NotCopied {
        /// The container.
        container: String,
        /// The variable.
        key: String,
        /// Its value in the spec.
        value: String,
        /// What is wrong, with the accepted forms.
        reason: String,
    },
    /// A copied variable set with `valueFrom`: its value is known only when the container starts.
    ValueFrom {
        /// The container.
        container: String,
        /// The variable.
        key: String,
    },
}

impl fmt::Display for PlanWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanWarning::NotCopied {
                container,
                key,
                value,
                reason,
            } => write!(
                f,
                "container {container:?}: {key}={value:?} left out of its limits file: {reason}"
            ),
            PlanWarning::ValueFrom { container, key } => write!(
                f,
                "container {container:?}: {key} is set with valueFrom, so its value is not known at admission; left out of its limits file"
            ),
        }
    }
}

/// Why a copied value is not written, or `None` when it is written as it is.
fn copy_refusal(key: &str, value: &str) -> Option<String> {
    let problems = hami_core::check_entry(key, value);
    if !problems.is_empty() {
        return Some(problems.join("; "));
    }
    match key {
        ENV_CUDA_TASK_PRIORITY => match value.parse::<TaskPriority>() {
            Ok(p) if p.to_string() == value => None,
            Ok(p) => Some(format!(
                "not in canonical form (write {p}): the contract writes integers without leading zeros"
            )),
            Err(e) => Some(e.to_string()),
        },
        ENV_GPU_CORE_UTILIZATION_POLICY => value.parse::<CorePolicy>().err().map(|e| e.to_string()),
        ENV_LIBVGPU_HOSTPID_BROKER => match value {
            "0" | "1" => None,
            _ => Some("accepted values: 0, 1".to_owned()),
        },
        ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE => {
            if value.starts_with('/') && !value.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                None
            } else {
                Some("not an absolute path without white space".to_owned())
            }
        }
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// The builder
// ---------------------------------------------------------------------------------------------

/// Builds one container's limits file (see the module documentation).
#[derive(Debug, Clone)]
pub struct LimitsBuilder {
    container: String,
    file: LimitsFile,
    warnings: Vec<PlanWarning>,
}

impl LimitsBuilder {
    /// An empty file (`HAMI_LIMITS_FORMAT=1` only) for `container`.
    pub fn new(container: &str) -> Self {
        Self {
            container: container.to_owned(),
            file: LimitsFile::new(),
            warnings: Vec::new(),
        }
    }

    /// `CUDA_DEVICE_MEMORY_LIMIT_<index>`, or `CUDA_DEVICE_MEMORY_LIMIT` for `None` (KAI: every
    /// GPU of the container). Fails only for an index HAMi-core never reads (above 15).
    pub fn memory_limit(
        &mut self,
        index: Option<usize>,
        limit: MemoryLimitMib,
    ) -> Result<&mut Self, LimitsFileError> {
        match index {
            Some(i) => self.file.set_memory_limit(i, limit)?,
            None => self.file.set_memory_limit_all(limit),
        }
        Ok(self)
    }

    /// `CUDA_DEVICE_SM_LIMIT`.
    pub fn sm_limit(&mut self, limit: SmLimit) -> &mut Self {
        self.file.set_sm_limit(limit);
        self
    }

    /// `CUDA_DEVICE_MEMORY_SHARED_CACHE` (a container path).
    pub fn shared_cache(&mut self, path: &str) -> Result<&mut Self, LimitsFileError> {
        if let Some(reason) = copy_refusal(ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE, path) {
            return Err(LimitsFileError::UnsafeValue {
                key: ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE.to_owned(),
                value: path.to_owned(),
                reason,
            });
        }
        self.file
            .insert(ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE, path)?;
        Ok(self)
    }

    /// `HAMI_GPU_FRACTION=<fraction>` and `HAMI_NODE_GPUS=<node_gpus>`, both or neither (KAI
    /// `gpu-fraction`, file delivery, beside the admission-time memory limit): with them the
    /// preload library caps the container at `floor(fraction × MiB)` of the GPU(s) it sees on its
    /// node, read from the node GPU file at `node_gpus` (a container path).
    ///
    /// # Errors
    /// [`LimitsFileError::UnsafeValue`] for a fraction not in canonical form
    /// ([`crate::limits_file::GPU_FRACTION_FORM`]) or a path that is not absolute or holds white
    /// space; nothing is set then.
    pub fn per_node_fraction(
        &mut self,
        fraction: &str,
        node_gpus: &str,
    ) -> Result<&mut Self, LimitsFileError> {
        let fraction = GpuFraction::new(fraction)?;
        let node_gpus = NodeGpusPath::new(node_gpus)?;
        Ok(self.per_node(fraction, node_gpus))
    }

    /// [`LimitsBuilder::per_node_fraction`] for values checked already (the webhook's).
    pub fn per_node(&mut self, fraction: GpuFraction, node_gpus: NodeGpusPath) -> &mut Self {
        self.file.set_per_node_fraction(fraction, node_gpus);
        self
    }

    /// `HAMI_UNCAPPED=<reason>`: the container runs without a GPU memory cap (a KAI `gpu-fraction`
    /// pod admitted with `kai.missingBasis: warn`), for `hami-limits check` to report.
    ///
    /// # Errors
    /// [`LimitsFileError::UnsafeValue`] for a reason that is not a label (`a-z`, `0-9`, `-`).
    pub fn uncapped(&mut self, reason: &str) -> Result<&mut Self, LimitsFileError> {
        self.file.insert(ENV_HAMI_UNCAPPED, reason)?;
        Ok(self)
    }

    /// `CUDA_OVERSUBSCRIBE=true` (memory scaling above 1).
    pub fn oversubscribe(&mut self) -> &mut Self {
        // A fixed, valid key and value: cannot fail.
        let _ = self.file.insert(ENV_CUDA_OVERSUBSCRIBE, "true");
        self
    }

    /// `LIBCUDA_LOG_LEVEL` (0..=4).
    pub fn log_level(&mut self, level: u8) -> Result<&mut Self, LimitsFileError> {
        self.file.set_log_level(level)?;
        Ok(self)
    }

    /// `GPU_CORE_UTILIZATION_POLICY`.
    pub fn core_policy(&mut self, policy: CorePolicy) -> &mut Self {
        self.file.set_core_policy(policy);
        self
    }

    /// Copy the variables of [`COPIED_FROM_SPEC`] from the container spec's `env` (last entry
    /// wins), except those already set; a value HAMi-core would not read as meant is left out
    /// with a warning.
    pub fn copy_from_spec(&mut self, env: &[SpecEnv<'_>]) -> &mut Self {
        for key in COPIED_FROM_SPEC {
            if self.file.contains_key(key) {
                continue;
            }
            match spec_value(env, key) {
                SpecValue::Absent => {}
                SpecValue::ValueFrom => self.warnings.push(PlanWarning::ValueFrom {
                    container: self.container.clone(),
                    key: key.to_owned(),
                }),
                SpecValue::Literal(value) => {
                    let refused = copy_refusal(key, value)
                        .or_else(|| self.file.insert(key, value).err().map(|e| e.to_string()));
                    if let Some(reason) = refused {
                        self.warnings.push(PlanWarning::NotCopied {
                            container: self.container.clone(),
                            key: key.to_owned(),
                            value: value.to_owned(),
                            reason,
                        });
                    }
                }
            }
        }
        self
    }

    /// The value set for `key` so far, as the file will hold it.
    pub fn text(&self, key: &str) -> Option<String> {
        self.file.text(key)
    }

    /// The file and the warnings.
    pub fn finish(self) -> (LimitsFile, Vec<PlanWarning>) {
        (self.file, self.warnings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &[(&'a str, Option<&'a str>)]) -> Vec<SpecEnv<'a>> {
        pairs
            .iter()
            .map(|(name, value)| SpecEnv {
                name,
                value: *value,
            })
            .collect()
    }

    #[test]
    fn keys_name_files_and_refuse_what_could_escape() {
        let k = ContainerKey::new("5c0a8f52-1d3e-4b6f-8a9c-0e1f2a3b4c5d", "cuda").unwrap();
        assert_eq!(k.dir_name(), "5c0a8f52-1d3e-4b6f-8a9c-0e1f2a3b4c5d_cuda");
        assert_eq!(
            k.limits_file_name(),
            "5c0a8f52-1d3e-4b6f-8a9c-0e1f2a3b4c5d_cuda.limits"
        );
        for name in [
            "",
            "../x",
            "a/b",
            "UPPER",
            "-a",
            "a-",
            "a.b",
            &"a".repeat(64),
        ] {
            assert!(
                ContainerKey::new("5c0a8f52-1d3e-4b6f-8a9c-0e1f2a3b4c5d", name).is_err(),
                "{name:?}"
            );
        }
        for uid in [
            "",
            "x",
            "../../etc",
            "5c0a8f52-1d3e-4b6f-8a9c-0e1f2a3b4c5",
            "5c0a8f52x1d3e-4b6f-8a9c-0e1f2a3b4c5d",
        ] {
            assert!(ContainerKey::new(uid, "cuda").is_err(), "{uid:?}");
        }
    }

    #[test]
    fn the_last_entry_of_a_name_wins() {
        let e = env(&[
            ("CUDA_TASK_PRIORITY", Some("1")),
            ("OTHER", Some("x")),
            ("CUDA_TASK_PRIORITY", Some("2")),
        ]);
        let mut b = LimitsBuilder::new("c");
        b.copy_from_spec(&e);
        assert_eq!(b.text("CUDA_TASK_PRIORITY").as_deref(), Some("2"));
        // A later valueFrom hides an earlier literal.
        let e = env(&[
            ("CUDA_TASK_PRIORITY", Some("1")),
            ("CUDA_TASK_PRIORITY", None),
        ]);
        let mut b = LimitsBuilder::new("c");
        b.copy_from_spec(&e);
        let (file, warnings) = b.finish();
        assert_eq!(file.text("CUDA_TASK_PRIORITY"), None);
        assert!(matches!(warnings[0], PlanWarning::ValueFrom { .. }));
    }

    #[test]
    fn only_values_hami_core_reads_as_meant_are_copied() {
        for (key, value) in [
            ("CUDA_TASK_PRIORITY", " 1"),
            ("CUDA_TASK_PRIORITY", "01"),
            ("CUDA_TASK_PRIORITY", "abc"),
            ("CUDA_TASK_PRIORITY", "+1"),
            ("GPU_CORE_UTILIZATION_POLICY", "FORCE"),
            ("GPU_CORE_UTILIZATION_POLICY", "force "),
            ("LIBVGPU_HOSTPID_BROKER", "01"),
            ("LIBVGPU_HOSTPID_BROKER", " 1"),
            ("LIBVGPU_HOSTPID_BROKER", "true"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "relative/path"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/with space"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/a\rb"),
        ] {
            let e = env(&[(key, Some(value))]);
            let mut b = LimitsBuilder::new("c");
            b.copy_from_spec(&e);
            let (file, warnings) = b.finish();
            assert_eq!(file.text(key), None, "{key}={value:?}");
            assert_eq!(warnings.len(), 1, "{key}={value:?}");
            assert!(warnings[0].to_string().contains(key));
        }
        for (key, value) in [
            ("CUDA_TASK_PRIORITY", "0"),
            ("CUDA_TASK_PRIORITY", "-3"),
            ("GPU_CORE_UTILIZATION_POLICY", "disable"),
            ("LIBVGPU_HOSTPID_BROKER", "1"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/usr/local/vgpu/x.cache"),
        ] {
            let e = env(&[(key, Some(value))]);
            let mut b = LimitsBuilder::new("c");
            b.copy_from_spec(&e);
            let (file, warnings) = b.finish();
            assert_eq!(file.text(key).as_deref(), Some(value), "{key}={value:?}");
            assert!(warnings.is_empty());
        }
    }

    #[test]
    fn per_node_fraction_is_both_keys_or_neither() {
        let mut b = LimitsBuilder::new("c");
        b.memory_limit(None, MemoryLimitMib::new(4096).unwrap())
            .unwrap();
        b.per_node_fraction("0.25", "/usr/local/vgpu/node-gpus")
            .unwrap();
        let (file, warnings) = b.finish();
        assert!(warnings.is_empty());
        let text = file.render();
        assert_eq!(
            text,
            "CUDA_DEVICE_MEMORY_LIMIT=4096m\nHAMI_GPU_FRACTION=0.25\nHAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/usr/local/vgpu/node-gpus\n"
        );
        assert!(crate::limits_file::parse(&text).is_clean());
        for (fraction, path, key) in [
            ("0.250", "/usr/local/vgpu/node-gpus", "HAMI_GPU_FRACTION"),
            ("25e-2", "/usr/local/vgpu/node-gpus", "HAMI_GPU_FRACTION"),
            ("0.25", "usr/local/vgpu/node-gpus", "HAMI_NODE_GPUS"),
            ("0.25", "/usr/local/v gpu/node-gpus", "HAMI_NODE_GPUS"),
        ] {
            let mut b = LimitsBuilder::new("c");
            let err = b.per_node_fraction(fraction, path).unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
            let (file, _) = b.finish();
            assert_eq!(file.text("HAMI_GPU_FRACTION"), None, "{fraction} {path}");
            assert_eq!(file.text("HAMI_NODE_GPUS"), None, "{fraction} {path}");
        }
    }

    #[test]
    fn an_uncapped_file_holds_the_reason_only() {
        let mut b = LimitsBuilder::new("c");
        b.uncapped("no-matching-node").unwrap();
        let (file, _) = b.finish();
        assert_eq!(
            file.render(),
            "HAMI_LIMITS_FORMAT=1\nHAMI_UNCAPPED=no-matching-node\n"
        );
        assert!(
            LimitsBuilder::new("c")
                .uncapped("no matching node")
                .is_err()
        );
    }

    #[test]
    fn what_the_program_sets_wins_over_the_spec() {
        let e = env(&[
            ("GPU_CORE_UTILIZATION_POLICY", Some("force")),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", Some("/tmp/mine")),
        ]);
        let mut b = LimitsBuilder::new("c");
        b.core_policy(CorePolicy::Disable);
        b.shared_cache("/usr/local/vgpu/usage.cache").unwrap();
        b.memory_limit(Some(0), MemoryLimitMib::new(3000).unwrap())
            .unwrap();
        b.sm_limit(SmLimit::new(50).unwrap());
        b.copy_from_spec(&e);
        let (file, warnings) = b.finish();
        assert!(warnings.is_empty());
        assert_eq!(
            file.render(),
            "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\nCUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/usage.cache\n\
             CUDA_DEVICE_SM_LIMIT=50\nGPU_CORE_UTILIZATION_POLICY=disable\nHAMI_LIMITS_FORMAT=1\n"
        );
    }
}
