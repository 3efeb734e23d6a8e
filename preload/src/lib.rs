//! `libhami_preload.so`: makes `/overrideEnv` authoritative for HAMi-core in every process.
//!
//! Listed first in `/etc/ld.so.preload`, the library is mapped into every dynamically linked
//! process of the container — the entrypoint, `kubectl exec`, an SSH login, `su -`, `sudo`, cron —
//! and its ELF constructor runs before `main`. It reads the limits file the device plugin (or the
//! webhook, for KAI pods) delivered at `/overrideEnv` and, when the file holds a memory limit,
//! replaces the inherited HAMi-core variables with the file's. For a KAI `gpu-fraction` container
//! it then sizes the cap to the GPU(s) the container sees on this node: the node GPU file named by
//! `HAMI_NODE_GPUS` and the container's `/dev/nvidia<N>` devices give the memory, and
//! `CUDA_DEVICE_MEMORY_LIMIT` becomes `floor(fraction × MiB)m` of the smallest (or the
//! admission-time value stands). HAMi-core reads its settings lazily, at the first CUDA call, so it
//! sees the file's values.
//!
//! The decision is [`hami_preload_core::decide`]; this file is its I/O. The shipped build
//! (`scripts/build-preload`: profile `preload`, `panic = "abort"`) is `#![no_std]`: `core` and raw
//! libc calls only, a fixed buffer, no allocation of its own, about 20 KiB. Its panic handler
//! calls a symbol defined nowhere, which `scripts/check-preload-abi` refuses to find among the
//! library's dynamic symbols: a panic path left in the code fails the build instead of reaching a
//! process. Builds with unwinding (`cargo test`) link `std` for its panic runtime and run the same
//! code.
//!
//! What the constructor never does: print (unless `HAMI_PRELOAD_DEBUG=1`, and never in
//! secure-execution mode), abort, panic, write a file, block on a FIFO, read more than
//! `READ_LIMIT_BYTES` of the limits file, touch a variable outside the contract, or change
//! `errno`.
//!
//! This is the only crate of the workspace with `unsafe` code; each block says why it is sound.
#![cfg_attr(panic = "abort", no_std)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![allow(unsafe_code)]

use core::cell::UnsafeCell;
use core::ffi::{c_char, c_int, c_void};

use hami_preload_core::decide::{
    FractionRequest, Kept, Limits, MAX_EXPORTED, MibText, PerNode, Untouched, VisibleGpus,
    cap_on_node, parse_node_gpus, read_limits,
};
use hami_preload_core::keys::is_contract_variable;
use hami_preload_core::names::{
    ENV_CUDA_DEVICE_MEMORY_LIMIT, NODE_GPUS_READ_LIMIT_BYTES, READ_LIMIT_BYTES,
};

/// The constructor, placed in `.init_array`: the dynamic loader calls it after relocating the
/// library and before the program's `main`.
#[used]
#[unsafe(link_section = ".init_array")]
static CONSTRUCTOR: extern "C" fn() = hami_preload_init;

#[cfg(panic = "abort")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    unsafe extern "C" {
        /// Defined nowhere. `scripts/check-preload-abi` fails a library whose dynamic symbols
        /// name it: a panic path the optimiser could not remove. The library that ships has none,
        /// so this handler is not in it at all.
        fn hami_preload_panic_path_left_in_the_library() -> !;
    }
    // SAFETY: never executed in a shipped library (see above).
    unsafe { hami_preload_panic_path_left_in_the_library() }
}

// `core` is precompiled with unwind tables that name the personality routine; with
// `panic = "abort"` nothing unwinds, so it is never called, but the name must resolve. Defined
// here as a hidden symbol (`ret`, valid on x86-64 and AArch64): bound at link time inside the
// library and never exported, so it cannot interpose on a Rust program's own.
#[cfg(panic = "abort")]
core::arch::global_asm!(
    ".pushsection .text.rust_eh_personality,\"ax\",@progbits",
    ".globl rust_eh_personality",
    ".hidden rust_eh_personality",
    ".type rust_eh_personality,@function",
    "rust_eh_personality:",
    "ret",
    ".size rust_eh_personality, . - rust_eh_personality",
    ".popsection",
);

// glibc: without `std`, nothing else asks the linker for libc.so.6 (and its symbol versions).
#[cfg(panic = "abort")]
#[link(name = "c")]
unsafe extern "C" {}

