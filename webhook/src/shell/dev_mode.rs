//! `serve --dev`: no cluster, no files. A throwaway CA and a serving certificate for `localhost`
//! and `127.0.0.1` (made by `hami-certgen`'s [`hami_certgen::pki`], the functions that make the
//! chart's certificates), the CA and an example review written to a temporary folder, and the
//! `curl` command that uses them printed. Tests take their certificates from here too.

use std::io::Write as _;
use std::path::PathBuf;

use time::OffsetDateTime;

use crate::policy::settings::Settings;
use crate::shell::server::CertSource;
use crate::shell::tls;

/// Why `serve --dev` could not set itself up.
#[derive(Debug, thiserror::Error)]
pub enum DevModeError {
    /// The throwaway CA or certificate could not be made.
    #[error("cannot make certificates: {0}")]
    Certificates(#[from] hami_certgen::CertgenError),
    /// The temporary folder could not be created.
    #[error("cannot create {}: {source}", path.display())]
    CreateDir {
        /// The folder.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The CA or the example review could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The certificate just made could not be loaded.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
}

/// A CA and a serving certificate signed by it, all PEM.
#[derive(Debug, Clone)]
pub struct DevCerts {
    /// The CA certificate: what a client trusts (`curl --cacert`).
    pub ca_pem: String,
    /// The serving certificate.
    pub cert_pem: String,
    /// The serving certificate's private key (PKCS#8).
    pub key_pem: String,
}

/// Days the throwaway CA and certificate are valid: a year (rcgen's default is the year 4096,
/// which hides expiry handling).
const DEV_DAYS: u32 = 365;

/// A fresh CA and a serving certificate for `localhost` and `127.0.0.1`.
///
/// # Errors
/// [`hami_certgen::CertgenError`] if key generation or signing fails.
pub fn generate_localhost() -> Result<DevCerts, hami_certgen::CertgenError> {
    let names = ["localhost".to_owned(), "127.0.0.1".to_owned()];
    let bundle =
        hami_certgen::pki::new_bundle(&names, DEV_DAYS, DEV_DAYS, OffsetDateTime::now_utc())?;
    Ok(DevCerts {
        ca_pem: bundle.ca.cert_pem,
        cert_pem: bundle.serving.cert_pem,
        key_pem: bundle.serving.key_pem,
    })
}

/// An example AdmissionReview (a HAMi GPU pod) for the printed `curl` command.
pub const EXAMPLE_REVIEW: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"00000000-0000-0000-0000-000000000001","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"namespace":"default","operation":"CREATE","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"cuda-demo","namespace":"default","annotations":{"hami.io/limit-delivery":"file"}},"spec":{"schedulerName":"default-scheduler","containers":[{"name":"cuda","image":"nvidia/cuda:12.4.1-base-ubuntu22.04","command":["sleep","infinity"],"resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpumem":"3000","nvidia.com/priority":"0"}}}]}}}}"#;

/// Make the throwaway certificates, write the CA and an example review, and print how to call.
pub(crate) fn dev_certs(settings: &Settings) -> crate::Result<CertSource, DevModeError> {
    let certs = generate_localhost()?;
    let dir = std::env::temp_dir().join(format!("hami-webhook-dev-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| DevModeError::CreateDir {
        path: dir.clone(),
        source,
    })?;
    let ca = dir.join("ca.pem");
    let example = dir.join("review.json");
    let write = |path: &PathBuf, text: &str| {
        std::fs::write(path, text).map_err(|source| DevModeError::Write {
            path: path.clone(),
            source,
        })
    };
    write(&ca, &certs.ca_pem)?;
    write(&example, EXAMPLE_REVIEW)?;
    let loaded = tls::load_pem(
        certs.cert_pem.as_bytes(),
        certs.key_pem.as_bytes(),
        None,
        None,
    )?;
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
