//! The decision, in two pure steps around the library's I/O:
//!
//! 1. [`read_limits`]: the limits file's first bytes → the entries to export, or why the
//!    environment stays untouched. Same rules as `hami_preload_reference` (the reference): the file
//!    counts only when it holds a memory limit HAMi-core reads as a limit; the later of two entries
//!    with one key wins; a memory entry that reads as "no limit" is skipped; a truncated read drops
//!    the cut last line.
//! 2. For a KAI `gpu-fraction` container ([`Limits::fraction_request`]): the node GPU file
//!    ([`parse_node_gpus`]) and the GPUs whose device nodes the container sees ([`VisibleGpus`])
//!    → [`cap_on_node`]: `floor(fraction × MiB)` of the smallest visible GPU, replacing the
//!    admission-time `CUDA_DEVICE_MEMORY_LIMIT`, or the reason the admission-time cap stands
//!    ([`Kept`]).
//!
//! Every entry is a byte range of the caller's buffer; nothing is allocated.

use crate::fraction;
use crate::keys::{Exported, exported, memory_is_limit};
use crate::lines::{LineKind, Lines};
use crate::names::{
    ENV_HAMI_GPU_FRACTION, ENV_HAMI_NODE_GPUS, ENV_HAMI_NODE_GPUS_FORMAT, MAX_GPU_MINOR,
    NODE_GPU_MAX_MIB, NODE_GPU_MAX_UUID_LEN, NODE_GPUS_MAX_PATH_BYTES, NODE_GPUS_READ_LIMIT_BYTES,
    NVIDIA_DEVICE_MAJOR,
};

/// The most distinct keys the library exports: `CUDA_DEVICE_MEMORY_LIMIT` and `_0`..`_15`, the
/// same for `CUDA_DEVICE_SM_LIMIT`, and six single keys.
pub const MAX_EXPORTED: usize = 2 * (1 + 16) + 6;

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
    /// The file is longer than the read bound and its first bytes hold no complete line.
    NoCompleteLine,
}

impl Untouched {
    /// For messages.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Untouched::Missing => "no file",
            Untouched::NotARegularFile => "not a regular file",
            Untouched::Unreadable => "unreadable",
            Untouched::NoMemoryLimit => "no memory limit in the file",
            Untouched::NoCompleteLine => "no complete line in the first bytes of the file",
        }
    }
}

/// One `KEY=VALUE` line of the caller's buffer: key `start..eq`, value `eq + 1..end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// First byte of the line.
    pub start: usize,
    /// The `=`.
    pub eq: usize,
    /// One past the value.
    pub end: usize,
}

impl Entry {
    /// The key's bytes.
    #[must_use]
    pub fn key<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        buf.get(self.start..self.eq).unwrap_or_default()
    }

    /// The value's bytes.
    #[must_use]
    pub fn value<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        buf.get(self.eq + 1..self.end).unwrap_or_default()
    }
}

const NO_ENTRY: Entry = Entry {
    start: 0,
    eq: 0,
    end: 0,
};

/// What the limits file asks for.
#[derive(Debug, Clone)]
pub struct Limits {
    entries: [Entry; MAX_EXPORTED],
    len: usize,
    /// The entry of `CUDA_DEVICE_MEMORY_LIMIT` (a limit), by position in `entries`.
    global_memory: Option<usize>,
    fraction: Option<Entry>,
    node_gpus: Option<Entry>,
    /// Lines refused by the grammar, plus memory entries that read as no limit.
    pub skipped_lines: usize,
}

impl Limits {
    /// The entries to export (distinct keys, in first-seen order).
    pub fn entries(&self) -> &[Entry] {
        self.entries.get(..self.len).unwrap_or_default()
    }

    /// The position in [`Limits::entries`] of `CUDA_DEVICE_MEMORY_LIMIT`, the value the per-node
    /// cap replaces.
    #[must_use]
    pub fn global_memory(&self) -> Option<usize> {
        self.global_memory
    }

