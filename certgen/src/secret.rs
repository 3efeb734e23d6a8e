//! Pure decision over the webhook Secret: keep it, renew the serving certificate, or start over.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use time::{Duration, OffsetDateTime};

use crate::error::CertgenError;
use crate::pki::{self, CaMaterial, CertBundle};

/// Secret keys. `ca.crt`, `tls.crt`, `tls.key` are what cert-manager writes too, so the chart mounts
/// the same Secret either way; `ca.key` lets a later run renew the serving certificate under the same
/// CA, so the caBundle in the webhook configuration stays valid across renewals.
pub const KEY_CA_CRT: &str = "ca.crt";
pub const KEY_CA_KEY: &str = "ca.key";
pub const KEY_TLS_CRT: &str = "tls.crt";
pub const KEY_TLS_KEY: &str = "tls.key";

/// Label put on Secrets this tool made.
pub const MANAGED_BY_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "hami-certgen");

/// What `create` needs to know.
#[derive(Clone, Debug)]
pub struct CreateSettings {
    pub namespace: String,
    pub service: String,
    pub secret_name: String,
    pub cluster_domain: String,
    pub ca_days: u32,
    pub cert_days: u32,
    /// Renew the serving certificate when it expires within this many days.
    pub renew_before_days: u32,
}

impl CreateSettings {
    /// Rejects lifetimes that would make every run renew: a serving certificate (or CA) that is
    /// always inside its own renewal window.
    pub fn validate(&self) -> Result<(), CertgenError> {
        if self.cert_days <= self.renew_before_days {
            return Err(CertgenError::Settings(format!(
                "--cert-days={} must be greater than --renew-before-days={} (the certificate would be renewed on every run)",
                self.cert_days, self.renew_before_days
            )));
        }
        if self.ca_days <= self.renew_before_days {
            return Err(CertgenError::Settings(format!(
                "--ca-days={} must be greater than --renew-before-days={} (the CA would be replaced on every run)",
                self.ca_days, self.renew_before_days
            )));
        }
        Ok(())
    }

    pub fn dns_names(&self) -> Vec<String> {
        pki::service_dns_names(&self.service, &self.namespace, &self.cluster_domain)
    }

    fn renew_margin(&self) -> Duration {
        Duration::days(i64::from(self.renew_before_days))
    }
}

/// Why a new serving certificate (and maybe a new CA) is needed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    Missing,
    Unreadable(String),
    CaExpiring,
    ServingExpiring,
    NamesChanged,
    NotSignedByCa,
    KeyMismatch,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Missing => f.write_str("the Secret does not exist"),
            Reason::Unreadable(why) => write!(f, "the Secret is unusable: {why}"),
            Reason::CaExpiring => f.write_str("the CA expires within the renewal window"),
            Reason::ServingExpiring => {
                f.write_str("the serving certificate expires within the renewal window")
            }
            Reason::NamesChanged => {
                f.write_str("the serving certificate does not cover the service's DNS names")
            }
            Reason::NotSignedByCa => f.write_str("the serving certificate is not signed by ca.crt"),
            Reason::KeyMismatch => f.write_str("tls.key does not match tls.crt"),
        }
    }
}

/// The outcome of [`plan`].
#[derive(Debug, PartialEq, Eq)]
pub enum SecretPlan {
    /// The Secret is valid and stays so beyond the renewal window.
    Keep,
    /// Write this bundle. `new_ca` is false when the existing CA was kept.
    Write {
        bundle: CertBundle,
        new_ca: bool,
        reason: Reason,
    },
}

fn text<'a>(secret: &'a Secret, key: &'static str) -> Result<&'a str, CertgenError> {
    let meta = &secret.metadata;
    let ns = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .filter(|b| !b.0.is_empty())
        .ok_or_else(|| CertgenError::SecretKeyMissing {
            namespace: ns.clone(),
            name: name.clone(),
            key,
        })?;
    std::str::from_utf8(&bytes.0).map_err(|_| CertgenError::SecretKeyNotText {
        namespace: ns,
        name,
        key,
    })
}

