//! `hami-certgen`: makes the webhook's serving certificate and patches its caBundle.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use hami_certgen::cluster::{self, CreateOutcome, PatchOutcome};
use hami_certgen::secret::CreateSettings;
use hami_certgen::{CertgenError, local};
use hami_ops::LogFormat;

// Each environment name once (`HAMI_LOG_FORMAT` is `hami_ops::ENV_LOG_FORMAT`, as in the other
// programs); `create` and `patch` share the namespace and the Secret's name.
const ENV_CA_DAYS: &str = "HAMI_CERTGEN_CA_DAYS";
const ENV_CERT_DAYS: &str = "HAMI_CERTGEN_CERT_DAYS";
const ENV_NAMESPACE: &str = "HAMI_CERTGEN_NAMESPACE";
const ENV_SERVICE: &str = "HAMI_CERTGEN_SERVICE";
const ENV_SECRET_NAME: &str = "HAMI_CERTGEN_SECRET_NAME";
const ENV_CLUSTER_DOMAIN: &str = "HAMI_CERTGEN_CLUSTER_DOMAIN";
const ENV_RENEW_BEFORE_DAYS: &str = "HAMI_CERTGEN_RENEW_BEFORE_DAYS";
const ENV_WEBHOOK_NAME: &str = "HAMI_CERTGEN_WEBHOOK_NAME";

/// Certificates for the hami-limits admission webhook.
#[derive(Debug, Parser)]
#[command(name = "hami-certgen", version, about)]
struct Cli {
    /// Log format.
    #[arg(long, env = hami_ops::ENV_LOG_FORMAT, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Make (or keep, or renew) the CA and serving certificate in a Secret. Idempotent.
    Create(CreateArgs),
    /// Write the Secret's ca.crt into clientConfig.caBundle of every webhook of a
    /// MutatingWebhookConfiguration.
    Patch(PatchArgs),
    /// Write ca.crt, ca.key, tls.crt, tls.key into a directory, for development.
    Local(LocalArgs),
}

#[derive(Debug, Args)]
struct Validity {
    /// Lifetime of a new CA, in days.
    #[arg(long, env = ENV_CA_DAYS, default_value_t = 3650, value_parser = clap::value_parser!(u32).range(1..=36500))]
    ca_days: u32,
    /// Lifetime of a new serving certificate, in days.
    #[arg(long, env = ENV_CERT_DAYS, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=36500))]
    cert_days: u32,
}

#[derive(Debug, Args)]
struct CreateArgs {
    /// Namespace of the webhook Service and of the Secret.
    #[arg(long, env = ENV_NAMESPACE)]
    namespace: String,
    /// Name of the webhook Service; the certificate covers SVC, SVC.NS, SVC.NS.svc and
    /// SVC.NS.svc.<cluster-domain>.
    #[arg(long, env = ENV_SERVICE)]
    service: String,
    /// Name of the Secret (type kubernetes.io/tls, keys ca.crt, ca.key, tls.crt, tls.key).
    #[arg(long, env = ENV_SECRET_NAME)]
    secret_name: String,
    /// Cluster DNS domain.
    #[arg(
        long,
        env = ENV_CLUSTER_DOMAIN,
        default_value = "cluster.local"
    )]
    cluster_domain: String,
    /// Renew the serving certificate (keeping the CA) when it expires within this many days.
    #[arg(long, env = ENV_RENEW_BEFORE_DAYS, default_value_t = 30)]
    renew_before_days: u32,
    #[command(flatten)]
    validity: Validity,
}

#[derive(Debug, Args)]
struct PatchArgs {
    /// Name of the MutatingWebhookConfiguration.
    #[arg(long, env = ENV_WEBHOOK_NAME)]
    webhook_name: String,
    /// Name of the Secret holding ca.crt.
    #[arg(long, env = ENV_SECRET_NAME)]
    secret_name: String,
    /// Namespace of the Secret.
    #[arg(long, env = ENV_NAMESPACE)]
    namespace: String,
}

#[derive(Debug, Args)]
struct LocalArgs {
    /// Directory to write into (created when absent).
    #[arg(long)]
    out: PathBuf,
    /// DNS names (or IP addresses) of the serving certificate.
    #[arg(long, required = true, num_args = 1..)]
    dns: Vec<String>,
    #[command(flatten)]
    validity: Validity,
}

async fn client() -> Result<kube::Client, CertgenError> {
    kube::Client::try_default()
        .await
        .map_err(|source| CertgenError::Kube {
            action: "connecting to the API server".to_owned(),
            source,
        })
}

async fn run(cli: Cli) -> Result<(), CertgenError> {
    match cli.command {
        Command::Create(args) => {
            let settings = CreateSettings {
                namespace: args.namespace,
                service: args.service,
                secret_name: args.secret_name,
                cluster_domain: args.cluster_domain,
                ca_days: args.validity.ca_days,
                cert_days: args.validity.cert_days,
                renew_before_days: args.renew_before_days,
            };
            let outcome = cluster::create(client().await?, &settings).await?;
            let secret = format!("{}/{}", settings.namespace, settings.secret_name);
            match outcome {
                CreateOutcome::Kept => println!("secret {secret}: valid, kept"),
                CreateOutcome::Created => println!("secret {secret}: created"),
                CreateOutcome::Updated { reason, new_ca } => {
                    let ca = if new_ca { "new CA" } else { "same CA" };
                    println!("secret {secret}: renewed ({reason}; {ca})");
                }
            }
        }
        Command::Patch(args) => {
            let outcome = cluster::patch(
                client().await?,
                &args.namespace,
                &args.secret_name,
                &args.webhook_name,
            )
            .await?;
            match outcome {
                PatchOutcome::Unchanged => {
                    println!(
                        "mutatingwebhookconfiguration {}: caBundle already current",
                        args.webhook_name
                    );
                }
                PatchOutcome::Patched { webhooks } => {
                    println!(
                        "mutatingwebhookconfiguration {}: caBundle written to {webhooks} webhook(s)",
                        args.webhook_name
                    );
                }
            }
        }
        Command::Local(args) => {
            let (_, paths) = local::write_local(
                &args.out,
                &args.dns,
                args.validity.ca_days,
                args.validity.cert_days,
                time::OffsetDateTime::now_utc(),
            )?;
            for path in paths {
                println!("{}", path.display());
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The one logging set-up of every hami-limits program (level from RUST_LOG, default info).
    let _ = hami_ops::init_logging(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hami-certgen: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hami-certgen: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}
