//! The limits file HAMi-core reads at `/overrideEnv`: strict rendering, tolerant parsing.
//!
//! Format (contract): one `KEY=VALUE` per line, `\n` endings, keys sorted by byte order, no
//! comments, no blank lines, no spaces around `=`, a trailing newline, and always
//! `HAMI_LIMITS_FORMAT=1`. It is the subset today's `load_env_from_file()` reads: that reader stops
//! at the first line without `=`, splits at the first `=`, trims nothing and keeps `\r`.
//!
//! [`parse`] is the reader the preload library uses (see [`crate::preload`]): a malformed line is
//! reported and skipped, the lines after it still count, and a CRLF ending is stripped.
//!
//! Beside HAMi-core's variables a file may hold the project's own optional keys, which HAMi-core
//! never reads and which no program exports to the environment:
//! - `HAMI_GPU_FRACTION=0.<digits>` and `HAMI_NODE_GPUS=<path>` (KAI `gpu-fraction` pods, file
//!   delivery): the pod's fraction and the node GPU file ([`crate::node_gpus`]) in the container.
//!   With both, the preload library replaces the file's admission-time `CUDA_DEVICE_MEMORY_LIMIT`
//!   (the fraction of the smallest GPU the pod could land on) by `floor(fraction × MiB)` of the
//!   smallest GPU whose `/dev/nvidia<N>` the container sees, sized from the node file; when it
//!   cannot (no or unusable node file, a visible GPU the file does not list, no visible GPU), the
//!   admission-time cap stands.
//! - `HAMI_UNCAPPED=<reason>`: a KAI `gpu-fraction` container admitted without a cap
//!   (`kai.missingBasis: warn`); `hami-limits check` reports it.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use hami_preload_core::fraction::{MAX_PLACES, parse_canonical};

use crate::hami_core::{self, KeyKind};
use crate::names::{
    ENV_CUDA_DEVICE_MEMORY_LIMIT, ENV_HAMI_GPU_FRACTION, ENV_HAMI_LIMITS_FORMAT,
    ENV_HAMI_NODE_GPUS, ENV_HAMI_UNCAPPED, LIMITS_FORMAT_VERSION, MAX_DEVICE_INDEX,
    UNCAPPED_NO_MATCHING_NODE, UNCAPPED_NO_SOURCE, UNCAPPED_NOT_SYNCED, memory_limit_env,
};
use crate::values::{MemoryLimitMib, SmLimit};

/// HAMi-core reads lines of up to this many bytes, newline included; longer lines are split.
pub use hami_preload_core::lines::MAX_LINE_BYTES;

/// A small, valid limits file, as the device plugin writes one for a container with one GPU
/// share of 3000 MiB and 50 % of the cores (`hami-limits check --example`).
pub const EXAMPLE: &str = "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\n\
CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/usage.cache\n\
CUDA_DEVICE_SM_LIMIT=50\n\
HAMI_LIMITS_FORMAT=1\n";

/// Why an entry cannot be written into a limits file. Every variant names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsFileError {
    /// The key is not `[A-Z_][A-Z0-9_]*` (empty, lowercase, `=`, space, newline, NUL ...).
    #[error("limits file key {key:?} is not of the form [A-Z_][A-Z0-9_]*")]
    InvalidKey {
        /// The offending key.
        key: String,
    },
    /// The value holds a character that would break the line format.
    #[error("limits file value for {key} contains {what}, which would break the file: {value:?}")]
    InvalidValue {
        /// The key.
        key: String,
        /// The offending value.
        value: String,
        /// `a newline`, `a carriage return` or `a NUL byte`.
        what: &'static str,
    },
    /// A memory or SM value HAMi-core would misread, or a key HAMi-core never reads.
    #[error("limits file entry {key}={value:?} is refused: {reason}")]
    UnsafeValue {
        /// The key.
        key: String,
        /// The offending value.
        value: String,
        /// What is wrong and which form is accepted.
        reason: String,
    },
    /// `HAMI_LIMITS_FORMAT` is written by the file itself.
    #[error(
        "limits file key {key} is reserved: it is always {LIMITS_FORMAT_VERSION}, not {value:?}"
    )]
    ReservedKey {
        /// The key.
        key: String,
        /// The value that was offered.
        value: String,
    },
    /// The line would be longer than HAMi-core's line buffer.
    #[error(
        "limits file line for {key} would be {len} bytes; HAMi-core reads lines of up to {MAX_LINE_BYTES} bytes"
    )]
    LineTooLong {
        /// The key.
        key: String,
        /// Line length including the newline.
        len: usize,
    },
}

