//! The tolerant reader of limits files: every malformed line reported with its number and
//! skipped, the lines after it still read.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::hami_core;
use crate::limits_file::entry::{MAX_LINE_BYTES, is_valid_key};
use crate::limits_file::project_keys::project_entry_warnings;
use crate::names::{
    ENV_CUDA_DEVICE_MEMORY_LIMIT, ENV_HAMI_GPU_FRACTION, ENV_HAMI_LIMITS_FORMAT,
    ENV_HAMI_NODE_GPUS, LIMITS_FORMAT_VERSION,
};

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
        let entry = if length > MAX_LINE_BYTES {
            Err(SkippedLine::TooLong { length })
        } else {
            // A CRLF line ending: the CR is stripped, so `3000m\r` means 3000 MiB (the preload
            // library exports what this parser reads). A CR anywhere else is an error below.
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
            line_text(raw).and_then(split_entry)
        };
        match entry {
            Ok((key, value)) => self.record(line, key, value, report),
            Err(why) => report(Diagnostic {
                line,
                severity: Severity::Error,
                message: why.to_string(),
            }),
        }
    }

    /// A well-formed entry: kept (a later duplicate wins), with a warning wherever HAMi-core or
    /// the preload library would read it differently than it evidently intends.
    fn record(&mut self, line: usize, key: &str, value: &str, report: &mut impl FnMut(Diagnostic)) {
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
            self.format = read_format(key, value, &mut warning);
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

/// `HAMI_LIMITS_FORMAT`'s value: a positive integer without leading zero; `None`, with a warning,
/// for anything else. A format newer than this reader is read as usual, with a warning.
fn read_format(key: &str, value: &str, warning: &mut impl FnMut(String)) -> Option<u32> {
    match value.parse::<u32>() {
        Ok(v) if v >= 1 && (value == "1" || !value.starts_with('0')) => {
            if v > LIMITS_FORMAT_VERSION {
                warning(format!(
                    "format {v} is newer than this reader (format {LIMITS_FORMAT_VERSION}); entries are read as usual"
                ));
            }
            Some(v)
        }
        _ => {
            warning(format!(
                "{key}={value:?} is not a positive integer; format unknown"
            ));
            None
        }
    }
}

/// Why a line is skipped: its diagnostic's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SkippedLine<'a> {
    /// Longer than HAMi-core's line buffer.
    TooLong { length: usize },
    /// A carriage return before the line's end.
    CarriageReturn,
    /// A NUL byte.
    Nul,
    /// Not UTF-8.
    NotUtf8,
    /// No `=`: a blank line, a comment line, or other text.
    NoEquals { text: &'a str },
    /// Nothing before the `=`.
    EmptyKey { value: &'a str },
    /// A key not of the form `[A-Z_][A-Z0-9_]*`.
    InvalidKey { key: &'a str },
}

impl fmt::Display for SkippedLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SkippedLine::TooLong { length } => write!(
                f,
                "line is {length} bytes; HAMi-core reads lines of up to {MAX_LINE_BYTES} bytes and would split it"
            ),
            SkippedLine::CarriageReturn => f.write_str(
                "line contains a carriage return before its end: HAMi-core keeps it in the value, \
                 so 3000m\\r would read as 3000 bytes",
            ),
            SkippedLine::Nul => f.write_str("line contains a NUL byte"),
            SkippedLine::NotUtf8 => f.write_str("line is not valid UTF-8"),
            SkippedLine::NoEquals { text } => {
                if text.trim().is_empty() {
                    f.write_str("blank line")?;
                } else if text.trim_start().starts_with('#') {
                    f.write_str("comment line")?;
                } else {
                    write!(f, "line {text:?} has no '='")?;
                }
                f.write_str(
                    ": not a KEY=VALUE entry (released HAMi-core stops reading the file at such a line)",
                )
            }
            SkippedLine::EmptyKey { value } => write!(f, "empty key before '=' (value {value:?})"),
            SkippedLine::InvalidKey { key } => {
                let why = if key.trim() != key {
                    " (white space around the key: HAMi-core trims nothing)"
                } else {
                    ""
                };
                write!(f, "key {key:?} is not of the form [A-Z_][A-Z0-9_]*{why}")
            }
        }
    }
}

/// The line as text, or why it is skipped: a carriage return before its end, a NUL byte, invalid
/// UTF-8.
fn line_text(raw: &[u8]) -> Result<&str, SkippedLine<'static>> {
    if raw.contains(&b'\r') {
        return Err(SkippedLine::CarriageReturn);
    }
    if raw.contains(&0) {
        return Err(SkippedLine::Nul);
    }
    std::str::from_utf8(raw).map_err(|_| SkippedLine::NotUtf8)
}

/// `KEY=VALUE` split at the first `=`, or why the line is skipped: no `=` (a blank or comment
/// line too), an empty key, a key not of the form `[A-Z_][A-Z0-9_]*`.
fn split_entry(text: &str) -> Result<(&str, &str), SkippedLine<'_>> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(SkippedLine::NoEquals { text });
    };
    if key.is_empty() {
        return Err(SkippedLine::EmptyKey { value });
    }
    if !is_valid_key(key) {
        return Err(SkippedLine::InvalidKey { key });
    }
    Ok((key, value))
}
