//! The one error type of `hami-certgen`; every variant names what failed and with which input.

/// Errors of certificate generation, Secret handling and caBundle patching.
#[derive(Debug, thiserror::Error)]
pub enum CertgenError {
    #[error("generating the {what}: {source}")]
    Generate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("{what}: {reason}")]
    Parse { what: &'static str, reason: String },
    #[error("{0}")]
    Settings(String),
    #[error("no DNS names given for the serving certificate")]
    NoDnsNames,
    #[error("Secret {namespace}/{name}: key {key} is missing or empty")]
    SecretKeyMissing {
        namespace: String,
        name: String,
        key: &'static str,
    },
    #[error("Secret {namespace}/{name}: {key} is not UTF-8 PEM text")]
    SecretKeyNotText {
        namespace: String,
        name: String,
        key: &'static str,
    },
    #[error("MutatingWebhookConfiguration {name} has no webhooks to patch")]
    NoWebhooks { name: String },
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("{action}: gave up after {attempts} conflicting updates")]
    Conflict { action: String, attempts: u32 },
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}
