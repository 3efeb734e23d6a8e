//! `libhami_preload.so`: makes `/overrideEnv` authoritative for HAMi-core in every process.
//!
//! Listed first in `/etc/ld.so.preload`, the library is mapped into every dynamically linked
//! process of the container — the entrypoint, `kubectl exec`, an SSH login, `su -`, `sudo`, cron —
//! and its ELF constructor runs before `main`. It reads the limits file the device plugin (or the
//! webhook, for KAI pods) delivered at `/overrideEnv` and, when the file holds a memory limit,
//! replaces the inherited HAMi-core variables with the file's ([`hami_shared::preload::decide`]).
//! HAMi-core reads its settings lazily, at the first CUDA call, so it sees the file's values.
//!
//! What the constructor never does: print (unless `HAMI_PRELOAD_DEBUG=1`, and never in
//! secure-execution mode), abort, let a panic out, write a file, block on a FIFO, read more than
//! [`READ_LIMIT_BYTES`], touch a variable outside the contract, or change `errno`.
//!
//! This is the only crate of the workspace with `unsafe` code; each block says why it is sound.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;

use hami_shared::names::OVERRIDE_ENV_PATH;
use hami_shared::preload::{Decision, ENV_PRELOAD_DEBUG, READ_LIMIT_BYTES, Untouched, decide};

/// The constructor, placed in `.init_array`: the dynamic loader calls it after relocating the
/// library and before the program's `main`.
#[allow(unsafe_code)]
#[used]
#[unsafe(link_section = ".init_array")]
static CONSTRUCTOR: extern "C" fn() = hami_preload_init;

/// The constructor body: everything inside `catch_unwind`, `errno` restored.
extern "C" fn hami_preload_init() {
    let saved_errno = errno();
    // Nothing in `run` is expected to panic; should it, the panic stays here, silent: the default
    // hook would print a message into the user's program (this hook belongs to this library's own
    // copy of std and affects no other code in the process).
    std::panic::set_hook(Box::new(|_| {}));
    let _ = std::panic::catch_unwind(run);
    let _ = std::panic::take_hook();
    set_errno(saved_errno);
}

fn run() {
    let debug = !secure_execution()
        && std::env::var_os(ENV_PRELOAD_DEBUG).is_some_and(|v| v.as_encoded_bytes() == b"1");
    let decision = match read_bounded(OVERRIDE_ENV_PATH) {
        Ok((contents, truncated)) => {
            let names = std::env::vars_os().map(|(name, _)| name);
            decide(&contents, truncated, names)
        }
        Err(why) => Decision::Untouched(why),
    };
    if let Decision::Apply(overlay) = &decision {
        for name in &overlay.remove {
            // SAFETY: the constructor runs before `main`, while the process has a single thread
            // (the loader runs initialisers before any code of the program can start another), so
            // nothing reads or writes the environment concurrently.
            #[allow(unsafe_code)]
            unsafe {
                std::env::remove_var(name)
            };
        }
        for (key, value) in &overlay.set {
            // SAFETY: as above, single-threaded before `main`. Keys are `[A-Z_][A-Z0-9_]*` and
            // values hold no NUL or newline (the contract's parser refuses such lines).
            #[allow(unsafe_code)]
            unsafe {
                std::env::set_var(key, value)
            };
        }
    }
    if debug {
        let line = format!("{} ({OVERRIDE_ENV_PATH})\n", decision.summary());
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

/// At most [`READ_LIMIT_BYTES`] of the file, and whether it is longer. Opened non-blocking (a FIFO
/// never blocks the process) and checked to be a regular file before anything is read.
fn read_bounded(path: &str) -> Result<(Vec<u8>, bool), Untouched> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.kind() {
            ErrorKind::NotFound => Untouched::Missing,
            _ => Untouched::Unreadable,
        })?;
    let meta = file.metadata().map_err(|_| Untouched::Unreadable)?;
    if !meta.file_type().is_file() {
        return Err(Untouched::NotARegularFile);
    }
    let mut contents = Vec::with_capacity(READ_LIMIT_BYTES + 1);
    Read::take(&file, READ_LIMIT_BYTES as u64 + 1)
        .read_to_end(&mut contents)
        .map_err(|_| Untouched::Unreadable)?;
    let truncated = contents.len() > READ_LIMIT_BYTES;
    contents.truncate(READ_LIMIT_BYTES);
    drop::<File>(file);
    Ok((contents, truncated))
}

/// True in secure-execution mode (setuid/setgid or file capabilities): opt-in variables are
/// ignored there.
fn secure_execution() -> bool {
    // SAFETY: `getauxval` only reads the auxiliary vector the kernel passed to the process; it is
    // available since glibc 2.16 and returns 0 for an unknown type.
    #[allow(unsafe_code)]
    let secure = unsafe { libc::getauxval(libc::AT_SECURE) };
    secure != 0
}

fn errno() -> libc::c_int {
    // SAFETY: `__errno_location` returns a valid pointer to the calling thread's `errno`.
    #[allow(unsafe_code)]
    unsafe {
        *libc::__errno_location()
    }
}

fn set_errno(value: libc::c_int) {
    // SAFETY: as in `errno`; writing the thread's own `errno` is what C code does all the time.
    #[allow(unsafe_code)]
    unsafe {
        *libc::__errno_location() = value;
    }
}