    /// The `HAMI_NODE_GPUS` entry, if any (the library NUL-terminates its value in place).
    #[must_use]
    pub fn node_gpus_entry(&self) -> Option<Entry> {
        self.node_gpus
    }

    /// `None` without `HAMI_GPU_FRACTION`; else the fraction's digits and the node GPU file's
    /// path, or why no per-node cap can be computed from the file alone.
    ///
    /// # Errors
    /// [`Kept`]: the fraction is not canonical, the file has no admission-time
    /// `CUDA_DEVICE_MEMORY_LIMIT` to replace, or `HAMI_NODE_GPUS` is missing or not an absolute
    /// path of at most 4095 bytes.
    pub fn fraction_request<'b>(&self, buf: &'b [u8]) -> Option<Result<FractionRequest<'b>, Kept>> {
        let fraction = self.fraction?;
        Some(self.request(buf, fraction))
    }

    fn request<'b>(&self, buf: &'b [u8], fraction: Entry) -> Result<FractionRequest<'b>, Kept> {
        let digits =
            fraction::parse_canonical(fraction.value(buf)).ok_or(Kept::FractionMalformed)?;
        if self.global_memory.is_none() {
            return Err(Kept::NoAdmissionCap);
        }
        let path = self.node_gpus.ok_or(Kept::NoNodeGpusPath)?.value(buf);
        if !is_node_gpus_path(path) {
            return Err(Kept::NodeGpusPathInvalid);
        }
        Ok(FractionRequest {
            digits,
            node_gpus_path: path,
        })
    }
}

/// True for a `HAMI_NODE_GPUS` value the library opens: absolute, at most 4095 bytes.
#[must_use]
pub fn is_node_gpus_path(path: &[u8]) -> bool {
    path.first() == Some(&b'/') && path.len() <= NODE_GPUS_MAX_PATH_BYTES
}

/// A per-node cap to compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FractionRequest<'b> {
    /// The fraction's digits after `0.`.
    pub digits: &'b [u8],
    /// Where the node GPU file is.
    pub node_gpus_path: &'b [u8],
}

/// Decide from the limits file's first bytes. `truncated`: the file is longer than what was read;
/// everything after the last newline is then dropped.
///
/// # Errors
/// [`Untouched`]: no memory limit, or no complete line in a truncated read.
pub fn read_limits(contents: &[u8], truncated: bool) -> crate::Result<Limits> {
    let contents = if truncated {
        match contents.iter().rposition(|b| *b == b'\n') {
            Some(end) => contents.get(..=end).unwrap_or_default(),
            None => return Err(Untouched::NoCompleteLine),
        }
    } else {
        contents
    };
    let mut l = Limits {
        entries: [NO_ENTRY; MAX_EXPORTED],
        len: 0,
        global_memory: None,
        fraction: None,
        node_gpus: None,
        skipped_lines: 0,
    };
    for line in Lines::new(contents) {
        let LineKind::Entry { eq } = line.kind else {
            l.skipped_lines += 1;
            continue;
        };
        let e = Entry {
            start: line.start,
            eq,
            end: line.end,
        };
        let key = e.key(contents);
        if exported(key).is_some() {
            match l.entries().iter().position(|old| old.key(contents) == key) {
                Some(i) => {
                    if let Some(slot) = l.entries.get_mut(i) {
                        *slot = e;
                    }
                }
                None => {
                    if let Some(slot) = l.entries.get_mut(l.len) {
                        *slot = e;
                        l.len += 1;
                    }
                }
            }
        } else if key == ENV_HAMI_GPU_FRACTION.as_bytes() {
            l.fraction = Some(e);
        } else if key == ENV_HAMI_NODE_GPUS.as_bytes() {
            l.node_gpus = Some(e);
        }
    }
    // Memory entries that read as no limit are skipped (a limit is never turned into no limit).
    let mut kept = 0;
    let mut has_memory_limit = false;
    for i in 0..l.len {
        let Some(e) = l.entries.get(i).copied() else {
            break;
        };
        if let Some(Exported::Memory(index)) = exported(e.key(contents)) {
            if !memory_is_limit(e.value(contents)) {
                l.skipped_lines += 1;
                continue;
            }
            has_memory_limit = true;
            if index.is_none() {
                l.global_memory = Some(kept);
            }
        }
        if let Some(slot) = l.entries.get_mut(kept) {
            *slot = e;
        }
        kept += 1;
    }
    l.len = kept;
    if !has_memory_limit {
        return Err(Untouched::NoMemoryLimit);
    }
    Ok(l)
}

