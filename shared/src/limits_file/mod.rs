//! The limits file HAMi-core reads at `/overrideEnv`: strict rendering, tolerant parsing.
//!
//! Format (contract): one `KEY=VALUE` per line, `\n` endings, keys sorted by byte order, no
//! comments, no blank lines, no spaces around `=`, a trailing newline, and always
//! `HAMI_LIMITS_FORMAT=1`. It is the subset today's `load_env_from_file()` reads: that reader stops
//! at the first line without `=`, splits at the first `=`, trims nothing and keeps `\r`.
//!
//! [`parse()`] is the reader the preload library uses (see [`crate::preload`]): a malformed line is
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
//!
//! One concern a file: `entry.rs` the typed values ([`Value`]) and what may be written, `file.rs`
//! the [`LimitsFile`] and its rendering, `project_keys.rs` the project's own keys, `parse.rs` the
//! tolerant reader.

mod entry;
mod file;
mod parse;
mod project_keys;

#[cfg(test)]
mod tests;

/// What the writers of this module return.
pub type Result<T, E = LimitsFileError> = std::result::Result<T, E>;

pub use entry::{GpuFraction, LimitsFileError, MAX_LINE_BYTES, NodeGpusPath, Value, is_valid_key};
pub use file::{EXAMPLE, LimitsFile};
pub use parse::{Diagnostic, LineParser, ParsedLimitsFile, Severity, parse, parse_bytes};
pub use project_keys::{
    GPU_FRACTION_FORM, is_node_gpus_path, project_entry_warnings, project_value_problem,
    uncapped_reason,
};
