//! File operations in folders that containers write into, done the way root must do them there:
//! every entry is reached through its folder's descriptor (`openat`, `mkdirat`, `unlinkat`), never
//! through a path that a container could re-point, and no symbolic link is ever followed. A mode
//! is changed with `fchmod` on the descriptor of what was checked, never with `chmod` on a path.
//!
//! Two folders need it: the host's `/tmp/vgpulock`, bind-mounted read-write into every HAMi-core
//! container of the node, and the per-container folder `<hook>/vgpu/containers/<podUID>_<ctr>`,
//! bind-mounted read-write at `<hook>/vgpu` in its container. A process in a container, of any
//! UID, must be assumed to have planted a link or a hard link under any name it could write.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{
    AtFlags, CWD, FileType, Mode, OFlags, Stat, fchmod, fchown, fstat, mkdirat, openat, statat,
    unlinkat,
};
use rustix::io::Errno;
use rustix::process::{Gid, Uid, getegid, geteuid};

/// Why a folder or file could not be made safe; names the path.
#[derive(Debug, thiserror::Error)]
pub enum NoFollowError {
    /// A system call failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// What was attempted.
        op: &'static str,
        /// The path (for the message only: the call itself went through a descriptor).
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Something other than what we make sits where we need a folder or file, and replacing it
    /// is not ours to do (it could be the operator's): refused, never followed.
    #[error(
        "refusing {path}: it is {found}, not {expected}; remove it on the host (root never follows or changes it)"
    )]
    Refused {
        /// The path.
        path: PathBuf,
        /// What is there (`a symbolic link`, `a directory`, …).
        found: &'static str,
        /// What was wanted.
        expected: &'static str,
    },
}

impl NoFollowError {
    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            NoFollowError::Io { path, .. } | NoFollowError::Refused { path, .. } => path,
        }
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> NoFollowError + 'a {
    move |e| NoFollowError::Io {
        op,
        path: path.to_path_buf(),
        source: e.into(),
    }
}

fn describe(kind: FileType) -> &'static str {
    match kind {
        FileType::Symlink => "a symbolic link",
        FileType::Directory => "a directory",
        FileType::RegularFile => "a regular file",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        _ => "an unknown kind of file",
    }
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// What `name` in `dir` is, without following it (`None`: nothing there).
fn kind_at(dir: &OwnedFd, name: &str, path: &Path) -> Result<Option<Stat>, NoFollowError> {
    match statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(io_err("stat (not following links)", path)(e)),
    }
}

fn file_type(st: &Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

/// Opens `path` as a directory; a symbolic link (in its last component) or anything but a
/// directory is refused. The folders above it must not be writable by containers: they are the
/// operator's (`/tmp`, the hook path).
pub fn open_dir(path: &Path) -> Result<OwnedFd, NoFollowError> {
    match openat(CWD, path, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => Ok(fd),
        Err(e @ (Errno::LOOP | Errno::NOTDIR)) => {
            let found = statat(CWD, path, AtFlags::SYMLINK_NOFOLLOW)
                .map(|st| describe(file_type(&st)))
                .unwrap_or("not a directory");
            if found == "a directory" {
                // Raced with a replacement: report what open said.
                return Err(io_err("open directory", path)(e));
            }
            Err(NoFollowError::Refused {
                path: path.to_path_buf(),
                found,
                expected: "a directory",
            })
        }
        Err(e) => Err(io_err("open directory", path)(e)),
    }
}

/// Makes `dir` owned by this process (root in the plugin) with exactly `mode`, through its
/// descriptor.
pub fn own_and_chmod(dir: &OwnedFd, path: &Path, mode: u32) -> Result<(), NoFollowError> {
    let st = fstat(dir).map_err(io_err("stat", path))?;
    let (uid, gid) = (geteuid(), getegid());
    if Uid::from_raw(st.st_uid) != uid || Gid::from_raw(st.st_gid) != gid {
        fchown(dir, Some(uid), Some(gid)).map_err(io_err("chown", path))?;
    }
    // Explicit: the mode given to mkdir/open is filtered by the umask; fchown clears set-id bits.
    if st.st_mode & 0o7777 != mode {
        fchmod(dir, Mode::from_raw_mode(mode)).map_err(io_err("chmod", path))?;
    }
    Ok(())
}

/// Creates `name` in `dir` as a new, empty regular file of this process with exactly `mode`:
/// `O_CREAT|O_EXCL|O_NOFOLLOW`, so whatever is already there (a link above all) makes it fail
/// instead of being followed.
pub fn create_new_file_at(
    dir: &OwnedFd,
    name: &str,
    mode: u32,
    path: &Path,
) -> Result<(), NoFollowError> {
    let fd = openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )
    .map_err(io_err("create", path))?;
    fchmod(&fd, Mode::from_raw_mode(mode)).map_err(io_err("chmod", path))
}

