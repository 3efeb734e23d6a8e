//! `hami-device-plugin install-hook`: puts HAMi-core and the hami-limits preload library into the
//! hook path on the host, with an `ld.so.preload` generated for that path, and publishes the node
//! GPU file beside them.
//!
//! What ends up under `HOOK/vgpu` (each file `0644`, the directories `0755`):
//!
//! - `libvgpu.so`: HAMi-core, from `--hami-core-dir`, which must hold exactly one of `libvgpu.so`
//!   or `libvgpu.so.<version>` (HAMi images since v2.5 carry only the versioned name);
//! - `libhami_preload.so`: the preload library (`--preload`), which loads `/overrideEnv` into the
//!   environment before `main`;
//! - `node-gpus`: **generated**, the node GPU file ([`hami_shared::node_gpus`]: each GPU's minor
//!   number, UUID and MiB), from NVML or, with `--inventory FILE`, from the inventory file. The
//!   preload library reads it in KAI `gpu-fraction` containers. Without a GPU list (NVML not
//!   loadable and no inventory, or a source listing no GPU) it is not published and a file already
//!   there is removed: a wrong file is worse than none (readers then keep the admission-time cap);
//! - `ld.so.preload`: **generated**, `HOOK/vgpu/libhami_preload.so` then `HOOK/vgpu/libvgpu.so`,
//!   one absolute path a line. Never copied from the image: HAMi's copy hard-codes
//!   `/usr/local/vgpu/libvgpu.so` whatever the hook path (HAMi#2017).
//!
//! The module is split in two (files `plan.rs` and `node_gpus.rs`, then `execute.rs`): [`plan_install`] decides, purely, what to install from what a scan
//! of the directory found ([`FoundEntry`]) and what the GPU source listed ([`GpuListing`], read by
//! [`list_gpus`]); [`execute`] does the file I/O. Each file is written to a temporary file beside
//! its final name, `fsync`ed, renamed over it and the directory `fsync`ed
//! ([`hami_publish::publish_atomic`]), so a library that running processes map is never
//! overwritten in place, and the libraries go first and `ld.so.preload` last, so that at every
//! moment (including after a failure or a crash) `ld.so.preload` is the previous complete one or
//! absent, and never names a library that is not there. `node-gpus` goes between them (or, when
//! withdrawn, is removed before any file is installed): whatever a new `ld.so.preload` activates
//! finds the node file of this run, never the previous one.
//!
//! A GPU list that cannot be read (an unreadable or malformed inventory file, an NVML call failing
//! for one GPU) or a GPU the file cannot hold ([`NodeGpusError`]) is an error, found by the plan
//! before anything is written: the libraries and `ld.so.preload` stay as they were (complete, and
//! right whatever the hardware), but a `node-gpus` already there is removed, since this run can no
//! longer vouch for it ([`InstallHookError::node_gpus_to_withdraw`]).

use std::io;
use std::path::{Path, PathBuf};

use hami_publish::PublishError;
use hami_shared::names::LIBVGPU_SO;
use hami_shared::node_gpus::NodeGpusError;

use crate::gpu::inventory::InventoryError;

mod execute;
mod node_gpus;
mod plan;

pub use execute::*;
pub use node_gpus::*;
use plan::listing;
pub use plan::*;

/// The first bytes of every ELF file.
pub const ELF_MAGIC: &[u8] = b"\x7fELF";

/// Mode of the directories created under the hook path.
pub const DIR_MODE: u32 = 0o755;

/// How many names of the scanned directory an error lists at most.
const LISTED_NAMES: usize = 20;

/// What `install-hook` is asked (its flags, as the command line parsed them).
#[derive(Debug, Clone)]
pub struct InstallHookArgs {
    /// Directory holding HAMi-core's library: exactly one of `libvgpu.so` or
    /// `libvgpu.so.<version>` (HAMi images since v2.5: `/k8s-vgpu/lib/nvidia/libvgpu.so.<version>`).
    /// Symbolic links to a regular file are followed; other files there (HAMi's own
    /// `ld.so.preload`) are ignored.
    pub hami_core_dir: PathBuf,
    /// The hami-limits preload library (`libhami_preload.so`), installed as
    /// `HOOK/vgpu/libhami_preload.so`.
    pub preload: PathBuf,
    /// HAMi's hook path on the host, `HOOK` (the same value as `run --hook-path`): an absolute
    /// path without whitespace, `:` or `..`; the files go to `HOOK/vgpu/`.
    pub hook_path: PathBuf,
    /// YAML list of GPUs (the file `run --inventory` reads) for `HOOK/vgpu/node-gpus`, on a
    /// machine without NVIDIA GPUs; without it the GPUs come from NVML.
    pub inventory: Option<PathBuf>,
}