/// `/overrideEnv`, NUL-terminated.
const OVERRIDE_ENV: &[u8] = b"/overrideEnv\0";
/// `/dev`, NUL-terminated.
const DEV: &[u8] = b"/dev\0";
/// `HAMI_PRELOAD_DEBUG`, NUL-terminated.
const PRELOAD_DEBUG: &[u8] = b"HAMI_PRELOAD_DEBUG\0";

/// A buffer in `.bss` (no bytes on disk), written only by the constructor.
struct Static<const N: usize>(UnsafeCell<[u8; N]>);

// SAFETY: the buffers are touched only by the constructor, which runs once, single-threaded,
// before `main`; afterwards the environment points into them and nothing writes them again.
unsafe impl<const N: usize> Sync for Static<N> {}

/// The limits file's bytes (one more than the bound, to see that a file is longer). Entries are
/// exported with `putenv` in place: each value's line end becomes a NUL, so the environment
/// points here for the life of the process (a preloaded library is never unloaded).
static FILE: Static<{ READ_LIMIT_BYTES + 1 }> = Static(UnsafeCell::new([0; READ_LIMIT_BYTES + 1]));
/// `CUDA_DEVICE_MEMORY_LIMIT=<mib>m` of the per-node cap, for `putenv`.
static PER_NODE: Static<64> = Static(UnsafeCell::new([0; 64]));

/// The constructor body: `errno` restored.
extern "C" fn hami_preload_init() {
    let saved_errno = errno();
    run();
    set_errno(saved_errno);
}

fn run() {
    // SAFETY: single-threaded before `main` (see `Static`); this is the only reference made.
    let buf = unsafe { &mut *FILE.0.get() };
    let outcome = match read_file(OVERRIDE_ENV, buf) {
        Ok(n) => {
            let truncated = n > READ_LIMIT_BYTES;
            let contents = buf.get(..n.min(READ_LIMIT_BYTES)).unwrap_or_default();
            match read_limits(contents, truncated) {
                Ok(limits) => {
                    // The node GPU file's path is opened where it lies: its line end becomes a
                    // NUL (the key is never exported, and no other entry includes that byte).
                    if let Some(end) = limits.node_gpus_entry().and_then(|e| buf.get_mut(e.end)) {
                        *end = 0;
                    }
                    // The bytes after the file's (and its NUL) are free: the node GPU file is
                    // read there when it fits, in the page the limits file already touched.
                    let (contents, spare) = buf.split_at_mut((n + 1).min(READ_LIMIT_BYTES + 1));
                    let contents = contents.get(..n.min(READ_LIMIT_BYTES)).unwrap_or_default();
                    let per_node = per_node(&limits, contents, spare);
                    Ok((limits, per_node))
                }
                Err(why) => Err(why),
            }
        }
        Err(e) => Err(match e {
            ReadError::Missing => Untouched::Missing,
            ReadError::NotRegular => Untouched::NotARegularFile,
            ReadError::Unreadable => Untouched::Unreadable,
        }),
    };
    let removed = match &outcome {
        Ok((limits, per_node)) => apply(buf, limits, *per_node),
        Err(_) => 0,
    };
    if debug_enabled() {
        report(&outcome, removed);
    }
}

/// The per-node step for a file with `HAMI_GPU_FRACTION`: the node GPU file, then `/dev`.
fn per_node(limits: &Limits, contents: &[u8], spare: &mut [u8]) -> Option<PerNode> {
    Some(match limits.fraction_request(contents)? {
        Ok(request) => match spare.get_mut(..NODE_GPUS_READ_LIMIT_BYTES + 1) {
            Some(node) => per_node_on(&request, node),
            None => per_node_on_stack(&request),
        },
        Err(why) => PerNode::Kept(why),
    })
}

/// [`per_node_on`] with the node GPU file read into a stack buffer (a limits file of more than
/// 4 KiB leaves too little room after it).
#[inline(never)]
fn per_node_on_stack(request: &FractionRequest<'_>) -> PerNode {
    let mut node = [0u8; NODE_GPUS_READ_LIMIT_BYTES + 1];
    per_node_on(request, &mut node)
}

