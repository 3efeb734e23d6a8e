//! Where HAMi-core puts each field of its shared region, per layout version.
//!
//! Facts from HAMi-core `src/multiprocess/multiprocess_memory_limit.h` (commit `8f3a89c`, the
//! project's mirror, and the later stored revision `02279de`; line numbers are `8f3a89c`'s) and
//! `multiprocess_memory_limit.c` (`try_create_shrreg`), for x86_64 and aarch64 glibc (LP64:
//! `size_t` and `sem_t` 8-byte aligned, `sizeof(sem_t)` = 32, `int` 4 bytes). All integers are
//! little-endian on both.
//!
//! | field (`shared_region_t`, h:91-109) | offset | size | notes |
//! |---|---:|---:|---|
//! | `initialized_flag` (`_Atomic int32_t`) | 0 | 4 | `19920718` once initialised (h:26), stored last (c:1145) |
//! | `major_version` (`uint32_t`) | 4 | 4 | `MAJOR_VERSION` 1 (h:59) |
//! | `minor_version` (`uint32_t`) | 8 | 4 | `MINOR_VERSION` 2 since `b69b1ea` (2026-04-24), 1 before (h:60) |
//! | `sm_init_flag` (`_Atomic int32_t`) | 12 | 4 | |
//! | `owner_pid` (`_Atomic size_t`) | 16 | 8 | |
//! | `sem` (`sem_t`) | 24 | 32 | slot add/remove lock |
//! | `device_num` (`uint64_t`) | 56 | 8 | NVML device count, written by `init_device_info` (c:141) |
//! | `uuids` (`char[16][96]`) | 64 | 1536 | NVML UUIDs, NUL-terminated |
//! | `limit` (`uint64_t[16]`) | 1600 | 128 | memory limit per device, bytes; 0 = none |
//! | `sm_limit` (`uint64_t[16]`) | 1728 | 128 | SM limit per device, percent; 100 when unset (c:195-212) |
//! | `procs` (`shrreg_proc_slot_t[1024]`) | 1856 | 2007040 | 1960 bytes a slot (below) |
//! | `proc_num` (`_Atomic int`) | 2008896 | 4 | slots in use, `procs[0..proc_num]` |
//! | `utilization_switch` (`_Atomic int`) | 2008900 | 4 | 1 at creation (c:1136); HAMi's monitor toggles it |
//! | `recent_kernel` (`_Atomic int`) | 2008904 | 4 | 2 at creation |
//! | `priority` (`int`) | 2008908 | 4 | `atoi(CUDA_TASK_PRIORITY)`, default 1 (c:1139-1142) |
//! | `last_kernel_time` (`_Atomic uint64_t`) | 2008912 | 8 | |
//! | 1.1: `uint64_t unused[4]`; 1.2: `sem_t sem_postinit` | 2008920 | 32 | same size: 1.2 reuses 1.1's padding |
//! | `sizeof(shared_region_t)` | | 2008952 | the file is one byte longer (c:1093-1098) |
//!
//! | field (`shrreg_proc_slot_t`, h:78-87) | offset in slot | size |
//! |---|---:|---:|
//! | `pid` (`_Atomic int32_t`, the container's PID) | 0 | 4 |
//! | `hostpid` (`_Atomic int32_t`, 0 until the watcher finds it) | 4 | 4 |
//! | `used` (`device_memory_t[16]`, 64 bytes each: `context_size` +0, `module_size` +8, `data_size` +16, `offset` +24, `total` +32, `unused[3]` +40) | 8 | 1024 |
//! | `monitorused` (`uint64_t[16]`) | 1032 | 128 |
//! | `device_util` (`device_util_t[16]`, 48 bytes each: `dec_util`, `enc_util`, `sm_util`, `unused[3]`) | 1160 | 768 |
//! | `status` (`_Atomic int32_t`: 1 running, 2 suspended, 0 cleared) | 1928 | 4 |
//! | (padding) | 1932 | 4 |
//! | 1.1: `unused[3]`; 1.2: `seqlock` (`_Atomic uint64_t`) + `unused[2]` | 1936 | 24 |
//!
//! The `_Atomic` qualifiers added in `24a0f49` (2026-02) change no size or alignment. HAMi v2.10.0
//! reads the same offsets in its vGPU monitor (`pkg/monitor/nvidia/v1/spec.go`; its
//! `spec_test.go:47-69` asserts them). Between `1988c5d` (2026-03-25) and `b69b1ea` (2026-04-24)
//! HAMi-core wrote version 1.1 with another layout — `sem_postinit` after `sem`, every later region
//! field 32 bytes further, `seqlock` after `hostpid` — which `b69b1ea` undid "to be compatible with
//! older cache file format"; that layout is recognised by its size and refused
//! ([`TRANSIENT_V1_1_SIZE`]). Before `9b46404` (2024-08) the region had no version fields.
//!
//! Every figure here was checked with gcc's `offsetof`/`sizeof` on x86_64 glibc against
//! HAMi-core's header at `ec8979d` (1.1), `8f3a89c` (1.2) and `e200da2` (the transient layout).

