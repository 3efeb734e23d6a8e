//! The pure reader: a region file's bytes in, a typed [`Region`] or a [`ParseError`] out.
//!
//! The bytes come from a file a tenant's processes map read-write, so nothing in them is trusted:
//! the length is checked against the layout before any field is read, `proc_num` is bounded by the
//! slot array, and every read is a bounds-checked slice (an error, never a panic). Memory held is
//! bounded by the slot array, whatever the input.

use serde::Serialize;

use super::layout::{
    DEVICE_COUNT, DEVICE_MEMORY_SIZE, DEVICE_UTIL_SIZE, LAYOUTS, Layout, MAGIC_FLAG, READ_MARGIN,
    SLOT_COUNT, TRANSIENT_V1_1_SIZE, UUID_SIZE, layout_for,
};

/// One device's entry of a slot's `used[]` (`device_memory_t`), in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    /// `context_size`: the CUDA context.
    pub context: u64,
    /// `module_size`: loaded modules.
    pub module: u64,
    /// `data_size`: allocations.
    pub data: u64,
    /// `offset`.
    pub offset: u64,
    /// `total`: what HAMi-core sums against the limit.
    pub total: u64,
}

/// One process slot (`shrreg_proc_slot_t`) of `procs[0..proc_num]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcSlot {
    /// Position in `procs[]`.
    pub slot: usize,
    /// `pid`: the process's PID in the container's PID namespace.
    pub pid: i32,
    /// `hostpid`: its PID on the node; 0 until HAMi-core's watcher found it.
    pub hostpid: i32,
    /// `status`: 1 running, 2 suspended, 0 cleared.
    pub status: i32,
    /// `seqlock` (layout 1.2): odd while the process updates its usage.
    pub seqlock: Option<u64>,
    /// `used[d]` per device.
    pub used: [DeviceMemory; DEVICE_COUNT],
    /// `monitorused[d]`: what HAMi's monitor last saw through NVML.
    pub monitorused: [u64; DEVICE_COUNT],
    /// `device_util[d].sm_util`.
    pub sm_util: [u64; DEVICE_COUNT],
}

/// A region as HAMi-core stamped it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Region {
    /// The layout it was read with.
    pub layout: &'static Layout,
    /// The file's length in bytes.
    pub length: usize,
    /// `sm_init_flag`.
    pub sm_init_flag: i32,
    /// `owner_pid`: the process holding the slot lock, 0 when free.
    pub owner_pid: u64,
    /// `device_num`: the devices NVML showed the first process (0 before its NVML init).
    pub device_num: u64,
    /// `uuids[0..device_num]`: `None` for an entry that is not printable ASCII.
    pub uuids: Vec<Option<String>>,
    /// `limit[d]`: the memory limit in force, bytes; 0 = none.
    pub limit: [u64; DEVICE_COUNT],
    /// `sm_limit[d]`: the SM limit in force, percent (HAMi-core throttles for 1..=99).
    pub sm_limit: [u64; DEVICE_COUNT],
    /// `procs[0..proc_num]`.
    pub procs: Vec<ProcSlot>,
    /// `utilization_switch`: 1 at creation; HAMi's monitor sets 0/1 by priority.
    pub utilization_switch: i32,
    /// `recent_kernel`.
    pub recent_kernel: i32,
    /// `priority`: `CUDA_TASK_PRIORITY` of the first writer (default 1).
    pub priority: i32,
    /// `last_kernel_time` (seconds since the epoch).
    pub last_kernel_time: u64,
}

impl Region {
    /// `Σ used[device].total` over the slots (saturating: a hostile slot cannot wrap the sum).
    pub fn used(&self, device: usize) -> u64 {
        self.procs
            .iter()
            .filter_map(|p| p.used.get(device))
            .fold(0u64, |sum, u| sum.saturating_add(u.total))
    }
}

