//! `hami-device-plugin install-hook`: puts HAMi-core and the hami-limits preload library into the
//! hook path on the host, with an `ld.so.preload` generated for that path.
//!
//! What ends up under `HOOK/vgpu` (each file `0644`, the directories `0755`):
//!
//! - `libvgpu.so`: HAMi-core, from `--hami-core-dir`, which must hold exactly one of `libvgpu.so`
//!   or `libvgpu.so.<version>` (HAMi images since v2.5 carry only the versioned name);
//! - `libhami_preload.so`: the preload library (`--preload`), which loads `/overrideEnv` into the
//!   environment before `main`;
//! - `ld.so.preload`: **generated**, `HOOK/vgpu/libhami_preload.so` then `HOOK/vgpu/libvgpu.so`,
//!   one absolute path a line. Never copied from the image: HAMi's copy hard-codes
//!   `/usr/local/vgpu/libvgpu.so` whatever the hook path (HAMi#2017).
//!
//! The module is split in two: [`plan_install`] decides, purely, what to install from what a scan
//! of the directory found ([`FoundEntry`]); [`execute`] does the file I/O. Each file is written to
//! a temporary file beside its final name, `fsync`ed, renamed over it and the directory `fsync`ed
//! ([`hami_shared::publish_atomic`]), so a library that running processes map is never
//! overwritten in place, and the libraries go first and `ld.so.preload` last, so that at every
//! moment (including after a failure or a crash) `ld.so.preload` is the previous complete one or
//! absent, and never names a library that is not there.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use clap::Args;
use hami_shared::names::{
    CONTAINERS_DIR, DEFAULT_HOOK_PATH, LD_SO_PRELOAD_FILE, LIBHAMI_PRELOAD_SO, LIBVGPU_SO, VGPU_DIR,
};
use hami_shared::publish::PUBLISHED_MODE;
use hami_shared::{PublishError, publish_atomic, sweep_temp_files};

/// The first bytes of every ELF file.
pub const ELF_MAGIC: &[u8] = b"\x7fELF";

/// Mode of the directories created under the hook path.
pub const DIR_MODE: u32 = 0o755;

/// How many names of the scanned directory an error lists at most.
const LISTED_NAMES: usize = 20;

/// `install-hook` flags.
#[derive(Debug, Clone, Args)]
pub struct InstallHookArgs {
    /// Directory holding HAMi-core's library: exactly one of `libvgpu.so` or
    /// `libvgpu.so.<version>` (HAMi images since v2.5: `/k8s-vgpu/lib/nvidia/libvgpu.so.<version>`).
    /// Symbolic links to a regular file are followed; other files there (HAMi's own
    /// `ld.so.preload`) are ignored.
    #[arg(long = "hami-core-dir", value_name = "DIR")]
    pub hami_core_dir: PathBuf,
    /// The hami-limits preload library (`libhami_preload.so`), installed as
    /// `HOOK/vgpu/libhami_preload.so`.
    #[arg(long = "preload", value_name = "FILE")]
    pub preload: PathBuf,
    /// HAMi's hook path on the host, `HOOK` (the same value as `run --hook-path`): an absolute
    /// path without whitespace, `:` or `..`; the files go to `HOOK/vgpu/`.
    #[arg(long = "hook-path", env = "HAMI_HOOK_PATH", default_value = DEFAULT_HOOK_PATH, value_name = "HOOK")]
    pub hook_path: PathBuf,
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
    /// A directory created could not be `fsync`ed (its creation may not be durable).
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
}

impl InstallHookError {
    /// Exit status: 2 for an invalid `--hook-path`, 1 for everything else.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::InvalidHookPath { .. } => 2,
            _ => 1,
        }
    }
}

fn listing(names: &[String]) -> String {
    if names.is_empty() {
        return "nothing (the directory is empty)".to_owned();
    }
    let shown = names
        .iter()
        .take(LISTED_NAMES)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    match names.len().checked_sub(LISTED_NAMES) {
        Some(more) if more > 0 => format!("{shown} and {more} more"),
        _ => shown,
    }
}

/// What one name in the HAMi-core directory is, symbolic links followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A device, FIFO or socket.
    Special,
    /// A symbolic link to nothing (or a file that cannot be inspected).
    Dangling,
}

impl EntryKind {
    fn describe(self) -> &'static str {
        match self {
            Self::File => "a regular file",
            Self::Directory => "a directory",
            Self::Special => "a device, FIFO or socket",
            Self::Dangling => "a dangling symbolic link or an unreadable entry",
        }
    }
}

/// One name found in the HAMi-core directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundEntry {
    /// The file name (lossily decoded for display and matching).
    pub name: String,
    /// Its path.
    pub path: PathBuf,
    /// What it is, symbolic links followed.
    pub kind: EntryKind,
    /// True when the name itself is a symbolic link.
    pub symlink: bool,
    /// Device and inode of the file it resolves to (two names of one file are one library).
    pub identity: Option<(u64, u64)>,
}