/// The CA stored in `secret`, when it is readable, its key matches, and it is valid beyond `margin`.
fn usable_ca(secret: &Secret, now: OffsetDateTime, margin: Duration) -> Result<CaMaterial, Reason> {
    let unreadable = |e: CertgenError| Reason::Unreadable(e.to_string());
    let cert_pem = text(secret, KEY_CA_CRT).map_err(unreadable)?;
    let key_pem = text(secret, KEY_CA_KEY).map_err(unreadable)?;
    let info = pki::inspect("ca.crt", cert_pem).map_err(unreadable)?;
    if !info.is_ca {
        return Err(Reason::Unreadable(
            "ca.crt is not a CA certificate".to_owned(),
        ));
    }
    if pki::private_key_public_part("ca.key", key_pem).map_err(unreadable)? != info.public_key {
        return Err(Reason::Unreadable(
            "ca.key does not match ca.crt".to_owned(),
        ));
    }
    // The CA must outlive any serving certificate issued now by the renewal margin.
    if !info.valid_for(now, margin) {
        return Err(Reason::CaExpiring);
    }
    Ok(CaMaterial {
        cert_pem: cert_pem.to_owned(),
        key_pem: key_pem.to_owned(),
    })
}

/// Checks the serving certificate against the CA and the wanted names.
fn serving_problem(
    secret: &Secret,
    ca: &CaMaterial,
    names: &[String],
    now: OffsetDateTime,
    margin: Duration,
) -> Option<Reason> {
    let (cert_pem, key_pem) = match (text(secret, KEY_TLS_CRT), text(secret, KEY_TLS_KEY)) {
        (Ok(c), Ok(k)) => (c, k),
        (Err(e), _) | (_, Err(e)) => return Some(Reason::Unreadable(e.to_string())),
    };
    let info = match pki::inspect("tls.crt", cert_pem) {
        Ok(info) => info,
        Err(e) => return Some(Reason::Unreadable(e.to_string())),
    };
    if pki::verify_signed_by(cert_pem, &ca.cert_pem).is_err() {
        return Some(Reason::NotSignedByCa);
    }
    match pki::private_key_public_part("tls.key", key_pem) {
        Ok(public) if public == info.public_key => {}
        Ok(_) => return Some(Reason::KeyMismatch),
        Err(e) => return Some(Reason::Unreadable(e.to_string())),
    }
    if !names.iter().all(|n| info.dns_names.contains(n)) {
        return Some(Reason::NamesChanged);
    }
    if !info.valid_for(now, margin) {
        return Some(Reason::ServingExpiring);
    }
    None
}

/// Decides what `create` writes, given the Secret as it is now (`None` when absent).
///
/// Idempotent: a Secret that is whole, matches the service and is valid beyond the renewal window is
/// kept byte for byte. A serving certificate that needs renewing is reissued under the stored CA, so the
/// webhook configuration's caBundle stays valid; only a missing, broken or expiring CA is replaced.
pub fn plan(
    existing: Option<&Secret>,
    settings: &CreateSettings,
    now: OffsetDateTime,
) -> Result<SecretPlan, CertgenError> {
    let names = settings.dns_names();
    let margin = settings.renew_margin();
    let Some(secret) = existing else {
        let bundle = pki::new_bundle(&names, settings.ca_days, settings.cert_days, now)?;
        return Ok(SecretPlan::Write {
            bundle,
            new_ca: true,
            reason: Reason::Missing,
        });
    };
    let previous_trust = text(secret, KEY_CA_CRT).unwrap_or_default();
    let ca = match usable_ca(secret, now, margin) {
        Ok(mut ca) => {
            ca.cert_pem = pki::trust_bundle(&ca.cert_pem, previous_trust, now);
            ca
        }
        Err(reason) => {
            let mut bundle = pki::new_bundle(&names, settings.ca_days, settings.cert_days, now)?;
            bundle.ca.cert_pem = pki::trust_bundle(&bundle.ca.cert_pem, previous_trust, now);
            return Ok(SecretPlan::Write {
                bundle,
                new_ca: true,
                reason,
            });
        }
    };
    match serving_problem(secret, &ca, &names, now, margin) {
        None => Ok(SecretPlan::Keep),
        Some(reason) => {
            let serving = pki::issue_serving(&ca, &names, settings.cert_days, now)?;
            Ok(SecretPlan::Write {
                bundle: CertBundle { ca, serving },
                new_ca: false,
                reason,
            })
        }
    }
}