/// The node GPU file into `node` (one byte more than the bound), then `/dev`. Never inlined: its
/// buffers (a few KiB of stack, which the compiler probes page by page) are then only touched by
/// the processes of a `gpu-fraction` container, not by every exec.
#[inline(never)]
fn per_node_on(request: &FractionRequest<'_>, node: &mut [u8]) -> PerNode {
    // `run` NUL-terminated the path in the file's buffer, right after the slice; a path of at
    // most 4095 bytes, absolute (`fraction_request` checked both).
    let n = match read_file_at(request.node_gpus_path.as_ptr(), node) {
        Ok(n) => n,
        Err(e) => {
            return PerNode::Kept(match e {
                ReadError::Missing => Kept::NodeFileMissing,
                ReadError::NotRegular => Kept::NodeFileNotRegular,
                ReadError::Unreadable => Kept::NodeFileUnreadable,
            });
        }
    };
    let table = match parse_node_gpus(node.get(..n).unwrap_or_default()) {
        Ok(t) => t,
        Err(why) => return PerNode::Kept(why),
    };
    match scan_dev() {
        Ok(visible) => cap_on_node(request.digits, &table, &visible),
        Err(why) => PerNode::Kept(why),
    }
}

/// How many variables the environment built in [`ENVP`] may hold; a larger environment takes the
/// slower path (`putenv`, which allocates).
const ENVP_SLOTS: usize = 1024;

/// The new environment array: the inherited variables less the contract's, then the file's
/// entries, then NULL. `environ` is pointed here, so no allocation is made before `main` (glibc's
/// `setenv` later copies an array it did not allocate, and never frees it).
static ENVP: StaticPtrs = StaticPtrs(UnsafeCell::new([core::ptr::null_mut(); ENVP_SLOTS]));

/// An array of pointers in `.bss`, written only by the constructor.
struct StaticPtrs(UnsafeCell<[*mut c_char; ENVP_SLOTS]>);

// SAFETY: as for `Static`: written once by the constructor, single-threaded, before `main`.
unsafe impl Sync for StaticPtrs {}

/// Remove every inherited contract variable, then export the file's entries. Returns how many
/// variables were removed.
fn apply(buf: &mut [u8], limits: &Limits, per_node: Option<PerNode>) -> usize {
    // The NUL-terminated `KEY=VALUE` lines to export, in the buffers that outlive the process.
    let mut lines: [*mut c_char; MAX_EXPORTED] = [core::ptr::null_mut(); MAX_EXPORTED];
    let mut count = 0;
    for (i, e) in limits.entries().iter().enumerate() {
        let line = if let Some(PerNode::Applied { mib, .. }) = per_node
            && limits.global_memory() == Some(i)
        {
            per_node_line(mib)
        } else {
            // The value ends at a newline, a CR or the end of the data: within the buffer, which
            // is one byte longer than anything read as an entry.
            match (
                buf.get_mut(e.end).map(|end| *end = 0),
                buf.get_mut(e.start..),
            ) {
                (Some(()), Some(line)) => Some(line.as_mut_ptr().cast::<c_char>()),
                _ => None,
            }
        };
        if let (Some(line), Some(slot)) = (line, lines.get_mut(count)) {
            *slot = line;
            count += 1;
        }
    }
    let lines = lines.get(..count).unwrap_or_default();
    if let Some(removed) = replace_environment(lines) {
        return removed;
    }
    let removed = remove_contract_variables();
    for &line in lines {
        put(line);
    }
    removed
}

/// `CUDA_DEVICE_MEMORY_LIMIT=<mib>m`, NUL-terminated, in [`PER_NODE`].
fn per_node_line(mib: u64) -> Option<*mut c_char> {
    // SAFETY: single-threaded before `main` (see `Static`); the only reference made.
    let line = unsafe { &mut *PER_NODE.0.get() };
    let value = MibText::new(mib);
    let name = ENV_CUDA_DEVICE_MEMORY_LIMIT.as_bytes();
    let at = name.len() + 1;
    let end = at + value.as_bytes().len();
    // `line` is zeroed and 64 bytes long: the text (at most 46 bytes) stays NUL-terminated.
    (copy_into(line, 0, name)
        && copy_into(line, name.len(), b"=")
        && copy_into(line, at, value.as_bytes())
        && end < line.len())
    .then_some(line.as_mut_ptr().cast::<c_char>())
}