/// True for `[A-Z_][A-Z0-9_]*`.
pub fn is_valid_key(key: &str) -> bool {
    hami_preload_core::lines::is_valid_key(key.as_bytes())
}

/// The limits for one container, sorted by key; always holds `HAMI_LIMITS_FORMAT=1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsFile {
    entries: BTreeMap<String, String>,
}

impl Default for LimitsFile {
    fn default() -> Self {
        Self::new()
    }
}

impl LimitsFile {
    /// A file holding only `HAMI_LIMITS_FORMAT=1`.
    pub fn new() -> Self {
        let mut entries = BTreeMap::new();
        entries.insert(
            ENV_HAMI_LIMITS_FORMAT.to_owned(),
            LIMITS_FORMAT_VERSION.to_string(),
        );
        Self { entries }
    }

    /// Build from entries; the first refused entry is the error.
    pub fn from_entries<K, V>(
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, LimitsFileError>
    where
        K: Into<String>,
        V: Into<String>,
    {
        let mut file = Self::new();
        for (k, v) in entries {
            file.insert(k, v)?;
        }
        Ok(file)
    }

    /// Set `key` to `value`, returning the previous value.
    ///
    /// Refuses keys outside `[A-Z_][A-Z0-9_]*` and values holding `\n`, `\r` or NUL. Memory keys
    /// must hold the safe form `^[1-9][0-9]*m$` and SM keys a bare integer 0..=100, because any
    /// other spelling risks HAMi-core reading a different limit (`04000m` is octal) or none.
    pub fn insert(
        &mut self,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<Option<String>, LimitsFileError> {
        let key = key.into();
        let value = value.into();
        if !is_valid_key(&key) {
            return Err(LimitsFileError::InvalidKey { key });
        }
        let what = if value.contains('\n') {
            Some("a newline")
        } else if value.contains('\r') {
            Some("a carriage return")
        } else if value.contains('\0') {
            Some("a NUL byte")
        } else {
            None
        };
        if let Some(what) = what {
            return Err(LimitsFileError::InvalidValue { key, value, what });
        }
        if key == ENV_HAMI_LIMITS_FORMAT {
            if value == LIMITS_FORMAT_VERSION.to_string() {
                return Ok(Some(value));
            }
            return Err(LimitsFileError::ReservedKey { key, value });
        }
        let refused = match hami_core::key_kind(&key) {
            KeyKind::Memory(_) => value.parse::<MemoryLimitMib>().err().map(|e| e.to_string()),
            KeyKind::Sm(_) => value.parse::<SmLimit>().err().map(|e| e.to_string()),
            KeyKind::UnreadIndex => Some(unread_index_reason()),
            KeyKind::Other => project_value_problem(&key, &value),
            _ => None,
        };
        if let Some(reason) = refused {
            return Err(LimitsFileError::UnsafeValue { key, value, reason });
        }
        let len = key.len() + value.len() + 2;
        if len > MAX_LINE_BYTES {
            return Err(LimitsFileError::LineTooLong { key, len });
        }
        Ok(self.entries.insert(key, value))
    }

    /// Set `CUDA_DEVICE_MEMORY_LIMIT_<index>`. The typed limit is rendered once (`<N>m`, the form
    /// HAMi-core reads as meant) and never parsed back.
    ///
    /// # Errors
    /// [`LimitsFileError::UnsafeValue`] for an index HAMi-core never reads (above 15).
    pub fn set_memory_limit(
        &mut self,
        index: usize,
        limit: MemoryLimitMib,
    ) -> Result<(), LimitsFileError> {
        let key = memory_limit_env(index);
        if !matches!(hami_core::key_kind(&key), KeyKind::Memory(Some(_))) {
            return Err(LimitsFileError::UnsafeValue {
                key,
                value: limit.to_string(),
                reason: unread_index_reason(),
            });
        }
        self.entries.insert(key, limit.to_string());
        Ok(())
    }

    /// Set `CUDA_DEVICE_MEMORY_LIMIT`, the limit of every GPU of the container (KAI). Typed, so
    /// rendered once and never parsed back; cannot fail.
    pub fn set_memory_limit_all(&mut self, limit: MemoryLimitMib) {
        self.entries
            .insert(ENV_CUDA_DEVICE_MEMORY_LIMIT.to_owned(), limit.to_string());
    }

    /// Set `CUDA_DEVICE_SM_LIMIT`.
    pub fn set_sm_limit(&mut self, limit: SmLimit) {
        self.entries.insert(
            crate::names::ENV_CUDA_DEVICE_SM_LIMIT.to_owned(),
            limit.to_string(),
        );
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries.get(key).map(String::as_str)
    }

    /// Remove `key` (`HAMI_LIMITS_FORMAT` stays).
    pub fn remove(&mut self, key: &str) -> Option<String> {
        if key == ENV_HAMI_LIMITS_FORMAT {
            return None;
        }
        self.entries.remove(key)
    }

    /// Entries in byte order of the keys, `HAMI_LIMITS_FORMAT` included.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The entries as a map, `HAMI_LIMITS_FORMAT` included.
    pub fn entries(&self) -> &BTreeMap<String, String> {
        &self.entries
    }

    /// Number of entries, `HAMI_LIMITS_FORMAT` included (so never 0).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing but `HAMI_LIMITS_FORMAT` is set.
    pub fn is_empty(&self) -> bool {
        self.entries.len() == 1
    }

    /// The file's bytes: sorted `KEY=VALUE\n` lines, byte-stable for equal contents.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(
            self.entries
                .iter()
                .map(|(k, v)| k.len() + v.len() + 2)
                .sum(),
        );
        for (k, v) in &self.entries {
            out.push_str(k);
            out.push('=');
            out.push_str(v);
            out.push('\n');
        }
        out
    }
}

