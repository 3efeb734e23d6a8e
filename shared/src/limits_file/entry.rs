//! One entry of a limits file, typed: the value of each key the contract gives a type is held as
//! that type ([`MemoryLimitMib`], [`SmLimit`], [`CorePolicy`], [`GpuFraction`], [`NodeGpusPath`])
//! and rendered to text once, when the file is written. Text from outside (a container spec, a
//! parsed file) is checked and typed once, by [`Value::parse`].

use std::fmt;

use crate::hami_core::{self, KeyKind};
use crate::limits_file::Result;
use crate::limits_file::project_keys::project_value_problem;
use crate::names::{
    ENV_HAMI_GPU_FRACTION, ENV_HAMI_LIMITS_FORMAT, ENV_HAMI_NODE_GPUS, LIMITS_FORMAT_VERSION,
    MAX_DEVICE_INDEX,
};
use crate::values::{CorePolicy, MemoryLimitMib, SmLimit};

/// HAMi-core reads lines of up to this many bytes, newline included; longer lines are split.
pub use hami_preload_core::lines::MAX_LINE_BYTES;

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

/// Why a per-device key with an index HAMi-core never reads is refused.
pub(crate) fn unread_index_reason() -> String {
    format!(
        "HAMi-core never reads this key (device indexes are 0..={MAX_DEVICE_INDEX}, without leading zero)"
    )
}

/// A project key's value in the form the webhook writes, or the refusal naming key and value.
fn project_value(key: &str, value: &str) -> Result<String> {
    match project_value_problem(key, value) {
        None => Ok(value.to_owned()),
        Some(reason) => Err(LimitsFileError::UnsafeValue {
            key: key.to_owned(),
            value: value.to_owned(),
            reason,
        }),
    }
}

/// A `HAMI_GPU_FRACTION` value in canonical form (`0.` then 1 to 64 digits, the last not `0`),
/// the form the preload library reads ([`hami_preload_core::fraction::parse_canonical`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GpuFraction(String);

impl GpuFraction {
    /// Check `text` once.
    ///
    /// # Errors
    /// [`LimitsFileError::UnsafeValue`] naming `HAMI_GPU_FRACTION` for any other spelling.
    pub fn new(text: &str) -> Result<Self> {
        project_value(ENV_HAMI_GPU_FRACTION, text).map(Self)
    }

    /// The canonical text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for GpuFraction {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for GpuFraction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A `HAMI_NODE_GPUS` value: the node GPU file's container path, absolute, without white space or
/// control characters, at most 4095 bytes ([`crate::limits_file::is_node_gpus_path`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeGpusPath(String);

impl NodeGpusPath {
    /// Check `path` once.
    ///
    /// # Errors
    /// [`LimitsFileError::UnsafeValue`] naming `HAMI_NODE_GPUS` for any other path.
    pub fn new(path: &str) -> Result<Self> {
        project_value(ENV_HAMI_NODE_GPUS, path).map(Self)
    }

    /// The path.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeGpusPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The value of one entry. Which variant a key holds is fixed by the key (see [`Value::parse`]
/// and the typed setters of [`crate::limits_file::LimitsFile`]); [`fmt::Display`] is its text in
/// the file, `KEY=<this>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `HAMI_LIMITS_FORMAT`: always [`LIMITS_FORMAT_VERSION`].
    Format,
    /// `CUDA_DEVICE_MEMORY_LIMIT` or `CUDA_DEVICE_MEMORY_LIMIT_<i>`: `<N>m`.
    MemoryLimit(MemoryLimitMib),
    /// `CUDA_DEVICE_SM_LIMIT` or `CUDA_DEVICE_SM_LIMIT_<i>`: a bare percentage.
    SmLimit(SmLimit),
    /// `GPU_CORE_UTILIZATION_POLICY` as the program sets it (a copied spelling is [`Value::Text`]).
    CorePolicy(CorePolicy),
    /// `LIBCUDA_LOG_LEVEL` as the program sets it (0..=4).
    LogLevel(u8),
    /// `HAMI_GPU_FRACTION`.
    GpuFraction(GpuFraction),
    /// `HAMI_NODE_GPUS`.
    NodeGpus(NodeGpusPath),
    /// Any other value, as written (checked for what would break the line, and for the project's
    /// `HAMI_UNCAPPED` its label form).
    Text(String),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Format => write!(f, "{LIMITS_FORMAT_VERSION}"),
            Value::MemoryLimit(limit) => limit.fmt(f),
            Value::SmLimit(limit) => limit.fmt(f),
            Value::CorePolicy(policy) => f.write_str(policy.as_str()),
            Value::LogLevel(level) => level.fmt(f),
            Value::GpuFraction(fraction) => fraction.fmt(f),
            Value::NodeGpus(path) => path.fmt(f),
            Value::Text(text) => f.write_str(text),
        }
    }
}

impl Value {
    /// The typed value of `key=text`, checked once: refuses values holding `\n`, `\r` or NUL, a
    /// `HAMI_LIMITS_FORMAT` other than [`LIMITS_FORMAT_VERSION`], memory values not in the safe
    /// form `^[1-9][0-9]*m$`, SM values other than a bare integer 0..=100 (any other spelling
    /// risks HAMi-core reading a different limit, `04000m` is octal, or none), per-device keys
    /// HAMi-core never reads, and the project's own keys in another form than the webhook writes.
    /// The key itself is checked by the caller.
    ///
    /// # Errors
    /// [`LimitsFileError::InvalidValue`], [`LimitsFileError::ReservedKey`] or
    /// [`LimitsFileError::UnsafeValue`], naming the key and the value.
    pub fn parse(key: &str, text: String) -> Result<Self> {
        let what = if text.contains('\n') {
            Some("a newline")
        } else if text.contains('\r') {
            Some("a carriage return")
        } else if text.contains('\0') {
            Some("a NUL byte")
        } else {
            None
        };
        if let Some(what) = what {
            return Err(LimitsFileError::InvalidValue {
                key: key.to_owned(),
                value: text,
                what,
            });
        }
        if key == ENV_HAMI_LIMITS_FORMAT {
            if text == LIMITS_FORMAT_VERSION.to_string() {
                return Ok(Value::Format);
            }
            return Err(LimitsFileError::ReservedKey {
                key: key.to_owned(),
                value: text,
            });
        }
        let unsafe_value = |text: String, reason: String| LimitsFileError::UnsafeValue {
            key: key.to_owned(),
            value: text,
            reason,
        };
        match hami_core::key_kind(key) {
            KeyKind::Memory(_) => match text.parse::<MemoryLimitMib>() {
                Ok(limit) => Ok(Value::MemoryLimit(limit)),
                Err(e) => Err(unsafe_value(text, e.to_string())),
            },
            KeyKind::Sm(_) => match text.parse::<SmLimit>() {
                Ok(limit) => Ok(Value::SmLimit(limit)),
                Err(e) => Err(unsafe_value(text, e.to_string())),
            },
            KeyKind::UnreadIndex => Err(unsafe_value(text, unread_index_reason())),
            KeyKind::Other => match key {
                ENV_HAMI_GPU_FRACTION => GpuFraction::new(&text).map(Value::GpuFraction),
                ENV_HAMI_NODE_GPUS => NodeGpusPath::new(&text).map(Value::NodeGpus),
                _ => project_value(key, &text).map(Value::Text),
            },
            _ => Ok(Value::Text(text)),
        }
    }
}
