//! The composition root: the command line, settings, logging, the VRAM basis and the server,
//! wired together. `main.rs` only calls [`main`].

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use hami_shared::names;
use tracing::{error, info, warn};

use crate::policy::settings::{ServerSettings, Settings};
use crate::shell::dev_mode::dev_certs;
use crate::shell::error::WebhookError;
use crate::shell::offline_commands::{CommandOutput, MutateOutput, mutate_command, review_command};
use crate::shell::server::{CertSource, run};
use crate::shell::vram::metrics::KaiMetrics;
use crate::shell::vram::source::{VramArgs, VramSource};

/// Mutating admission webhook for hami-limits: validates hami.io/limit-delivery and applies HAMi's
/// GPU-pod mutations.
#[derive(Debug, Parser)]
#[command(name = "hami-webhook", version)]
pub struct Cli {
    /// Log format (overrides server.logFormat, HAMI_SERVER__LOGFORMAT and HAMI_LOG_FORMAT).
    #[arg(long, global = true, value_enum)]
    log_format: Option<hami_ops::LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve POST /mutate over HTTPS, and /healthz, /readyz, /metrics over HTTP.
    Serve(ServeArgs),
    /// Answer one AdmissionReview (JSON, from a file or stdin) on stdout.
    Review(ReviewArgs),
    /// Show what the webhook would do to a Pod (YAML or JSON): the mutated pod or the patch.
    Mutate(MutateArgs),
}

#[derive(Debug, Args)]
struct ConfigArg {
    /// Settings file (YAML or JSON); HAMI_* environment variables override it.
    #[arg(long, env = names::ENV_HAMI_WEBHOOK_CONFIG)]
    config: Option<PathBuf>,
}

/// The server's flags. Each overrides its settings key, which the environment
/// (`HAMI_SERVER__<KEY>`) and the file set otherwise: one mechanism reads each variable.
#[derive(Debug, Args)]
struct ServeArgs {
    #[command(flatten)]
    config: ConfigArg,
    #[command(flatten)]
    vram: VramArgs,
    /// HTTPS address for /mutate (server.listen; default 0.0.0.0:9443, with --dev 127.0.0.1:9443).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Plain-HTTP address for /healthz, /readyz, /metrics (server.metricsListen; default
    /// 0.0.0.0:9090, with --dev 127.0.0.1:9090).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// PEM certificate chain, reloaded when it changes (server.tlsCert).
    #[arg(long, conflicts_with = "dev")]
    tls_cert: Option<PathBuf>,
    /// PEM private key, reloaded when it changes (server.tlsKey).
    #[arg(long, conflicts_with = "dev")]
    tls_key: Option<PathBuf>,
    /// Tokio worker threads; 0 = one per usable CPU, 1 = single-threaded (server.workerThreads).
    #[arg(long)]
    worker_threads: Option<usize>,
    /// No cluster, no files: make a throwaway CA and certificate for localhost/127.0.0.1, write the
    /// CA and an example review to a temporary folder, and print a curl command that uses them.
    #[arg(long)]
    dev: bool,
}

