//! A region file that could not be read or is not a region: the path and what went wrong.

use serde::Serialize;

use super::parse::ParseError;

/// A region file that could not be read, or whose bytes are not a region; names the path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[error("{path}: {kind}")]
pub struct RegionError {
    /// The file.
    pub path: String,
    /// What went wrong.
    pub kind: RegionErrorKind,
}

/// What went wrong with a region file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum RegionErrorKind {
    /// No file: no process of the container has started CUDA (or HAMi-core uses another path).
    #[error("no such file (no process has started CUDA with this region yet)")]
    Missing,
    /// A symbolic link: refused, never followed (the container can write its folder).
    #[error("a symbolic link: refused (a region is a regular file; links are never followed)")]
    Symlink,
    /// Not a regular file.
    #[error("a {file_type}, not a regular file: refused")]
    NotRegular {
        /// `directory`, `fifo`, `socket`, `character device`, `block device`.
        file_type: &'static str,
    },
    /// An I/O error.
    #[error("cannot {op}: {message}")]
    Io {
        /// `open`, `stat`, `read`.
        op: &'static str,
        /// The error.
        message: String,
    },
    /// The bytes are not a region the reader accepts.
    #[error("{0}")]
    Parse(ParseError),
}

impl RegionError {
    /// True when no process has created the region yet (missing, empty, being initialised):
    /// the `no-region` verdict rather than `unreadable`.
    pub fn is_no_region(&self) -> bool {
        matches!(
            self.kind,
            RegionErrorKind::Missing
                | RegionErrorKind::Parse(ParseError::Empty | ParseError::NotInitialised { .. })
        )
    }
}