/// Why a per-device key with an index HAMi-core never reads is refused.
fn unread_index_reason() -> String {
    format!(
        "HAMi-core never reads this key (device indexes are 0..={MAX_DEVICE_INDEX}, without leading zero)"
    )
}

impl fmt::Display for LimitsFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

// ---------------------------------------------------------------------------------------------
// The project's own optional keys
// ---------------------------------------------------------------------------------------------
//
// HAMi-core reads none of them and older preload libraries ignore keys they do not know (a
// format-1 reader keeps unknown keys and exports only the contract's variables), so they need no
// new `HAMI_LIMITS_FORMAT`.

/// The accepted form of a `HAMI_GPU_FRACTION` value, for messages (see
/// [`hami_preload_core::fraction::parse_canonical`]).
pub const GPU_FRACTION_FORM: &str = "0.<1..=64 digits, last not 0>";

/// What `hami-limits check` suggests for a container without a cap: the fixes of the webhook's
/// `kai.missingBasis: deny` message.
const UNCAPPED_FIX: &str = "label the GPU nodes it can land on with nvidia.com/gpu.memory=<MiB> (GPU Feature Discovery does), set kai.perGpuVramMib, or request gpu-memory=<MiB> instead of gpu-fraction";

/// True for a `HAMI_NODE_GPUS` value as the webhook writes it: a path the preload library opens
/// ([`hami_preload_core::decide::is_node_gpus_path`]: absolute, at most 4095 bytes) without white
/// space or control characters.
pub fn is_node_gpus_path(path: &str) -> bool {
    hami_preload_core::decide::is_node_gpus_path(path.as_bytes())
        && !path.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// True for a reason label: 1 to 63 characters of `a-z`, `0-9` and `-`, starting with a letter and
/// not ending with `-` (a Prometheus label value and a limits-file value alike).
fn is_reason_label(value: &str) -> bool {
    let b = value.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1] != b'-'
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// What is wrong with the value of one of the project's own keys (`HAMI_GPU_FRACTION`,
/// `HAMI_NODE_GPUS`, `HAMI_UNCAPPED`), measured against the form the webhook writes; `None` when
/// it is in that form, and for every other key. [`LimitsFile::insert`] refuses such a value.
pub fn project_value_problem(key: &str, value: &str) -> Option<String> {
    match key {
        ENV_HAMI_GPU_FRACTION => parse_canonical(value.as_bytes()).is_none().then(|| {
            format!("not of the form {GPU_FRACTION_FORM} (e.g. 0.25; at most {MAX_PLACES} places)")
        }),
        ENV_HAMI_NODE_GPUS => (!is_node_gpus_path(value))
            .then(|| "not an absolute path without white space (at most 4095 bytes)".to_owned()),
        ENV_HAMI_UNCAPPED => (!is_reason_label(value)).then(|| {
            "not a reason label (a-z, 0-9 and '-', starting with a letter, at most 63 characters)"
                .to_owned()
        }),
        _ => None,
    }
}

/// Why the webhook admitted a `gpu-fraction` pod without a cap, for an [`ENV_HAMI_UNCAPPED`]
/// reason label; `None` for a label it never writes.
pub fn uncapped_reason(label: &str) -> Option<&'static str> {
    match label {
        UNCAPPED_NO_SOURCE => Some(
            "the webhook had no source of per-GPU VRAM: no kai.perGpuVramMib and no node watch or --nodes list",
        ),
        UNCAPPED_NOT_SYNCED => Some(
            "the webhook had not read the GPU node list yet (its node watch was starting or failing)",
        ),
        UNCAPPED_NO_MATCHING_NODE => Some(
            "no GPU node the pod can be placed on (nodeName, nodeSelector, required node affinity) carries a usable nvidia.com/gpu.memory label",
        ),
        _ => None,
    }
}