/// Why the admission-time cap stands for a `gpu-fraction` container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// `HAMI_GPU_FRACTION` is not `0.<1..=64 digits, last not 0>`.
    FractionMalformed,
    /// The file has no `CUDA_DEVICE_MEMORY_LIMIT` reading as a limit to replace.
    NoAdmissionCap,
    /// No `HAMI_NODE_GPUS` entry.
    NoNodeGpusPath,
    /// `HAMI_NODE_GPUS` is not an absolute path of at most 4095 bytes.
    NodeGpusPathInvalid,
    /// No node GPU file at the path.
    NodeFileMissing,
    /// The path is not a regular file.
    NodeFileNotRegular,
    /// The node GPU file could not be read.
    NodeFileUnreadable,
    /// The node GPU file is longer than the read bound.
    NodeFileTooLarge,
    /// The node GPU file is not a valid format-1 file (see `hami_shared::node_gpus`).
    NodeFileInvalid,
    /// `/dev` could not be listed.
    DeviceScanFailed,
    /// A `/dev/nvidia<N>` that is not NVIDIA's character device `195:N`.
    DeviceMismatch,
    /// No `/dev/nvidia<N>` in the container.
    NoVisibleGpu,
    /// A visible GPU (this minor number) that the node GPU file does not list.
    GpuNotInFile(u32),
    /// The fraction of the smallest visible GPU is below 1 MiB.
    BelowOneMib,
}

impl Kept {
    /// For messages.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Kept::FractionMalformed => "HAMI_GPU_FRACTION is not 0.<digits>",
            Kept::NoAdmissionCap => "no CUDA_DEVICE_MEMORY_LIMIT to replace",
            Kept::NoNodeGpusPath => "no HAMI_NODE_GPUS",
            Kept::NodeGpusPathInvalid => "HAMI_NODE_GPUS is not an absolute path",
            Kept::NodeFileMissing => "no node GPU file",
            Kept::NodeFileNotRegular => "the node GPU file is not a regular file",
            Kept::NodeFileUnreadable => "the node GPU file is unreadable",
            Kept::NodeFileTooLarge => "the node GPU file is too large",
            Kept::NodeFileInvalid => "the node GPU file is not a valid format-1 file",
            Kept::DeviceScanFailed => "/dev could not be listed",
            Kept::DeviceMismatch => "a /dev/nvidia<N> is not the character device 195:N",
            Kept::NoVisibleGpu => "no /dev/nvidia<N> in the container",
            Kept::GpuNotInFile(_) => "a visible GPU is not in the node GPU file",
            Kept::BelowOneMib => "the fraction of the GPU is below 1 MiB",
        }
    }
}

/// The outcome of step 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerNode {
    /// `CUDA_DEVICE_MEMORY_LIMIT=<mib>m` replaces the admission-time value.
    Applied {
        /// The cap.
        mib: u64,
        /// Memory of the smallest visible GPU.
        gpu_mib: u64,
        /// Visible GPUs.
        gpus: u32,
    },
    /// The admission-time cap stands.
    Kept(Kept),
}

/// Memory in MiB of each GPU minor number a valid node GPU file lists (0: not listed).
#[derive(Debug, Clone)]
pub struct NodeTable {
    /// At most [`NODE_GPU_MAX_MIB`] (2^24), so `u32` holds it.
    mib: [u32; MAX_GPU_MINOR as usize + 1],
}

