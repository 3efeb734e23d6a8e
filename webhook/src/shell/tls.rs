//! The serving certificate: loading, hot reload, and the rustls server configuration.
//!
//! Kubernetes updates a Secret volume by writing a new directory and swapping the `..data`
//! symlink, which file-event watchers see unreliably. [`CertStore::check_once`] instead reads both
//! files and compares a hash of their contents, every few seconds ([`CertStore::watch`]). A new
//! pair that parses and matches is swapped in atomically: handshakes after the swap get it, open
//! connections keep the keys they negotiated. A pair that does not load keeps the old one, is
//! logged and counted, and is not retried until the files change again.

use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use hami_ops::Readiness;
use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tracing::{error, info};

use crate::shell::metrics::{Metrics, READY_CERTIFICATE};

/// A certificate or key that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// No certificate in the PEM.
    #[error("no PEM certificate found{0}")]
    NoCertificate(String),
    /// The PEM does not hold a usable private key.
    #[error("no usable PEM private key{0}")]
    BadKey(String),
    /// The key is not one rustls can sign with, or does not match the certificate.
    #[error("certificate and key do not form a usable pair: {0}")]
    Pair(rustls::Error),
    /// The leaf certificate is not valid X.509.
    #[error("certificate is not valid X.509: {0}")]
    X509(String),
    /// Building the TLS configuration failed.
    #[error("TLS configuration: {0}")]
    Config(rustls::Error),
}

/// A parsed certificate chain and key, with the leaf's `notAfter`.
#[derive(Debug, Clone)]
pub struct LoadedCert {
    pub key: Arc<CertifiedKey>,
    /// `notAfter` of the leaf, Unix seconds.
    pub not_after: i64,
}

fn suffix(source: Option<&Path>) -> String {
    source.map_or_else(String::new, |p| format!(" in {}", p.display()))
}

/// Parse a PEM chain and PEM key into a key rustls can serve, checking that they match.
///
/// # Errors
/// [`TlsError`] naming what is wrong.
pub fn load_pem(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: Option<&Path>,
    key_path: Option<&Path>,
) -> Result<LoadedCert, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::NoCertificate(format!("{}: {e}", suffix(cert_path))))?;
    let Some(leaf) = chain.first() else {
        return Err(TlsError::NoCertificate(suffix(cert_path)));
    };
    let (_, x509) =
        x509_parser::parse_x509_certificate(leaf).map_err(|e| TlsError::X509(e.to_string()))?;
    let not_after = x509.validity().not_after.timestamp();
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| TlsError::BadKey(format!("{}: {e}", suffix(key_path))))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key).map_err(TlsError::Pair)?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(TlsError::Pair)?;
    Ok(LoadedCert {
        key: Arc::new(certified),
        not_after,
    })
}

/// Where the certificate comes from.
#[derive(Debug, Clone)]
enum Source {
    Files { cert: PathBuf, key: PathBuf },
    Fixed,
}

/// The certificate in use, swapped atomically on reload; rustls asks it on every handshake.
pub struct CertStore {
    current: RwLock<Option<Arc<CertifiedKey>>>,
    source: Source,
    last_seen: Mutex<Option<u64>>,
    metrics: Arc<Metrics>,
    readiness: Readiness,
}

impl fmt::Debug for CertStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertStore")
            .field("source", &self.source)
            .field("loaded", &self.is_loaded())
            .finish_non_exhaustive()
    }
}

/// What a reload check found.
#[derive(Debug)]
pub enum ReloadResult {
    /// The files have not changed since the last check.
    Unchanged,
    /// A new certificate is in use.
    Reloaded,
    /// The files changed but do not load; the previous certificate (if any) stays.
    Failed(TlsError),
}

impl CertStore {
    /// A store that reads `cert` and `key` now (a failure is logged and leaves the store empty and
    /// not ready) and again whenever [`Self::check_once`] sees them change.
    #[must_use]
    pub fn from_files(
        cert: PathBuf,
        key: PathBuf,
        metrics: Arc<Metrics>,
        readiness: Readiness,
    ) -> Arc<Self> {
        let store = Arc::new(Self {
            current: RwLock::new(None),
            source: Source::Files { cert, key },
            last_seen: Mutex::new(None),
            metrics,
            readiness,
        });
        if let ReloadResult::Failed(e) = store.check_once() {
            error!(error = %e, "serving certificate not loaded; retrying when the files change");
        }
        store
    }

    /// A store with a fixed certificate (`--dev`); never reloads.
    #[must_use]
    pub fn fixed(cert: LoadedCert, metrics: Arc<Metrics>, readiness: Readiness) -> Arc<Self> {
        metrics.observe_cert_reload(true, Some(cert.not_after));
        readiness.set(READY_CERTIFICATE, true);
        Arc::new(Self {
            current: RwLock::new(Some(cert.key)),
            source: Source::Fixed,
            last_seen: Mutex::new(None),
            metrics,
            readiness,
        })
    }

