//! `hami-certgen`: the admission webhook's CA and serving certificate, kept in a Secret, and the
//! caBundle of its MutatingWebhookConfiguration. Replaces the Go `kube-webhook-certgen` image that
//! HAMi's and KAI-resource-isolator's charts pull in.
//!
//! The decisions are pure ([`secret::plan`], [`webhook_config::with_ca_bundle`]); [`cluster`] only
//! reads, writes and retries.
#![forbid(unsafe_code)]

pub mod cluster;
pub mod error;
pub mod local;
pub mod pki;
pub mod secret;
pub mod webhook_config;

pub use error::CertgenError;