#[derive(Debug, Args)]
struct ReviewArgs {
    #[command(flatten)]
    config: ConfigArg,
    #[command(flatten)]
    vram: VramArgs,
    /// The AdmissionReview file; stdin when absent or `-`.
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct MutateArgs {
    #[command(flatten)]
    config: ConfigArg,
    #[command(flatten)]
    vram: VramArgs,
    /// The Pod (YAML or JSON, one document, as `kubectl get pod -o yaml` prints it); `-` for stdin.
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// Print the JSONPatch instead of the mutated pod.
    #[arg(long)]
    patch: bool,
}

/// `hami-webhook`: parse the command line and run it.
#[must_use]
pub fn main() -> ExitCode {
    // One crypto provider, installed before anything touches rustls.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    // Before anything is logged or bound: `serve` may restart itself (same pid) once.
    let pinned = match cli.command {
        Command::Serve(_) => pin_malloc_mmap_threshold(),
        _ => None,
    };
    let config = match &cli.command {
        Command::Serve(a) => a.config.config.as_deref(),
        Command::Review(a) => a.config.config.as_deref(),
        Command::Mutate(a) => a.config.config.as_deref(),
    };
    // The process environment is read here, once, for the settings loader.
    let (mut settings, notices) = match Settings::load_from_env(config, std::env::vars()) {
        Ok(s) => s,
        Err(e) => return fail(&WebhookError::from(e)),
    };
    if let Some(f) = cli.log_format {
        settings.server.log_format = f;
    }
    // A second subscriber (tests running `main` twice) keeps the first.
    let _ = hami_ops::init_logging(settings.server.log_format);
    for notice in notices {
        warn!("{notice}");
    }
    let vram_args = match &cli.command {
        Command::Serve(a) => &a.vram,
        Command::Review(a) => &a.vram,
        Command::Mutate(a) => &a.vram,
    };
    // The flag wins over the settings key; the decision reads the key.
    if let Some(n) = vram_args.per_gpu_vram_mib {
        settings.kai.per_gpu_vram_mib = Some(n);
    }
    match cli.command {
        Command::Serve(args) => {
            if let Some(e) = pinned {
                warn!(error = %e, "cannot restart with a fixed malloc mmap threshold; large request bodies may leave memory resident");
            }
            serve(args, settings)
        }
        Command::Review(args) => {
            let vram = match offline_basis(&settings, &args.vram) {
                Ok(v) => v,
                Err(e) => return fail(&e),
            };
            let input = match read_input(args.file.as_ref()) {
                Ok(i) => i,
                Err(e) => return fail(&e),
            };
            emit(&vram.with_basis(|b| review_command(&input, &settings, b)))
        }
        Command::Mutate(args) => {
            let vram = match offline_basis(&settings, &args.vram) {
                Ok(v) => v,
                Err(e) => return fail(&e),
            };
            let input = match read_input(Some(&args.file)) {
                Ok(i) => i,
                Err(e) => return fail(&e),
            };
            let output = if args.patch {
                MutateOutput::Patch
            } else {
                MutateOutput::Pod
            };
            emit(&vram.with_basis(|b| mutate_command(&input, output, &settings, b)))
        }
    }
}

/// glibc's malloc raises its mmap threshold each time a large mapped block is freed; request
/// bodies of several MiB then come from per-thread arenas that are not given back, and the
/// server's RSS stays at the high-water mark of many bodies (49.9 MiB seen with 8 MiB bodies,
/// 28 MiB with the threshold fixed). The threshold can only be fixed before the process starts,
/// so `serve` restarts itself once (same pid: `exec`) with
/// `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072` (glibc's default value, now fixed) added,
/// unless `GLIBC_TUNABLES` already sets `glibc.malloc.mmap_threshold` or this is not glibc.
/// Returns the error when the `exec` failed (the server then runs as it is).
fn pin_malloc_mmap_threshold() -> Option<std::io::Error> {
    use std::os::unix::process::CommandExt as _;
    const VAR: &str = "GLIBC_TUNABLES";
    const SETTING: &str = "glibc.malloc.mmap_threshold";
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return None;
    }
    let current = std::env::var(VAR).unwrap_or_default();
    if current.contains(SETTING) {
        return None;
    }
    let value = if current.is_empty() {
        format!("{SETTING}=131072")
    } else {
        format!("{current}:{SETTING}=131072")
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return Some(e),
    };
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
    // Returns only on failure.
    Some(
        std::process::Command::new(exe)
            .arg0(arg0)
            .args(args)
            .env(VAR, value)
            .exec(),
    )
}

/// `review` and `mutate`: a fixed basis (`--per-gpu-vram-mib`, `kai.perGpuVramMib`, `--nodes`)
/// or none; never a watch.
fn offline_basis(settings: &Settings, args: &VramArgs) -> crate::Result<VramSource> {
    Ok(VramSource::choose(
        settings.kai.per_gpu_vram_mib,
        args.nodes.as_deref(),
        false,
        &KaiMetrics::default(),
    )?)
}

fn read_input(file: Option<&PathBuf>) -> crate::Result<Vec<u8>> {
    match file {
        Some(p) if p.as_os_str() != "-" => {
            std::fs::read(p).map_err(|source| WebhookError::ReadInput {
                path: p.clone(),
                source,
            })
        }
        _ => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .map_err(WebhookError::ReadStdin)?;
            Ok(buf)
        }
    }
}

