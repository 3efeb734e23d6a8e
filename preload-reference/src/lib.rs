//! What the preload library (`libhami_preload.so`) does with `/overrideEnv`: a pure decision over
//! the file's bytes and the names of the inherited environment variables.
//!
//! Released HAMi-core reads its settings from the environment at the first CUDA call and reads
//! `/overrideEnv` only late, on its NVML path, after the shared region was created from the
//! environment. The preload library, listed first in `/etc/ld.so.preload`, runs [`decide`] in its
//! ELF constructor and applies the result before `main`, so every process of the container — the
//! entrypoint, `kubectl exec`, an SSH login, `su -`, `sudo`, cron — is capped by the file.
//!
//! The rules:
//! - The file counts only when it holds at least one memory limit that HAMi-core reads as a limit
//!   ([`KeyKind::Memory`] with a positive reading). Otherwise — empty, garbage, no memory limit —
//!   the environment is left untouched ([`Decision::Untouched`]).
//! - When it counts, it is authoritative for HAMi-core's settings: every inherited
//!   [contract variable](is_contract_variable) is removed, then the file's contract entries are
//!   set. A key outside the contract (`LD_LIBRARY_PATH=…`) is never exported; every other variable
//!   of the process is left alone.
//! - The file is parsed with the tolerant [`hami_shared::limits_file::parse_bytes`]: a malformed
//!   line is skipped and the lines after it still count; CRLF endings are stripped. A memory entry that
//!   HAMi-core would read as "no limit" (`0`, garbage, a negative number) is skipped too: a limit
//!   is never turned into no limit.
//! - The reader reads at most [`READ_LIMIT_BYTES`]; when the file is longer, the cut last line is
//!   dropped (a cut `3000m` would read as `30` bytes).
//! - A KAI `gpu-fraction` container's file also holds `HAMI_GPU_FRACTION` and `HAMI_NODE_GPUS`
//!   ([`hami_shared::limits_file`]): the library then reads the node GPU file
//!   ([`hami_shared::node_gpus`]) and looks at the container's `/dev/nvidia<N>` devices
//!   ([`VisibleGpus`]); `CUDA_DEVICE_MEMORY_LIMIT` becomes `floor(fraction × MiB)m` of the smallest visible GPU ([`PerNode::Applied`]), or the
//!   admission-time value stands, with the reason ([`Kept`]). No environment is consulted: an SSH
//!   session has none.
//!
//! This crate is the reference: written with `std` over the contract's own parsers
//! ([`hami_shared::limits_file::parse_bytes`], [`hami_shared::node_gpus::parse`]). The library
//! decides with `hami_preload_core::decide` (no `std`, no allocation); the `preload_differential`
//! fuzz target and the tests of this crate feed both the same bytes and compare the environments
//! they produce ([`library_env`]). A test oracle only: no shipped program links it.
#![forbid(unsafe_code)]

pub mod library_env;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use hami_preload_core::decide::is_node_gpus_path;
use hami_preload_core::fraction;

use hami_shared::hami_core::{KeyKind, MemoryReading, interpret_memory, key_kind};
use hami_shared::limits_file::{Severity, parse_bytes};
use hami_shared::names::{ENV_CUDA_DEVICE_MEMORY_LIMIT, ENV_HAMI_GPU_FRACTION, ENV_HAMI_NODE_GPUS};
use hami_shared::node_gpus;
use hami_shared::preload::{NODE_GPUS_READ_LIMIT_BYTES, is_contract_variable, is_exported_key};

pub use hami_preload_core::decide::{Kept, PerNode, Untouched, VisibleGpus};
pub use hami_shared::preload::READ_LIMIT_BYTES;

/// What to do to the environment when the file counts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Overlay {
    /// Inherited contract variables to remove, in the order they were seen.
    pub remove: Vec<OsString>,
    /// The file's contract entries to set, sorted by key (`CUDA_DEVICE_MEMORY_LIMIT` replaced by
    /// the per-node cap when one applies).
    pub set: Vec<(String, String)>,
    /// Lines of the file that were skipped (malformed, or a memory value that reads as no limit).
    pub skipped_lines: usize,
    /// The per-node step, for a file with `HAMI_GPU_FRACTION`.
    pub per_node: Option<PerNode>,
}

/// The decision for one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Leave the environment exactly as it is.
    Untouched(Untouched),
    /// Remove, then set.
    Apply(Overlay),
}

