//! `hami-limits`: inspect a limits file the way HAMi-core will read it, a node GPU file the way
//! the preload library will, or HAMi-core's shared region (`region`): is the cap in force?
//!
//! Exit status of `check`: 0 no diagnostics, 1 any diagnostic, 2 the file could not be read.
//!
//! `check` streams: it holds one line (at most HAMi-core's 9,999-byte line) and the entries,
//! however long the input, and writes each diagnostic as it is found. `check --node-gpus` reads
//! at most [`NODE_GPUS_CHECK_BYTES`] (the preload library reads 4 KiB of it).

mod region;

use std::io::{BufRead, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hami_shared::limits_file::{self, Diagnostic, EXAMPLE, LineParser, Severity};
use hami_shared::names::{NODE_GPUS_FILE, NODE_GPUS_FORMAT_VERSION};
use hami_shared::node_gpus;
use hami_shared::preload::NODE_GPUS_READ_LIMIT_BYTES;

#[derive(Debug, Parser)]
#[command(
    name = "hami-limits",
    version,
    about = "Inspect hami-limits limits files (/overrideEnv) as HAMi-core reads them",
    long_about = "Inspect hami-limits limits files (/overrideEnv) as HAMi-core reads them.\n\n\
        The device plugin publishes one limits file per container and mounts it read-only at \
        /overrideEnv, so that every process (entrypoint, kubectl exec, SSH, su -, cron) gets the same \
        GPU limits. This tool reports malformed lines and values HAMi-core would read differently \
        than intended (04000m is octal, 3000Mi is 3000 bytes, 0 is no limit), and checks the node \
        GPU file (<hook>/vgpu/node-gpus) from which the preload library sizes a KAI gpu-fraction \
        container's cap."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check a limits file (or, with --node-gpus, a node GPU file): one line per diagnostic,
    /// `line N: <severity>: <message>`.
    #[command(
        after_help = "Examples:\n  kubectl exec POD -- cat /overrideEnv | hami-limits check -\n  \
            hami-limits check /usr/local/vgpu/containers/<pod-uid>_<container>.limits --json\n  \
            hami-limits check --example\n  \
            hami-limits check --node-gpus /usr/local/vgpu/node-gpus\n  \
            kubectl exec POD -- cat /usr/local/vgpu/node-gpus | hami-limits check --node-gpus - --json\n\n\
            A KAI container admitted without a GPU memory cap (kai.missingBasis: warn) has \
            HAMI_UNCAPPED=<reason> in its limits file: reported as a warning.\n\
            A node GPU file finding about the file as a whole (no format line, too large) is \
            printed as `file: <severity>: <message>` (line 0 in --json).\n\n\
            Exit status: 0 no diagnostics, 1 any diagnostic (error or warning), 2 the file could not be read."
    )]
    Check {
        /// The limits file; `-` (the default) reads standard input.
        #[arg(value_name = "FILE|-", conflicts_with_all = ["example", "node_gpus"])]
        file: Option<PathBuf>,
        /// Print one JSON object: {"diagnostics": [{"line", "severity", "message"}], "format", "entries"}
        /// (streamed: the diagnostics are written as they are found); with --node-gpus
        /// {"diagnostics", "format", "gpus": {"<minor>": {"mib", "uuid"}}, "usable"}.
        #[arg(long)]
        json: bool,
        /// Check a built-in example file (what the device plugin writes for a 3000 MiB, 50 % share).
        #[arg(long)]
        example: bool,
        /// Check a node GPU file instead (`node-gpus` in the hook folder, as `hami-device-plugin
        /// install-hook` publishes it: each GPU's /dev/nvidia<minor>, UUID and MiB, from which the
        /// preload library computes a KAI gpu-fraction container's exact cap); `-` reads standard
        /// input.
        #[arg(long, value_name = "FILE|-", conflicts_with = "example")]
        node_gpus: Option<PathBuf>,
    },
    /// Read HAMi-core's shared region (usage.cache) of one container or of every container of a
    /// node and say whether the cap is in force: the limits stamped in it (the ones HAMi-core
    /// enforces), each process with its usage, the sum per GPU, and a verdict per container and
    /// GPU: capped, uncapped, mismatch, no-region, stale, unreadable, no-limit.
    #[command(
        after_help = "PATH is a region file (<HOOK>/vgpu/containers/<pod-uid>_<container>/usage.cache), a \
            container's folder, or the containers folder (<HOOK>/vgpu/containers: every container of \
            the node). The limits file compared with is the one the device plugin publishes beside \
            the folder (<pod-uid>_<container>.limits), or --limits.\n\n\
            Examples:\n  hami-limits region /usr/local/vgpu/containers\n  \
            hami-limits region /usr/local/vgpu/containers/<pod-uid>_main --json\n  \
            kubectl exec POD -- hami-limits region /usr/local/vgpu/usage.cache --limits /overrideEnv --pids container\n  \
            hami-limits region --layout\n\n\
            Links are never followed and at most the largest region's size + 4 KiB is read: the \
            container's processes write these files.\n\n\
            Exit status: 0 no problem, 1 a container is uncapped, mismatch, stale or unreadable, \
            2 PATH cannot be read."
    )]
    Region {
        /// A region file, a container folder, or a folder of container folders.
        #[arg(value_name = "PATH", required_unless_present = "layout")]
        path: Option<PathBuf>,
        /// One JSON object: {"containers": [{"container", "region_file", "limits_file",
        /// "verdict", "region", "error"}]}.
        #[arg(long)]
        json: bool,
        /// The limits file to compare with (default: the one beside the container's folder).
        #[arg(long, value_name = "FILE")]
        limits: Option<PathBuf>,
        /// MiB of the smallest GPU the container sees, for a KAI gpu-fraction container's
        /// per-node cap (HAMI_GPU_FRACTION × this); without it the admission-time cap is expected.
        #[arg(long, value_name = "MIB")]
        gpu_mib: Option<u64>,
        /// Whose PIDs decide whether a slot's process still exists: host (hostpid, on the node),
        /// container (pid, inside the container), none.
        #[arg(long, value_enum, default_value = "host")]
        pids: region::PidView,
        /// Print the offsets the reader assumes for each layout as JSON (to compare with
        /// offsetof() against HAMi-core's header) and exit.
        #[arg(long, conflicts_with_all = ["path", "json", "limits", "gpu_mib"])]
        layout: bool,
    },
}