use serde::Serialize;

/// `MULTIPROCESS_SHARED_REGION_MAGIC_FLAG`: `initialized_flag` once a process initialised it.
pub const MAGIC_FLAG: i32 = 19_920_718;
/// `CUDA_DEVICE_MAX_COUNT`: the per-device arrays' length.
pub const DEVICE_COUNT: usize = 16;
/// `SHARED_REGION_MAX_PROCESS_NUM`: the slot array's length.
pub const SLOT_COUNT: usize = 1024;
/// `sizeof(sem_t)` on 64-bit glibc.
pub const SEM_SIZE: usize = 32;
/// `sizeof(device_memory_t)`.
pub const DEVICE_MEMORY_SIZE: usize = 64;
/// `sizeof(device_util_t)`.
pub const DEVICE_UTIL_SIZE: usize = 48;
/// Bytes of each `uuids` entry.
pub const UUID_SIZE: usize = 96;
/// `sizeof(shared_region_t)` of the layout HAMi-core wrote as version 1.1 between `1988c5d` and
/// `b69b1ea`: 32 bytes more than [`V1_REGION_SIZE`].
pub const TRANSIENT_V1_1_SIZE: usize = V1_REGION_SIZE + SEM_SIZE;

/// Offsets inside one process slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SlotOffsets {
    /// `sizeof(shrreg_proc_slot_t)`.
    pub size: usize,
    /// `pid`.
    pub pid: usize,
    /// `hostpid`.
    pub hostpid: usize,
    /// `used[0]`; entry `d` at `used + d * 64`.
    pub used: usize,
    /// `used[d].context_size` within the entry.
    pub used_context_size: usize,
    /// `used[d].module_size` within the entry.
    pub used_module_size: usize,
    /// `used[d].data_size` within the entry.
    pub used_data_size: usize,
    /// `used[d].offset` within the entry.
    pub used_offset: usize,
    /// `used[d].total` within the entry.
    pub used_total: usize,
    /// `monitorused[0]`.
    pub monitorused: usize,
    /// `device_util[0]`; entry `d` at `device_util + d * 48`.
    pub device_util: usize,
    /// `device_util[d].sm_util` within the entry.
    pub device_util_sm_util: usize,
    /// `status`.
    pub status: usize,
    /// `seqlock` (1.2 only).
    pub seqlock: Option<usize>,
}

/// Offsets inside `shared_region_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RegionOffsets {
    /// `initialized_flag`.
    pub initialized_flag: usize,
    /// `major_version`.
    pub major_version: usize,
    /// `minor_version`.
    pub minor_version: usize,
    /// `sm_init_flag`.
    pub sm_init_flag: usize,
    /// `owner_pid`.
    pub owner_pid: usize,
    /// `sem`.
    pub sem: usize,
    /// `device_num`.
    pub device_num: usize,
    /// `uuids[0]`.
    pub uuids: usize,
    /// `limit[0]`.
    pub limit: usize,
    /// `sm_limit[0]`.
    pub sm_limit: usize,
    /// `procs[0]`.
    pub procs: usize,
    /// `proc_num`.
    pub proc_num: usize,
    /// `utilization_switch`.
    pub utilization_switch: usize,
    /// `recent_kernel`.
    pub recent_kernel: usize,
    /// `priority`.
    pub priority: usize,
    /// `last_kernel_time`.
    pub last_kernel_time: usize,
    /// `sem_postinit` (1.2) or `unused[4]` (1.1).
    pub tail: usize,
    /// The slot.
    pub slot: SlotOffsets,
}

/// One layout the reader accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// `major.minor` as HAMi-core stamps it.
    pub version: &'static str,
    /// `major_version`.
    pub major: u32,
    /// `minor_version`.
    pub minor: u32,
    /// `sizeof(shared_region_t)`: the bytes HAMi-core maps.
    pub size: usize,
    /// Which HAMi-core revisions write it.
    pub written_by: &'static str,
    /// Where each field is.
    pub offsets: RegionOffsets,
}

const V1_SLOT_SIZE: usize = 8
    + DEVICE_COUNT * DEVICE_MEMORY_SIZE
    + DEVICE_COUNT * 8
    + DEVICE_COUNT * DEVICE_UTIL_SIZE
    + 8
    + 24;
const V1_PROCS: usize = 1856;
const V1_PROC_NUM: usize = V1_PROCS + SLOT_COUNT * V1_SLOT_SIZE;
/// `sizeof(shared_region_t)` of versions 1.1 and 1.2.
pub const V1_REGION_SIZE: usize = V1_PROC_NUM + 24 + 32;