/// True for `libvgpu.so` and `libvgpu.so.<version>` (any non-empty version).
pub fn is_libvgpu_name(name: &str) -> bool {
    name == LIBVGPU_SO
        || name
            .strip_prefix(LIBVGPU_SO)
            .and_then(|rest| rest.strip_prefix('.'))
            .is_some_and(|version| !version.is_empty())
}

/// Where an installed file's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSource {
    /// Copied from this file.
    Copy(PathBuf),
    /// Generated text.
    Generated(String),
}

/// One file to install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedInstall {
    /// The final path under `HOOK/vgpu`.
    pub dest: PathBuf,
    /// Its bytes.
    pub source: FileSource,
}

/// What [`plan_install`] decided: the directories and the files, in installation order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallPlan {
    /// The normalised hook path.
    pub hook_path: PathBuf,
    /// `HOOK/vgpu`.
    pub vgpu_dir: PathBuf,
    /// `HOOK/vgpu/containers`.
    pub containers_dir: PathBuf,
    /// `libvgpu.so`, `libhami_preload.so`, then `ld.so.preload`: the libraries before the list
    /// that names them.
    pub files: Vec<PlannedInstall>,
}

/// The hook path as it will be written into `ld.so.preload`: absolute, UTF-8, without
/// whitespace, control characters, `:` (glibc splits `ld.so.preload` on whitespace and `:`) or
/// `..`; `.` components, repeated and trailing slashes removed.
pub fn normalise_hook_path(hook: &Path) -> Result<PathBuf, InstallHookError> {
    let invalid = |reason| InstallHookError::InvalidHookPath {
        value: hook.to_string_lossy().into_owned(),
        reason,
    };
    let value = hook.to_str().ok_or_else(|| invalid("not valid UTF-8"))?;
    if !value.starts_with('/') {
        return Err(invalid("not an absolute path"));
    }
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid(
            "contains whitespace or a control character, which would split its line of ld.so.preload",
        ));
    }
    if value.contains(':') {
        return Err(invalid(
            "contains ':', which separates the entries of ld.so.preload",
        ));
    }
    let mut normal = PathBuf::from("/");
    for component in hook.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => normal.push(part),
            Component::ParentDir => return Err(invalid("contains a '..' component")),
            Component::Prefix(_) => return Err(invalid("not an absolute path")),
        }
    }
    Ok(normal)
}

/// The generated `ld.so.preload` for `vgpu_dir` (`HOOK/vgpu`): the preload library first, so that
/// it runs before HAMi-core reads the environment, then HAMi-core.
pub fn ld_so_preload_contents(vgpu_dir: &Path) -> String {
    format!(
        "{}\n{}\n",
        vgpu_dir.join(LIBHAMI_PRELOAD_SO).display(),
        vgpu_dir.join(LIBVGPU_SO).display()
    )
}

/// The one HAMi-core library among `found` (the scan of `dir`).
///
/// Candidates are `libvgpu.so` and `libvgpu.so.<version>`. Each must resolve to a regular file
/// (a directory named `libvgpu.so` is an error); names of one file (a symbolic link to the
/// versioned file, a hard link) count once, and the name that is not a symbolic link is chosen.
/// None, or several distinct files (`libvgpu.so` beside `libvgpu.so.<version>`, two versions),
/// is an error listing what was found.
pub fn select_libvgpu<'a>(
    dir: &Path,
    found: &'a [FoundEntry],
) -> Result<&'a FoundEntry, InstallHookError> {
    let mut candidates: Vec<&FoundEntry> =
        found.iter().filter(|e| is_libvgpu_name(&e.name)).collect();
    candidates.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(bad) = candidates.iter().find(|e| e.kind != EntryKind::File) {
        return Err(InstallHookError::NotARegularFile {
            path: bad.path.clone(),
            what: bad.kind.describe(),
        });
    }
    let mut distinct: Vec<&FoundEntry> = Vec::new();
    for candidate in candidates.iter().copied() {
        let same = distinct
            .iter()
            .position(|d| d.identity.is_some() && d.identity == candidate.identity);
        match same {
            // Prefer the real name over a symbolic link to it.
            Some(i) if distinct[i].symlink && !candidate.symlink => distinct[i] = candidate,
            Some(_) => {}
            None => distinct.push(candidate),
        }
    }
    match distinct.as_slice() {
        [one] => Ok(one),
        [] => {
            let mut names: Vec<String> = found.iter().map(|e| e.name.clone()).collect();
            names.sort();
            Err(InstallHookError::NoLibrary {
                dir: dir.to_path_buf(),
                found: names,
            })
        }
        _ => Err(InstallHookError::Ambiguous {
            dir: dir.to_path_buf(),
            candidates: candidates.iter().map(|e| e.name.clone()).collect(),
        }),
    }
}

