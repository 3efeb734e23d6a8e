//! Atomic publication of a file into a directory, so that a reader never sees a partial file.
//!
//! A truncated limits file is worse than none: `CUDA_DEVICE_MEMORY_LIMIT_0=30` (cut from `3000m`)
//! reads as 30 bytes. So the bytes go to a temporary file in the **same** directory (a rename is
//! atomic only within one file system), which is written, `chmod 0644`ed (explicitly, so the
//! umask does not matter) and `fsync`ed, renamed over the final name, and then the directory is
//! `fsync`ed so that the rename itself survives a power loss. A crash leaves at most a temporary
//! file, which [`sweep_temp_files`] removes at start.
//!
//! The device plugin publishes the limits files with it, and `install-hook` the hook folder's
//! files; both sweep their folders at start. The contract (`hami-shared`) renders the bytes; this
//! crate puts them on disk.
#![forbid(unsafe_code)]

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Mode of every published file: root-owned, world-readable, never writable by the container.
pub const PUBLISHED_MODE: u32 = 0o644;

/// Marker in the name of every temporary file: `.<name>.hami-tmp.<pid>.<n>`.
pub const TEMP_MARKER: &str = ".hami-tmp.";

/// What the functions of this crate return.
pub type Result<T, E = PublishError> = std::result::Result<T, E>;

/// What failed while publishing or sweeping; each variant names the path.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The final name is empty, `.`/`..`, holds a `/` or NUL, or looks like a temporary file.
    #[error("cannot publish {name:?} into {dir}: not a plain file name")]
    InvalidFileName {
        /// The directory.
        dir: PathBuf,
        /// The refused name.
        name: String,
    },
    /// The temporary file could not be created (missing or read-only directory, ...).
    #[error("cannot create temporary file {path}: {source}")]
    CreateTemp {
        /// The temporary file's path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Writing the contents failed (disk full, ...).
    #[error("cannot write {path}: {source}")]
    Write {
        /// The temporary file's path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `fsync` of the temporary file failed.
    #[error("cannot fsync {path}: {source}")]
    SyncFile {
        /// The temporary file's path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `chmod 0644` of the temporary file failed.
    #[error("cannot chmod 0644 {path}: {source}")]
    Chmod {
        /// The temporary file's path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Renaming the temporary file over the final name failed.
    #[error("cannot rename {from} to {to}: {source}")]
    Rename {
        /// The temporary file's path.
        from: PathBuf,
        /// The final path.
        to: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `fsync` of the directory failed: the file is complete but its rename may not be durable.
    #[error("cannot fsync directory {path}: {source}")]
    SyncDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The directory could not be listed during a sweep.
    #[error("cannot list directory {path}: {source}")]
    ReadDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A leftover temporary file could not be removed.
    #[error("cannot remove leftover temporary file {path}: {source}")]
    RemoveTemp {
        /// The temporary file's path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl PublishError {
    /// The path the error is about (the final path for a rename).
    pub fn path(&self) -> &Path {
        match self {
            PublishError::InvalidFileName { dir, .. } => dir,
            PublishError::CreateTemp { path, .. }
            | PublishError::Write { path, .. }
            | PublishError::SyncFile { path, .. }
            | PublishError::Chmod { path, .. }
            | PublishError::SyncDir { path, .. }
            | PublishError::ReadDir { path, .. }
            | PublishError::RemoveTemp { path, .. } => path,
            PublishError::Rename { to, .. } => to,
        }
    }
}

/// True when `name` is a temporary file of [`publish_atomic`].
pub fn is_temp_file_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(TEMP_MARKER)
}

fn temp_name(file_name: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        ".{file_name}{TEMP_MARKER}{}.{n}.{nanos}",
        std::process::id()
    )
}

/// Removes the temporary file unless disarmed (after a successful rename).
struct TempGuard<'a> {
    path: &'a Path,
    armed: bool,
}

impl Drop for TempGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: the error that got us here is the one to report.
            let _ = fs::remove_file(self.path);
        }
    }
}