/// Build the new environment in [`ENVP`] and point `environ` at it: the inherited entries that
/// are not contract variables, then `lines`. `None` (nothing changed) when it does not fit.
fn replace_environment(lines: &[*mut c_char]) -> Option<usize> {
    // SAFETY: single-threaded before `main` (see `StaticPtrs`); the only reference made.
    let envp = unsafe { &mut *ENVP.0.get() };
    let mut n = 0;
    let mut removed = 0;
    // SAFETY: single-threaded before `main`; `environ` is NULL or a NULL-terminated array of
    // NUL-terminated strings, only read here.
    unsafe {
        let mut src = environ;
        if !src.is_null() {
            while !(*src).is_null() {
                let entry = *src;
                if is_contract_entry(entry) {
                    removed += 1;
                } else {
                    *envp.get_mut(n)? = entry;
                    n += 1;
                }
                src = src.add(1);
            }
        }
    }
    for &line in lines {
        *envp.get_mut(n)? = line;
        n += 1;
    }
    *envp.get_mut(n)? = core::ptr::null_mut();
    // SAFETY: single-threaded before `main`: nothing reads `environ` concurrently. The array is
    // NULL-terminated, its strings live as long as the process (the inherited ones where the
    // kernel or an earlier `setenv` put them, ours in the `Static` buffers), and it stays valid
    // for glibc to read, to compact (`unsetenv`) and to copy (`setenv`).
    unsafe {
        environ = envp.as_mut_ptr();
    }
    Some(removed)
}

/// Copy `src` into `dst` at `at`; false (and nothing copied) when it does not fit.
fn copy_into(dst: &mut [u8], at: usize, src: &[u8]) -> bool {
    match dst.get_mut(at..at + src.len()) {
        Some(d) => {
            d.copy_from_slice(src);
            true
        }
        None => false,
    }
}

/// `putenv` a NUL-terminated `KEY=VALUE` that lives as long as the process.
fn put(line: *mut c_char) {
    // SAFETY: `line` points into one of the `Static` buffers, which live as long as the process
    // and are never written again; it is NUL-terminated and holds a `=` (the caller built it).
    // Single-threaded before `main`: no other thread reads the environment.
    unsafe {
        libc::putenv(line);
    }
}

unsafe extern "C" {
    /// The process's environment (glibc: `environ`, an alias of `__environ`).
    static mut environ: *mut *mut c_char;
}

/// Remove the inherited contract variables by compacting `environ` in place, as glibc's
/// `unsetenv` does (no allocation, no name length limit). Entries without `=` are left alone.
fn remove_contract_variables() -> usize {
    let mut removed = 0;
    // SAFETY: single-threaded before `main`. `environ` is a NULL-terminated array of pointers to
    // NUL-terminated strings (the kernel's, or glibc's after an earlier `setenv`); entries are only
    // moved down within it and the terminator moved with them, exactly as `unsetenv` does.
    unsafe {
        let base = environ;
        if base.is_null() {
            return 0;
        }
        let mut src = base;
        let mut dst = base;
        while !(*src).is_null() {
            let entry = *src;
            if is_contract_entry(entry) {
                removed += 1;
            } else {
                *dst = entry;
                dst = dst.add(1);
            }
            src = src.add(1);
        }
        *dst = core::ptr::null_mut();
    }
    removed
}

/// True for `NAME=...` whose name is a contract variable.
fn is_contract_entry(entry: *const c_char) -> bool {
    let mut name = [0u8; 64];
    let mut n = 0;
    loop {
        // SAFETY: `entry` is NUL-terminated; reading stops at the NUL, the `=`, or once the name
        // is longer than any contract variable could be matched on.
        let b = unsafe { *entry.add(n) } as u8;
        if b == 0 {
            return false;
        }
        if b == b'=' {
            break;
        }
        match name.get_mut(n) {
            Some(slot) => *slot = b,
            None => {
                // Longer than 64 bytes: a contract variable only if it has a per-device prefix,
                // which the first 64 bytes already show.
                return is_contract_variable(&name) && has_equals(entry, n);
            }
        }
        n += 1;
    }
    is_contract_variable(name.get(..n).unwrap_or_default())
}

/// True when the NUL-terminated `entry` holds a `=` at or after `from`.
fn has_equals(entry: *const c_char, from: usize) -> bool {
    let mut i = from;
    loop {
        // SAFETY: `entry` is NUL-terminated; reading stops there.
        let b = unsafe { *entry.add(i) } as u8;
        match b {
            0 => return false,
            b'=' => return true,
            _ => i += 1,
        }
    }
}

/// Why a file the library reads could not be read.
#[derive(Clone, Copy)]
enum ReadError {
    Missing,
    NotRegular,
    Unreadable,
}

/// This library's results: what a read returned, or [`ReadError`]; the decisions name their own
/// reasons (`Result<_, Kept>`).
type Result<T, E = ReadError> = core::result::Result<T, E>;

