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

mod error;
pub mod fixture;
mod io;
pub mod layout;
mod parse;
pub mod verdict;

#[cfg(test)]
mod tests;

/// What the readers of this module return.
pub type Result<T, E = RegionError> = std::result::Result<T, E>;

pub use error::{RegionError, RegionErrorKind};
pub use io::{
    ContainerDir, LIMITS_FILE_READ_BYTES, LimitsReadError, LimitsReadErrorKind, container_dirs,
    limits_file_for, parse_region_bytes, read_limits_bytes, read_limits_file, read_region_bytes,
    read_region_file,
};
pub use layout::{LAYOUTS, Layout, MAX_REGION_FILE_BYTES, READ_MARGIN};
pub use parse::{DeviceMemory, ParseError, ProcSlot, Region, parse};
pub use verdict::{
    ContainerVerdict, CorePolicyReading, FileLimits, GpuVerdict, Liveness, MemoryBasis,
    PriorityReport, SlotReport, UtilizationReport, Verdict, judge,
};