/// Why bytes are not a region the reader accepts. Each names the field, the value and what is
/// accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(tag = "error", rename_all = "kebab-case")]
pub enum ParseError {
    /// Zero bytes: the device plugin pre-creates the file empty; no process has mapped it yet.
    #[error("empty (no process has started CUDA with this region yet)")]
    Empty,
    /// `initialized_flag` is 0: a process sized the file and has not finished initialising it
    /// (or died doing so; the next process initialises it again).
    #[error(
        "not initialised: initialized_flag = 0 in {length} bytes (a process is initialising it, or died doing so)"
    )]
    NotInitialised {
        /// The file's length.
        length: usize,
    },
    /// Too short for the layout it names (or for the header).
    #[error("{length} bytes: too short for {what} ({need} bytes); torn or truncated")]
    TooShort {
        /// The file's length.
        length: usize,
        /// What it is too short for.
        what: String,
        /// The bytes needed.
        need: usize,
    },
    /// Longer than any region HAMi-core writes, plus a margin.
    #[error(
        "more than {max} bytes: not a region HAMi-core writes (version {version}: {size} bytes, + 1)"
    )]
    Oversized {
        /// The most accepted.
        max: usize,
        /// The version it claims.
        version: String,
        /// The layout's size.
        size: usize,
    },
    /// `initialized_flag` is neither 0 nor the magic.
    #[error("initialized_flag = {found}: accepted 0 (uninitialised) or {MAGIC_FLAG}")]
    BadMagic {
        /// The value found.
        found: i32,
    },
    /// A version the reader does not know.
    #[error("version {major}.{minor} in {length} bytes: accepted {accepted}")]
    UnknownVersion {
        /// `major_version`.
        major: u32,
        /// `minor_version`.
        minor: u32,
        /// The file's length.
        length: usize,
        /// The versions accepted, with their sizes.
        accepted: String,
    },
    /// Version 1.1 in the size of the layout HAMi-core wrote as 1.1 in March-April 2026.
    #[error(
        "version 1.1 in {length} bytes: the layout HAMi-core 1988c5d..b69b1ea (2026-03/04) wrote as 1.1 \
         (sem_postinit after sem, seqlock after hostpid; {TRANSIENT_V1_1_SIZE} bytes) is not read: \
         restart the container's CUDA processes under a current libvgpu.so"
    )]
    TransientLayout {
        /// The file's length.
        length: usize,
    },
    /// A field outside the values HAMi-core can write.
    #[error("{field} = {value}: accepted {accepted}")]
    Field {
        /// The field, e.g. `proc_num`.
        field: &'static str,
        /// The value found.
        value: i128,
        /// The accepted values.
        accepted: &'static str,
    },
}

/// Read-only little-endian view with every read bounds-checked.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn array<const N: usize>(&self, at: usize) -> Result<[u8; N], ParseError> {
        at.checked_add(N)
            .and_then(|end| self.0.get(at..end))
            .and_then(|s| <[u8; N]>::try_from(s).ok())
            .ok_or(ParseError::TooShort {
                length: self.0.len(),
                what: format!("a field at offset {at}"),
                need: at.saturating_add(N),
            })
    }
    fn i32(&self, at: usize) -> Result<i32, ParseError> {
        self.array::<4>(at).map(i32::from_le_bytes)
    }
    fn u32(&self, at: usize) -> Result<u32, ParseError> {
        self.array::<4>(at).map(u32::from_le_bytes)
    }
    fn u64(&self, at: usize) -> Result<u64, ParseError> {
        self.array::<8>(at).map(u64::from_le_bytes)
    }
    fn u64s(&self, at: usize, stride: usize) -> Result<[u64; DEVICE_COUNT], ParseError> {
        let mut out = [0u64; DEVICE_COUNT];
        for (d, v) in out.iter_mut().enumerate() {
            *v = self.u64(at + d * stride)?;
        }
        Ok(out)
    }
}

