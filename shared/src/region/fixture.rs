//! Region files in HAMi-core's exact layout, for tests, the fuzz target and the GPU machine's
//! comparison: a stub `libvgpu.so` cannot write regions, so tests write them from here.
//!
//! [`RegionFixture::new`] starts from what `try_create_shrreg` stamps on a fresh file (magic,
//! version, SM limit 100 everywhere, `utilization_switch` 1, `recent_kernel` 2, `priority` 1, no
//! slot) and [`RegionFixture::bytes`] returns the file as HAMi-core leaves it: the structure plus
//! the one byte it writes past the end.

use super::layout::{
    DEVICE_COUNT, DEVICE_MEMORY_SIZE, DEVICE_UTIL_SIZE, Layout, MAGIC_FLAG, UUID_SIZE,
};
use super::parse::DeviceMemory;

/// One process slot to write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FixtureSlot {
    /// `pid`.
    pub pid: i32,
    /// `hostpid`.
    pub hostpid: i32,
    /// `status` (HAMi-core writes 1 when it takes the slot).
    pub status: i32,
    /// `used[d]`.
    pub used: [DeviceMemory; DEVICE_COUNT],
    /// `monitorused[d]`.
    pub monitorused: [u64; DEVICE_COUNT],
}

impl FixtureSlot {
    /// A running process (`status` 1) using `total` bytes on `device`, `context` of them its
    /// CUDA context.
    pub fn running(pid: i32, hostpid: i32, device: usize, context: u64, total: u64) -> Self {
        let mut slot = FixtureSlot {
            pid,
            hostpid,
            status: 1,
            ..FixtureSlot::default()
        };
        if let Some(u) = slot.used.get_mut(device) {
            *u = DeviceMemory {
                context,
                data: total.saturating_sub(context),
                total,
                ..DeviceMemory::default()
            };
        }
        slot
    }
}

/// A region to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionFixture {
    /// The layout (offsets and stamped version).
    pub layout: &'static Layout,
    /// `initialized_flag`.
    pub initialized_flag: i32,
    /// `major_version`, `minor_version` (default: the layout's).
    pub version: (u32, u32),
    /// `device_num`.
    pub device_num: u64,
    /// `uuids[d]`.
    pub uuids: Vec<String>,
    /// `limit[d]`, bytes.
    pub limit: [u64; DEVICE_COUNT],
    /// `sm_limit[d]`.
    pub sm_limit: [u64; DEVICE_COUNT],
    /// `procs[0..]`.
    pub procs: Vec<FixtureSlot>,
    /// `proc_num`; `None` writes `procs.len()`.
    pub proc_num: Option<i32>,
    /// `utilization_switch`.
    pub utilization_switch: i32,
    /// `recent_kernel`.
    pub recent_kernel: i32,
    /// `priority`.
    pub priority: i32,
}

impl RegionFixture {
    /// A region as a process with no limit variables initialises it.
    pub fn new(layout: &'static Layout) -> Self {
        RegionFixture {
            layout,
            initialized_flag: MAGIC_FLAG,
            version: (layout.major, layout.minor),
            device_num: 0,
            uuids: Vec::new(),
            limit: [0; DEVICE_COUNT],
            sm_limit: [100; DEVICE_COUNT],
            procs: Vec::new(),
            proc_num: None,
            utilization_switch: 1,
            recent_kernel: 2,
            priority: 1,
        }
    }

    /// The same memory limit on every device (`CUDA_DEVICE_MEMORY_LIMIT`, HAMi-core's fallback).
    #[must_use]
    pub fn with_limit_all(mut self, bytes: u64) -> Self {
        self.limit = [bytes; DEVICE_COUNT];
        self
    }

    /// The file's bytes: `sizeof(shared_region_t)` + 1, as HAMi-core sizes it.
    pub fn bytes(&self) -> Vec<u8> {
        let o = &self.layout.offsets;
        let mut buf = vec![0u8; self.layout.size + 1];
        let mut put = |at: usize, bytes: &[u8]| {
            if let Some(dst) = buf.get_mut(at..at + bytes.len()) {
                dst.copy_from_slice(bytes);
            }
        };
        put(o.initialized_flag, &self.initialized_flag.to_le_bytes());
        put(o.major_version, &self.version.0.to_le_bytes());
        put(o.minor_version, &self.version.1.to_le_bytes());
        // glibc's sem_init(&sem, 1, 1) on 64-bit: the count 1 in the low half of the first
        // word, no waiters, `private` 0 (process-shared). The reader never looks at it.
        put(o.sem, &1u64.to_le_bytes());
        put(o.device_num, &self.device_num.to_le_bytes());
        for (d, uuid) in self.uuids.iter().take(DEVICE_COUNT).enumerate() {
            let raw = uuid.as_bytes();
            put(
                o.uuids + d * UUID_SIZE,
                &raw[..raw.len().min(UUID_SIZE - 1)],
            );
        }
        for d in 0..DEVICE_COUNT {
            put(o.limit + d * 8, &self.limit[d].to_le_bytes());
            put(o.sm_limit + d * 8, &self.sm_limit[d].to_le_bytes());
        }
        let s = &o.slot;
        for (i, p) in self
            .procs
            .iter()
            .take(super::layout::SLOT_COUNT)
            .enumerate()
        {
            let base = o.procs + i * s.size;
            put(base + s.pid, &p.pid.to_le_bytes());
            put(base + s.hostpid, &p.hostpid.to_le_bytes());
            put(base + s.status, &p.status.to_le_bytes());
            for d in 0..DEVICE_COUNT {
                let at = base + s.used + d * DEVICE_MEMORY_SIZE;
                let u = &p.used[d];
                put(at + s.used_context_size, &u.context.to_le_bytes());
                put(at + s.used_module_size, &u.module.to_le_bytes());
                put(at + s.used_data_size, &u.data.to_le_bytes());
                put(at + s.used_offset, &u.offset.to_le_bytes());
                put(at + s.used_total, &u.total.to_le_bytes());
                put(
                    base + s.monitorused + d * 8,
                    &p.monitorused[d].to_le_bytes(),
                );
                // Touch device_util so that a layout error shows as a wrong sm_util.
                put(
                    base + s.device_util + d * DEVICE_UTIL_SIZE + s.device_util_sm_util,
                    &0u64.to_le_bytes(),
                );
            }
        }
        let proc_num = self
            .proc_num
            .unwrap_or_else(|| i32::try_from(self.procs.len()).unwrap_or(i32::MAX));
        put(o.proc_num, &proc_num.to_le_bytes());
        put(o.utilization_switch, &self.utilization_switch.to_le_bytes());
        put(o.recent_kernel, &self.recent_kernel.to_le_bytes());
        put(o.priority, &self.priority.to_le_bytes());
        if self.layout.offsets.slot.seqlock.is_some() {
            // 1.2 initialises sem_postinit like sem.
            put(o.tail, &1u64.to_le_bytes());
        }
        buf
    }
}
