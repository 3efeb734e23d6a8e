//! The limits file HAMi-core reads at `/overrideEnv`: strict rendering, tolerant parsing.
//!
//! Format (contract): one `KEY=VALUE` per line, `\n` endings, keys sorted by byte order, no
//! comments, no blank lines, no spaces around `=`, a trailing newline, and always
//! `HAMI_LIMITS_FORMAT=1`. It is the subset today's `load_env_from_file()` reads: that reader stops
//! at the first line without `=`, splits at the first `=`, trims nothing and keeps `\r`.
//!
//! [`parse`] is the reader the preload library uses (see [`crate::preload`]): a malformed line is
//! reported and skipped, the lines after it still count, and a CRLF ending is stripped.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::hami_core::{self, KeyKind};
use crate::names::{
    ENV_HAMI_LIMITS_FORMAT, LIMITS_FORMAT_VERSION, MAX_DEVICE_INDEX, memory_limit_env,
};
use crate::values::{MemoryLimitMib, SmLimit};

/// HAMi-core reads lines of up to this many bytes, newline included; longer lines are split.
pub const MAX_LINE_BYTES: usize = 9_999;

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
    let mut bytes = key.bytes();
    matches!(bytes.next(), Some(b'A'..=b'Z' | b'_'))
        && bytes.all(|b| matches!(b, b'A'..=b'Z' | b'0'..=b'9' | b'_'))
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
            KeyKind::UnreadIndex => Some(format!(
                "HAMi-core never reads this key (device indexes are 0..={MAX_DEVICE_INDEX}, without leading zero)"
            )),
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

    /// Set `CUDA_DEVICE_MEMORY_LIMIT_<index>`.
    pub fn set_memory_limit(
        &mut self,
        index: usize,
        limit: MemoryLimitMib,
    ) -> Result<(), LimitsFileError> {
        self.insert(memory_limit_env(index), limit.to_string())
            .map(|_| ())
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

impl fmt::Display for LimitsFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
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
            for w in hami_core::check_entry(key, value) {
                warning(format!("{key}={value:?}: {w}"));
            }
        }
        self.entries.insert(key.to_owned(), value.to_owned());
    }

    /// After the last line: `ends_with_newline` is false when the input's last line had no
    /// newline (a truncated file?). An input of no lines at all is reported as empty.
    pub fn finish(&mut self, ends_with_newline: bool, report: &mut impl FnMut(Diagnostic)) {
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

    #[test]
    fn value_keeps_later_equals_signs() {
        let p = parse("A=b=c\nHAMI_LIMITS_FORMAT=1\n");
        assert_eq!(p.entries["A"], "b=c");
        assert!(p.is_clean());
    }
}
