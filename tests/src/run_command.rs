//! The device plugin's `run` command in process, as the tests of the whole `run` path start it:
//! its flags parsed as `hami-device-plugin run <flags>` would be, the API server client handed
//! over, and stopped as SIGTERM stops it.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use hami_device_plugin::app::{AppError, RunContext, RunOptions};
use hami_device_plugin::cli::{Cli, Command, RunArgs};
use hami_device_plugin::kubelet::service::{AllocateHandler, VisibleDevicesOnly};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Why the plugin could not be started or did not stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum RunCommandError {
    /// The flags do not parse.
    #[error("hami-device-plugin run: the flags do not parse: {0}")]
    Flags(String),
    /// The flags parse to another command than `run`.
    #[error("hami-device-plugin run: the flags are not those of `run`")]
    NotRun,
    /// The plugin had not stopped `after` the shutdown signal.
    #[error("hami-device-plugin run: still running {after:?} after the shutdown signal")]
    StopTimedOut {
        /// How long it was given.
        after: Duration,
    },
    /// The plugin's task panicked or was cancelled.
    #[error("hami-device-plugin run: its task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// `run` returned an error.
    #[error(transparent)]
    Run(#[from] AppError),
}

/// A running `hami-device-plugin run`.
#[derive(Debug)]
pub struct RunCommand {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), AppError>>,
}

impl RunCommand {
    /// `hami-device-plugin run <flags>` against the API server `client`, with
    /// [`VisibleDevicesOnly`] answering `Allocate`.
    ///
    /// # Errors
    /// [`RunCommandError::Flags`] or [`RunCommandError::NotRun`] for flags that are not those of
    /// `run`.
    pub fn start<I, T>(flags: I, client: kube::Client) -> Result<Self, RunCommandError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let args = run_args(flags)?;
        let options = RunOptions {
            client: Some(client),
            ..RunOptions::default()
        };
        let visible_devices_only = |_: &RunContext| -> Result<Arc<dyn AllocateHandler>, AppError> {
            Ok(Arc::new(VisibleDevicesOnly))
        };
        Ok(Self::spawn(args, options, visible_devices_only))
    }

    /// `run` with parsed `args`, `options` and the `Allocate` handler `make_allocate` builds.
    pub fn spawn(
        args: RunArgs,
        options: RunOptions,
        make_allocate: impl FnOnce(&RunContext) -> Result<Arc<dyn AllocateHandler>, AppError>
        + Send
        + 'static,
    ) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(hami_device_plugin::app::run_with_options(
            args,
            options,
            make_allocate,
            async {
                let _ = stopped.await;
            },
        ));
        Self { stop, task }
    }

    /// Stops it (as SIGTERM does) and waits at most `wait` for `run` to return.
    ///
    /// # Errors
    /// [`RunCommandError::StopTimedOut`], [`RunCommandError::Task`], or `run`'s own error.
    pub async fn stop(self, wait: Duration) -> Result<(), RunCommandError> {
        // The plugin may have ended already: its result below says how.
        let _ = self.stop.send(());
        match tokio::time::timeout(wait, self.task).await {
            Err(_) => Err(RunCommandError::StopTimedOut { after: wait }),
            Ok(joined) => Ok(joined??),
        }
    }
}

/// `hami-device-plugin run <flags>`, parsed.
fn run_args<I, T>(flags: I) -> Result<RunArgs, RunCommandError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let line = ["hami-device-plugin".into(), "run".into()]
        .into_iter()
        .chain(flags.into_iter().map(Into::into));
    let parsed = Cli::parse_with_env(line, |name| std::env::var_os(name))
        .map_err(|e| RunCommandError::Flags(e.to_string()))?;
    match parsed.cli.command {
        Command::Run(args) => Ok(args),
        _ => Err(RunCommandError::NotRun),
    }
}
