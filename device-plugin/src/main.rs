//! `hami-device-plugin`: parses the command line, installs logging and signal handling, and hands
//! over to the library.

use std::process::ExitCode;

use clap::Parser;
use hami_device_plugin::cli::{self, Cli, CliError, Command};

/// Installs the SIGTERM/SIGINT handlers now (a signal that arrives while the plugin is still
/// starting must not kill it with the socket left behind) and returns a future that completes on
/// the first of them.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "shutting down"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "shutting down"),
        }
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let subscriber = cli::log_subscriber(
        cli.log_format,
        std::io::stderr,
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
    );
    if let Err(error) = tracing::subscriber::set_global_default(subscriber) {
        eprintln!("hami-device-plugin: cannot install logging: {error}");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(error) => {
            eprintln!("hami-device-plugin: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => {
                let shutdown = shutdown_signal().map_err(CliError::Signals)?;
                cli::run(args, hami_device_plugin::allocation::make_handler, shutdown).await
            }
            Command::Inventory(args) => cli::inventory_report(&args.source).map(|report| {
                if args.json {
                    match serde_json::to_string_pretty(&report) {
                        Ok(text) => println!("{text}"),
                        Err(error) => eprintln!("hami-device-plugin: {error}"),
                    }
                } else {
                    print!("{}", cli::render_report(&report));
                }
            }),
            Command::Plan(args) => hami_device_plugin::allocation::dry_run::run_plan(&args)
                .map_err(CliError::from)
                .map(|report| match serde_json::to_string_pretty(&report) {
                    Ok(text) => println!("{text}"),
                    Err(error) => eprintln!("hami-device-plugin: {error}"),
                }),
            Command::InstallHook(args) => hami_device_plugin::install_hook::install_hook(&args)
                .map_err(CliError::from)
                .map(|report| {
                    if report.removed_temporaries > 0 {
                        tracing::info!(
                            count = report.removed_temporaries,
                            "removed leftover temporary files of an earlier run"
                        );
                    }
                    for dir in &report.created_dirs {
                        tracing::info!(dir = %dir.display(), "created directory");
                    }
                    for file in &report.files {
                        println!("{file}");
                    }
                }),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("hami-device-plugin: {error}");
            ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(1))
        }
    }
}