/// What `hami-limits check` says about one of the project's own keys: a value in another form
/// than the webhook writes, with what the preload library then does, and `HAMI_UNCAPPED` always
/// (the container runs without a GPU memory cap).
pub fn project_entry_warnings(key: &str, value: &str) -> Vec<String> {
    let problem = project_value_problem(key, value);
    match key {
        ENV_HAMI_GPU_FRACTION => problem
            .map(|p| {
                format!(
                    "{p}: the preload library ignores it, so the file's CUDA_DEVICE_MEMORY_LIMIT (the admission-time cap, from the smallest GPU the pod could land on) stands instead of the exact fraction of the GPU the container sees"
                )
            })
            .into_iter()
            .collect(),
        ENV_HAMI_NODE_GPUS => problem
            .map(|p| {
                format!(
                    "{p}: the preload library cannot read the node GPU file there, so the file's CUDA_DEVICE_MEMORY_LIMIT (the admission-time cap) stands"
                )
            })
            .into_iter()
            .collect(),
        ENV_HAMI_UNCAPPED => {
            let why = match (problem, uncapped_reason(value)) {
                (Some(p), _) => format!("reason {p}"),
                (None, Some(why)) => why.to_owned(),
                (None, None) => format!(
                    "reason {value:?} is not one the webhook writes ({UNCAPPED_NO_SOURCE}, {UNCAPPED_NOT_SYNCED}, {UNCAPPED_NO_MATCHING_NODE})"
                ),
            };
            vec![format!(
                "this container runs without a GPU memory cap: its KAI gpu-fraction pod was admitted uncapped because kai.missingBasis is warn and {why}; HAMi-core is loaded but limits no memory. To cap it: {UNCAPPED_FIX}, and recreate the pod (kai.missingBasis: deny, the default, refuses such pods instead)"
            )]
        }
        _ => Vec::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// Tolerant parse
// ---------------------------------------------------------------------------------------------

/// How bad a diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The line was skipped.
    Error,
    /// The line counts, but HAMi-core may read it differently than intended.
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        })
    }
}

/// One finding about one line (1-based).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    /// 1-based line number.
    pub line: usize,
    /// Error (line skipped) or warning (line kept).
    pub severity: Severity,
    /// What is wrong and what HAMi-core makes of it.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}: {}", self.line, self.severity, self.message)
    }
}

/// The result of [`parse`]: what counts, and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ParsedLimitsFile {
    /// `HAMI_LIMITS_FORMAT`, or `None` for a legacy file without it (accepted) or an invalid one.
    pub format: Option<u32>,
    /// The entries that count (later duplicates win), unknown keys included.
    pub entries: BTreeMap<String, String>,
    /// Findings in line order.
    pub diagnostics: Vec<Diagnostic>,
}

impl ParsedLimitsFile {
    /// True when there is nothing to report.
    pub fn is_clean(&self) -> bool {
        self.diagnostics.is_empty()
    }
}

/// Parse a limits file tolerantly (see [`parse_bytes`]).
pub fn parse(text: &str) -> ParsedLimitsFile {
    parse_bytes(text.as_bytes())
}

/// Parse a limits file: malformed lines are reported with their number and skipped, and the lines
/// after them still count; a later duplicate key wins (warning); memory and SM values get a
/// warning wherever HAMi-core would read them differently than they evidently intend.
pub fn parse_bytes(bytes: &[u8]) -> ParsedLimitsFile {
    let mut diagnostics = Vec::new();
    let mut parser = LineParser::new();
    if bytes.is_empty() {
        parser.finish(true, &mut |d| diagnostics.push(d));
        let (format, entries) = parser.into_parts();
        return ParsedLimitsFile {
            format,
            entries,
            diagnostics,
        };
    }
    let body = bytes.strip_suffix(b"\n");
    let ends_with_newline = body.is_some();
    for raw in body.unwrap_or(bytes).split(|b| *b == b'\n') {
        parser.line(raw, raw.len() + 1, &mut |d| diagnostics.push(d));
    }
    parser.finish(ends_with_newline, &mut |d| diagnostics.push(d));
    let (format, entries) = parser.into_parts();
    ParsedLimitsFile {
        format,
        entries,
        diagnostics,
    }
}