/// Publish `contents` as `dir/file_name` atomically; returns the final path.
///
/// The directory must exist (it is not created: a missing directory is a configuration error the
/// caller should see). On any error before the rename the temporary file is removed, so nothing
/// is left behind; an existing file keeps its old contents.
pub fn publish_atomic(dir: &Path, file_name: &str, contents: &[u8]) -> Result<PathBuf> {
    if file_name.is_empty()
        || file_name == "."
        || file_name == ".."
        || file_name.contains(['/', '\0'])
        || is_temp_file_name(file_name)
    {
        return Err(PublishError::InvalidFileName {
            dir: dir.to_path_buf(),
            name: file_name.to_owned(),
        });
    }
    let final_path = dir.join(file_name);
    let temp_path = dir.join(temp_name(file_name));

    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp_path)
        .map_err(|source| PublishError::CreateTemp {
            path: temp_path.clone(),
            source,
        })?;
    let mut guard = TempGuard {
        path: &temp_path,
        armed: true,
    };
    file.write_all(contents)
        .map_err(|source| PublishError::Write {
            path: temp_path.clone(),
            source,
        })?;
    // fchmod, not the creation mode: the creation mode is filtered by the umask. Before the
    // fsync, so that one fsync makes the contents and the mode durable together.
    file.set_permissions(Permissions::from_mode(PUBLISHED_MODE))
        .map_err(|source| PublishError::Chmod {
            path: temp_path.clone(),
            source,
        })?;
    file.sync_all().map_err(|source| PublishError::SyncFile {
        path: temp_path.clone(),
        source,
    })?;
    drop(file);
    fs::rename(&temp_path, &final_path).map_err(|source| PublishError::Rename {
        from: temp_path.clone(),
        to: final_path.clone(),
        source,
    })?;
    guard.armed = false;
    sync_dir(dir)?;
    Ok(final_path)
}

/// `fsync` a directory so that renames and removals in it are durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| PublishError::SyncDir {
            path: dir.to_path_buf(),
            source,
        })
}

/// Remove the temporary files a crashed [`publish_atomic`] left in `dir`; returns how many.
///
/// Call it at start, before publishing: it would also remove a concurrent publisher's file.
pub fn sweep_temp_files(dir: &Path) -> Result<usize> {
    let read_dir_err = |source| PublishError::ReadDir {
        path: dir.to_path_buf(),
        source,
    };
    let mut removed = 0;
    for entry in fs::read_dir(dir).map_err(read_dir_err)? {
        let entry = entry.map_err(read_dir_err)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !is_temp_file_name(name) {
            continue;
        }
        let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
        if !is_file {
            continue;
        }
        let path = entry.path();
        match fs::remove_file(&path) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(PublishError::RemoveTemp { path, source }),
        }
    }
    if removed > 0 {
        sync_dir(dir)?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publishes_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let p = publish_atomic(dir.path(), "a.limits", b"one\n").unwrap();
        assert_eq!(p, dir.path().join("a.limits"));
        assert_eq!(fs::read(&p).unwrap(), b"one\n");
        publish_atomic(dir.path(), "a.limits", b"two\n").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two\n");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
            0o644
        );
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("a.limits")]);
    }

    #[test]
    fn refuses_names_that_are_not_plain() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["", ".", "..", "a/b", "../x", "a\0", ".x.hami-tmp.1.2"] {
            let err = publish_atomic(dir.path(), name, b"x").unwrap_err();
            assert!(
                matches!(err, PublishError::InvalidFileName { .. }),
                "{name:?}"
            );
        }
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn sweep_removes_only_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("keep.limits"), "x").unwrap();
        fs::write(dir.path().join(".keep.limits.hami-tmp.12.0.5"), "partial").unwrap();
        fs::write(dir.path().join(".other.hami-tmp.9.9.9"), "").unwrap();
        fs::write(dir.path().join(".hidden"), "").unwrap();
        fs::create_dir(dir.path().join(".dir.hami-tmp.1.1.1")).unwrap();
        assert_eq!(sweep_temp_files(dir.path()).unwrap(), 2);
        let mut names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, [".dir.hami-tmp.1.1.1", ".hidden", "keep.limits"]);
        assert_eq!(sweep_temp_files(dir.path()).unwrap(), 0);
    }

    #[test]
    fn failed_rename_leaves_nothing_behind() {
        // The final name is a non-empty directory: rename(2) fails after the temp file was written.
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("taken")).unwrap();
        fs::write(dir.path().join("taken/x"), "").unwrap();
        let err = publish_atomic(dir.path(), "taken", b"data").unwrap_err();
        assert!(matches!(err, PublishError::Rename { .. }), "{err}");
        assert!(
            err.to_string()
                .contains(&dir.path().join("taken").display().to_string())
        );
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("taken")]);
    }
}
