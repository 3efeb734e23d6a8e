//! `hami-limits`: inspect a limits file the way HAMi-core will read it.
//!
//! Exit status of `check`: 0 no diagnostics, 1 any diagnostic, 2 the file could not be read.
//!
//! `check` streams: it holds one line (at most HAMi-core's 9,999-byte line) and the entries,
//! however long the input, and writes each diagnostic as it is found.

use std::io::{BufRead, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hami_shared::limits_file::{self, EXAMPLE, LineParser};

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
        /// Print one JSON object: {"diagnostics": [{"line", "severity", "message"}], "format", "entries"}
        /// (streamed: the diagnostics are written as they are found).
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

/// Where `check` reads from.
fn open_input(file: Option<&PathBuf>) -> Result<(String, Box<dyn Read>), String> {
    match file {
        Some(p) if p.as_os_str() != "-" => {
            let f =
                std::fs::File::open(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            match f.metadata() {
                Ok(m) if m.is_dir() => {
                    Err(format!("cannot read {}: it is a directory", p.display()))
                }
                Ok(_) => Ok((p.display().to_string(), Box::new(f) as Box<dyn Read>)),
                Err(e) => Err(format!("cannot read {}: {e}", p.display())),
            }
        }
        _ => Ok((
            "standard input".to_owned(),
            Box::new(std::io::stdin().lock()) as Box<dyn Read>,
        )),
    }
}

/// Read one line into `buf`, keeping at most `cap` bytes of it (the rest is read and dropped).
/// Returns the line's full length (newline included) and whether it ended with a newline; a
/// length of 0 is the end of the input.
fn read_line_bounded(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    cap: usize,
) -> std::io::Result<(usize, bool)> {
    buf.clear();
    let mut total = 0;
    loop {
        let chunk = match reader.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok((total, false));
        }
        let (take, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let room = cap.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..take.min(room)]);
        total += take;
        reader.consume(take);
        if done {
            return Ok((total, true));
        }
    }
}

/// Streams the diagnostics out as they are found: memory holds one line (at most
/// `MAX_LINE_BYTES`) and the entries, whatever the input's size.
struct Reporter<'a, W: Write> {
    out: &'a mut W,
    json: bool,
    count: usize,
    failed: Option<std::io::Error>,
}

impl<W: Write> Reporter<'_, W> {
    fn emit(&mut self, d: limits_file::Diagnostic) {
        if self.failed.is_some() {
            return;
        }
        let result = if self.json {
            let sep = if self.count == 0 { "" } else { "," };
            serde_json::to_string(&d)
                .map_err(std::io::Error::other)
                .and_then(|text| write!(self.out, "{sep}{text}"))
        } else {
            writeln!(self.out, "{d}")
        };
        self.count += 1;
        if let Err(e) = result {
            self.failed = Some(e);
        }
    }
}

fn check(file: Option<PathBuf>, json: bool, example: bool) -> u8 {
    let (name, input): (String, Box<dyn Read>) = if example {
        (
            "built-in example".to_owned(),
            Box::new(EXAMPLE.as_bytes()) as Box<dyn Read>,
        )
    } else {
        match open_input(file.as_ref()) {
            Ok(v) => v,
            Err(msg) => {
                eprintln!("hami-limits: {msg}");
                return EXIT_UNREADABLE;
            }
        }
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if example && !json {
        let header = format!(
            "Example limits file, as the device plugin publishes it for a container with a 3000 MiB, \
             50 % GPU share\n(host: <HOOK_PATH>/vgpu/containers/<pod-uid>_<container>.limits, \
             container: /overrideEnv):\n\n{EXAMPLE}\nDiagnostics ({}):",
            limits_file::parse(EXAMPLE).diagnostics.len()
        );
        if writeln!(out, "{header}").is_err() {
            return EXIT_UNREADABLE;
        }
    }
    if json && write!(out, "{{\"diagnostics\":[").is_err() {
        return EXIT_UNREADABLE;
    }
    let mut reader = std::io::BufReader::with_capacity(64 * 1024, input);
    let mut parser = LineParser::new();
    let mut line = Vec::with_capacity(limits_file::MAX_LINE_BYTES + 1);
    let mut reporter = Reporter {
        out: &mut out,
        json,
        count: 0,
        failed: None,
    };
    let mut ends_with_newline = true;
    loop {
        match read_line_bounded(&mut reader, &mut line, limits_file::MAX_LINE_BYTES + 1) {
            Ok((0, _)) => break,
            Ok((length, newline)) => {
                let raw = if newline && line.last() == Some(&b'\n') {
                    &line[..line.len() - 1]
                } else {
                    &line[..]
                };
                let length = if newline { length } else { length + 1 };
                parser.line(raw, length, &mut |d| reporter.emit(d));
                if !newline {
                    ends_with_newline = false;
                    break;
                }
            }
            Err(e) => {
                drop(reporter);
                // What is still buffered is dropped, not written: the output would be cut short.
                let _ = out.into_parts();
                eprintln!("hami-limits: cannot read {name}: {e}");
                return EXIT_UNREADABLE;
            }
        }
    }
    parser.finish(ends_with_newline, &mut |d| reporter.emit(d));
    let count = reporter.count;
    if reporter.failed.is_some() {
        return EXIT_UNREADABLE;
    }
    let lines = parser.lines();
    let (format, entries) = parser.into_parts();
    let tail = if json {
        serde_json::to_string(&entries)
            .map_err(std::io::Error::other)
            .and_then(|entries| {
                let format = format.map_or_else(|| "null".to_owned(), |f| f.to_string());
                writeln!(out, "],\"format\":{format},\"entries\":{entries}}}")
            })
    } else if example && count == 0 {
        writeln!(out, "(none)")
    } else {
        Ok(())
    };
    if tail.and_then(|()| out.flush()).is_err() {
        return EXIT_UNREADABLE;
    }
    if !json {
        eprintln!(
            "hami-limits: {name}: {lines} lines, {} entries, format {}, {count} diagnostics",
            entries.len(),
            format.map_or_else(|| "absent (legacy)".to_owned(), |f| f.to_string()),
        );
    }
    if count == 0 {
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