fn fail(error: &WebhookError) -> ExitCode {
    eprintln!("hami-webhook: {error}");
    ExitCode::from(2)
}

fn emit(out: &CommandOutput) -> ExitCode {
    let _ = std::io::stdout().write_all(out.stdout.as_bytes());
    let _ = std::io::stderr().write_all(out.stderr.as_bytes());
    ExitCode::from(u8::try_from(out.code).unwrap_or(2))
}

/// The `serve` flags over their settings keys (`--dev` moves the default addresses to loopback;
/// configured ones stay).
fn apply_serve_flags(args: &ServeArgs, server: &mut ServerSettings) {
    let local = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let defaults = ServerSettings::default();
    match (args.listen, args.dev) {
        (Some(a), _) => server.listen = a,
        (None, true) if server.listen == defaults.listen => server.listen = local(9443),
        (None, _) => {}
    }
    match (args.metrics_listen, args.dev) {
        (Some(a), _) => server.metrics_listen = a,
        (None, true) if server.metrics_listen == defaults.metrics_listen => {
            server.metrics_listen = local(9090);
        }
        (None, _) => {}
    }
    if let Some(c) = &args.tls_cert {
        server.tls_cert.clone_from(c);
    }
    if let Some(k) = &args.tls_key {
        server.tls_key.clone_from(k);
    }
    if let Some(n) = args.worker_threads {
        server.worker_threads = n;
    }
}

/// The Tokio runtime: `worker_threads` 1 is single-threaded, 0 one worker per usable CPU.
fn runtime(worker_threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    match worker_threads {
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        0 => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    }
}

fn serve(args: ServeArgs, mut settings: Settings) -> ExitCode {
    apply_serve_flags(&args, &mut settings.server);
    let runtime = match runtime(settings.server.worker_threads) {
        Ok(r) => r,
        Err(e) => return fail(&WebhookError::Runtime(e)),
    };
    // SIGTERM/SIGINT handlers first, before any file, socket or cluster is touched: a signal
    // during start-up then stops the server instead of killing it.
    let shutdown = {
        let _enter = runtime.enter();
        match hami_ops::shutdown_signal() {
            Ok(s) => s,
            Err(e) => return fail(&WebhookError::Signals(e)),
        }
    };
    // KAI: the per-GPU VRAM basis (kai.perGpuVramMib, --nodes, or the node watch). `serve --dev`
    // runs without a cluster: no node watch (it could never sync, so /readyz would stay false);
    // gpu-fraction pods get no cap there unless --per-gpu-vram-mib or --nodes says.
    let kai_metrics = KaiMetrics::default();
    let vram = match VramSource::choose(
        settings.kai.per_gpu_vram_mib,
        args.vram.nodes.as_deref(),
        !args.dev,
        &kai_metrics,
    ) {
        Ok(v) => v,
        Err(e) => return fail(&e.into()),
    };
    let certs = if args.dev {
        match dev_certs(&settings) {
            Ok(c) => c,
            Err(e) => return fail(&e.into()),
        }
    } else {
        CertSource::Files {
            cert: settings.server.tls_cert.clone(),
            key: settings.server.tls_key.clone(),
        }
    };
    let settings = Arc::new(settings);
    runtime.block_on(async move {
        let listen = settings.server.listen;
        let metrics_listen = settings.server.metrics_listen;
        let listener = match tokio::net::TcpListener::bind(listen).await {
            Ok(l) => l,
            Err(source) => {
                return fail(&WebhookError::Listen {
                    addr: listen,
                    source,
                });
            }
        };
        let ops = match tokio::net::TcpListener::bind(metrics_listen).await {
            Ok(l) => l,
            Err(source) => {
                return fail(&WebhookError::Listen {
                    addr: metrics_listen,
                    source,
                });
            }
        };
        info!(%listen, %metrics_listen, "hami-webhook serving");
        match run(settings, vram, kai_metrics, listener, ops, certs, shutdown).await {
            Ok(()) => {
                info!("stopped");
                ExitCode::SUCCESS
            }
            Err(e) => {
                error!(error = %e, "webhook failed");
                ExitCode::FAILURE
            }
        }
    })
}