/// The Secret that stores `bundle`; `base` (the existing object) keeps its metadata, so an update
/// carries its `resourceVersion` and a concurrent writer is detected.
pub fn render(bundle: &CertBundle, settings: &CreateSettings, base: Option<&Secret>) -> Secret {
    let mut meta = base
        .map(|s| s.metadata.clone())
        .unwrap_or_else(|| ObjectMeta {
            name: Some(settings.secret_name.clone()),
            namespace: Some(settings.namespace.clone()),
            ..ObjectMeta::default()
        });
    meta.managed_fields = None;
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(MANAGED_BY_LABEL.0.to_owned(), MANAGED_BY_LABEL.1.to_owned());
    let data = BTreeMap::from([
        (
            KEY_CA_CRT.to_owned(),
            ByteString(bundle.ca.cert_pem.clone().into_bytes()),
        ),
        (
            KEY_CA_KEY.to_owned(),
            ByteString(bundle.ca.key_pem.clone().into_bytes()),
        ),
        (
            KEY_TLS_CRT.to_owned(),
            ByteString(bundle.serving.cert_pem.clone().into_bytes()),
        ),
        (
            KEY_TLS_KEY.to_owned(),
            ByteString(bundle.serving.key_pem.clone().into_bytes()),
        ),
    ]);
    // A Secret's type is immutable: keep the existing one (an `Opaque` Secret made by hand takes
    // these keys just as well) rather than fail the update.
    let type_ = base
        .and_then(|s| s.type_.clone())
        .unwrap_or_else(|| "kubernetes.io/tls".to_owned());
    Secret {
        metadata: meta,
        type_: Some(type_),
        data: Some(data),
        ..Secret::default()
    }
}