impl NodeTable {
    /// MiB of the GPU with this minor number.
    #[must_use]
    pub fn mib(&self, minor: u32) -> Option<u64> {
        self.mib
            .get(usize::try_from(minor).ok()?)
            .map(|m| u64::from(*m))
            .filter(|m| *m > 0)
    }
}

/// `NVIDIA<minor>_<field>`: the minor (0..=254, no leading zero) and the field.
#[must_use]
pub fn split_gpu_key(key: &[u8]) -> Option<(u32, &[u8])> {
    let rest = key.strip_prefix(b"NVIDIA")?;
    let underscore = rest.iter().position(|b| *b == b'_')?;
    let digits = rest.get(..underscore)?;
    let field = rest.get(underscore + 1..)?;
    let minor = if digits == b"0" {
        0
    } else {
        u32::try_from(strict_decimal(digits)?).ok()?
    };
    (minor <= MAX_GPU_MINOR).then_some((minor, field))
}

/// A decimal integer without sign, white space or leading zero (so never `0`).
#[must_use]
pub fn strict_decimal(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.first() == Some(&b'0') {
        return None;
    }
    let mut v: u64 = 0;
    for d in text {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v
            .checked_mul(10)?
            .checked_add(u64::from(d.wrapping_sub(b'0')))?;
    }
    Some(v)
}

/// True for a UUID a node GPU file may hold: 1..=64 of `[A-Za-z0-9._-]`.
#[must_use]
pub fn is_gpu_uuid(uuid: &[u8]) -> bool {
    !uuid.is_empty()
        && uuid.len() <= NODE_GPU_MAX_UUID_LEN
        && uuid
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Offsets of a value in the node file (which is at most 4 KiB), `u16::MAX` when absent.
#[derive(Clone, Copy)]
struct Span(u16, u16);

const NO_SPAN: Span = Span(u16::MAX, u16::MAX);

impl Span {
    fn of(e: &Entry) -> Span {
        let start = u16::try_from(e.eq + 1).unwrap_or(u16::MAX);
        let end = u16::try_from(e.end).unwrap_or(u16::MAX);
        Span(start, end)
    }

    fn get(self, buf: &[u8]) -> Option<&[u8]> {
        if self.0 == u16::MAX {
            return None;
        }
        buf.get(usize::from(self.0)..usize::from(self.1))
    }
}

/// Read a node GPU file: valid only when it is at most 4 KiB, every line is well formed, it holds
/// `HAMI_NODE_GPUS_FORMAT=1`, and every `NVIDIA<minor>_MIB` (1..=16 TiB, no leading zero) and
/// `NVIDIA<minor>_UUID` value (the later entry of a key wins) is valid. Other keys are ignored.
///
/// # Errors
/// [`Kept::NodeFileTooLarge`], [`Kept::NodeFileInvalid`].
pub fn parse_node_gpus(bytes: &[u8]) -> Result<NodeTable, Kept> {
    if bytes.len() > NODE_GPUS_READ_LIMIT_BYTES {
        return Err(Kept::NodeFileTooLarge);
    }
    const SLOTS: usize = MAX_GPU_MINOR as usize + 1;
    let mut mib = [NO_SPAN; SLOTS];
    let mut uuid = [NO_SPAN; SLOTS];
    let mut format = NO_SPAN;
    for line in Lines::new(bytes) {
        let LineKind::Entry { eq } = line.kind else {
            return Err(Kept::NodeFileInvalid);
        };
        let e = Entry {
            start: line.start,
            eq,
            end: line.end,
        };
        let key = e.key(bytes);
        if key == ENV_HAMI_NODE_GPUS_FORMAT.as_bytes() {
            format = Span::of(&e);
            continue;
        }
        let Some((minor, field)) = split_gpu_key(key) else {
            continue;
        };
        let slot = usize::try_from(minor).unwrap_or(usize::MAX);
        let table = match field {
            b"MIB" => &mut mib,
            b"UUID" => &mut uuid,
            _ => continue,
        };
        if let Some(s) = table.get_mut(slot) {
            *s = Span::of(&e);
        }
    }
    if format.get(bytes) != Some(b"1") {
        return Err(Kept::NodeFileInvalid);
    }
    let mut out = NodeTable { mib: [0; SLOTS] };
    for (i, span) in mib.iter().enumerate() {
        if let Some(v) = span.get(bytes) {
            let m = strict_decimal(v)
                .filter(|m| *m <= NODE_GPU_MAX_MIB)
                .and_then(|m| u32::try_from(m).ok())
                .ok_or(Kept::NodeFileInvalid)?;
            if let Some(slot) = out.mib.get_mut(i) {
                *slot = m;
            }
        }
    }
    for span in &uuid {
        if let Some(v) = span.get(bytes)
            && !is_gpu_uuid(v)
        {
            return Err(Kept::NodeFileInvalid);
        }
    }
    Ok(out)
}

/// The GPUs whose device nodes a container sees: each `/dev/nvidia<N>` (N 0..=254 without
/// leading zero) that is NVIDIA's character device `195:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VisibleGpus {
    bits: [u64; 4],
    mismatch: bool,
}

