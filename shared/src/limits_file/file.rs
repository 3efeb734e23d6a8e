//! [`LimitsFile`]: one container's typed entries, rendered once, strictly, when written.

use std::collections::BTreeMap;
use std::fmt;
use std::fmt::Write as _;

use crate::hami_core::{self, KeyKind};
use crate::limits_file::Result;
use crate::limits_file::entry::{
    GpuFraction, LimitsFileError, MAX_LINE_BYTES, NodeGpusPath, Value, is_valid_key,
    unread_index_reason,
};
use crate::names::{
    ENV_CUDA_DEVICE_MEMORY_LIMIT, ENV_CUDA_DEVICE_SM_LIMIT, ENV_GPU_CORE_UTILIZATION_POLICY,
    ENV_HAMI_GPU_FRACTION, ENV_HAMI_LIMITS_FORMAT, ENV_HAMI_NODE_GPUS, ENV_LIBCUDA_LOG_LEVEL,
    memory_limit_env,
};
use crate::values::{CorePolicy, MemoryLimitMib, SmLimit};

/// A small, valid limits file, as the device plugin writes one for a container with one GPU
/// share of 3000 MiB and 50 % of the cores (`hami-limits check --example`).
pub const EXAMPLE: &str = "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\n\
CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/usage.cache\n\
CUDA_DEVICE_SM_LIMIT=50\n\
HAMI_LIMITS_FORMAT=1\n";

/// The limits for one container, sorted by key; always holds `HAMI_LIMITS_FORMAT=1`. Values are
/// typed ([`Value`]) and become text once, in [`LimitsFile::render`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsFile {
    entries: BTreeMap<String, Value>,
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
        entries.insert(ENV_HAMI_LIMITS_FORMAT.to_owned(), Value::Format);
        Self { entries }
    }

    /// Build from entries as text (a parsed file); the first refused entry is the error.
    pub fn from_entries<K, V>(entries: impl IntoIterator<Item = (K, V)>) -> Result<Self>
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

    /// Set `key` to the value `text` stands for ([`Value::parse`]: typed once, here), returning
    /// the previous value.
    ///
    /// Refuses keys outside `[A-Z_][A-Z0-9_]*`, every value [`Value::parse`] refuses, and a line
    /// longer than HAMi-core reads.
    pub fn insert(
        &mut self,
        key: impl Into<String>,
        text: impl Into<String>,
    ) -> Result<Option<Value>> {
        let key = key.into();
        if !is_valid_key(&key) {
            return Err(LimitsFileError::InvalidKey { key });
        }
        let text = text.into();
        let len = key.len() + text.len() + 2;
        let value = Value::parse(&key, text)?;
        if value == Value::Format {
            return Ok(Some(Value::Format));
        }
        if len > MAX_LINE_BYTES {
            return Err(LimitsFileError::LineTooLong { key, len });
        }
        Ok(self.entries.insert(key, value))
    }

    /// Set `CUDA_DEVICE_MEMORY_LIMIT_<index>`, typed (rendered `<N>m`, the form HAMi-core reads
    /// as meant, when the file is written).
    ///
    /// # Errors
    /// [`LimitsFileError::UnsafeValue`] for an index HAMi-core never reads (above 15).
    pub fn set_memory_limit(&mut self, index: usize, limit: MemoryLimitMib) -> Result<()> {
        let key = memory_limit_env(index);
        if !matches!(hami_core::key_kind(&key), KeyKind::Memory(Some(_))) {
            return Err(LimitsFileError::UnsafeValue {
                key,
                value: limit.to_string(),
                reason: unread_index_reason(),
            });
        }
        self.entries.insert(key, Value::MemoryLimit(limit));
        Ok(())
    }

    /// Set `CUDA_DEVICE_MEMORY_LIMIT`, the limit of every GPU of the container (KAI); cannot fail.
    pub fn set_memory_limit_all(&mut self, limit: MemoryLimitMib) {
        self.entries.insert(
            ENV_CUDA_DEVICE_MEMORY_LIMIT.to_owned(),
            Value::MemoryLimit(limit),
        );
    }

    /// Set `CUDA_DEVICE_SM_LIMIT`.
    pub fn set_sm_limit(&mut self, limit: SmLimit) {
        self.entries
            .insert(ENV_CUDA_DEVICE_SM_LIMIT.to_owned(), Value::SmLimit(limit));
    }

    /// Set `GPU_CORE_UTILIZATION_POLICY`.
    pub fn set_core_policy(&mut self, policy: CorePolicy) {
        self.entries.insert(
            ENV_GPU_CORE_UTILIZATION_POLICY.to_owned(),
            Value::CorePolicy(policy),
        );
    }

    /// Set `LIBCUDA_LOG_LEVEL`.
    ///
    /// # Errors
    /// [`LimitsFileError::UnsafeValue`] for a level above 4, which HAMi-core does not know.
    pub fn set_log_level(&mut self, level: u8) -> Result<()> {
        if level > 4 {
            return Err(LimitsFileError::UnsafeValue {
                key: ENV_LIBCUDA_LOG_LEVEL.to_owned(),
                value: level.to_string(),
                reason: "HAMi-core knows log levels 0..=4".to_owned(),
            });
        }
        self.entries
            .insert(ENV_LIBCUDA_LOG_LEVEL.to_owned(), Value::LogLevel(level));
        Ok(())
    }

    /// Set `HAMI_GPU_FRACTION` and `HAMI_NODE_GPUS`, both (see [`crate::limits_file`]).
    pub fn set_per_node_fraction(&mut self, fraction: GpuFraction, node_gpus: NodeGpusPath) {
        self.entries.insert(
            ENV_HAMI_GPU_FRACTION.to_owned(),
            Value::GpuFraction(fraction),
        );
        self.entries
            .insert(ENV_HAMI_NODE_GPUS.to_owned(), Value::NodeGpus(node_gpus));
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.get(key)
    }

    /// The value of `key` as the file will hold it.
    pub fn text(&self, key: &str) -> Option<String> {
        self.entries.get(key).map(Value::to_string)
    }

    /// True when `key` is set.
    pub fn contains_key(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    /// Remove `key` (`HAMI_LIMITS_FORMAT` stays).
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        if key == ENV_HAMI_LIMITS_FORMAT {
            return None;
        }
        self.entries.remove(key)
    }

    /// Entries in byte order of the keys, `HAMI_LIMITS_FORMAT` included.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The entries as the file holds them (key to text), `HAMI_LIMITS_FORMAT` included.
    pub fn texts(&self) -> BTreeMap<String, String> {
        self.entries
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect()
    }

    /// Number of entries, `HAMI_LIMITS_FORMAT` included (so never 0).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing but `HAMI_LIMITS_FORMAT` is set.
    pub fn is_empty(&self) -> bool {
        self.entries.len() == 1
    }

    /// The file's bytes: sorted `KEY=VALUE\n` lines, byte-stable for equal contents. The one
    /// place where the typed values become text.
    pub fn render(&self) -> String {
        // Most lines are short (`CUDA_DEVICE_MEMORY_LIMIT_0=3000m`): one allocation in practice.
        let mut out = String::with_capacity(self.entries.len() * 40);
        for (k, v) in &self.entries {
            // Writing into a String cannot fail.
            let _ = writeln!(out, "{k}={v}");
        }
        out
    }
}

impl fmt::Display for LimitsFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}
