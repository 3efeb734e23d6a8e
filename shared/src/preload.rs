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
//! - The file is parsed with the tolerant [`crate::limits_file::parse_bytes`]: a malformed line is
//!   skipped and the lines after it still count; CRLF endings are stripped. A memory entry that
//!   HAMi-core would read as "no limit" (`0`, garbage, a negative number) is skipped too: a limit
//!   is never turned into no limit.
//! - The reader reads at most [`READ_LIMIT_BYTES`]; when the file is longer, the cut last line is
//!   dropped (a cut `3000m` would read as `30` bytes).

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;

use crate::hami_core::{KeyKind, MemoryReading, interpret_memory, key_kind};
use crate::limits_file::{Severity, parse_bytes};
use crate::names::{
    ENV_CUDA_DEVICE_MEMORY_LIMIT, ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE, ENV_CUDA_DEVICE_SM_LIMIT,
    ENV_CUDA_OVERSUBSCRIBE, ENV_CUDA_TASK_PRIORITY, ENV_GPU_CORE_UTILIZATION_POLICY,
    ENV_LIBCUDA_LOG_LEVEL, ENV_LIBVGPU_HOSTPID_BROKER,
};

pub use hami_preload_core::names::{ENV_PRELOAD_DEBUG, READ_LIMIT_BYTES};

/// Every variable HAMi-core reads that the contract names, by exact name. The per-device forms
/// `CUDA_DEVICE_MEMORY_LIMIT_<i>` and `CUDA_DEVICE_SM_LIMIT_<i>` are covered by
/// [`CONTRACT_VARIABLE_PREFIXES`].
pub const CONTRACT_VARIABLES: &[&str] = &[
    ENV_CUDA_DEVICE_MEMORY_LIMIT,
    ENV_CUDA_DEVICE_SM_LIMIT,
    ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE,
    ENV_CUDA_OVERSUBSCRIBE,
    ENV_GPU_CORE_UTILIZATION_POLICY,
    ENV_CUDA_TASK_PRIORITY,
    ENV_LIBCUDA_LOG_LEVEL,
    ENV_LIBVGPU_HOSTPID_BROKER,
];

/// Prefixes of the per-device contract variables (`CUDA_DEVICE_MEMORY_LIMIT_<anything>`,
/// `CUDA_DEVICE_SM_LIMIT_<anything>`). Inherited variables with these prefixes are all removed when
/// the file counts, whatever follows the prefix.
pub const CONTRACT_VARIABLE_PREFIXES: &[&str] =
    &["CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT_"];

/// True for a variable of the contract: removed from the environment when the file counts.
pub fn is_contract_variable(name: &[u8]) -> bool {
    CONTRACT_VARIABLES.iter().any(|v| v.as_bytes() == name)
        || CONTRACT_VARIABLE_PREFIXES
            .iter()
            .any(|p| name.starts_with(p.as_bytes()))
}

/// True for a file key the library may export: a contract variable under a name HAMi-core reads
/// (device indexes 0..=15 without leading zero).
pub fn is_exported_key(key: &str) -> bool {
    match key_kind(key) {
        KeyKind::Memory(_)
        | KeyKind::Sm(_)
        | KeyKind::CorePolicy
        | KeyKind::TaskPriority
        | KeyKind::LogLevel
        | KeyKind::HostPidBroker
        | KeyKind::SharedCache => true,
        KeyKind::UnreadIndex => false,
        KeyKind::Other => key == ENV_CUDA_OVERSUBSCRIBE,
    }
}

/// Why the environment was left as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Untouched {
    /// No file at the path.
    Missing,
    /// The path is not a regular file (directory, FIFO, device, socket).
    NotARegularFile,
    /// The file could not be opened or read (permissions, I/O error).
    Unreadable,
    /// The file holds no memory limit that HAMi-core reads as a limit.
    NoMemoryLimit,
    /// The file is longer than [`READ_LIMIT_BYTES`] and its first bytes hold no complete line.
    NoCompleteLine,
}

impl fmt::Display for Untouched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Untouched::Missing => "no file",
            Untouched::NotARegularFile => "not a regular file",
            Untouched::Unreadable => "unreadable",
            Untouched::NoMemoryLimit => "no memory limit in the file",
            Untouched::NoCompleteLine => "no complete line in the first bytes of the file",
        })
    }
}

/// What to do to the environment when the file counts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Overlay {
    /// Inherited contract variables to remove, in the order they were seen.
    pub remove: Vec<OsString>,
    /// The file's contract entries to set, sorted by key.
    pub set: Vec<(String, String)>,
    /// Lines of the file that were skipped (malformed, or a memory value that reads as no limit).
    pub skipped_lines: usize,
    /// Well-formed entries that are not exported (outside the contract, or never read by HAMi-core).
    pub ignored_keys: usize,
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
    /// One line for the opt-in diagnostic (no newline).
    pub fn summary(&self) -> String {
        match self {
            Decision::Untouched(why) => format!("hami-preload: environment untouched: {why}"),
            Decision::Apply(o) => format!(
                "hami-preload: applied the limits file: set {}, removed {} inherited, skipped {} line(s), ignored {} key(s)",
                o.set.len(),
                o.remove.len(),
                o.skipped_lines,
                o.ignored_keys
            ),
        }
    }
}

/// Decide what to do with a file's first bytes.
///
/// `contents` are the bytes read (at most [`READ_LIMIT_BYTES`]); `truncated` is true when the file
/// is longer than that, in which case everything after the last newline is dropped. `inherited`
/// are the names of the process's environment variables.
pub fn decide<I, S>(contents: &[u8], truncated: bool, inherited: I) -> Decision
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
    let mut ignored_keys = 0;
    let mut set: BTreeMap<&str, &str> = BTreeMap::new();
    let mut has_memory_limit = false;
    for (key, value) in &parsed.entries {
        if !is_exported_key(key) {
            ignored_keys += 1;
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
        set.insert(key, value);
    }
    if !has_memory_limit {
        return Decision::Untouched(Untouched::NoMemoryLimit);
    }
    let remove = inherited
        .into_iter()
        .filter(|name| is_contract_variable(name.as_ref().as_bytes()))
        .map(|name| name.as_ref().to_owned())
        .collect();
    Decision::Apply(Overlay {
        remove,
        set: set
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        skipped_lines,
        ignored_keys,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(file: &str, env: &[&str]) -> Overlay {
        match decide(file.as_bytes(), false, env) {
            Decision::Apply(o) => o,
            Decision::Untouched(why) => panic!("untouched ({why}) for {file:?}"),
        }
    }

    #[test]
    fn the_example_is_applied_over_spoofed_variables() {
        let o = apply(
            crate::limits_file::EXAMPLE,
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
        assert_eq!((o.skipped_lines, o.ignored_keys), (0, 1)); // HAMI_LIMITS_FORMAT
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