/// The pure plan: what to install under `hook_path` from the scan of `hami_core_dir` and the
/// preload library `preload`.
pub fn plan_install(
    found: &[FoundEntry],
    hami_core_dir: &Path,
    preload: &Path,
    hook_path: &Path,
) -> Result<InstallPlan, InstallHookError> {
    let hook_path = normalise_hook_path(hook_path)?;
    let libvgpu = select_libvgpu(hami_core_dir, found)?;
    let vgpu_dir = hook_path.join(VGPU_DIR);
    let files = vec![
        PlannedInstall {
            dest: vgpu_dir.join(LIBVGPU_SO),
            source: FileSource::Copy(libvgpu.path.clone()),
        },
        PlannedInstall {
            dest: vgpu_dir.join(LIBHAMI_PRELOAD_SO),
            source: FileSource::Copy(preload.to_path_buf()),
        },
        PlannedInstall {
            dest: vgpu_dir.join(LD_SO_PRELOAD_FILE),
            source: FileSource::Generated(ld_so_preload_contents(&vgpu_dir)),
        },
    ];
    Ok(InstallPlan {
        containers_dir: vgpu_dir.join(CONTAINERS_DIR),
        vgpu_dir,
        hook_path,
        files,
    })
}

/// Checks that `bytes`, read from `path`, can be installed as a library: not empty, ELF.
pub fn check_library_bytes(path: &Path, bytes: &[u8]) -> Result<(), InstallHookError> {
    if bytes.is_empty() {
        return Err(InstallHookError::EmptySource {
            path: path.to_path_buf(),
        });
    }
    if !bytes.starts_with(ELF_MAGIC) {
        return Err(InstallHookError::NotElf {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// Lists `dir`: every name, what it is, symbolic links followed.
pub fn scan_dir(dir: &Path) -> Result<Vec<FoundEntry>, InstallHookError> {
    let read_dir_err = |source| InstallHookError::ReadDir {
        dir: dir.to_path_buf(),
        source,
    };
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_dir_err)? {
        let entry = entry.map_err(read_dir_err)?;
        let path = entry.path();
        let symlink = entry.file_type().is_ok_and(|t| t.is_symlink());
        let (kind, identity) = match fs::metadata(&path) {
            Ok(meta) if meta.is_file() => (EntryKind::File, Some((meta.dev(), meta.ino()))),
            Ok(meta) if meta.is_dir() => (EntryKind::Directory, Some((meta.dev(), meta.ino()))),
            Ok(meta) => (EntryKind::Special, Some((meta.dev(), meta.ino()))),
            Err(_) => (EntryKind::Dangling, None),
        };
        found.push(FoundEntry {
            name: entry.file_name().to_string_lossy().into_owned(),
            path,
            kind,
            symlink,
            identity,
        });
    }
    Ok(found)
}

/// Reads a library to install, symbolic links followed: a regular, readable, non-empty ELF file.
pub fn read_library(path: &Path) -> Result<Vec<u8>, InstallHookError> {
    let read_err = |source| InstallHookError::ReadSource {
        path: path.to_path_buf(),
        source,
    };
    let meta = fs::metadata(path).map_err(read_err)?;
    if !meta.is_file() {
        let what = if meta.is_dir() {
            EntryKind::Directory
        } else {
            EntryKind::Special
        };
        return Err(InstallHookError::NotARegularFile {
            path: path.to_path_buf(),
            what: what.describe(),
        });
    }
    let bytes = fs::read(path).map_err(read_err)?;
    check_library_bytes(path, &bytes)?;
    Ok(bytes)
}

/// What happened to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Written (it was missing or different).
    Installed,
    /// Already there with the same bytes and mode `0644`: not rewritten.
    Unchanged,
}

/// One installed file, as reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledFile {
    /// The final path.
    pub path: PathBuf,
    /// Installed or unchanged.
    pub outcome: Outcome,
    /// The file copied, or `None` for generated text.
    pub from: Option<PathBuf>,
    /// Its size in bytes.
    pub bytes: usize,
}

impl fmt::Display for InstalledFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let outcome = match self.outcome {
            Outcome::Installed => "installed",
            Outcome::Unchanged => "unchanged",
        };
        write!(f, "{outcome} {}", self.path.display())?;
        match &self.from {
            Some(from) => write!(f, " (from {}, {} bytes)", from.display(), self.bytes),
            None => write!(f, " (generated, {} bytes)", self.bytes),
        }
    }
}