/// Why `install-hook` failed; every variant names the path or the value at fault.
#[derive(Debug, thiserror::Error)]
pub enum InstallHookError {
    /// `--hook-path` cannot be written into `ld.so.preload` as given.
    #[error("--hook-path {value:?}: {reason}")]
    InvalidHookPath {
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The HAMi-core directory could not be listed.
    #[error("cannot list {dir} (--hami-core-dir): {source}")]
    ReadDir {
        /// The directory.
        dir: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// No `libvgpu.so` nor `libvgpu.so.<version>` in the directory.
    #[error(
        "no HAMi-core library in {dir} (--hami-core-dir): expected {LIBVGPU_SO} or one {LIBVGPU_SO}.<version>; found {}",
        listing(found)
    )]
    NoLibrary {
        /// The directory.
        dir: PathBuf,
        /// The names it holds (sorted).
        found: Vec<String>,
    },
    /// More than one distinct HAMi-core library in the directory.
    #[error(
        "more than one HAMi-core library in {dir} (--hami-core-dir): {}; keep exactly one of {LIBVGPU_SO} or {LIBVGPU_SO}.<version>",
        candidates.join(", ")
    )]
    Ambiguous {
        /// The directory.
        dir: PathBuf,
        /// The candidates' names (sorted).
        candidates: Vec<String>,
    },
    /// A source file (or a library candidate) is not a regular file.
    #[error("{path}: {what}, not a regular file")]
    NotARegularFile {
        /// The path.
        path: PathBuf,
        /// What it is instead.
        what: &'static str,
    },
    /// A source file could not be read.
    #[error("cannot read {path}: {source}")]
    ReadSource {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A source file is empty.
    #[error("{path} is empty; refusing to install it")]
    EmptySource {
        /// The path.
        path: PathBuf,
    },
    /// A source file is not an ELF shared object.
    #[error("{path} is not an ELF file (it does not start with \\x7fELF); refusing to install it")]
    NotElf {
        /// The path.
        path: PathBuf,
    },
    /// A destination directory exists and is not a directory.
    #[error("{path} exists and is not a directory")]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// A destination directory could not be created (or inspected, or `chmod`ed).
    #[error("cannot create directory {path}: {source}")]
    CreateDir {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A directory could not be `fsync`ed (a directory created or a file removed in it may not be
    /// durable).
    #[error(transparent)]
    SyncDir(PublishError),
    /// Leftover temporary files of an earlier run could not be removed.
    #[error("cannot remove leftover temporary files: {0}")]
    Sweep(#[source] PublishError),
    /// Installing a file failed (its temporary file is removed; the previous file, if any, stays).
    #[error("cannot install {path}: {source}")]
    Install {
        /// The final path.
        path: PathBuf,
        /// What failed, naming the path involved.
        #[source]
        source: PublishError,
    },
    /// The GPUs for the node GPU file could not be listed: the inventory file is unreadable or
    /// malformed (the message names the entry), or an NVML call failed for a GPU.
    #[error("cannot list the GPUs for {path}: {error}")]
    GpuList {
        /// The node GPU file.
        path: PathBuf,
        /// What the source reported.
        #[source]
        error: InventoryError,
    },
    /// A GPU the node GPU file cannot hold (the message names the GPU, the field and the range).
    #[error("cannot write the GPUs of {from} into {path}: {error}")]
    NodeGpus {
        /// The node GPU file.
        path: PathBuf,
        /// Where the GPUs came from.
        from: GpuSource,
        /// The GPU and what is wrong with it.
        #[source]
        error: NodeGpusError,
    },
    /// A node GPU file to withdraw could not be removed (or its removal not made durable).
    #[error("cannot remove {path}: {source}")]
    Withdraw {
        /// The node GPU file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl InstallHookError {
    /// Exit status: 2 for an invalid `--hook-path`, 1 for everything else.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::InvalidHookPath { .. } => 2,
            _ => 1,
        }
    }

    /// The node GPU file a run refused with this error must not leave behind: after a GPU list
    /// that cannot be read or written, a `node-gpus` from an earlier run may describe other GPUs,
    /// and a wrong file is worse than none. `None` for every other error (nothing is touched).
    pub fn node_gpus_to_withdraw(&self) -> Option<&Path> {
        match self {
            Self::GpuList { path, .. } | Self::NodeGpus { path, .. } => Some(path),
            _ => None,
        }
    }
}

/// `install-hook`: scan, list the GPUs, plan, execute. A plan refused for its GPU list withdraws
/// the node GPU file ([`InstallHookError::node_gpus_to_withdraw`]) and touches nothing else.
pub fn install_hook(args: &InstallHookArgs) -> Result<InstallReport, InstallHookError> {
    // The hook path first: a bad value is reported before anything else is looked at.
    normalise_hook_path(&args.hook_path)?;
    let found = scan_dir(&args.hami_core_dir)?;
    let gpus = list_gpus(args.inventory.as_deref());
    match plan_install(
        &found,
        &args.hami_core_dir,
        &args.preload,
        &args.hook_path,
        gpus,
    ) {
        Ok(plan) => execute(&plan),
        Err(refused) => {
            if let Some(path) = refused.node_gpus_to_withdraw() {
                // The refusal is the error to report; the withdrawal's outcome is logged.
                match withdraw_node_gpus(path) {
                    Ok(true) => tracing::warn!(
                        file = %path.display(),
                        "removed the node GPU file of an earlier run: this run has no GPU list"
                    ),
                    Ok(false) => {}
                    Err(error) => tracing::error!(%error, "stale node GPU file left in place"),
                }
            }
            Err(refused)
        }
    }
}