impl Decision {
    /// One line for the opt-in diagnostic (no newline), as the library prints it.
    pub fn summary(&self) -> String {
        match self {
            Decision::Untouched(why) => {
                format!("hami-preload: environment untouched: {}", why.as_str())
            }
            Decision::Apply(o) => {
                let mut line = format!(
                    "hami-preload: applied the limits file: set {}, removed {} inherited, skipped {} line(s)",
                    o.set.len(),
                    o.remove.len(),
                    o.skipped_lines
                );
                match o.per_node {
                    None => {}
                    Some(PerNode::Applied { mib, gpu_mib, gpus }) => line.push_str(&format!(
                        "; per-node cap {mib} MiB (smallest of {gpus} visible GPU(s): {gpu_mib} MiB)"
                    )),
                    Some(PerNode::Kept(why)) => line.push_str(&format!(
                        "; admission-time cap kept: {}",
                        why.as_str()
                    )),
                }
                line
            }
        }
    }
}

/// What the library finds on the node for the per-node step: the node GPU file's bytes (or why
/// there are none) and the GPUs whose device nodes the container sees (or why `/dev` could not
/// be listed).
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    /// The node GPU file: the bytes read, or [`Kept::NodeFileMissing`],
    /// [`Kept::NodeFileNotRegular`], [`Kept::NodeFileUnreadable`].
    pub node_file: Result<&'a [u8], Kept>,
    /// The container's `/dev/nvidia<N>` devices, or [`Kept::DeviceScanFailed`].
    pub devices: Result<VisibleGpus, Kept>,
}

impl NodeView<'_> {
    /// No node GPU file and no GPU device.
    pub const ABSENT: NodeView<'static> = NodeView {
        node_file: Err(Kept::NodeFileMissing),
        devices: Ok(VisibleGpus::EMPTY),
    };
}

/// Decide what to do with a file's first bytes, without a node GPU file ([`NodeView::ABSENT`]).
///
/// `contents` are the bytes read (at most [`READ_LIMIT_BYTES`]); `truncated` is true when the file
/// is longer than that, in which case everything after the last newline is dropped. `inherited`
/// are the names of the process's environment variables.
pub fn decide<I, S>(contents: &[u8], truncated: bool, inherited: I) -> Decision
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    decide_on_node(contents, truncated, inherited, &NodeView::ABSENT)
}

/// [`decide`], with what the node offers for the per-node step.
pub fn decide_on_node<I, S>(
    contents: &[u8],
    truncated: bool,
    inherited: I,
    node: &NodeView<'_>,
) -> Decision
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let contents = if truncated {
        match contents.iter().rposition(|b| *b == b'\n') {
            Some(end) => &contents[..=end],
            None => return Decision::Untouched(Untouched::NoCompleteLine),
        }
    } else {
        contents
    };
    let parsed = parse_bytes(contents);
    let mut skipped_lines = parsed
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    let mut set: BTreeMap<&str, String> = BTreeMap::new();
    let mut has_memory_limit = false;
    for (key, value) in &parsed.entries {
        if !is_exported_key(key) {
            continue;
        }
        if let KeyKind::Memory(_) = key_kind(key) {
            match interpret_memory(value).reading {
                MemoryReading::Bytes(_) => has_memory_limit = true,
                MemoryReading::Unlimited => {
                    skipped_lines += 1;
                    continue;
                }
            }
        }
        set.insert(key, value.clone());
    }
    if !has_memory_limit {
        return Decision::Untouched(Untouched::NoMemoryLimit);
    }
    let per_node = parsed.entries.get(ENV_HAMI_GPU_FRACTION).map(|f| {
        per_node(
            f,
            set.contains_key(ENV_CUDA_DEVICE_MEMORY_LIMIT),
            parsed.entries.get(ENV_HAMI_NODE_GPUS).map(String::as_str),
            node,
        )
    });
    if let Some(PerNode::Applied { mib, .. }) = per_node {
        set.insert(ENV_CUDA_DEVICE_MEMORY_LIMIT, format!("{mib}m"));
    }
    let remove = inherited
        .into_iter()
        .filter(|name| is_contract_variable(name.as_ref().as_bytes()))
        .map(|name| name.as_ref().to_owned())
        .collect();
    Decision::Apply(Overlay {
        remove,
        set: set.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        skipped_lines,
        per_node,
    })
}