/// Makes sure `name` in `dir` is a regular file of this process, with one link and exactly
/// `mode`: such a file is kept (its content too); anything else but a directory — a symbolic
/// link, a file of another owner, a hard link, a FIFO — is unlinked (never followed) and the
/// file created anew. A directory is refused.
pub fn ensure_own_file_at(
    dir: &OwnedFd,
    name: &str,
    mode: u32,
    path: &Path,
) -> Result<(), NoFollowError> {
    if let Some(st) = kind_at(dir, name, path)? {
        match file_type(&st) {
            FileType::Directory => {
                return Err(NoFollowError::Refused {
                    path: path.to_path_buf(),
                    found: "a directory",
                    expected: "a regular file",
                });
            }
            FileType::RegularFile => {
                // Opened without following, without blocking, then checked: what was stat'ed
                // may have been swapped since.
                let flags = OFlags::RDONLY
                    | OFlags::NOFOLLOW
                    | OFlags::NONBLOCK
                    | OFlags::NOCTTY
                    | OFlags::CLOEXEC;
                if let Ok(fd) = openat(dir, name, flags, Mode::empty()) {
                    let st = fstat(&fd).map_err(io_err("stat", path))?;
                    if file_type(&st) == FileType::RegularFile
                        && Uid::from_raw(st.st_uid) == geteuid()
                        && st.st_nlink == 1
                    {
                        if st.st_mode & 0o7777 != mode {
                            fchmod(&fd, Mode::from_raw_mode(mode))
                                .map_err(io_err("chmod", path))?;
                        }
                        return Ok(());
                    }
                }
            }
            _ => {}
        }
        match unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(io_err("remove", path)(e)),
        }
    }
    create_new_file_at(dir, name, mode, path)
}

/// Removes `name` in `dir` whatever it is, following nothing: a directory with
/// [`fs::remove_dir_all`] — which on Linux walks the tree with `openat(O_NOFOLLOW)` and
/// `unlinkat` and removes a link in it as a link (the CVE-2022-21658 fix, Rust 1.58.1; this
/// workspace needs 1.89) — anything else with `unlinkat`. Nothing there is not an error.
pub fn remove_entry_at(dir: &OwnedFd, dir_path: &Path, name: &str) -> Result<(), NoFollowError> {
    let path = dir_path.join(name);
    let Some(st) = kind_at(dir, name, &path)? else {
        return Ok(());
    };
    if file_type(&st) == FileType::Directory {
        return match fs::remove_dir_all(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(NoFollowError::Io {
                op: "remove",
                path,
                source,
            }),
        };
    }
    match unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(io_err("remove", &path)(e)),
    }
}

/// Creates the folder `name` in `dir` anew (`mkdirat`; there must be nothing under that name),
/// makes it this process's with exactly `mode`, and returns its descriptor.
pub fn create_dir_at(
    dir: &OwnedFd,
    name: &str,
    mode: u32,
    path: &Path,
) -> Result<OwnedFd, NoFollowError> {
    mkdirat(dir, name, Mode::from_raw_mode(mode)).map_err(io_err("create directory", path))?;
    let fd = openat(dir, name, DIR_FLAGS, Mode::empty()).map_err(io_err("open directory", path))?;
    own_and_chmod(&fd, path, mode)?;
    Ok(fd)
}
