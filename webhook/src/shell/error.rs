//! [`WebhookError`]: why a `hami-webhook` command could not run, the one error `main` reports. Each
//! room's own error (settings, the VRAM source, `--dev`) passes through with its message, which
//! names the file, the key or the flag and the value.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::shell::dev_mode::DevModeError;
use crate::shell::settings_load::SettingsLoadError;
use crate::shell::vram::source::VramSourceError;

/// Why a command could not run (the server's own failures once it runs are the server's).
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The settings could not be loaded.
    #[error(transparent)]
    Settings(#[from] SettingsLoadError),
    /// The per-GPU VRAM basis could not be set up.
    #[error(transparent)]
    Vram(#[from] VramSourceError),
    /// `serve --dev` could not make or write its certificates.
    #[error(transparent)]
    DevMode(#[from] DevModeError),
    /// The input file of `review` or `mutate` could not be read.
    #[error("cannot read {}: {source}", path.display())]
    ReadInput {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Standard input could not be read.
    #[error("cannot read stdin: {0}")]
    ReadStdin(std::io::Error),
    /// The Tokio runtime could not be built.
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    /// The SIGTERM/SIGINT handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    /// An address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}