/// Read the NUL-terminated `path` into `buf` (at most its length); the number of bytes read.
/// Opened non-blocking (a FIFO never blocks the process) and checked to be a regular file before
/// anything is read.
fn read_file(path: &[u8], buf: &mut [u8]) -> Result<usize> {
    read_file_at(path.as_ptr(), buf)
}

/// [`read_file`] of a path given by its first byte; the path must be NUL-terminated.
fn read_file_at(path: *const u8, buf: &mut [u8]) -> Result<usize> {
    // SAFETY: `path` is NUL-terminated: a constant of this file, or the `HAMI_NODE_GPUS` value in
    // the file's buffer, whose line end `run` overwrote with a NUL.
    let fd = unsafe {
        libc::open(
            path.cast::<c_char>(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(if errno() == libc::ENOENT {
            ReadError::Missing
        } else {
            ReadError::Unreadable
        });
    }
    let result = read_regular(fd, buf);
    // SAFETY: `fd` is the descriptor opened above, closed once.
    unsafe { libc::close(fd) };
    result
}

fn read_regular(fd: c_int, buf: &mut [u8]) -> Result<usize> {
    let size = match fd_stat(fd, b"\0", libc::AT_EMPTY_PATH) {
        Some(st) if st.mode & libc::S_IFMT == libc::S_IFREG => st.size,
        Some(_) => return Err(ReadError::NotRegular),
        None => return Err(ReadError::Unreadable),
    };
    let mut n = 0;
    while let Some(rest) = buf.get_mut(n..) {
        if rest.is_empty() {
            break;
        }
        // SAFETY: `rest` is writable for `rest.len()` bytes.
        let got = unsafe { libc::read(fd, rest.as_mut_ptr().cast::<c_void>(), rest.len()) };
        match got {
            0 => break,
            // Once the file's size is read, the next read would return 0: saved (the published
            // files are replaced by rename, never written in place). A size of 0 (a procfs-like
            // file) reads on until the end.
            g if g > 0 => {
                n += g.unsigned_abs();
                if size > 0 && n as u64 >= size {
                    break;
                }
            }
            _ if errno() == libc::EINTR => {}
            _ => return Err(ReadError::Unreadable),
        }
    }
    Ok(n)
}

/// What [`fd_stat`] returns.
struct Stat {
    mode: u32,
    rdev: u64,
    size: u64,
}

/// `fstatat(dirfd, name, flags)` as the raw system call (no glibc stat wrapper, whose symbols
/// changed in 2.33).
fn fd_stat(dirfd: c_int, name: &[u8], flags: c_int) -> Option<Stat> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated and `st` is a writable `struct stat`, the layout the
    // kernel's `newfstatat` fills on this architecture.
    let r = unsafe {
        libc::syscall(
            libc::SYS_newfstatat,
            dirfd,
            name.as_ptr().cast::<c_char>(),
            &mut st as *mut libc::stat,
            flags,
        )
    };
    (r == 0).then_some(Stat {
        mode: st.st_mode,
        rdev: st.st_rdev,
        size: u64::try_from(st.st_size).unwrap_or(0),
    })
}

/// The `/dev/nvidia<N>` devices of the container, from `getdents64` on `/dev` and a `stat` of
/// each candidate.
fn scan_dev() -> Result<VisibleGpus, Kept> {
    // SAFETY: `DEV` is NUL-terminated.
    let fd = unsafe {
        libc::open(
            DEV.as_ptr().cast::<c_char>(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(Kept::DeviceScanFailed);
    }
    let result = scan_entries(fd);
    // SAFETY: `fd` is the descriptor opened above, closed once.
    unsafe { libc::close(fd) };
    result
}

/// `struct linux_dirent64` buffer, 8-byte aligned as the kernel writes it. A container's `/dev`
/// (about 20 entries of 24 to 40 bytes) fits in one call; a larger one takes several.
#[repr(C, align(8))]
struct Dirents([u8; 1024]);

fn scan_entries(fd: c_int) -> Result<VisibleGpus, Kept> {
    let mut visible = VisibleGpus::new();
    let mut d = Dirents([0; 1024]);
    loop {
        // SAFETY: the buffer is writable for its length; the kernel writes whole records.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, d.0.as_mut_ptr(), d.0.len()) };
        if n == 0 {
            return Ok(visible);
        }
        let Ok(n) = usize::try_from(n) else {
            return Err(Kept::DeviceScanFailed);
        };
        let mut off = 0;
        // d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name (NUL-terminated).
        while let Some(header) = d.0.get(off..off + 19) {
            if off >= n {
                break;
            }
            let reclen = usize::from(u16::from_ne_bytes([
                header.get(16).copied().unwrap_or(0),
                header.get(17).copied().unwrap_or(0),
            ]));
            let Some(record) = d.0.get(off + 19..off + reclen.max(19)) else {
                return Err(Kept::DeviceScanFailed);
            };
            if reclen < 19 {
                return Err(Kept::DeviceScanFailed);
            }
            let name_len = record.iter().position(|b| *b == 0).unwrap_or(record.len());
            let name = record.get(..name_len).unwrap_or_default();
            if name.starts_with(b"nvidia")
                && hami_preload_core::decide::gpu_device_name(name).is_some()
            {
                let with_nul = record.get(..=name_len).unwrap_or_default();
                visible.observe(name, fd_stat(fd, with_nul, 0).map(|st| (st.mode, st.rdev)));
            }
            off += reclen;
        }
    }
}

fn debug_enabled() -> bool {
    // SAFETY: `getauxval` only reads the auxiliary vector the kernel passed to the process; it is
    // available since glibc 2.16 and returns 0 for an unknown type.
    let secure = unsafe { libc::getauxval(libc::AT_SECURE) } != 0;
    if secure {
        return false;
    }
    // SAFETY: the name is NUL-terminated; single-threaded before `main`.
    let value = unsafe { libc::getenv(PRELOAD_DEBUG.as_ptr().cast::<c_char>()) };
    if value.is_null() {
        return false;
    }
    // SAFETY: `getenv` returned a NUL-terminated string; at most two bytes are read.
    unsafe { *value == b'1' as c_char && *value.add(1) == 0 }
}

/// A line for stderr, built without allocation (too long a line is cut, never overrun).
struct Line {
    buf: [u8; 256],
    len: usize,
}

impl Line {
    fn push(&mut self, bytes: &[u8]) -> &mut Self {
        for b in bytes {
            if let Some(slot) = self.buf.get_mut(self.len) {
                *slot = *b;
                self.len += 1;
            }
        }
        self
    }

    fn num(&mut self, v: u64) -> &mut Self {
        let t = MibText::new(v);
        let digits = t.as_bytes();
        self.push(
            digits
                .get(..digits.len().saturating_sub(1))
                .unwrap_or_default(),
        )
    }
}

/// The opt-in diagnostic: the same line as `hami_preload_reference::Decision::summary`.
fn report(outcome: &Result<(Limits, Option<PerNode>), Untouched>, removed: usize) {
    let mut l = Line {
        buf: [0; 256],
        len: 0,
    };
    match outcome {
        Err(why) => {
            l.push(b"hami-preload: environment untouched: ")
                .push(why.as_str().as_bytes());
        }
        Ok((limits, per_node)) => {
            l.push(b"hami-preload: applied the limits file: set ")
                .num(limits.entries().len() as u64)
                .push(b", removed ")
                .num(removed as u64)
                .push(b" inherited, skipped ")
                .num(limits.skipped_lines as u64)
                .push(b" line(s)");
            match per_node {
                None => {}
                Some(PerNode::Applied { mib, gpu_mib, gpus }) => {
                    l.push(b"; per-node cap ")
                        .num(*mib)
                        .push(b" MiB (smallest of ")
                        .num(u64::from(*gpus))
                        .push(b" visible GPU(s): ")
                        .num(*gpu_mib)
                        .push(b" MiB)");
                }
                Some(PerNode::Kept(why)) => {
                    l.push(b"; admission-time cap kept: ")
                        .push(why.as_str().as_bytes());
                }
            }
        }
    }
    l.push(b" (/overrideEnv)\n");
    let out = l.buf.get(..l.len).unwrap_or_default();
    // SAFETY: writes `out.len()` bytes from a live buffer to stderr; a short or failed write is
    // ignored (the line is a diagnostic).
    unsafe {
        libc::write(2, out.as_ptr().cast::<c_void>(), out.len());
    }
}

fn errno() -> c_int {
    // SAFETY: `__errno_location` returns a valid pointer to the calling thread's `errno`.
    unsafe { *libc::__errno_location() }
}

fn set_errno(value: c_int) {
    // SAFETY: as in `errno`; writing the thread's own `errno` is what C code does all the time.
    unsafe {
        *libc::__errno_location() = value;
    }
}
