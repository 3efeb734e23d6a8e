//! `hami-limits`: inspect a limits file the way HAMi-core will read it.
//!
//! Exit status of `check`: 0 no diagnostics, 1 any diagnostic, 2 the file could not be read.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hami_shared::limits_file::{self, EXAMPLE, ParsedLimitsFile};

#[derive(Debug, Parser)]
#[command(
    name = "hami-limits",
    version,
    about = "Inspect hami-limits limits files (/overrideEnv) as HAMi-core reads them",
    long_about = "Inspect hami-limits limits files (/overrideEnv) as HAMi-core reads them.\n\n\
        The device plugin publishes one limits file per container and mounts it read-only at \
        /overrideEnv, so that every process (entrypoint, kubectl exec, SSH, su -, cron) gets the same \
        GPU limits. This tool reports malformed lines and values HAMi-core would read differently \
        than intended (04000m is octal, 3000Mi is 3000 bytes, 0 is no limit)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check a limits file: one line per diagnostic, `line N: <severity>: <message>`.
    #[command(
        after_help = "Examples:\n  kubectl exec POD -- cat /overrideEnv | hami-limits check -\n  \
            hami-limits check /usr/local/vgpu/containers/<pod-uid>_<container>.limits --json\n  \
            hami-limits check --example\n\n\
            Exit status: 0 no diagnostics, 1 any diagnostic (error or warning), 2 the file could not be read."
    )]
    Check {
        /// The limits file; `-` (the default) reads standard input.
        #[arg(value_name = "FILE|-", conflicts_with = "example")]
        file: Option<PathBuf>,
        /// Print one JSON object: {"format", "entries", "diagnostics": [{"line", "severity", "message"}]}.
        #[arg(long)]
        json: bool,
        /// Check a built-in example file (what the device plugin writes for a 3000 MiB, 50 % share).
        #[arg(long)]
        example: bool,
    },
}

const EXIT_CLEAN: u8 = 0;
const EXIT_DIAGNOSTICS: u8 = 1;
const EXIT_UNREADABLE: u8 = 2;

fn read_input(file: Option<&PathBuf>) -> Result<(String, Vec<u8>), String> {
    let mut bytes = Vec::new();
    match file {
        None => read_stdin(&mut bytes).map(|()| ("standard input".to_owned(), bytes)),
        Some(p) if p.as_os_str() == "-" => {
            read_stdin(&mut bytes).map(|()| ("standard input".to_owned(), bytes))
        }
        Some(p) => std::fs::read(p)
            .map(|b| (p.display().to_string(), b))
            .map_err(|e| format!("cannot read {}: {e}", p.display())),
    }
}

fn read_stdin(buf: &mut Vec<u8>) -> Result<(), String> {
    std::io::stdin()
        .lock()
        .read_to_end(buf)
        .map(|_| ())
        .map_err(|e| format!("cannot read standard input: {e}"))
}

fn report(parsed: &ParsedLimitsFile, json: bool, out: &mut impl Write) -> std::io::Result<()> {
    if json {
        let text = serde_json::to_string(parsed).map_err(std::io::Error::other)?;
        writeln!(out, "{text}")
    } else {
        for d in &parsed.diagnostics {
            writeln!(out, "{d}")?;
        }
        Ok(())
    }
}

fn check(file: Option<PathBuf>, json: bool, example: bool) -> u8 {
    let (name, bytes) = if example {
        ("built-in example".to_owned(), EXAMPLE.as_bytes().to_vec())
    } else {
        match read_input(file.as_ref()) {
            Ok(v) => v,
            Err(msg) => {
                eprintln!("hami-limits: {msg}");
                return EXIT_UNREADABLE;
            }
        }
    };
    let parsed = limits_file::parse_bytes(&bytes);
    let mut out = std::io::stdout().lock();
    if example && !json {
        let header = format!(
            "Example limits file, as the device plugin publishes it for a container with a 3000 MiB, \
             50 % GPU share\n(host: <HOOK_PATH>/vgpu/containers/<pod-uid>_<container>.limits, \
             container: /overrideEnv):\n\n{EXAMPLE}\nDiagnostics ({}):",
            parsed.diagnostics.len()
        );
        if writeln!(out, "{header}").is_err() {
            return EXIT_UNREADABLE;
        }
    }
    if report(&parsed, json, &mut out).is_err() {
        return EXIT_UNREADABLE;
    }
    if example && !json && parsed.diagnostics.is_empty() {
        let _ = writeln!(out, "(none)");
    }
    if !json {
        eprintln!(
            "hami-limits: {name}: {} entries, format {}, {} diagnostics",
            parsed.entries.len(),
            parsed
                .format
                .map_or_else(|| "absent (legacy)".to_owned(), |f| f.to_string()),
            parsed.diagnostics.len()
        );
    }
    if parsed.diagnostics.is_empty() {
        EXIT_CLEAN
    } else {
        EXIT_DIAGNOSTICS
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check {
            file,
            json,
            example,
        } => ExitCode::from(check(file, json, example)),
    }
}