/// What [`execute`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallReport {
    /// One entry per file, in installation order.
    pub files: Vec<InstalledFile>,
    /// Directories created.
    pub created_dirs: Vec<PathBuf>,
    /// Leftover temporary files of an earlier run removed from `HOOK/vgpu`.
    pub removed_temporaries: usize,
}

/// Creates `path` (mode `0755`, whatever the umask) unless it is a directory already; true
/// when created.
fn ensure_dir(path: &Path) -> Result<bool, InstallHookError> {
    let create_err = |source| InstallHookError::CreateDir {
        path: path.to_path_buf(),
        source,
    };
    match fs::metadata(path) {
        Ok(meta) if meta.is_dir() => return Ok(false),
        Ok(_) => {
            return Err(InstallHookError::NotADirectory {
                path: path.to_path_buf(),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(create_err(e)),
    }
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
    {
        Ok(()) => {}
        // A file of that name (or in the way of a parent).
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::AlreadyExists | io::ErrorKind::NotADirectory
            ) =>
        {
            return Err(InstallHookError::NotADirectory {
                path: path.to_path_buf(),
            });
        }
        Err(e) => return Err(create_err(e)),
    }
    fs::set_permissions(path, fs::Permissions::from_mode(DIR_MODE)).map_err(create_err)?;
    if let Some(parent) = path.parent() {
        hami_shared::publish::sync_dir(parent).map_err(InstallHookError::SyncDir)?;
    }
    Ok(true)
}

/// True when `dest` is a regular file (not a symbolic link) with mode `0644` and exactly `bytes`.
fn is_unchanged(dest: &Path, bytes: &[u8]) -> bool {
    let Ok(meta) = fs::symlink_metadata(dest) else {
        return false;
    };
    meta.is_file()
        && meta.permissions().mode() & 0o7777 == PUBLISHED_MODE
        && usize::try_from(meta.len()).is_ok_and(|len| len == bytes.len())
        && fs::read(dest).is_ok_and(|current| current == bytes)
}

/// Carries out `plan`: reads and checks both libraries (nothing is written when either is
/// wrong), creates `HOOK/vgpu` and `HOOK/vgpu/containers`, removes leftover temporary files of
/// an earlier run, then installs the files in the plan's order, each atomically; a file already
/// there with the same bytes and mode is left alone.
///
/// On a failure the failing file's temporary file is removed and its previous version stays;
/// files installed before it stay installed (both libraries are installed before
/// `ld.so.preload`, so `ld.so.preload` never names a library that is not there).
pub fn execute(plan: &InstallPlan) -> Result<InstallReport, InstallHookError> {
    // Every input first: nothing is written unless all of them are good.
    let mut contents = Vec::with_capacity(plan.files.len());
    for file in &plan.files {
        let (bytes, from) = match &file.source {
            FileSource::Copy(path) => (read_library(path)?, Some(path.clone())),
            FileSource::Generated(text) => (text.as_bytes().to_vec(), None),
        };
        contents.push((file, bytes, from));
    }
    let mut created_dirs = Vec::new();
    for dir in [&plan.vgpu_dir, &plan.containers_dir] {
        if ensure_dir(dir)? {
            created_dirs.push(dir.clone());
        }
    }
    let removed_temporaries = sweep_temp_files(&plan.vgpu_dir).map_err(InstallHookError::Sweep)?;
    let mut files = Vec::with_capacity(contents.len());
    for (file, bytes, from) in contents {
        let outcome = if is_unchanged(&file.dest, &bytes) {
            Outcome::Unchanged
        } else {
            install_file(&file.dest, &bytes)?;
            Outcome::Installed
        };
        files.push(InstalledFile {
            path: file.dest.clone(),
            outcome,
            from,
            bytes: bytes.len(),
        });
    }
    Ok(InstallReport {
        files,
        created_dirs,
        removed_temporaries,
    })
}

fn install_file(dest: &Path, bytes: &[u8]) -> Result<(), InstallHookError> {
    let install_err = |source| InstallHookError::Install {
        path: dest.to_path_buf(),
        source,
    };
    let (Some(dir), Some(name)) = (dest.parent(), dest.file_name().and_then(|n| n.to_str())) else {
        return Err(install_err(PublishError::InvalidFileName {
            dir: dest.to_path_buf(),
            name: String::new(),
        }));
    };
    publish_atomic(dir, name, bytes).map_err(install_err)?;
    Ok(())
}

/// `install-hook`: scan, plan, execute.
pub fn install_hook(args: &InstallHookArgs) -> Result<InstallReport, InstallHookError> {
    // The hook path first: a bad value is reported before anything else is looked at.
    normalise_hook_path(&args.hook_path)?;
    let found = scan_dir(&args.hami_core_dir)?;
    let plan = plan_install(&found, &args.hami_core_dir, &args.preload, &args.hook_path)?;
    execute(&plan)
}