/// The per-node step of a file holding `HAMI_GPU_FRACTION=fraction`.
fn per_node(
    fraction: &str,
    has_admission_cap: bool,
    path: Option<&str>,
    node: &NodeView<'_>,
) -> PerNode {
    let kept = PerNode::Kept;
    let Some(digits) = fraction::parse_canonical(fraction.as_bytes()) else {
        return kept(Kept::FractionMalformed);
    };
    if !has_admission_cap {
        return kept(Kept::NoAdmissionCap);
    }
    let Some(path) = path else {
        return kept(Kept::NoNodeGpusPath);
    };
    if !is_node_gpus_path(path.as_bytes()) {
        return kept(Kept::NodeGpusPathInvalid);
    }
    let bytes = match node.node_file {
        Ok(b) if b.len() > NODE_GPUS_READ_LIMIT_BYTES => return kept(Kept::NodeFileTooLarge),
        Ok(b) => b,
        Err(why) => return kept(why),
    };
    let file = node_gpus::parse(bytes);
    if !file.usable() {
        return kept(Kept::NodeFileInvalid);
    }
    let devices = match node.devices {
        Ok(d) => d,
        Err(why) => return kept(why),
    };
    if devices.mismatch() {
        return kept(Kept::DeviceMismatch);
    }
    let mut smallest: Option<u64> = None;
    let mut gpus = 0;
    for minor in devices.minors() {
        let Some(mib) = file.mib_for(minor) else {
            return kept(Kept::GpuNotInFile(minor));
        };
        smallest = Some(smallest.map_or(mib, |s| s.min(mib)));
        gpus += 1;
    }
    let Some(gpu_mib) = smallest else {
        return kept(Kept::NoVisibleGpu);
    };
    match fraction::of_mib(digits, gpu_mib) {
        0 => kept(Kept::BelowOneMib),
        mib => PerNode::Applied { mib, gpu_mib, gpus },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(file: &str, env: &[&str]) -> Overlay {
        match decide(file.as_bytes(), false, env) {
            Decision::Apply(o) => o,
            Decision::Untouched(why) => panic!("untouched ({}) for {file:?}", why.as_str()),
        }
    }

    #[test]
    fn the_example_is_applied_over_spoofed_variables() {
        let o = apply(
            hami_shared::limits_file::EXAMPLE,
            &[
                "PATH",
                "CUDA_DEVICE_MEMORY_LIMIT_0",
                "CUDA_DEVICE_SM_LIMIT_3",
                "HOME",
            ],
        );
        assert_eq!(
            o.remove,
            vec![
                OsString::from("CUDA_DEVICE_MEMORY_LIMIT_0"),
                OsString::from("CUDA_DEVICE_SM_LIMIT_3")
            ]
        );
        assert_eq!(
            o.set,
            vec![
                ("CUDA_DEVICE_MEMORY_LIMIT_0".to_owned(), "3000m".to_owned()),
                (
                    "CUDA_DEVICE_MEMORY_SHARED_CACHE".to_owned(),
                    "/usr/local/vgpu/usage.cache".to_owned()
                ),
                ("CUDA_DEVICE_SM_LIMIT".to_owned(), "50".to_owned()),
            ]
        );
        assert_eq!((o.skipped_lines, o.per_node), (0, None));
    }

    #[test]
    fn untouched_without_a_memory_limit() {
        for file in [
            "",
            "\0\u{1}garbage",
            "CUDA_DEVICE_SM_LIMIT=50\nHAMI_LIMITS_FORMAT=1\n",
            "CUDA_DEVICE_MEMORY_LIMIT_0=0\n",
            "CUDA_DEVICE_MEMORY_LIMIT=abc\n",
            "CUDA_DEVICE_MEMORY_LIMIT_16=3000m\n",
            "CUDA_DEVICE_MEMORY_LIMIT_0=-1m\n",
        ] {
            assert_eq!(
                decide(file.as_bytes(), false, ["CUDA_DEVICE_MEMORY_LIMIT"]),
                Decision::Untouched(Untouched::NoMemoryLimit),
                "{file:?}"
            );
        }
    }

    #[test]
    fn truncated_reads_drop_the_cut_line() {
        let file = b"CUDA_DEVICE_MEMORY_LIMIT_0=3000m\nCUDA_DEVICE_MEMORY_LIMIT_1=30";
        let Decision::Apply(o) = decide(file, true, Vec::<OsString>::new()) else {
            panic!("not applied");
        };
        assert_eq!(
            o.set,
            vec![("CUDA_DEVICE_MEMORY_LIMIT_0".to_owned(), "3000m".to_owned())]
        );
        assert_eq!(
            decide(
                b"CUDA_DEVICE_MEMORY_LIMIT_0=3000m",
                true,
                Vec::<OsString>::new()
            ),
            Decision::Untouched(Untouched::NoCompleteLine)
        );
    }
}