/// `S_IFMT` and `S_IFCHR` of `st_mode`.
const S_IFMT: u32 = 0o170_000;
const S_IFCHR: u32 = 0o020_000;

/// glibc's `gnu_dev_major` / `gnu_dev_minor` of a 64-bit `dev_t`.
#[must_use]
pub fn dev_major_minor(rdev: u64) -> (u64, u64) {
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    (major, minor)
}

/// The minor number a `/dev` entry name claims: `nvidia<N>`, N 0..=254 without leading zero.
#[must_use]
pub fn gpu_device_name(name: &[u8]) -> Option<u32> {
    let digits = name.strip_prefix(b"nvidia")?;
    let minor = if digits == b"0" {
        0
    } else {
        u32::try_from(strict_decimal(digits)?).ok()?
    };
    (minor <= MAX_GPU_MINOR).then_some(minor)
}

impl VisibleGpus {
    /// None seen.
    pub const EMPTY: VisibleGpus = VisibleGpus {
        bits: [0; 4],
        mismatch: false,
    };

    /// None seen.
    #[must_use]
    pub fn new() -> Self {
        Self::EMPTY
    }

    /// Record one `/dev` entry: its name and, when `stat` succeeded, `(st_mode, st_rdev)`. Names
    /// that are not `nvidia<N>` are ignored; a `nvidia<N>` that is not `195:N` (or cannot be
    /// stat'ed) marks the scan as inconsistent.
    pub fn observe(&mut self, name: &[u8], stat: Option<(u32, u64)>) {
        let Some(minor) = gpu_device_name(name) else {
            return;
        };
        match stat {
            Some((mode, rdev))
                if mode & S_IFMT == S_IFCHR
                    && dev_major_minor(rdev)
                        == (u64::from(NVIDIA_DEVICE_MAJOR), u64::from(minor)) =>
            {
                self.add(minor);
            }
            _ => self.mismatch = true,
        }
    }

    /// Record a visible GPU by minor number (0..=254; others ignored).
    pub fn add(&mut self, minor: u32) {
        if minor <= MAX_GPU_MINOR
            && let Some(word) = self.bits.get_mut((minor / 64) as usize)
        {
            *word |= 1 << (minor % 64);
        }
    }

    /// Mark the scan as inconsistent.
    pub fn set_mismatch(&mut self) {
        self.mismatch = true;
    }

    /// True when a `nvidia<N>` entry was not `195:N`.
    #[must_use]
    pub fn mismatch(&self) -> bool {
        self.mismatch
    }

    /// The visible minors, ascending.
    pub fn minors(&self) -> impl Iterator<Item = u32> + '_ {
        (0..=MAX_GPU_MINOR).filter(|m| {
            self.bits
                .get((m / 64) as usize)
                .is_some_and(|w| w & (1 << (m % 64)) != 0)
        })
    }
}

