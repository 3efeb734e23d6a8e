//! The node GPU file: each GPU of a node with the minor number of its `/dev/nvidia<minor>`, its
//! UUID and its total memory in MiB. `hami-device-plugin install-hook` publishes it beside the
//! libraries (`<hook>/vgpu/node-gpus`, and the KAI hook folder), atomically and read-only, from
//! NVML or, on a machine without NVIDIA GPUs, from the inventory file. The preload library reads
//! it in KAI `gpu-fraction` containers to compute the per-node cap.
//!
//! Format (version 1), the limits file's `KEY=VALUE` grammar, one entry a line, `\n` endings:
//!
//! ```text
//! HAMI_NODE_GPUS_FORMAT=1
//! NVIDIA0_MIB=143771
//! NVIDIA0_UUID=GPU-4d3c2b1a-0000-0000-0000-000000000000
//! NVIDIA1_MIB=143771
//! NVIDIA1_UUID=GPU-4d3c2b1a-0000-0000-0000-000000000001
//! ```
//!
//! - `HAMI_NODE_GPUS_FORMAT=1` is required; a reader ignores a file without it or of another
//!   version (the admission-time cap then stands).
//! - `NVIDIA<minor>_MIB`: total memory in MiB as NVML reports it (`memory.total / 2^20`), a decimal
//!   integer 1..=[`MAX_MIB`] without leading zero. `<minor>` is 0..=254, without leading zero.
//! - `NVIDIA<minor>_UUID`: the NVML UUID, 1..=64 characters of `[A-Za-z0-9._-]` (informational:
//!   the preload library matches GPUs by minor number, the identity the container's device nodes
//!   carry).
//!
//! The render is strict ([`NodeGpus::render`] refuses nothing it cannot write back exactly); the
//! parse ([`parse`]) is the tolerant line parser of the limits file plus a strict check of every
//! value, with diagnostics in the same form, so `hami-limits check --node-gpus` reports them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::limits_file::{Diagnostic, Severity, parse_bytes};
use crate::names::{ENV_HAMI_NODE_GPUS_FORMAT, MAX_GPU_MINOR, NODE_GPUS_FORMAT_VERSION};

/// The largest memory size a `NVIDIA<minor>_MIB` entry may state: 16 TiB in MiB.
pub use hami_preload_core::names::NODE_GPU_MAX_MIB as MAX_MIB;
/// The longest UUID.
pub use hami_preload_core::names::NODE_GPU_MAX_UUID_LEN as MAX_UUID_LEN;

/// One GPU of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGpu {
    /// Minor number of `/dev/nvidia<minor>` (NVML `nvmlDeviceGetMinorNumber`).
    pub minor: u32,
    /// NVML UUID.
    pub uuid: String,
    /// Total memory in MiB.
    pub memory_mib: u64,
}

/// What the writer of this module returns.
pub type Result<T, E = NodeGpusError> = std::result::Result<T, E>;

/// Why a GPU cannot be written into the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeGpusError {
    /// Minor number out of range.
    #[error("GPU {uuid:?}: minor number {minor} is not in 0..={MAX_GPU_MINOR}")]
    Minor {
        /// The UUID.
        uuid: String,
        /// The minor.
        minor: u32,
    },
    /// Memory out of range.
    #[error("GPU {uuid:?} (minor {minor}): memory {mib} MiB is not in 1..={MAX_MIB}")]
    Memory {
        /// The UUID.
        uuid: String,
        /// The minor.
        minor: u32,
        /// The MiB.
        mib: u64,
    },
    /// UUID not writable.
    #[error(
        "GPU with minor {minor}: UUID {uuid:?} is not 1..={MAX_UUID_LEN} characters of letters, digits, '.', '_', '-'"
    )]
    Uuid {
        /// The minor.
        minor: u32,
        /// The UUID.
        uuid: String,
    },
    /// Two GPUs with one minor.
    #[error("GPUs {first:?} and {second:?} both have minor number {minor}")]
    DuplicateMinor {
        /// The minor.
        minor: u32,
        /// The first GPU's UUID.
        first: String,
        /// The second GPU's UUID.
        second: String,
    },
}

