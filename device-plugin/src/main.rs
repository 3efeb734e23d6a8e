//! `hami-device-plugin`: parses the command line, installs logging, starts the runtime with the
//! signal handlers installed first, and hands over to the library ([`hami_device_plugin::app`]).

use std::process::ExitCode;

use hami_device_plugin::app::{self, AppError};
use hami_device_plugin::cli::{Cli, Command};
use hami_device_plugin::commands::install_hook::{self, InstallReport, NodeGpusReport};
use hami_device_plugin::commands::plan::{self as dry_run, PlanReport};
use hami_device_plugin::commands::serve_preload;

fn print_json(value: &impl serde::Serialize) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => println!("{text}"),
        Err(error) => eprintln!("hami-device-plugin: {error}"),
    }
}

/// `plan`: the notes on stderr, the report as JSON on stdout.
fn print_plan(report: &PlanReport) {
    for note in &report.notes {
        eprintln!("hami-device-plugin plan: nothing to allocate: {note}");
    }
    if report.removed_temporaries > 0 {
        eprintln!(
            "hami-device-plugin plan: removed {} leftover temporary file(s) of an interrupted --write",
            report.removed_temporaries
        );
    }
    print_json(report);
}

/// `install-hook`: what was done in the log, one line per file on stdout.
fn print_install(report: &InstallReport) {
    if report.removed_temporaries > 0 {
        tracing::info!(
            count = report.removed_temporaries,
            "removed leftover temporary files of an earlier run"
        );
    }
    for dir in &report.created_dirs {
        tracing::info!(dir = %dir.display(), "created directory");
    }
    if let NodeGpusReport::Withdrawn {
        path,
        reason,
        removed,
    } = &report.node_gpus
    {
        tracing::warn!(file = %path.display(), removed_stale = removed, %reason, "no node GPU file published");
    }
    for line in report.lines() {
        println!("{line}");
    }
}

fn main() -> ExitCode {
    // The command line, and the deprecated environment names it falls back to.
    let parsed = Cli::parse_with_env(std::env::args_os(), |name| std::env::var_os(name));
    let (cli, deprecations) = match parsed {
        Ok(parsed) => (parsed.cli, parsed.deprecations),
        Err(error) => error.exit(),
    };
    if let Err(error) = hami_ops::init_logging(cli.log_format) {
        eprintln!("hami-device-plugin: {error}");
    }
    for notice in &deprecations {
        tracing::warn!("{notice}");
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
                // First thing: a SIGTERM during start-up must not kill the plugin with its
                // socket left behind. (The one-shot commands keep the default: a signal ends them.)
                let shutdown = hami_ops::shutdown_signal().map_err(AppError::Signals)?;
                app::run(args, app::make_allocate_handler, shutdown).await
            }
            Command::Inventory(args) => app::inventory_report(&args.source).map(|report| {
                if args.json {
                    print_json(&report);
                } else {
                    print!("{}", app::render_report(&report));
                }
            }),
            Command::Plan(args) => dry_run::run_plan(&args.into(), app::config_environment())
                .map_err(AppError::from)
                .map(|report| print_plan(&report)),
            Command::InstallHook(args) => install_hook::install_hook(&args.into())
                .map_err(AppError::from)
                .map(|report| print_install(&report)),
            Command::Regions(args) => hami_device_plugin::commands::regions::regions(&args.into())
                .map(|text| print!("{text}"))
                .map_err(AppError::from),
            Command::ServePreload(args) => {
                // As for `run`: a SIGTERM must not leave the socket behind.
                let shutdown = hami_ops::shutdown_signal().map_err(AppError::Signals)?;
                serve_preload::serve_preload(&args.into(), shutdown)
                    .await
                    .map_err(AppError::from)
            }
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