/// The tolerant parser, one line at a time, for readers that stream (`hami-limits check` holds
/// no more than one line and the entries, however long the input). [`parse_bytes`] is this over a
/// whole buffer.
#[derive(Debug, Default)]
pub struct LineParser {
    line: usize,
    format: Option<u32>,
    entries: BTreeMap<String, String>,
    first_seen: BTreeMap<String, usize>,
}

impl LineParser {
    /// Before the first line.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed the next line, without its `\n`. `length` is the line's full length in the input,
    /// newline included (a streaming reader may pass a prefix of an over-long line). Diagnostics
    /// go to `report`, in order.
    pub fn line(&mut self, raw: &[u8], length: usize, report: &mut impl FnMut(Diagnostic)) {
        self.line += 1;
        let line = self.line;
        let mut error = |message: String| {
            report(Diagnostic {
                line,
                severity: Severity::Error,
                message,
            })
        };
        if length > MAX_LINE_BYTES {
            error(format!(
                "line is {length} bytes; HAMi-core reads lines of up to {MAX_LINE_BYTES} bytes and would split it"
            ));
            return;
        }
        // A CRLF line ending: the CR is stripped, so `3000m\r` means 3000 MiB (the preload library
        // exports what this parser reads). A CR anywhere else is an error below.
        let raw = match raw.strip_suffix(b"\r") {
            Some(stripped) => {
                report(Diagnostic {
                    line,
                    severity: Severity::Warning,
                    message:
                        "CRLF line ending: the carriage return is stripped (HAMi-core's own late \
                              reader would keep it, so 3000m\\r would read as 3000 bytes there)"
                            .to_owned(),
                });
                stripped
            }
            None => raw,
        };
        let mut error = |message: String| {
            report(Diagnostic {
                line,
                severity: Severity::Error,
                message,
            })
        };
        if raw.contains(&b'\r') {
            error(
                "line contains a carriage return before its end: HAMi-core keeps it in the value, \
                 so 3000m\\r would read as 3000 bytes"
                    .to_owned(),
            );
            return;
        }
        if raw.contains(&0) {
            error("line contains a NUL byte".to_owned());
            return;
        }
        let Ok(text) = std::str::from_utf8(raw) else {
            error("line is not valid UTF-8".to_owned());
            return;
        };
        let Some((key, value)) = text.split_once('=') else {
            let what = if text.trim().is_empty() {
                "blank line".to_owned()
            } else if text.trim_start().starts_with('#') {
                "comment line".to_owned()
            } else {
                format!("line {text:?} has no '='")
            };
            error(format!(
                "{what}: not a KEY=VALUE entry (released HAMi-core stops reading the file at such a line)"
            ));
            return;
        };
        if key.is_empty() {
            error(format!("empty key before '=' (value {value:?})"));
            return;
        }
        if !is_valid_key(key) {
            let why = if key.trim() != key {
                " (white space around the key: HAMi-core trims nothing)"
            } else {
                ""
            };
            error(format!(
                "key {key:?} is not of the form [A-Z_][A-Z0-9_]*{why}"
            ));
            return;
        }
        let mut warning = |message: String| {
            report(Diagnostic {
                line,
                severity: Severity::Warning,
                message,
            })
        };
        if let Some(prev) = self.first_seen.get(key) {
            warning(format!(
                "duplicate key {key} (also on line {prev}): the later value wins"
            ));
        } else {
            self.first_seen.insert(key.to_owned(), line);
        }
        if key == ENV_HAMI_LIMITS_FORMAT {
            match value.parse::<u32>() {
                Ok(v) if v >= 1 && (value == "1" || !value.starts_with('0')) => {
                    self.format = Some(v);
                    if v > LIMITS_FORMAT_VERSION {
                        warning(format!(
                            "format {v} is newer than this reader (format {LIMITS_FORMAT_VERSION}); entries are read as usual"
                        ));
                    }
                }
                _ => {
                    self.format = None;
                    warning(format!(
                        "{key}={value:?} is not a positive integer; format unknown"
                    ));
                }
            }
        } else {
            for w in hami_core::check_entry(key, value)
                .into_iter()
                .chain(project_entry_warnings(key, value))
            {
                warning(format!("{key}={value:?}: {w}"));
            }
        }
        self.entries.insert(key.to_owned(), value.to_owned());
    }