/// The GPUs of a node, by minor number.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeGpus {
    gpus: BTreeMap<u32, NodeGpu>,
}

/// True for a UUID the file can hold.
pub fn is_valid_uuid(uuid: &str) -> bool {
    !uuid.is_empty()
        && uuid.len() <= MAX_UUID_LEN
        && uuid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// `NVIDIA<minor>_MIB`.
pub fn mib_key(minor: u32) -> String {
    format!("NVIDIA{minor}_MIB")
}

/// `NVIDIA<minor>_UUID`.
pub fn uuid_key(minor: u32) -> String {
    format!("NVIDIA{minor}_UUID")
}

/// A decimal integer without sign, white space or leading zero (`0` itself excluded).
fn strict_decimal(text: &str) -> Option<u64> {
    if text.is_empty() || text.starts_with('0') || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// `NVIDIA<minor>_<field>` split into the minor and the field; `None` for any other key.
pub fn split_key(key: &str) -> Option<(u32, &str)> {
    let rest = key.strip_prefix("NVIDIA")?;
    let (minor, field) = rest.split_once('_')?;
    let minor = if minor == "0" {
        0
    } else {
        strict_decimal(minor).and_then(|m| u32::try_from(m).ok())?
    };
    (minor <= MAX_GPU_MINOR).then_some((minor, field))
}

impl NodeGpus {
    /// No GPUs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a GPU.
    ///
    /// # Errors
    /// [`NodeGpusError`] for a value the file cannot hold or a second GPU with the same minor.
    pub fn insert(&mut self, gpu: NodeGpu) -> Result<()> {
        if gpu.minor > MAX_GPU_MINOR {
            return Err(NodeGpusError::Minor {
                uuid: gpu.uuid,
                minor: gpu.minor,
            });
        }
        if !is_valid_uuid(&gpu.uuid) {
            return Err(NodeGpusError::Uuid {
                minor: gpu.minor,
                uuid: gpu.uuid,
            });
        }
        if gpu.memory_mib == 0 || gpu.memory_mib > MAX_MIB {
            return Err(NodeGpusError::Memory {
                uuid: gpu.uuid,
                minor: gpu.minor,
                mib: gpu.memory_mib,
            });
        }
        if let Some(first) = self.gpus.get(&gpu.minor) {
            return Err(NodeGpusError::DuplicateMinor {
                minor: gpu.minor,
                first: first.uuid.clone(),
                second: gpu.uuid,
            });
        }
        self.gpus.insert(gpu.minor, gpu);
        Ok(())
    }

    /// The GPUs, by minor number.
    pub fn gpus(&self) -> impl Iterator<Item = &NodeGpu> {
        self.gpus.values()
    }

    /// The GPU with this minor number.
    pub fn by_minor(&self, minor: u32) -> Option<&NodeGpu> {
        self.gpus.get(&minor)
    }

    /// True without GPUs.
    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    /// The file's text: the format line, then each GPU's two entries by minor number.
    pub fn render(&self) -> String {
        let mut out = format!("{ENV_HAMI_NODE_GPUS_FORMAT}={NODE_GPUS_FORMAT_VERSION}\n");
        for g in self.gpus.values() {
            let _ = writeln!(out, "{}={}", mib_key(g.minor), g.memory_mib);
            let _ = writeln!(out, "{}={}", uuid_key(g.minor), g.uuid);
        }
        out
    }
}

/// What [`parse`] found: the GPUs whose entries are all valid, and a diagnostic per problem.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedNodeGpus {
    /// `HAMI_NODE_GPUS_FORMAT`, when present and a positive integer.
    pub format: Option<u32>,
    /// Minor → MiB of every `NVIDIA<minor>_MIB` entry with a valid value (what the preload library
    /// uses), whether or not its UUID entry is there.
    pub memory_mib: BTreeMap<u32, u64>,
    /// Minor → UUID of every valid `NVIDIA<minor>_UUID` entry.
    pub uuids: BTreeMap<u32, String>,
    /// Problems, in line order where they have one.
    pub diagnostics: Vec<Diagnostic>,
}

impl ParsedNodeGpus {
    /// True when the preload library would use the file: format 1 and no error.
    pub fn usable(&self) -> bool {
        self.format == Some(NODE_GPUS_FORMAT_VERSION)
            && !self
                .diagnostics
                .iter()
                .any(|d| d.severity == Severity::Error)
    }

    /// The MiB the preload library reads for a minor number: the entry when the file is of
    /// format 1 (entries with bad values are absent).
    pub fn mib_for(&self, minor: u32) -> Option<u64> {
        (self.format == Some(NODE_GPUS_FORMAT_VERSION))
            .then(|| self.memory_mib.get(&minor).copied())
            .flatten()
    }
}

/// The 1-based line of each key's last entry (the one that counts): where a problem with its value
/// is reported.
fn key_lines(bytes: &[u8]) -> BTreeMap<&str, usize> {
    let mut lines = BTreeMap::new();
    for (i, raw) in bytes.split(|b| *b == b'\n').enumerate() {
        let key = raw
            .iter()
            .position(|b| *b == b'=')
            .and_then(|eq| std::str::from_utf8(&raw[..eq]).ok());
        if let Some(key) = key {
            lines.insert(key, i + 1);
        }
    }
    lines
}

/// Parse a node GPU file, tolerantly (every problem reported, the valid entries kept). A
/// diagnostic about an entry names the line of the entry that counts (the last of its key); one
/// about the file as a whole (no format line) has line 0. Diagnostics are in line order.
pub fn parse(bytes: &[u8]) -> ParsedNodeGpus {
    let lines = parse_bytes(bytes);
    let line_of = key_lines(bytes);
    let at = |key: &str| line_of.get(key).copied().unwrap_or(0);
    let mut out = ParsedNodeGpus {
        diagnostics: lines
            .diagnostics
            .into_iter()
            .filter(|d| !is_limits_format_warning(d))
            .collect(),
        ..ParsedNodeGpus::default()
    };
    for (key, value) in &lines.entries {
        if key == ENV_HAMI_NODE_GPUS_FORMAT {
            out.read_format(key, value, at(key));
        } else {
            out.read_gpu_entry(key, value, at(key));
        }
    }
    let has_format_line = lines
        .entries
        .keys()
        .any(|k| k.as_str() == ENV_HAMI_NODE_GPUS_FORMAT);
    out.check_whole_file(has_format_line, at);
    // Stable: the line parser's findings keep their order within a line.
    out.diagnostics.sort_by_key(|d| d.line);
    out
}

/// A warning the limits file's line parser gives about a `HAMI_LIMITS_FORMAT` value, which means
/// nothing in a node GPU file (the key is reported there as an ignored key). Only those warnings
/// are dropped: an error — a malformed line, whatever text it quotes — always stands (a filter on
/// the text alone once hid the error of a line `NVIDIAHAMI_LIMITS_FORMAT771`, found by the
/// `preload_differential` fuzz target: this reader called the file valid, the library did not).
fn is_limits_format_warning(d: &Diagnostic) -> bool {
    let value_warning = d
        .message
        .strip_prefix(crate::names::ENV_HAMI_LIMITS_FORMAT)
        .is_some_and(|rest| rest.starts_with('='));
    let newer = d.message.starts_with("format ") && d.message.contains("newer than this reader");
    d.severity == Severity::Warning && (value_warning || newer)
}

/// An error about `line`.
fn error(line: usize, message: String) -> Diagnostic {
    Diagnostic {
        line,
        severity: Severity::Error,
        message,
    }
}

impl ParsedNodeGpus {
    /// `HAMI_NODE_GPUS_FORMAT`: the format, or an error when it is not the one this reader knows.
    fn read_format(&mut self, key: &str, value: &str, line: usize) {
        self.format = strict_decimal(value).and_then(|v| u32::try_from(v).ok());
        match self.format {
            Some(NODE_GPUS_FORMAT_VERSION) => {}
            Some(v) => self.diagnostics.push(error(line, format!(
                "{key}={v}: this reader knows format {NODE_GPUS_FORMAT_VERSION}; the preload library ignores the file"
            ))),
            None => self.diagnostics.push(error(line, format!(
                "{key}={value:?} is not a positive integer; the preload library ignores the file"
            ))),
        }
    }

    /// `NVIDIA<minor>_MIB` or `NVIDIA<minor>_UUID`, kept when its value is valid; any other key
    /// is ignored with a warning.
    fn read_gpu_entry(&mut self, key: &str, value: &str, line: usize) {
        match split_key(key) {
            Some((minor, "MIB")) => match strict_decimal(value).filter(|m| *m <= MAX_MIB) {
                Some(mib) => {
                    self.memory_mib.insert(minor, mib);
                }
                None => self.diagnostics.push(error(line, format!(
                    "{key}={value:?}: memory must be a decimal number of MiB in 1..={MAX_MIB} without leading zero; the preload library cannot size a GPU from it"
                ))),
            },
            Some((minor, "UUID")) => {
                if is_valid_uuid(value) {
                    self.uuids.insert(minor, value.to_owned());
                } else {
                    self.diagnostics.push(error(line, format!(
                        "{key}={value:?}: not 1..={MAX_UUID_LEN} characters of letters, digits, '.', '_', '-'"
                    )));
                }
            }
            _ => self.diagnostics.push(Diagnostic {
                line,
                severity: Severity::Warning,
                message: format!(
                    "key {key} is not one of {ENV_HAMI_NODE_GPUS_FORMAT}, NVIDIA<minor>_MIB, NVIDIA<minor>_UUID (minor 0..={MAX_GPU_MINOR}, no leading zero): ignored"
                ),
            }),
        }
    }

    /// What only the whole file shows: no format line, a GPU's MiB without its UUID (`at` gives
    /// a key's line).
    fn check_whole_file(&mut self, has_format_line: bool, at: impl Fn(&str) -> usize) {
        if self.format.is_none() && !has_format_line {
            self.diagnostics.push(error(
                0,
                format!(
                    "no {ENV_HAMI_NODE_GPUS_FORMAT} line: the preload library ignores the file"
                ),
            ));
        }
        for minor in self.memory_mib.keys() {
            if !self.uuids.contains_key(minor) {
                self.diagnostics.push(Diagnostic {
                    line: at(&mib_key(*minor)),
                    severity: Severity::Warning,
                    message: format!("{} has no {}", mib_key(*minor), uuid_key(*minor)),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> NodeGpus {
        let mut g = NodeGpus::new();
        for (minor, mib) in [(0, 143_771), (3, 81_559)] {
            g.insert(NodeGpu {
                minor,
                uuid: format!("GPU-{minor}"),
                memory_mib: mib,
            })
            .unwrap_or_else(|e| unreachable!("{e}"));
        }
        g
    }

    #[test]
    fn render_and_parse_agree() {
        let text = example().render();
        assert_eq!(
            text,
            "HAMI_NODE_GPUS_FORMAT=1\nNVIDIA0_MIB=143771\nNVIDIA0_UUID=GPU-0\nNVIDIA3_MIB=81559\nNVIDIA3_UUID=GPU-3\n"
        );
        let p = parse(text.as_bytes());
        assert!(p.usable(), "{:?}", p.diagnostics);
        assert!(p.diagnostics.is_empty(), "{:?}", p.diagnostics);
        assert_eq!(p.mib_for(0), Some(143_771));
        assert_eq!(p.mib_for(3), Some(81_559));
        assert_eq!(p.mib_for(1), None);
    }

    #[test]
    fn insert_refuses_what_it_cannot_write() {
        let mut g = example();
        let gpu = |minor, uuid: &str, memory_mib| NodeGpu {
            minor,
            uuid: uuid.to_owned(),
            memory_mib,
        };
        assert!(matches!(
            g.insert(gpu(255, "GPU-x", 1)),
            Err(NodeGpusError::Minor { .. })
        ));
        assert!(matches!(
            g.insert(gpu(1, "GPU x", 1)),
            Err(NodeGpusError::Uuid { .. })
        ));
        assert!(matches!(
            g.insert(gpu(1, "GPU-x", 0)),
            Err(NodeGpusError::Memory { .. })
        ));
        assert!(matches!(
            g.insert(gpu(0, "GPU-y", 1)),
            Err(NodeGpusError::DuplicateMinor { .. })
        ));
    }

    #[test]
    fn bad_files_are_reported_and_not_usable() {
        for (text, needle) in [
            ("NVIDIA0_MIB=1\n", "no HAMI_NODE_GPUS_FORMAT line"),
            ("HAMI_NODE_GPUS_FORMAT=2\nNVIDIA0_MIB=1\n", "knows format 1"),
            ("HAMI_NODE_GPUS_FORMAT=1\nNVIDIA0_MIB=080\n", "leading zero"),
            ("HAMI_NODE_GPUS_FORMAT=1\nNVIDIA0_MIB=0\n", "leading zero"),
            (
                "HAMI_NODE_GPUS_FORMAT=1\nNVIDIA0_MIB= 80\n",
                "without leading zero",
            ),
            ("HAMI_NODE_GPUS_FORMAT=1\nNVIDIA0_UUID=a b\n", "not 1..=64"),
            (
                "HAMI_NODE_GPUS_FORMAT=1\nnvidia0_MIB=1\n",
                "not of the form",
            ),
        ] {
            let p = parse(text.as_bytes());
            assert!(!p.usable(), "{text:?}");
            assert!(
                p.diagnostics.iter().any(|d| d.message.contains(needle)),
                "{text:?}: {:?}",
                p.diagnostics
            );
        }
        // Each finding names the line of the entry it is about; the file's own, line 0.
        let p = parse(b"NVIDIA0_UUID=GPU-0\nNVIDIA0_MIB=080\nNVIDIA1_MIB=5\nNVIDIA1_MIB=6\nX=1\n");
        let found: Vec<(usize, Severity, &str)> = p
            .diagnostics
            .iter()
            .map(|d| {
                (
                    d.line,
                    d.severity,
                    d.message.split(':').next().unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            found,
            [
                (0, Severity::Error, "no HAMI_NODE_GPUS_FORMAT line"),
                (2, Severity::Error, "NVIDIA0_MIB=\"080\""),
                (
                    4,
                    Severity::Warning,
                    "duplicate key NVIDIA1_MIB (also on line 3)"
                ),
                (4, Severity::Warning, "NVIDIA1_MIB has no NVIDIA1_UUID"),
                (
                    5,
                    Severity::Warning,
                    "key X is not one of HAMI_NODE_GPUS_FORMAT, NVIDIA<minor>_MIB, NVIDIA<minor>_UUID (minor 0..=254, no leading zero)"
                ),
            ],
            "{:?}",
            p.diagnostics
        );
        // An unknown key or a missing UUID is a warning: the file is still used.
        let p = parse(b"HAMI_NODE_GPUS_FORMAT=1\nNVIDIA01_MIB=5\nNVIDIA2_MIB=7\n");
        assert!(p.usable(), "{:?}", p.diagnostics);
        assert_eq!((p.mib_for(1), p.mib_for(2)), (None, Some(7)));
    }
}