/// `floor(fraction × MiB)` of the smallest GPU the container sees, or why the admission-time cap
/// stands: an inconsistent scan, no visible GPU, a visible GPU the file does not list (the lowest
/// such minor), or a cap below 1 MiB.
#[must_use]
pub fn cap_on_node(digits: &[u8], table: &NodeTable, visible: &VisibleGpus) -> PerNode {
    if visible.mismatch() {
        return PerNode::Kept(Kept::DeviceMismatch);
    }
    let mut smallest = u64::MAX;
    let mut gpus = 0;
    for minor in visible.minors() {
        let Some(mib) = table.mib(minor) else {
            return PerNode::Kept(Kept::GpuNotInFile(minor));
        };
        smallest = smallest.min(mib);
        gpus += 1;
    }
    if gpus == 0 {
        return PerNode::Kept(Kept::NoVisibleGpu);
    }
    match fraction::of_mib(digits, smallest) {
        0 => PerNode::Kept(Kept::BelowOneMib),
        mib => PerNode::Applied {
            mib,
            gpu_mib: smallest,
            gpus,
        },
    }
}

/// `<mib>m` as ASCII, without allocation.
#[derive(Debug, Clone, Copy)]
pub struct MibText {
    buf: [u8; 24],
    len: usize,
}

impl MibText {
    /// Format `mib` followed by `m`.
    #[must_use]
    pub fn new(mib: u64) -> Self {
        let mut digits = [0u8; 20];
        let mut n = 0;
        let mut v = mib;
        loop {
            if let Some(d) = digits.get_mut(n) {
                *d = b'0' + (v % 10) as u8;
            }
            n += 1;
            v /= 10;
            if v == 0 || n == digits.len() {
                break;
            }
        }
        let mut buf = [0u8; 24];
        for i in 0..n {
            if let (Some(dst), Some(src)) = (buf.get_mut(i), digits.get(n - 1 - i)) {
                *dst = *src;
            }
        }
        if let Some(m) = buf.get_mut(n) {
            *m = b'm';
        }
        MibText { buf, len: n + 1 }
    }

    /// The text.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KAI: &[u8] = b"CUDA_DEVICE_MEMORY_LIMIT=40960m\nHAMI_GPU_FRACTION=0.5\nHAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/usr/local/vgpu/node-gpus\n";
    const NODE: &[u8] = b"HAMI_NODE_GPUS_FORMAT=1\nNVIDIA0_MIB=81559\nNVIDIA0_UUID=GPU-a\nNVIDIA3_MIB=143771\nNVIDIA3_UUID=GPU-b\n";

    fn chr(minor: u64) -> Option<(u32, u64)> {
        Some((S_IFCHR | 0o666, (195 << 8) | minor))
    }

    #[test]
    fn a_fraction_of_the_card_the_container_sees() {
        let l = read_limits(KAI, false).unwrap_or_else(|_| unreachable!());
        let req = l
            .fraction_request(KAI)
            .and_then(Result::ok)
            .unwrap_or_else(|| unreachable!());
        assert_eq!(req.digits, b"5");
        assert_eq!(req.node_gpus_path, b"/usr/local/vgpu/node-gpus");
        let table = parse_node_gpus(NODE).unwrap_or_else(|_| unreachable!());
        let mut v = VisibleGpus::new();
        v.observe(b"nvidiactl", Some((S_IFCHR, (195 << 8) | 255)));
        v.observe(b"nvidia3", chr(3));
        assert_eq!(
            cap_on_node(req.digits, &table, &v),
            PerNode::Applied {
                mib: 71_885,
                gpu_mib: 143_771,
                gpus: 1
            }
        );
        v.observe(b"nvidia0", chr(0));
        assert_eq!(
            cap_on_node(req.digits, &table, &v),
            PerNode::Applied {
                mib: 40_779,
                gpu_mib: 81_559,
                gpus: 2
            }
        );
        v.add(7);
        assert_eq!(
            cap_on_node(req.digits, &table, &v),
            PerNode::Kept(Kept::GpuNotInFile(7))
        );
        let mut bad = VisibleGpus::new();
        bad.observe(b"nvidia3", chr(0));
        assert_eq!(
            cap_on_node(req.digits, &table, &bad),
            PerNode::Kept(Kept::DeviceMismatch)
        );
        let mut file = VisibleGpus::new();
        file.observe(b"nvidia3", Some((0o100_644, 0)));
        assert!(file.mismatch());
        assert_eq!(
            cap_on_node(req.digits, &table, &VisibleGpus::new()),
            PerNode::Kept(Kept::NoVisibleGpu)
        );
        assert_eq!(MibText::new(71_885).as_bytes(), b"71885m");
        assert_eq!(MibText::new(u64::MAX).as_bytes(), b"18446744073709551615m");
        assert_eq!(MibText::new(1).as_bytes(), b"1m");
    }