/// The CA certificate (PEM bytes) a Secret holds, for `patch`.
pub fn ca_certificate(secret: &Secret) -> Result<Vec<u8>, CertgenError> {
    let pem = text(secret, KEY_CA_CRT)?;
    pki::inspect("ca.crt", pem)?;
    Ok(pem.as_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> CreateSettings {
        CreateSettings {
            namespace: "hami-system".into(),
            service: "hami-limits-webhook".into(),
            secret_name: "hami-limits-webhook-tls".into(),
            cluster_domain: "cluster.local".into(),
            ca_days: 3650,
            cert_days: 365,
            renew_before_days: 30,
        }
    }

    fn t0() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
    }

    fn written(plan: SecretPlan) -> (CertBundle, bool, Reason) {
        match plan {
            SecretPlan::Write {
                bundle,
                new_ca,
                reason,
            } => (bundle, new_ca, reason),
            SecretPlan::Keep => panic!("expected a write"),
        }
    }

    fn fresh() -> Secret {
        let (bundle, new_ca, reason) = written(plan(None, &settings(), t0()).unwrap());
        assert!(new_ca);
        assert_eq!(reason, Reason::Missing);
        render(&bundle, &settings(), None)
    }

    #[test]
    fn absent_secret_gets_a_full_bundle_with_tls_type_and_label() {
        let secret = fresh();
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("hami-limits-webhook-tls")
        );
        assert_eq!(secret.metadata.namespace.as_deref(), Some("hami-system"));
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
        let data = secret.data.as_ref().unwrap();
        let keys: Vec<_> = data.keys().map(String::as_str).collect();
        assert_eq!(keys, ["ca.crt", "ca.key", "tls.crt", "tls.key"]);
        assert_eq!(
            secret
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .get("app.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("hami-certgen")
        );
        let ca = ca_certificate(&secret).unwrap();
        assert!(
            String::from_utf8(ca)
                .unwrap()
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
    }

    #[test]
    fn valid_secret_is_kept() {
        let secret = fresh();
        assert_eq!(
            plan(Some(&secret), &settings(), t0() + Duration::days(300)).unwrap(),
            SecretPlan::Keep
        );
    }

    #[test]
    fn serving_cert_inside_window_is_renewed_under_the_same_ca() {
        let secret = fresh();
        let later = t0() + Duration::days(340);
        let (bundle, new_ca, reason) = written(plan(Some(&secret), &settings(), later).unwrap());
        assert!(!new_ca);
        assert_eq!(reason, Reason::ServingExpiring);
        let old_ca = text(&secret, KEY_CA_CRT).unwrap();
        assert_eq!(bundle.ca.cert_pem, old_ca);
        assert_ne!(bundle.serving.cert_pem, text(&secret, KEY_TLS_CRT).unwrap());
        pki::verify_signed_by(&bundle.serving.cert_pem, old_ca).unwrap();
        let renewed = render(&bundle, &settings(), Some(&secret));
        assert_eq!(
            plan(Some(&renewed), &settings(), later).unwrap(),
            SecretPlan::Keep
        );
    }

    #[test]
    fn expiring_ca_is_replaced() {
        let mut s = settings();
        s.ca_days = 40;
        s.cert_days = 5;
        s.renew_before_days = 2;
        let (bundle, _, _) = written(plan(None, &s, t0()).unwrap());
        let secret = render(&bundle, &s, None);
        let rotated_at = t0() + Duration::days(39);
        let (rotated, new_ca, reason) = written(plan(Some(&secret), &s, rotated_at).unwrap());
        assert!(new_ca);
        assert_eq!(reason, Reason::CaExpiring);
        // ca.crt: the new CA first (it signs), then the outgoing one while it is still valid, so
        // the caBundle trusts whichever serving certificate the webhook presents mid-rotation.
        let blocks = pki::certificate_blocks(&rotated.ca.cert_pem);
        assert_eq!(blocks.len(), 2);
        assert_ne!(blocks[0], bundle.ca.cert_pem);
        assert_eq!(blocks[1], bundle.ca.cert_pem);
        pki::verify_signed_by(&rotated.serving.cert_pem, &rotated.ca.cert_pem).unwrap();
        let secret = render(&rotated, &s, Some(&secret));
        assert_eq!(
            plan(Some(&secret), &s, rotated_at).unwrap(),
            SecretPlan::Keep
        );
        // When the serving certificate is next renewed, the expired old CA is dropped.
        let (renewed, new_ca, _) =
            written(plan(Some(&secret), &s, rotated_at + Duration::days(4)).unwrap());
        assert!(!new_ca);
        assert_eq!(
            pki::certificate_blocks(&renewed.ca.cert_pem),
            vec![blocks[0].clone()]
        );
    }

    #[test]
    fn service_rename_reissues_keeping_the_ca() {
        let secret = fresh();
        let mut s = settings();
        s.service = "other".into();
        let (bundle, new_ca, reason) = written(plan(Some(&secret), &s, t0()).unwrap());
        assert!(!new_ca);
        assert_eq!(reason, Reason::NamesChanged);
        let info = pki::inspect("tls.crt", &bundle.serving.cert_pem).unwrap();
        assert!(info.dns_names.contains(&"other.hami-system.svc".to_owned()));
    }

    #[test]
    fn damaged_secrets_are_rebuilt() {
        let good = fresh();
        // Missing ca.key: the CA cannot sign, start over.
        let mut s = good.clone();
        s.data.as_mut().unwrap().remove(KEY_CA_KEY);
        let (_, new_ca, reason) = written(plan(Some(&s), &settings(), t0()).unwrap());
        assert!(new_ca);
        assert!(
            matches!(reason, Reason::Unreadable(ref m) if m.contains("ca.key")),
            "{reason:?}"
        );
        // tls.key from another bundle.
        let other = fresh();
        let mut s = good.clone();
        let foreign_key = other.data.as_ref().unwrap()[KEY_TLS_KEY].clone();
        s.data
            .as_mut()
            .unwrap()
            .insert(KEY_TLS_KEY.into(), foreign_key);
        let (_, new_ca, reason) = written(plan(Some(&s), &settings(), t0()).unwrap());
        assert!(!new_ca);
        assert_eq!(reason, Reason::KeyMismatch);
        // tls.crt signed by another CA.
        let mut s = good.clone();
        let foreign = other.data.as_ref().unwrap()[KEY_TLS_CRT].clone();
        s.data.as_mut().unwrap().insert(KEY_TLS_CRT.into(), foreign);
        assert_eq!(
            written(plan(Some(&s), &settings(), t0()).unwrap()).2,
            Reason::NotSignedByCa
        );
        // Garbage certificate.
        let mut s = good.clone();
        s.data
            .as_mut()
            .unwrap()
            .insert(KEY_TLS_CRT.into(), ByteString(b"junk".to_vec()));
        assert!(matches!(
            written(plan(Some(&s), &settings(), t0()).unwrap()).2,
            Reason::Unreadable(_)
        ));
        // Empty Secret (e.g. made by hand).
        let s = Secret {
            metadata: good.metadata.clone(),
            ..Secret::default()
        };
        let (_, new_ca, _) = written(plan(Some(&s), &settings(), t0()).unwrap());
        assert!(new_ca);
    }

    #[test]
    fn lifetimes_inside_the_renewal_window_are_refused() {
        assert!(settings().validate().is_ok());
        let mut s = settings();
        s.cert_days = 30;
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains("--cert-days=30 must be greater than --renew-before-days=30"),
            "{err}"
        );
        let mut s = settings();
        s.ca_days = 20;
        s.cert_days = 40;
        s.renew_before_days = 25;
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("--ca-days=20")
        );
    }

    #[test]
    fn render_keeps_existing_metadata() {
        let mut base = fresh();
        base.metadata.resource_version = Some("42".into());
        base.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert("team".into(), "gpu".into());
        let (bundle, _, _) = written(plan(None, &settings(), t0()).unwrap());
        let out = render(&bundle, &settings(), Some(&base));
        assert_eq!(out.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(
            out.metadata
                .labels
                .as_ref()
                .unwrap()
                .get("team")
                .map(String::as_str),
            Some("gpu")
        );
    }

    #[test]
    fn render_keeps_an_existing_secret_type() {
        let (bundle, _, _) = written(plan(None, &settings(), t0()).unwrap());
        let opaque = Secret {
            type_: Some("Opaque".into()),
            ..Secret::default()
        };
        assert_eq!(
            render(&bundle, &settings(), Some(&opaque)).type_.as_deref(),
            Some("Opaque")
        );
        let untyped = Secret::default();
        assert_eq!(
            render(&bundle, &settings(), Some(&untyped))
                .type_
                .as_deref(),
            Some("kubernetes.io/tls")
        );
    }

    #[test]
    fn ca_certificate_errors_name_the_secret() {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("s".into()),
                namespace: Some("n".into()),
                ..Default::default()
            },
            ..Secret::default()
        };
        let err = ca_certificate(&secret).unwrap_err().to_string();
        assert_eq!(err, "Secret n/s: key ca.crt is missing or empty");
    }
}