    /// After the last line: `ends_with_newline` is false when the input's last line had no
    /// newline (a truncated file?). An input of no lines at all is reported as empty.
    pub fn finish(&mut self, ends_with_newline: bool, report: &mut impl FnMut(Diagnostic)) {
        // The per-node cap needs both keys: one alone does nothing.
        for (present, absent) in [
            (ENV_HAMI_GPU_FRACTION, ENV_HAMI_NODE_GPUS),
            (ENV_HAMI_NODE_GPUS, ENV_HAMI_GPU_FRACTION),
        ] {
            if let (Some(&line), false) = (
                self.first_seen.get(present),
                self.entries.contains_key(absent),
            ) {
                report(Diagnostic {
                    line,
                    severity: Severity::Warning,
                    message: format!(
                        "{present} without {absent}: the preload library computes the per-node cap only from both, so the file's CUDA_DEVICE_MEMORY_LIMIT (the admission-time cap) stands"
                    ),
                });
            }
        }
        if let (Some(&line), false) = (
            self.first_seen.get(ENV_HAMI_GPU_FRACTION),
            self.entries.contains_key(ENV_CUDA_DEVICE_MEMORY_LIMIT),
        ) {
            report(Diagnostic {
                line,
                severity: Severity::Warning,
                message: format!(
                    "{ENV_HAMI_GPU_FRACTION} without {ENV_CUDA_DEVICE_MEMORY_LIMIT}: the preload library replaces the admission-time {ENV_CUDA_DEVICE_MEMORY_LIMIT} by the per-node cap, and there is none to replace here"
                ),
            });
        }
        if self.line == 0 {
            report(Diagnostic {
                line: 1,
                severity: Severity::Warning,
                message: "the file is empty: HAMi-core reads no limits from it".to_owned(),
            });
        } else if !ends_with_newline {
            report(Diagnostic {
                line: self.line,
                severity: Severity::Warning,
                message: "no newline at the end of the file: it may have been truncated (a cut 3000m reads as 30 bytes)"
                    .to_owned(),
            });
        }
    }

    /// Lines seen so far.
    pub fn lines(&self) -> usize {
        self.line
    }

    /// The entries that count so far.
    pub fn entries(&self) -> &BTreeMap<String, String> {
        &self.entries
    }