    #[test]
    fn the_request_needs_a_canonical_fraction_a_cap_and_a_path() {
        let cases: &[(&[u8], Kept)] = &[
            (
                b"CUDA_DEVICE_MEMORY_LIMIT=1m\nHAMI_GPU_FRACTION=0.50\nHAMI_NODE_GPUS=/n\n",
                Kept::FractionMalformed,
            ),
            (
                b"CUDA_DEVICE_MEMORY_LIMIT_0=1m\nHAMI_GPU_FRACTION=0.5\nHAMI_NODE_GPUS=/n\n",
                Kept::NoAdmissionCap,
            ),
            (
                b"CUDA_DEVICE_MEMORY_LIMIT=1m\nHAMI_GPU_FRACTION=0.5\n",
                Kept::NoNodeGpusPath,
            ),
            (
                b"CUDA_DEVICE_MEMORY_LIMIT=1m\nHAMI_GPU_FRACTION=0.5\nHAMI_NODE_GPUS=n\n",
                Kept::NodeGpusPathInvalid,
            ),
        ];
        for (file, kept) in cases {
            let l = read_limits(file, false).unwrap_or_else(|_| unreachable!());
            assert_eq!(l.fraction_request(file), Some(Err(*kept)));
        }
        let l =
            read_limits(b"CUDA_DEVICE_MEMORY_LIMIT=1m\n", false).unwrap_or_else(|_| unreachable!());
        assert_eq!(l.fraction_request(b"CUDA_DEVICE_MEMORY_LIMIT=1m\n"), None);
    }

    #[test]
    fn node_files_that_are_not_used() {
        for bad in [
            &b""[..],
            b"NVIDIA0_MIB=1\n",
            b"HAMI_NODE_GPUS_FORMAT=2\nNVIDIA0_MIB=1\n",
            b"HAMI_NODE_GPUS_FORMAT=01\n",
            b"HAMI_NODE_GPUS_FORMAT=1\nNVIDIA0_MIB=080\n",
            b"HAMI_NODE_GPUS_FORMAT=1\nNVIDIA0_MIB=16777217\n",
            b"HAMI_NODE_GPUS_FORMAT=1\nNVIDIA0_UUID=a b\n",
            b"HAMI_NODE_GPUS_FORMAT=1\n\nNVIDIA0_MIB=1\n",
        ] {
            assert!(
                parse_node_gpus(bad).is_err(),
                "{:?}",
                core::str::from_utf8(bad)
            );
        }
        // The later entry wins; unknown keys and a missing UUID are fine.
        let t = parse_node_gpus(
            b"HAMI_NODE_GPUS_FORMAT=1\nNVIDIA0_MIB=x\nNVIDIA0_MIB=5\nOTHER=1\nNVIDIA01_MIB=9\n",
        )
        .unwrap_or_else(|_| unreachable!());
        assert_eq!((t.mib(0), t.mib(1)), (Some(5), None));
        assert_eq!(
            parse_node_gpus(&[b'A'; NODE_GPUS_READ_LIMIT_BYTES + 1]).err(),
            Some(Kept::NodeFileTooLarge)
        );
    }
}
