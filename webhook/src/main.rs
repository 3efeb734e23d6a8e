//! `hami-webhook`: parse flags, install the TLS provider and logging, and call the library.

use std::io::{IsTerminal as _, Read as _, Write as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use hami_webhook::cli::{MutateOutput, mutate_command, review_command};
use hami_webhook::server::{CertSource, run};
use hami_webhook::settings::{LogFormat, Settings};
use hami_webhook::{dev, tls};
use tracing::{error, info};

/// Mutating admission webhook for hami-limits: validates hami.io/limit-delivery and applies HAMi's
/// GPU-pod mutations.
#[derive(Debug, Parser)]
#[command(name = "hami-webhook", version)]
struct Cli {
    /// Log format (overrides server.logFormat).
    #[arg(long, global = true, env = "HAMI_SERVER__LOGFORMAT", value_enum)]
    log_format: Option<LogFormat>,
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
    #[arg(long, env = "HAMI_WEBHOOK_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ServeArgs {
    #[command(flatten)]
    config: ConfigArg,
    #[command(flatten)]
    vram: hami_webhook::vram::VramArgs,
    /// HTTPS address for /mutate (server.listen; default 0.0.0.0:9443, with --dev 127.0.0.1:9443).
    #[arg(long, env = "HAMI_SERVER__LISTEN")]
    listen: Option<SocketAddr>,
    /// Plain-HTTP address for /healthz, /readyz, /metrics (server.metricsListen; default
    /// 0.0.0.0:9090, with --dev 127.0.0.1:9090).
    #[arg(long, env = "HAMI_SERVER__METRICSLISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// PEM certificate chain, reloaded when it changes (server.tlsCert).
    #[arg(long, env = "HAMI_SERVER__TLSCERT", conflicts_with = "dev")]
    tls_cert: Option<PathBuf>,
    /// PEM private key, reloaded when it changes (server.tlsKey).
    #[arg(long, env = "HAMI_SERVER__TLSKEY", conflicts_with = "dev")]
    tls_key: Option<PathBuf>,
    /// Tokio worker threads; 0 = one per usable CPU, 1 = single-threaded (server.workerThreads).
    #[arg(long, env = "HAMI_SERVER__WORKERTHREADS")]
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
    vram: hami_webhook::vram::VramArgs,
    /// The AdmissionReview file; stdin when absent or `-`.
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct MutateArgs {
    #[command(flatten)]
    config: ConfigArg,
    #[command(flatten)]
    vram: hami_webhook::vram::VramArgs,
    /// The Pod (YAML or JSON); `-` for stdin.
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// Print the JSONPatch instead of the mutated pod.
    #[arg(long)]
    patch: bool,
}

fn main() -> ExitCode {
    // One crypto provider, installed before anything touches rustls.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let config = match &cli.command {
        Command::Serve(a) => a.config.config.as_deref(),
        Command::Review(a) => a.config.config.as_deref(),
        Command::Mutate(a) => a.config.config.as_deref(),
    };
    let mut settings = match Settings::load(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("hami-webhook: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(f) = cli.log_format {
        settings.server.log_format = f;
    }
    init_logging(settings.server.log_format);
    // KAI: the per-GPU VRAM basis (PER_GPU_VRAM_MIB, --nodes, or the server's node watch).
    // `serve --dev` runs without a cluster: no node watch (it could never sync, so /readyz would
    // stay false); gpu-fraction pods get no cap there unless --per-gpu-vram-mib or --nodes says.
    let (vram, watch) = match &cli.command {
        Command::Serve(a) => (&a.vram, !a.dev),
        Command::Review(a) => (&a.vram, false),
        Command::Mutate(a) => (&a.vram, false),
    };
    let kai_metrics = settings.kai.metrics.clone();
    if let Err(e) = hami_webhook::vram::configure(&mut settings, vram, watch, &kai_metrics) {
        return fail(&e);
    }
    match cli.command {
        Command::Serve(args) => serve(args, settings),
        Command::Review(args) => {
            let input = match read_input(args.file.as_ref()) {
                Ok(i) => i,
                Err(e) => return fail(&e),
            };
            emit(review_command(&input, &settings))
        }
        Command::Mutate(args) => {
            let input = match read_input(Some(&args.file)) {
                Ok(i) => i,
                Err(e) => return fail(&e),
            };
            let output = if args.patch {
                MutateOutput::Patch
            } else {
                MutateOutput::Pod
            };
            emit(mutate_command(&input, output, &settings))
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn read_input(file: Option<&PathBuf>) -> Result<Vec<u8>, String> {
    match file {
        Some(p) if p.as_os_str() != "-" => {
            std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()))
        }
        _ => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .map_err(|e| format!("cannot read stdin: {e}"))?;
            Ok(buf)
        }
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("hami-webhook: {message}");
    ExitCode::from(2)
}

fn emit(out: hami_webhook::cli::CommandOutput) -> ExitCode {
    let _ = std::io::stdout().write_all(out.stdout.as_bytes());
    let _ = std::io::stderr().write_all(out.stderr.as_bytes());
    ExitCode::from(u8::try_from(out.code).unwrap_or(2))
}

fn serve(args: ServeArgs, mut settings: Settings) -> ExitCode {
    let local = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let server = &mut settings.server;
    match (args.listen, args.dev) {
        (Some(a), _) => server.listen = a,
        (None, true) => server.listen = local(9443),
        (None, false) => {}
    }
    match (args.metrics_listen, args.dev) {
        (Some(a), _) => server.metrics_listen = a,
        (None, true) => server.metrics_listen = local(9090),
        (None, false) => {}
    }
    if let Some(c) = args.tls_cert {
        server.tls_cert = c;
    }
    if let Some(k) = args.tls_key {
        server.tls_key = k;
    }
    if let Some(n) = args.worker_threads {
        server.worker_threads = n;
    }
    let certs = if args.dev {
        match dev_certs(&settings) {
            Ok(c) => c,
            Err(e) => return fail(&e),
        }
    } else {
        CertSource::Files {
            cert: settings.server.tls_cert.clone(),
            key: settings.server.tls_key.clone(),
        }
    };
    let runtime = match settings.server.worker_threads {
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
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    let settings = Arc::new(settings);
    runtime.block_on(async move {
        let listen = settings.server.listen;
        let metrics_listen = settings.server.metrics_listen;
        let listener = match tokio::net::TcpListener::bind(listen).await {
            Ok(l) => l,
            Err(e) => return fail(&format!("cannot listen on {listen}: {e}")),
        };
        let ops = match tokio::net::TcpListener::bind(metrics_listen).await {
            Ok(l) => l,
            Err(e) => return fail(&format!("cannot listen on {metrics_listen}: {e}")),
        };
        info!(%listen, %metrics_listen, "hami-webhook serving");
        match run(settings, listener, ops, certs, shutdown_signal()).await {
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

/// SIGTERM (Kubernetes) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    info!("shutdown signal received");
}

/// Make the throwaway certificates, write the CA and an example review, and print how to call.
fn dev_certs(settings: &Settings) -> Result<CertSource, String> {
    let certs = dev::generate_localhost().map_err(|e| format!("cannot make certificates: {e}"))?;
    let dir = std::env::temp_dir().join(format!("hami-webhook-dev-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let ca = dir.join("ca.pem");
    let example = dir.join("review.json");
    std::fs::write(&ca, &certs.ca_pem)
        .map_err(|e| format!("cannot write {}: {e}", ca.display()))?;
    std::fs::write(&example, dev::EXAMPLE_REVIEW)
        .map_err(|e| format!("cannot write {}: {e}", example.display()))?;
    let loaded = tls::load_pem(
        certs.cert_pem.as_bytes(),
        certs.key_pem.as_bytes(),
        None,
        None,
    )
    .map_err(|e| e.to_string())?;
    let port = settings.server.listen.port();
    let host = if settings.server.listen.ip().is_loopback()
        || settings.server.listen.ip().is_unspecified()
    {
        "localhost".to_owned()
    } else {
        settings.server.listen.ip().to_string()
    };
    println!("dev mode: throwaway CA written to {}", ca.display());
    if settings.kai.per_gpu_vram_mib.is_none() {
        println!(
            "dev mode: no node watch; gpu-fraction pods get no cap unless --per-gpu-vram-mib N or --nodes FILE is given"
        );
    }
    println!("example review written to {}", example.display());
    println!("try:");
    println!(
        "  curl --cacert {} -H 'Content-Type: application/json' --data-binary @{} https://{host}:{port}/mutate",
        ca.display(),
        example.display()
    );
    println!(
        "metrics: curl http://{}/metrics",
        settings.server.metrics_listen
    );
    let _ = std::io::stdout().flush();
    Ok(CertSource::Fixed(loaded))
}