fn accepted_versions() -> String {
    LAYOUTS
        .iter()
        .map(|l| format!("{} ({} bytes + 1)", l.version, l.size))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The layout the header names, the length checked against it.
fn layout_of(b: &Bytes<'_>) -> Result<&'static Layout, ParseError> {
    let length = b.0.len();
    if length == 0 {
        return Err(ParseError::Empty);
    }
    let header = |need| ParseError::TooShort {
        length,
        what: "the header (initialized_flag, major_version, minor_version)".to_owned(),
        need,
    };
    let magic = b.i32(0).map_err(|_| header(4))?;
    if magic == 0 {
        return Err(ParseError::NotInitialised { length });
    }
    if magic != MAGIC_FLAG {
        return Err(ParseError::BadMagic { found: magic });
    }
    let (major, minor) = (
        b.u32(4).map_err(|_| header(12))?,
        b.u32(8).map_err(|_| header(12))?,
    );
    if (major, minor) == (1, 1) && (TRANSIENT_V1_1_SIZE..=TRANSIENT_V1_1_SIZE + 1).contains(&length)
    {
        return Err(ParseError::TransientLayout { length });
    }
    let layout = layout_for(major, minor).ok_or_else(|| ParseError::UnknownVersion {
        major,
        minor,
        length,
        accepted: accepted_versions(),
    })?;
    if length < layout.size {
        return Err(ParseError::TooShort {
            length,
            what: format!("version {}", layout.version),
            need: layout.size,
        });
    }
    if length > layout.size + READ_MARGIN {
        return Err(ParseError::Oversized {
            max: layout.size + READ_MARGIN,
            version: layout.version.to_owned(),
            size: layout.size,
        });
    }
    Ok(layout)
}

fn uuid(raw: &[u8]) -> Option<String> {
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    let text = raw.get(..end)?;
    (!text.is_empty() && text.iter().all(u8::is_ascii_graphic))
        .then(|| String::from_utf8_lossy(text).into_owned())
}

/// Parse a region file's bytes (at most [`super::layout::MAX_REGION_FILE_BYTES`] + 1 of them
/// need be read: anything longer is [`ParseError::Oversized`]).
///
/// # Errors
/// [`ParseError`]: empty, uninitialised, torn, oversized, an unknown version or magic, or a field
/// no HAMi-core writes (`proc_num` outside 0..=1024, `device_num` above 16).
pub fn parse(bytes: &[u8]) -> Result<Region, ParseError> {
    let b = Bytes(bytes);
    let layout = layout_of(&b)?;
    let o = &layout.offsets;
    let proc_num = b.i32(o.proc_num)?;
    let procs_len = usize::try_from(proc_num)
        .ok()
        .filter(|n| *n <= SLOT_COUNT)
        .ok_or(ParseError::Field {
            field: "proc_num",
            value: i128::from(proc_num),
            accepted: "0..=1024 (the slot array's length)",
        })?;
    let device_num = b.u64(o.device_num)?;
    let devices = usize::try_from(device_num)
        .ok()
        .filter(|n| *n <= DEVICE_COUNT)
        .ok_or(ParseError::Field {
            field: "device_num",
            value: i128::from(device_num),
            accepted: "0..=16 (CUDA_DEVICE_MAX_COUNT)",
        })?;
    let uuids = (0..devices)
        .map(|d| {
            let at = o.uuids + d * UUID_SIZE;
            bytes.get(at..at + UUID_SIZE).and_then(uuid)
        })
        .collect();
    let mut procs = Vec::with_capacity(procs_len);
    for slot in 0..procs_len {
        procs.push(read_slot(&b, layout, slot)?);
    }
    Ok(Region {
        layout,
        length: bytes.len(),
        sm_init_flag: b.i32(o.sm_init_flag)?,
        owner_pid: b.u64(o.owner_pid)?,
        device_num,
        uuids,
        limit: b.u64s(o.limit, 8)?,
        sm_limit: b.u64s(o.sm_limit, 8)?,
        procs,
        utilization_switch: b.i32(o.utilization_switch)?,
        recent_kernel: b.i32(o.recent_kernel)?,
        priority: b.i32(o.priority)?,
        last_kernel_time: b.u64(o.last_kernel_time)?,
    })
}

fn read_slot(b: &Bytes<'_>, layout: &Layout, slot: usize) -> Result<ProcSlot, ParseError> {
    let s = &layout.offsets.slot;
    let base = layout.offsets.procs + slot * s.size;
    let mut used = [DeviceMemory::default(); DEVICE_COUNT];
    for (d, u) in used.iter_mut().enumerate() {
        let at = base + s.used + d * DEVICE_MEMORY_SIZE;
        *u = DeviceMemory {
            context: b.u64(at + s.used_context_size)?,
            module: b.u64(at + s.used_module_size)?,
            data: b.u64(at + s.used_data_size)?,
            offset: b.u64(at + s.used_offset)?,
            total: b.u64(at + s.used_total)?,
        };
    }
    Ok(ProcSlot {
        slot,
        pid: b.i32(base + s.pid)?,
        hostpid: b.i32(base + s.hostpid)?,
        status: b.i32(base + s.status)?,
        seqlock: s.seqlock.map(|at| b.u64(base + at)).transpose()?,
        used,
        monitorused: b.u64s(base + s.monitorused, 8)?,
        sm_util: b.u64s(
            base + s.device_util + s.device_util_sm_util,
            DEVICE_UTIL_SIZE,
        )?,
    })
}