const fn v1_offsets(seqlock: Option<usize>) -> RegionOffsets {
    RegionOffsets {
        initialized_flag: 0,
        major_version: 4,
        minor_version: 8,
        sm_init_flag: 12,
        owner_pid: 16,
        sem: 24,
        device_num: 24 + SEM_SIZE,
        uuids: 64,
        limit: 64 + DEVICE_COUNT * UUID_SIZE,
        sm_limit: 64 + DEVICE_COUNT * UUID_SIZE + DEVICE_COUNT * 8,
        procs: V1_PROCS,
        proc_num: V1_PROC_NUM,
        utilization_switch: V1_PROC_NUM + 4,
        recent_kernel: V1_PROC_NUM + 8,
        priority: V1_PROC_NUM + 12,
        last_kernel_time: V1_PROC_NUM + 16,
        tail: V1_PROC_NUM + 24,
        slot: SlotOffsets {
            size: V1_SLOT_SIZE,
            pid: 0,
            hostpid: 4,
            used: 8,
            used_context_size: 0,
            used_module_size: 8,
            used_data_size: 16,
            used_offset: 24,
            used_total: 32,
            monitorused: 8 + DEVICE_COUNT * DEVICE_MEMORY_SIZE,
            device_util: 8 + DEVICE_COUNT * DEVICE_MEMORY_SIZE + DEVICE_COUNT * 8,
            device_util_sm_util: 16,
            status: 8
                + DEVICE_COUNT * DEVICE_MEMORY_SIZE
                + DEVICE_COUNT * 8
                + DEVICE_COUNT * DEVICE_UTIL_SIZE,
            seqlock,
        },
    }
}

/// Version 1.1: HAMi-core `9b46404` (2024-08) to `1988c5d` (2026-03), e.g. what HAMi v2.8 ships.
pub const V1_1: Layout = Layout {
    version: "1.1",
    major: 1,
    minor: 1,
    size: V1_REGION_SIZE,
    written_by: "HAMi-core 9b46404 (2024-08) .. 1988c5d (2026-03), e.g. HAMi v2.8",
    offsets: v1_offsets(None),
};

/// Version 1.2: HAMi-core since `b69b1ea` (2026-04-24): HAMi v2.9, HAMi v2.10 and current.
pub const V1_2: Layout = Layout {
    version: "1.2",
    major: 1,
    minor: 2,
    size: V1_REGION_SIZE,
    written_by: "HAMi-core b69b1ea (2026-04) and later: HAMi v2.9, v2.10, current main",
    offsets: v1_offsets(Some(1936)),
};

/// Every layout the reader accepts.
pub const LAYOUTS: [&Layout; 2] = [&V1_1, &V1_2];

/// Bytes accepted past a layout's size: HAMi-core's file is one byte longer than the structure,
/// and a file grown by an older, larger layout keeps its length. Anything longer is refused.
pub const READ_MARGIN: usize = 4096;

/// The most bytes any accepted region file holds: the largest layout plus [`READ_MARGIN`].
pub const MAX_REGION_FILE_BYTES: usize = V1_REGION_SIZE + READ_MARGIN;

/// The layout stamped `major.minor`, if the reader knows it.
pub fn layout_for(major: u32, minor: u32) -> Option<&'static Layout> {
    LAYOUTS
        .into_iter()
        .find(|l| l.major == major && l.minor == minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The figures HAMi v2.10.0's monitor asserts for the same C structure (spec_test.go:47-69).
    #[test]
    fn v1_offsets_match_the_c_abi() {
        let o = V1_2.offsets;
        let table = [
            (o.initialized_flag, 0),
            (o.major_version, 4),
            (o.minor_version, 8),
            (o.sm_init_flag, 12),
            (o.owner_pid, 16),
            (o.sem, 24),
            (o.device_num, 56),
            (o.uuids, 64),
            (o.limit, 1600),
            (o.sm_limit, 1728),
            (o.procs, 1856),
            (o.proc_num, 2_008_896),
            (o.utilization_switch, 2_008_900),
            (o.recent_kernel, 2_008_904),
            (o.priority, 2_008_908),
            (o.last_kernel_time, 2_008_912),
            (o.tail, 2_008_920),
            (V1_REGION_SIZE, 2_008_952),
            (o.slot.size, 1960),
            (o.slot.monitorused, 1032),
            (o.slot.device_util, 1160),
            (o.slot.status, 1928),
            (TRANSIENT_V1_1_SIZE, 2_008_984),
        ];
        for (i, (got, want)) in table.into_iter().enumerate() {
            assert_eq!(got, want, "row {i}");
        }
        assert_eq!(o.slot.seqlock, Some(1936));
        assert_eq!(V1_1.offsets.slot.seqlock, None);
        assert_eq!(layout_for(1, 2), Some(&V1_2));
        assert_eq!(layout_for(1, 3), None);
    }
}
