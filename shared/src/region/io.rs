//! Reading region files from the node, where a tenant controls them: the container's processes
//! map `usage.cache` read-write, and a root process in the container can replace it with a link,
//! a FIFO or a huge file. So the file is opened `O_NOFOLLOW|O_NONBLOCK` (a link is refused, a FIFO
//! does not block the open), checked to be a regular file on the opened descriptor, and read for
//! at most [`MAX_REGION_FILE_BYTES`] + 1 bytes.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::Result;
use super::error::{RegionError, RegionErrorKind};
use super::layout::MAX_REGION_FILE_BYTES;
use super::parse::{Region, parse};
use crate::limits_file::{ParsedLimitsFile, parse_bytes};
use crate::names::{LIMITS_FILE_SUFFIX, USAGE_CACHE_FILE};

/// The most bytes of a limits file read (the device plugin writes a few hundred).
pub const LIMITS_FILE_READ_BYTES: usize = 64 * 1024;

fn file_type_name(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "fifo"
    } else if t.is_socket() {
        "socket"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_symlink() {
        "symbolic link"
    } else {
        "special file"
    }
}

/// Opens `path` without following a link in its last component and without blocking on a FIFO,
/// and checks on the descriptor that it is a regular file.
fn open_regular(path: &Path) -> Result<File, RegionErrorKind> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => RegionErrorKind::Missing,
            _ if e.raw_os_error() == Some(libc::ELOOP) => RegionErrorKind::Symlink,
            _ => RegionErrorKind::Io {
                op: "open",
                message: e.to_string(),
            },
        })?;
    let meta = file.metadata().map_err(|e| RegionErrorKind::Io {
        op: "stat",
        message: e.to_string(),
    })?;
    if !meta.file_type().is_file() {
        return Err(RegionErrorKind::NotRegular {
            file_type: file_type_name(meta.file_type()),
        });
    }
    Ok(file)
}

/// At most `limit` + 1 bytes of `path` (one more than accepted tells a longer file).
fn read_bounded(path: &Path, limit: usize) -> Result<Vec<u8>, RegionErrorKind> {
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(limit as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| RegionErrorKind::Io {
            op: "read",
            message: e.to_string(),
        })?;
    Ok(bytes)
}

/// Reads and parses the region file at `path` (see the module's notes on what is refused).
///
/// # Errors
/// [`RegionError`] naming `path`: missing, a link, not a regular file, an I/O error, or bytes
/// that are not a region ([`super::ParseError`]).
pub fn read_region_file(path: &Path) -> Result<Region> {
    parse_region_bytes(path, &read_region_bytes(path)?)
}

/// The bytes of the region file at `path`, read as [`read_region_file`] reads them (no link
/// followed, no FIFO waited on, at most [`MAX_REGION_FILE_BYTES`] + 1 bytes), not yet parsed:
/// for callers that keep reading and judging apart (the node exporters).
///
/// # Errors
/// [`RegionError`] naming `path`: missing, a link, not a regular file, or an I/O error.
pub fn read_region_bytes(path: &Path) -> Result<Vec<u8>> {
    read_bounded(path, MAX_REGION_FILE_BYTES).map_err(|kind| RegionError {
        path: path.display().to_string(),
        kind,
    })
}

/// [`parse`] of the bytes read from `path`, the error naming it.
///
/// # Errors
/// [`RegionError`] with [`RegionErrorKind::Parse`].
pub fn parse_region_bytes(path: &Path, bytes: &[u8]) -> Result<Region> {
    parse(bytes).map_err(|e| RegionError {
        path: path.display().to_string(),
        kind: RegionErrorKind::Parse(e),
    })
}

/// A limits file that could not be read as one: names the path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {kind}")]
pub struct LimitsReadError {
    /// The file.
    pub path: String,
    /// What went wrong.
    pub kind: LimitsReadErrorKind,
}

/// What went wrong with a limits file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsReadErrorKind {
    /// A link, not a regular file, or an I/O error (as for a region file).
    #[error("{0}")]
    Read(RegionErrorKind),
    /// Longer than any limits file.
    #[error("longer than {LIMITS_FILE_READ_BYTES} bytes: not a limits file")]
    TooLong,
}

/// Reads a limits file the same way (no link followed, bounded) and parses it tolerantly.
/// `Ok(None)` when there is none.
///
/// # Errors
/// [`LimitsReadError`]: a link, not a regular file, longer than [`LIMITS_FILE_READ_BYTES`], or an
/// I/O error.
pub fn read_limits_file(path: &Path) -> Result<Option<ParsedLimitsFile>, LimitsReadError> {
    Ok(read_limits_bytes(path)?.map(|bytes| parse_bytes(&bytes)))
}

/// The bytes of a limits file, read as [`read_limits_file`] reads them, not parsed.
/// `Ok(None)` when there is none.
///
/// # Errors
/// As [`read_limits_file`].
pub fn read_limits_bytes(path: &Path) -> Result<Option<Vec<u8>>, LimitsReadError> {
    let error = |kind| LimitsReadError {
        path: path.display().to_string(),
        kind,
    };
    match read_bounded(path, LIMITS_FILE_READ_BYTES) {
        Err(RegionErrorKind::Missing) => Ok(None),
        Err(e) => Err(error(LimitsReadErrorKind::Read(e))),
        Ok(bytes) if bytes.len() > LIMITS_FILE_READ_BYTES => {
            Err(error(LimitsReadErrorKind::TooLong))
        }
        Ok(bytes) => Ok(Some(bytes)),
    }
}

/// The limits file the device plugin publishes beside a container's folder:
/// `<containers>/<pod-uid>_<container>.limits` for `<containers>/<pod-uid>_<container>/usage.cache`.
pub fn limits_file_for(region_file: &Path) -> Option<PathBuf> {
    let dir = region_file.parent()?;
    let name = dir.file_name()?.to_str()?;
    Some(dir.with_file_name(format!("{name}{LIMITS_FILE_SUFFIX}")))
}

/// One per-container folder of `<HOOK>/vgpu/containers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerDir {
    /// `<pod-uid>_<container>`.
    pub name: String,
    /// Its region file.
    pub region: PathBuf,
    /// Its limits file (beside the folder).
    pub limits: PathBuf,
}

/// The per-container folders of `containers` (the device plugin's `<HOOK>/vgpu/containers`),
/// sorted by name. Links and anything but folders are skipped, never followed.
///
/// # Errors
/// The folder cannot be listed.
pub fn container_dirs(containers: &Path) -> io::Result<Vec<ContainerDir>> {
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(containers)? {
        let entry = entry?;
        // DirEntry::file_type does not follow links.
        if !entry.file_type()?.is_dir() {
            continue;
        }
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        dirs.push(ContainerDir {
            region: entry.path().join(USAGE_CACHE_FILE),
            limits: containers.join(format!("{name}{LIMITS_FILE_SUFFIX}")),
            name,
        });
    }
    dirs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(dirs)
}