    /// `HAMI_LIMITS_FORMAT` and the entries.
    pub fn into_parts(self) -> (Option<u32>, BTreeMap<String, String>) {
        (self.format, self.entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_sorted_with_format_line() {
        let mut f = LimitsFile::new();
        f.insert("CUDA_DEVICE_SM_LIMIT", "50").unwrap();
        f.insert(
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            "/usr/local/vgpu/usage.cache",
        )
        .unwrap();
        f.set_memory_limit(0, MemoryLimitMib::new(3000).unwrap())
            .unwrap();
        assert_eq!(f.render(), EXAMPLE);
        assert_eq!(LimitsFile::new().render(), "HAMI_LIMITS_FORMAT=1\n");
        assert!(LimitsFile::new().is_empty());
    }

    #[test]
    fn insert_refuses_what_would_break_the_file() {
        let mut f = LimitsFile::new();
        for key in ["", "lower", "A=B", "A B", "A\nB", "A\0", "1ABC", " A", "É"] {
            assert_eq!(
                f.insert(key, "1"),
                Err(LimitsFileError::InvalidKey {
                    key: key.to_owned()
                }),
                "{key:?}"
            );
        }
        for (value, what) in [
            ("a\nb", "a newline"),
            ("a\r", "a carriage return"),
            ("a\0", "a NUL byte"),
        ] {
            let err = f.insert("SOME_KEY", value).unwrap_err();
            assert!(
                matches!(&err, LimitsFileError::InvalidValue { key, what: w, .. } if key == "SOME_KEY" && *w == what)
            );
            assert!(err.to_string().contains("SOME_KEY"));
        }
        for value in [
            "04000m", "3000", "3000Mi", "0m", "-1", "0x10m", "1.5g", " 1m",
        ] {
            let err = f.insert("CUDA_DEVICE_MEMORY_LIMIT_0", value).unwrap_err();
            assert!(
                matches!(err, LimitsFileError::UnsafeValue { .. }),
                "{value:?}"
            );
            assert!(err.to_string().contains("CUDA_DEVICE_MEMORY_LIMIT_0"));
        }
        for value in ["050", "101", "50m", ""] {
            assert!(
                f.insert("CUDA_DEVICE_SM_LIMIT", value).is_err(),
                "{value:?}"
            );
        }
        assert!(f.insert("CUDA_DEVICE_MEMORY_LIMIT_16", "1m").is_err());
        assert!(matches!(
            f.insert("HAMI_LIMITS_FORMAT", "2"),
            Err(LimitsFileError::ReservedKey { .. })
        ));
        assert!(f.insert("HAMI_LIMITS_FORMAT", "1").is_ok());
        assert!(matches!(
            f.insert("LONG", "x".repeat(MAX_LINE_BYTES)),
            Err(LimitsFileError::LineTooLong { .. })
        ));
        assert!(f.insert("ANY_VALUE", "has = and spaces").is_ok());
        assert_eq!(f.remove("HAMI_LIMITS_FORMAT"), None);
        assert_eq!(f.get("HAMI_LIMITS_FORMAT"), Some("1"));
    }

    #[test]
    fn parses_the_example_cleanly() {
        let p = parse(EXAMPLE);
        assert_eq!(p.diagnostics, vec![]);
        assert_eq!(p.format, Some(1));
        assert_eq!(
            p.entries
                .get("CUDA_DEVICE_MEMORY_LIMIT_0")
                .map(String::as_str),
            Some("3000m")
        );
    }

    /// The file of a KAI gpu-fraction container in file delivery, as the webhook projects it.
    const FRACTION_FILE: &str = "CUDA_DEVICE_MEMORY_LIMIT=4096m\nHAMI_GPU_FRACTION=0.25\n\
        HAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/usr/local/vgpu/node-gpus\n";

    #[test]
    fn per_node_fraction_keys_are_accepted_and_check_clean() {
        let mut f = LimitsFile::new();
        f.insert("CUDA_DEVICE_MEMORY_LIMIT", "4096m").unwrap();
        f.insert("HAMI_GPU_FRACTION", "0.25").unwrap();
        f.insert("HAMI_NODE_GPUS", "/usr/local/vgpu/node-gpus")
            .unwrap();
        assert_eq!(f.render(), FRACTION_FILE);
        let p = parse(FRACTION_FILE);
        assert_eq!(p.diagnostics, vec![], "{FRACTION_FILE}");
        assert_eq!(p.format, Some(1));
        assert_eq!(p.entries["HAMI_GPU_FRACTION"], "0.25");
        // The longest canonical fraction: 64 places.
        let longest = format!("0.{}1", "0".repeat(MAX_PLACES - 1));
        assert!(f.insert("HAMI_GPU_FRACTION", longest.as_str()).is_ok());
        assert!(parse(&f.render()).is_clean());
        assert!(GPU_FRACTION_FORM.contains(&MAX_PLACES.to_string()));
    }

    #[test]
    fn per_node_fraction_keys_in_another_form_are_refused_and_warned_about() {
        let too_long = format!("0.{}1", "0".repeat(MAX_PLACES));
        for value in [
            "0.50",
            ".5",
            "0.",
            "1.0",
            "5e-1",
            "0.5 ",
            "0,5",
            "00.5",
            too_long.as_str(),
        ] {
            let mut f = LimitsFile::new();
            let err = f.insert("HAMI_GPU_FRACTION", value).unwrap_err();
            assert!(
                err.to_string().contains("HAMI_GPU_FRACTION")
                    && err.to_string().contains(GPU_FRACTION_FORM),
                "{value:?}: {err}"
            );
            let text = format!(
                "CUDA_DEVICE_MEMORY_LIMIT=1m\nHAMI_GPU_FRACTION={value}\nHAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/n\n"
            );
            let p = parse(&text);
            assert_eq!(p.diagnostics.len(), 1, "{value:?}: {:?}", p.diagnostics);
            let d = &p.diagnostics[0];
            assert_eq!((d.line, d.severity), (2, Severity::Warning));
            for needle in [
                GPU_FRACTION_FORM,
                "preload library ignores it",
                "CUDA_DEVICE_MEMORY_LIMIT",
            ] {
                assert!(d.message.contains(needle), "{needle}: {}", d.message);
            }
        }
        let too_long = format!("/{}", "a".repeat(4095));
        for value in [
            "",
            "relative/node-gpus",
            "/with space",
            "/tab\there",
            "~/node-gpus",
            too_long.as_str(),
        ] {
            let mut f = LimitsFile::new();
            let err = f.insert("HAMI_NODE_GPUS", value).unwrap_err();
            assert!(
                err.to_string()
                    .contains("not an absolute path without white space"),
                "{value:?}: {err}"
            );
            let text = format!(
                "CUDA_DEVICE_MEMORY_LIMIT=1m\nHAMI_GPU_FRACTION=0.5\nHAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS={value}\n"
            );
            let p = parse(&text);
            assert_eq!(p.diagnostics.len(), 1, "{value:?}: {:?}", p.diagnostics);
            assert_eq!(p.diagnostics[0].line, 4);
            assert!(
                p.diagnostics[0]
                    .message
                    .contains("cannot read the node GPU file"),
                "{:?}",
                p.diagnostics
            );
        }
    }

    #[test]
    fn one_per_node_key_without_the_other_is_reported() {
        let p =
            parse("CUDA_DEVICE_MEMORY_LIMIT=4096m\nHAMI_GPU_FRACTION=0.25\nHAMI_LIMITS_FORMAT=1\n");
        assert_eq!(p.diagnostics.len(), 1, "{:?}", p.diagnostics);
        assert_eq!(p.diagnostics[0].line, 2);
        assert!(
            p.diagnostics[0]
                .message
                .starts_with("HAMI_GPU_FRACTION without HAMI_NODE_GPUS: "),
            "{:?}",
            p.diagnostics
        );
        let p = parse("HAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/usr/local/vgpu/node-gpus\n");
        assert_eq!(p.diagnostics.len(), 1, "{:?}", p.diagnostics);
        assert_eq!(p.diagnostics[0].line, 2);
        assert!(
            p.diagnostics[0]
                .message
                .starts_with("HAMI_NODE_GPUS without HAMI_GPU_FRACTION: "),
            "{:?}",
            p.diagnostics
        );
        // The per-node cap replaces the global admission-time limit: a per-device one is not it.
        let p = parse(
            "CUDA_DEVICE_MEMORY_LIMIT_0=4096m\nHAMI_GPU_FRACTION=0.25\nHAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/n\n",
        );
        assert_eq!(p.diagnostics.len(), 1, "{:?}", p.diagnostics);
        assert_eq!(p.diagnostics[0].line, 2);
        assert!(
            p.diagnostics[0]
                .message
                .starts_with("HAMI_GPU_FRACTION without CUDA_DEVICE_MEMORY_LIMIT: "),
            "{:?}",
            p.diagnostics
        );
    }

    #[test]
    fn uncapped_is_always_reported_with_its_reason() {
        use crate::names::UNCAPPED_REASONS;
        for reason in UNCAPPED_REASONS {
            let mut f = LimitsFile::new();
            f.insert("HAMI_UNCAPPED", reason).unwrap();
            let text = f.render();
            assert_eq!(
                text,
                format!("HAMI_LIMITS_FORMAT=1\nHAMI_UNCAPPED={reason}\n")
            );
            let p = parse(&text);
            assert_eq!(p.diagnostics.len(), 1, "{:?}", p.diagnostics);
            let d = &p.diagnostics[0];
            assert_eq!((d.line, d.severity), (2, Severity::Warning));
            let why = uncapped_reason(reason).unwrap();
            for needle in [
                "runs without a GPU memory cap",
                "kai.missingBasis is warn",
                why,
                "kai.perGpuVramMib",
            ] {
                assert!(d.message.contains(needle), "{needle}: {}", d.message);
            }
        }
        // A label the webhook never writes is still a missing cap.
        let p = parse("HAMI_LIMITS_FORMAT=1\nHAMI_UNCAPPED=some-day\n");
        assert!(
            p.diagnostics[0]
                .message
                .contains("not one the webhook writes"),
            "{:?}",
            p.diagnostics
        );
        for bad in ["", "No-Source", "no source", "-x", "x-", "a\u{e9}"] {
            assert!(
                LimitsFile::new().insert("HAMI_UNCAPPED", bad).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn value_keeps_later_equals_signs() {
        let p = parse("A=b=c\nHAMI_LIMITS_FORMAT=1\n");
        assert_eq!(p.entries["A"], "b=c");
        assert!(p.is_clean());
    }
}