    /// Whether a certificate is loaded.
    #[must_use]
    pub fn is_loaded(&self) -> bool {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// The certificate in use.
    #[must_use]
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Read the files; if their contents changed since the last check, load and swap them in.
    pub fn check_once(&self) -> ReloadResult {
        let Source::Files { cert, key } = &self.source else {
            return ReloadResult::Unchanged;
        };
        let read = |p: &Path| {
            std::fs::read(p).map_err(|source| TlsError::Read {
                path: p.to_owned(),
                source,
            })
        };
        let (cert_read, key_read) = (read(cert), read(key));
        // The state is what was read, failures included: each distinct state is counted once
        // (a pair mid-rotation, e.g. the key written and the certificate not yet, is a failure
        // of its own, not the same state as both files missing).
        let mut hasher = DefaultHasher::new();
        for r in [&cert_read, &key_read] {
            match r {
                Ok(bytes) => (0u8, bytes).hash(&mut hasher),
                Err(e) => (1u8, e.to_string()).hash(&mut hasher),
            }
        }
        let hash = hasher.finish();
        if *self
            .last_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            == Some(hash)
        {
            return ReloadResult::Unchanged;
        }
        let (cert_pem, key_pem) = match (cert_read, key_read) {
            (Ok(c), Ok(k)) => (c, k),
            (Err(e), _) | (_, Err(e)) => return self.failed_once(hash, e),
        };
        match load_pem(&cert_pem, &key_pem, Some(cert), Some(key)) {
            Ok(loaded) => {
                *self
                    .last_seen
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(hash);
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(loaded.key);
                self.metrics
                    .observe_cert_reload(true, Some(loaded.not_after));
                self.readiness.set(READY_CERTIFICATE, true);
                info!(cert = %cert.display(), not_after = loaded.not_after, "serving certificate loaded");
                ReloadResult::Reloaded
            }
            Err(e) => self.failed_once(hash, e),
        }
    }

    fn failed_once(&self, hash: u64, e: TlsError) -> ReloadResult {
        let mut last = self
            .last_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *last == Some(hash) {
            return ReloadResult::Unchanged;
        }
        *last = Some(hash);
        drop(last);
        self.metrics.observe_cert_reload(false, None);
        error!(error = %e, keeping_previous = self.is_loaded(), "certificate reload failed");
        ReloadResult::Failed(e)
    }

    /// Check the files every `interval` until `shutdown` completes.
    pub async fn watch(self: Arc<Self>, interval: Duration, shutdown: impl Future<Output = ()>) {
        if matches!(self.source, Source::Fixed) {
            return;
        }
        tokio::pin!(shutdown);
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = ticker.tick() => {
                    let store = Arc::clone(&self);
                    // File reads block; keep them off the runtime's worker.
                    let _ = tokio::task::spawn_blocking(move || store.check_once()).await;
                }
            }
        }
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

/// The rustls configuration: TLS 1.2 and 1.3 only, ALPN `h2` and `http/1.1`, certificate from
/// `store`. The ring provider is used explicitly, so nothing depends on a process default.
///
/// # Errors
/// [`TlsError::Config`] if the provider rejects the protocol versions (it does not).
pub fn server_config(store: Arc<CertStore>) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_cert_resolver(store);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use hami_ops::Exposed;

    use super::*;

    /// Every distinct state of the two files is counted once: a key without its certificate
    /// (mid-rotation) is a failure of its own, not the "both missing" failure seen before it.
    #[test]
    fn each_failing_state_of_the_pair_is_counted_once() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let metrics = Arc::new(Metrics::new());
        let readiness = Readiness::new(&[READY_CERTIFICATE]);
        let store = CertStore::from_files(
            cert.clone(),
            key.clone(),
            Arc::clone(&metrics),
            readiness.clone(),
        );
        // Both missing, at start.
        assert_eq!(metrics.cert_reloads(), (0, 1));
        assert!(matches!(store.check_once(), ReloadResult::Unchanged));
        // The key arrives first, the certificate not yet.
        // From hami-certgen directly (the dev-mode module sits above this one).
        let names = ["localhost".to_owned()];
        let pair = hami_certgen::pki::new_bundle(&names, 2, 1, time::OffsetDateTime::now_utc())
            .unwrap()
            .serving;
        std::fs::write(&key, &pair.key_pem).unwrap();
        assert!(matches!(
            store.check_once(),
            ReloadResult::Failed(TlsError::Read { .. })
        ));
        assert_eq!(metrics.cert_reloads(), (0, 2));
        assert!(matches!(store.check_once(), ReloadResult::Unchanged));
        assert_eq!(metrics.cert_reloads(), (0, 2));
        assert!(!readiness.is_ready());
        // The certificate arrives: loaded.
        std::fs::write(&cert, &pair.cert_pem).unwrap();
        assert!(matches!(store.check_once(), ReloadResult::Reloaded));
        assert_eq!(metrics.cert_reloads(), (1, 2));
        assert!(readiness.is_ready());
        // Mid-rotation again: the certificate removed, the key still there. Counted, the loaded
        // pair kept; then the same pair back is a reload.
        std::fs::remove_file(&cert).unwrap();
        assert!(matches!(store.check_once(), ReloadResult::Failed(_)));
        assert_eq!(metrics.cert_reloads(), (1, 3));
        assert!(store.is_loaded());
        // The key goes too: another state, counted.
        std::fs::remove_file(&key).unwrap();
        assert!(matches!(store.check_once(), ReloadResult::Failed(_)));
        assert_eq!(metrics.cert_reloads(), (1, 4));
        std::fs::write(&cert, &pair.cert_pem).unwrap();
        assert!(matches!(store.check_once(), ReloadResult::Failed(_)));
        assert_eq!(metrics.cert_reloads(), (1, 5));
        std::fs::write(&key, &pair.key_pem).unwrap();
        assert!(matches!(store.check_once(), ReloadResult::Reloaded));
        assert_eq!(metrics.cert_reloads(), (2, 5));
        let text = metrics.encode();
        assert!(
            text.contains("hami_webhook_certificate_reloads_total{result=\"failure\"} 5"),
            "{text}"
        );
    }
}
