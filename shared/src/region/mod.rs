//! HAMi-core's shared region (`usage.cache`): the limits actually in force for a container, its
//! processes and their usage — read, and judged against the container's limits file.
//!
//! HAMi-core enforces the limits **stamped in the region** by the process that created it, not
//! the ones in the file or the environment of later processes: a process without the variables
//! that creates it stamps 0 (no limit) for every later one (HAMi#2125). This module answers "is
//! the cap in force?":
//!
//! - [`layout`]: the offsets of every field, per version (1.1 and 1.2: the same offsets), with
//!   the HAMi-core sources they come from.
//! - [`parse()`]: bytes in, a typed [`Region`] or a [`ParseError`] out. Pure; nothing from the file
//!   is trusted (lengths checked before any read, `proc_num` bounded by the slot array).
//! - [`read_region_file`]: the bounded, link-refusing read of a region file (the tenant's
//!   processes write it), and [`container_dirs`] over a folder of per-container folders.
//! - [`verdict`]: [`judge`] — `capped`, `uncapped`, `mismatch`, `no-region`, `stale`,
//!   `unreadable`, `no-limit` — from the region, [`FileLimits`] and a PID liveness oracle.
//! - [`fixture`]: regions in HAMi-core's exact layout, for tests and fuzzing.

pub mod fixture;
mod io;
pub mod layout;
mod parse;
pub mod verdict;

#[cfg(test)]
mod tests;

pub use io::{ContainerDir, container_dirs, limits_file_for, read_limits_file, read_region_file};
pub use layout::{LAYOUTS, Layout, MAX_REGION_FILE_BYTES};
pub use parse::{DeviceMemory, ParseError, ProcSlot, Region, parse};
pub use verdict::{
    ContainerVerdict, CorePolicyReading, FileLimits, GpuVerdict, Liveness, MemoryBasis,
    PriorityReport, SlotReport, UtilizationReport, Verdict, judge,
};

use serde::Serialize;

/// Bytes accepted past a layout's size: HAMi-core's file is one byte longer than the structure,
/// and a file grown by an older, larger layout keeps its length. Anything longer is refused.
pub const READ_MARGIN: usize = 4096;

/// A region file that could not be read, or whose bytes are not a region; names the path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[error("{path}: {kind}")]
pub struct RegionError {
    /// The file.
    pub path: String,
    /// What went wrong.
    pub kind: RegionErrorKind,
}

/// What went wrong with a region file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum RegionErrorKind {
    /// No file: no process of the container has started CUDA (or HAMi-core uses another path).
    #[error("no such file (no process has started CUDA with this region yet)")]
    Missing,
    /// A symbolic link: refused, never followed (the container can write its folder).
    #[error("a symbolic link: refused (a region is a regular file; links are never followed)")]
    Symlink,
    /// Not a regular file.
    #[error("a {file_type}, not a regular file: refused")]
    NotRegular {
        /// `directory`, `fifo`, `socket`, `character device`, `block device`.
        file_type: &'static str,
    },
    /// An I/O error.
    #[error("cannot {op}: {message}")]
    Io {
        /// `open`, `stat`, `read`.
        op: &'static str,
        /// The error.
        message: String,
    },
    /// The bytes are not a region the reader accepts.
    #[error("{0}")]
    Parse(ParseError),
}

impl RegionError {
    /// True when no process has created the region yet (missing, empty, being initialised):
    /// the `no-region` verdict rather than `unreadable`.
    pub fn is_no_region(&self) -> bool {
        matches!(
            self.kind,
            RegionErrorKind::Missing
                | RegionErrorKind::Parse(ParseError::Empty | ParseError::NotInitialised { .. })
        )
    }
}