/// The most bytes `check --node-gpus` reads: enough to report a file past the preload library's
/// 4 KiB, bounded for a file that is not a node GPU file at all.
const NODE_GPUS_CHECK_BYTES: usize = 64 * 1024;

const EXIT_CLEAN: u8 = 0;
const EXIT_DIAGNOSTICS: u8 = 1;
const EXIT_UNREADABLE: u8 = 2;

/// The input of `check` cannot be opened (`cannot read PATH: …`).
#[derive(Debug)]
enum InputError {
    /// Opening or inspecting the file failed.
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The path is a directory.
    Directory { path: PathBuf },
}

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io { path, source } => write!(f, "cannot read {}: {source}", path.display()),
            Self::Directory { path } => {
                write!(f, "cannot read {}: it is a directory", path.display())
            }
        }
    }
}

/// Where `check` reads from.
fn open_input(file: Option<&PathBuf>) -> Result<(String, Box<dyn Read>), InputError> {
    match file {
        Some(p) if p.as_os_str() != "-" => {
            let io = |source| InputError::Io {
                path: p.clone(),
                source,
            };
            let f = std::fs::File::open(p).map_err(io)?;
            match f.metadata() {
                Ok(m) if m.is_dir() => Err(InputError::Directory { path: p.clone() }),
                Ok(_) => Ok((p.display().to_string(), Box::new(f) as Box<dyn Read>)),
                Err(e) => Err(io(e)),
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
    let (name, input) = match check_input(file.as_ref(), example) {
        Ok(v) => v,
        Err(code) => return code,
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if example && !json && write_example_header(&mut out).is_err() {
        return EXIT_UNREADABLE;
    }
    if json && write!(out, "{{\"diagnostics\":[").is_err() {
        return EXIT_UNREADABLE;
    }
    let mut parser = LineParser::new();
    let mut reporter = Reporter {
        out: &mut out,
        json,
        count: 0,
        failed: None,
    };
    let ends_with_newline = match parse_lines(input, &mut parser, &mut reporter) {
        Ok(ends_with_newline) => ends_with_newline,
        Err(e) => {
            drop(reporter);
            // What is still buffered is dropped, not written: the output would be cut short.
            let _ = out.into_parts();
            eprintln!("hami-limits: cannot read {name}: {e}");
            return EXIT_UNREADABLE;
        }
    };
    parser.finish(ends_with_newline, &mut |d| reporter.emit(d));
    let count = reporter.count;
    if reporter.failed.is_some() {
        return EXIT_UNREADABLE;
    }
    let lines = parser.lines();
    let (format, entries) = parser.into_parts();
    let tail = if json {
        write_json_tail(&mut out, format, &entries)
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

/// What `check` reads: the built-in example, the file, or standard input; the exit status when
/// it cannot be opened (the reason printed).
fn check_input(file: Option<&PathBuf>, example: bool) -> Result<(String, Box<dyn Read>), u8> {
    if example {
        return Ok((
            "built-in example".to_owned(),
            Box::new(EXAMPLE.as_bytes()) as Box<dyn Read>,
        ));
    }
    open_or_report(file)
}

/// [`open_input`], the reason printed and the exit status returned when it cannot be opened.
fn open_or_report(file: Option<&PathBuf>) -> Result<(String, Box<dyn Read>), u8> {
    open_input(file).map_err(|msg| {
        eprintln!("hami-limits: {msg}");
        EXIT_UNREADABLE
    })
}

/// `check --example`'s text header: where the file lives, the file, the diagnostics count.
fn write_example_header(out: &mut impl Write) -> std::io::Result<()> {
    let header = format!(
        "Example limits file, as the device plugin publishes it for a container with a 3000 MiB, \
         50 % GPU share\n(host: <HOOK_PATH>/vgpu/containers/<pod-uid>_<container>.limits, \
         container: /overrideEnv):\n\n{EXAMPLE}\nDiagnostics ({}):",
        limits_file::parse(EXAMPLE).diagnostics.len()
    );
    writeln!(out, "{header}")
}

/// Feeds `input` to `parser` line by line (each held to HAMi-core's line length), the
/// diagnostics going to `reporter` as they are found. Returns whether the last line ended with a
/// newline.
fn parse_lines<W: Write>(
    input: Box<dyn Read>,
    parser: &mut LineParser,
    reporter: &mut Reporter<'_, W>,
) -> std::io::Result<bool> {
    let mut reader = std::io::BufReader::with_capacity(64 * 1024, input);
    let mut line = Vec::with_capacity(limits_file::MAX_LINE_BYTES + 1);
    loop {
        let (length, newline) =
            read_line_bounded(&mut reader, &mut line, limits_file::MAX_LINE_BYTES + 1)?;
        if length == 0 {
            return Ok(true);
        }
        let raw = if newline && line.last() == Some(&b'\n') {
            &line[..line.len() - 1]
        } else {
            &line[..]
        };
        let length = if newline { length } else { length + 1 };
        parser.line(raw, length, &mut |d| reporter.emit(d));
        if !newline {
            return Ok(false);
        }
    }
}

/// The end of `check --json`'s object, after the streamed diagnostics: the format and entries.
fn write_json_tail(
    out: &mut impl Write,
    format: Option<u32>,
    entries: &std::collections::BTreeMap<String, String>,
) -> std::io::Result<()> {
    let entries = serde_json::to_string(entries).map_err(std::io::Error::other)?;
    let format = format.map_or_else(|| "null".to_owned(), |f| f.to_string());
    writeln!(out, "],\"format\":{format},\"entries\":{entries}}}")
}

/// One diagnostic as a text line: `line N: …`, or `file: …` for one about the whole file.
fn diagnostic_line(d: &Diagnostic) -> String {
    if d.line == 0 {
        format!("file: {}: {}", d.severity, d.message)
    } else {
        d.to_string()
    }
}

/// `check --node-gpus FILE`: the node GPU file as the preload library reads it.
fn check_node_gpus(file: &PathBuf, json: bool) -> u8 {
    let (name, bytes) = match read_node_gpus(file) {
        Ok(v) => v,
        Err(code) => return code,
    };
    let parsed = parse_node_gpus(&bytes);
    // A file longer than the library reads carries an error (`parse_node_gpus`): not usable.
    let usable = parsed.usable();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = if json {
        writeln!(out, "{}", node_gpus_json(&parsed, usable))
    } else {
        parsed
            .diagnostics
            .iter()
            .try_for_each(|d| writeln!(out, "{}", diagnostic_line(d)))
    };
    if written.and_then(|()| out.flush()).is_err() {
        return EXIT_UNREADABLE;
    }
    if !json {
        eprintln!("{}", node_gpus_summary(&name, &parsed, usable));
    }
    if parsed.diagnostics.is_empty() {
        EXIT_CLEAN
    } else {
        EXIT_DIAGNOSTICS
    }
}

/// The node GPU file's name and at most [`NODE_GPUS_CHECK_BYTES`] + 1 of its bytes (one more
/// tells a longer file); the exit status when it cannot be read (the reason printed).
fn read_node_gpus(file: &PathBuf) -> Result<(String, Vec<u8>), u8> {
    let (name, input) = open_or_report(Some(file))?;
    let mut bytes = Vec::new();
    if let Err(e) = input
        .take(NODE_GPUS_CHECK_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
    {
        eprintln!("hami-limits: cannot read {name}: {e}");
        return Err(EXIT_UNREADABLE);
    }
    Ok((name, bytes))
}

/// The file as the reference reader parses it, with an error first when it is longer than the
/// preload library reads.
fn parse_node_gpus(bytes: &[u8]) -> node_gpus::ParsedNodeGpus {
    let mut parsed = node_gpus::parse(&bytes[..bytes.len().min(NODE_GPUS_CHECK_BYTES)]);
    if bytes.len() > NODE_GPUS_READ_LIMIT_BYTES {
        let size = if bytes.len() > NODE_GPUS_CHECK_BYTES {
            format!("more than {NODE_GPUS_CHECK_BYTES}")
        } else {
            bytes.len().to_string()
        };
        parsed.diagnostics.insert(
            0,
            Diagnostic {
                line: 0,
                severity: Severity::Error,
                message: format!(
                    "the file is {size} bytes: the preload library reads at most {NODE_GPUS_READ_LIMIT_BYTES} bytes of {NODE_GPUS_FILE} and ignores a longer file (the admission-time cap stands)"
                ),
            },
        );
    }
    parsed
}

/// `check --node-gpus --json`'s object: diagnostics, format, the GPUs by minor, usable.
fn node_gpus_json(parsed: &node_gpus::ParsedNodeGpus, usable: bool) -> serde_json::Value {
    let gpus: serde_json::Map<String, serde_json::Value> = parsed
        .memory_mib
        .keys()
        .chain(parsed.uuids.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|minor| {
            (
                minor.to_string(),
                serde_json::json!({
                    "mib": parsed.memory_mib.get(minor),
                    "uuid": parsed.uuids.get(minor),
                }),
            )
        })
        .collect();
    serde_json::json!({
        "diagnostics": parsed.diagnostics,
        "format": parsed.format,
        "gpus": gpus,
        "usable": usable,
    })
}

/// `check --node-gpus`'s summary line on standard error.
fn node_gpus_summary(name: &str, parsed: &node_gpus::ParsedNodeGpus, usable: bool) -> String {
    let gpus: Vec<String> = parsed
        .memory_mib
        .iter()
        .map(|(minor, mib)| format!("/dev/nvidia{minor} {mib} MiB"))
        .collect();
    format!(
        "hami-limits: {name}: node GPU file, format {}, {} GPUs ({}), {}, {} diagnostics",
        parsed
            .format
            .map_or_else(|| "absent".to_owned(), |f| f.to_string()),
        gpus.len(),
        if gpus.is_empty() {
            "none".to_owned()
        } else {
            gpus.join(", ")
        },
        if usable {
            "used by the preload library".to_owned()
        } else {
            format!(
                "ignored by the preload library (it reads a format-{NODE_GPUS_FORMAT_VERSION} file without errors)"
            )
        },
        parsed.diagnostics.len(),
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Region { layout: true, .. } => {
            println!("{}", region::layout_json());
            ExitCode::SUCCESS
        }
        Command::Region {
            path: Some(path),
            json,
            limits,
            gpu_mib,
            pids,
            layout: false,
        } => ExitCode::from(region::run(&region::RegionArgs {
            path,
            json,
            limits,
            gpu_mib,
            pids,
        })),
        Command::Region { path: None, .. } => ExitCode::from(EXIT_UNREADABLE),
        Command::Check {
            node_gpus: Some(file),
            json,
            ..
        } => ExitCode::from(check_node_gpus(&file, json)),
        Command::Check {
            file,
            json,
            example,
            node_gpus: None,
        } => ExitCode::from(check(file, json, example)),
    }
}
