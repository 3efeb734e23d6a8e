//! The pure plan of `install-hook`: what a scan of the HAMi-core directory found, which file is
//! HAMi-core, the generated `ld.so.preload`, and what to install.

use std::path::{Component, Path, PathBuf};

use hami_shared::names::{
    CONTAINERS_DIR, LD_SO_PRELOAD_FILE, LIBHAMI_PRELOAD_SO, LIBVGPU_SO, NODE_GPUS_FILE, VGPU_DIR,
};

use super::{ELF_MAGIC, GpuListing, InstallHookError, LISTED_NAMES, NodeGpusPlan, plan_node_gpus};

pub(super) fn listing(names: &[String]) -> String {
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
    pub(super) fn describe(self) -> &'static str {
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

/// What [`plan_install`] decided: the directories, the files in installation order, and the node
/// GPU file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallPlan {
    /// The normalised hook path.
    pub hook_path: PathBuf,
    /// `HOOK/vgpu`.
    pub vgpu_dir: PathBuf,
    /// `HOOK/vgpu/containers`.
    pub containers_dir: PathBuf,
    /// `libvgpu.so`, `libhami_preload.so`, `node-gpus` when published, then `ld.so.preload`:
    /// everything the list activates before the list.
    pub files: Vec<PlannedInstall>,
    /// `node-gpus`: published (then also in `files`) or withdrawn.
    pub node_gpus: NodeGpusPlan,
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

/// The pure plan: what to install under `hook_path` from the scan of `hami_core_dir`, the
/// preload library `preload` and the GPUs the source listed. Checked in this order: the hook
/// path, the HAMi-core library, the GPUs ([`plan_node_gpus`]).
pub fn plan_install(
    found: &[FoundEntry],
    hami_core_dir: &Path,
    preload: &Path,
    hook_path: &Path,
    gpus: GpuListing,
) -> Result<InstallPlan, InstallHookError> {
    let hook_path = normalise_hook_path(hook_path)?;
    let libvgpu = select_libvgpu(hami_core_dir, found)?;
    let vgpu_dir = hook_path.join(VGPU_DIR);
    let node_gpus = plan_node_gpus(&vgpu_dir.join(NODE_GPUS_FILE), gpus)?;
    let mut files = vec![
        PlannedInstall {
            dest: vgpu_dir.join(LIBVGPU_SO),
            source: FileSource::Copy(libvgpu.path.clone()),
        },
        PlannedInstall {
            dest: vgpu_dir.join(LIBHAMI_PRELOAD_SO),
            source: FileSource::Copy(preload.to_path_buf()),
        },
    ];
    if let NodeGpusPlan::Publish { path, gpus, .. } = &node_gpus {
        files.push(PlannedInstall {
            dest: path.clone(),
            source: FileSource::Generated(gpus.render()),
        });
    }
    files.push(PlannedInstall {
        dest: vgpu_dir.join(LD_SO_PRELOAD_FILE),
        source: FileSource::Generated(ld_so_preload_contents(&vgpu_dir)),
    });
    Ok(InstallPlan {
        containers_dir: vgpu_dir.join(CONTAINERS_DIR),
        vgpu_dir,
        hook_path,
        files,
        node_gpus,
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
