//! Pure certificate work: make a CA, issue a serving certificate, and inspect what a Secret holds.
//!
//! Every function takes the current time as an argument so that expiry and renewal are testable
//! without waiting.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};
use x509_parser::extensions::GeneralName;
use x509_parser::pem::Pem;

use crate::error::CertgenError;

/// Backdating `notBefore` absorbs clock skew between this Job and the API servers.
const CLOCK_SKEW: Duration = Duration::hours(1);

/// Common name of every CA this tool makes; also shown by `openssl x509 -noout -subject`.
pub const CA_COMMON_NAME: &str = "hami-limits-webhook-ca";

/// A CA certificate and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct CaMaterial {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for CaMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaMaterial")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

/// A serving certificate and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct ServingMaterial {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for ServingMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingMaterial")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

/// Everything the webhook Secret stores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertBundle {
    pub ca: CaMaterial,
    pub serving: ServingMaterial,
}

/// The DNS names kube-apiserver may use to reach `service` in `namespace`.
pub fn service_dns_names(service: &str, namespace: &str, cluster_domain: &str) -> Vec<String> {
    vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.{cluster_domain}"),
    ]
}

fn gen_error(what: &'static str) -> impl FnOnce(rcgen::Error) -> CertgenError {
    move |source| CertgenError::Generate { what, source }
}

/// Makes a fresh self-signed CA valid for `days` days from `now`.
pub fn new_ca(days: u32, now: OffsetDateTime) -> Result<CaMaterial, CertgenError> {
    let key = KeyPair::generate().map_err(gen_error("CA key"))?;
    let params = ca_params(days, now);
    let cert = params
        .self_signed(&key)
        .map_err(gen_error("CA certificate"))?;
    Ok(CaMaterial {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn ca_params(days: u32, now: OffsetDateTime) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_COMMON_NAME);
    dn.push(DnType::OrganizationName, "hami-limits");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = now - CLOCK_SKEW;
    params.not_after = now + Duration::days(i64::from(days));
    params
}

/// Issues a serving certificate for `dns_names`, signed by `ca`, valid for `days` days from `now`.
/// The first name becomes the subject's common name.
pub fn issue_serving(
    ca: &CaMaterial,
    dns_names: &[String],
    days: u32,
    now: OffsetDateTime,
) -> Result<ServingMaterial, CertgenError> {
    if dns_names.is_empty() {
        return Err(CertgenError::NoDnsNames);
    }
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(|source| CertgenError::Generate {
        what: "CA key (ca.key is not a usable private key)",
        source,
    })?;
    let issuer =
        Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key).map_err(gen_error("issuer from ca.crt"))?;
    let key = KeyPair::generate().map_err(gen_error("serving key"))?;
    let mut params = CertificateParams::new(dns_names.to_vec())
        .map_err(gen_error("serving certificate names"))?;
    let mut dn = DistinguishedName::new();
    // Callers pass the most specific name last (`svc.ns.svc.cluster.local`); CN is informational.
    let cn = dns_names
        .get(2)
        .or_else(|| dns_names.first())
        .cloned()
        .unwrap_or_default();
    dn.push(DnType::CommonName, cn);
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = now - CLOCK_SKEW;
    params.not_after = now + Duration::days(i64::from(days));
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(gen_error("serving certificate"))?;
    Ok(ServingMaterial {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Makes a new CA and a serving certificate signed by it.
pub fn new_bundle(
    dns_names: &[String],
    ca_days: u32,
    cert_days: u32,
    now: OffsetDateTime,
) -> Result<CertBundle, CertgenError> {
    let ca = new_ca(ca_days, now)?;
    let serving = issue_serving(&ca, dns_names, cert_days, now)?;
    Ok(CertBundle { ca, serving })
}

/// What a certificate says about itself, as far as this tool cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
    pub dns_names: Vec<String>,
    pub is_ca: bool,
    /// The raw subject public key (the BIT STRING content), to match against a private key.
    pub public_key: Vec<u8>,
    pub subject: String,
}

impl CertInfo {
    /// True when the certificate is valid now and stays valid for at least `margin`.
    pub fn valid_for(&self, now: OffsetDateTime, margin: Duration) -> bool {
        self.not_before <= now && now + margin < self.not_after
    }
}

fn parse_pem(what: &'static str, pem_text: &str) -> Result<Pem, CertgenError> {
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(pem_text.as_bytes()).map_err(|e| CertgenError::Parse {
            what,
            reason: e.to_string(),
        })?;
    if pem.label != "CERTIFICATE" {
        return Err(CertgenError::Parse {
            what,
            reason: format!("PEM block is {:?}, expected CERTIFICATE", pem.label),
        });
    }
    Ok(pem)
}

fn to_time(
    what: &'static str,
    t: x509_parser::time::ASN1Time,
) -> Result<OffsetDateTime, CertgenError> {
    OffsetDateTime::from_unix_timestamp(t.timestamp()).map_err(|e| CertgenError::Parse {
        what,
        reason: e.to_string(),
    })
}

/// Reads the first certificate of a PEM text.
pub fn inspect(what: &'static str, pem_text: &str) -> Result<CertInfo, CertgenError> {
    let pem = parse_pem(what, pem_text)?;
    let cert = pem.parse_x509().map_err(|e| CertgenError::Parse {
        what,
        reason: e.to_string(),
    })?;
    let mut dns_names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::DNSName(n) = name {
                dns_names.push((*n).to_owned());
            }
        }
    }
    Ok(CertInfo {
        not_before: to_time(what, cert.validity().not_before)?,
        not_after: to_time(what, cert.validity().not_after)?,
        dns_names,
        is_ca: cert.is_ca(),
        public_key: cert.public_key().subject_public_key.data.to_vec(),
        subject: cert.subject().to_string(),
    })
}

const PEM_BEGIN: &str = "-----BEGIN CERTIFICATE-----";
const PEM_END: &str = "-----END CERTIFICATE-----";

/// The certificate blocks of a PEM text, each as written (begin line to end line, newline-ended).
pub fn certificate_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(PEM_BEGIN) {
        let Some(len) = rest[start..].find(PEM_END) else {
            break;
        };
        let end = start + len + PEM_END.len();
        blocks.push(format!("{}\n", &rest[start..end]));
        rest = &rest[end..];
    }
    blocks
}

/// The `ca.crt` to publish: the signing CA first (what `Issuer` and [`inspect`] read), then every
/// other CA certificate of `previous` that is still valid at `now`.
///
/// Keeping the outgoing CA while it is valid makes a CA rotation seamless: kube-apiserver trusts the
/// caBundle it has until `patch` runs, and the webhook pods switch to the new serving certificate
/// only when kubelet refreshes their Secret volume; with both CAs in the bundle either order works.
/// Expired and duplicate certificates are dropped, so the bundle does not grow.
pub fn trust_bundle(signing_ca_pem: &str, previous: &str, now: OffsetDateTime) -> String {
    let signing = certificate_blocks(signing_ca_pem);
    let mut out: Vec<String> = signing.iter().take(1).cloned().collect();
    if out.is_empty() {
        out.push(signing_ca_pem.to_owned());
    }
    for block in certificate_blocks(previous) {
        if out.contains(&block) {
            continue;
        }
        if let Ok(info) = inspect("ca.crt", &block)
            && info.is_ca
            && info.valid_for(now, Duration::ZERO)
        {
            out.push(block);
        }
    }
    out.concat()
}

/// Checks that `leaf_pem` carries a valid signature by the key of `ca_pem`.
pub fn verify_signed_by(leaf_pem: &str, ca_pem: &str) -> Result<(), CertgenError> {
    let leaf = parse_pem("tls.crt", leaf_pem)?;
    let ca = parse_pem("ca.crt", ca_pem)?;
    let leaf = leaf.parse_x509().map_err(|e| CertgenError::Parse {
        what: "tls.crt",
        reason: e.to_string(),
    })?;
    let ca = ca.parse_x509().map_err(|e| CertgenError::Parse {
        what: "ca.crt",
        reason: e.to_string(),
    })?;
    leaf.verify_signature(Some(ca.public_key()))
        .map_err(|e| CertgenError::Parse {
            what: "tls.crt",
            reason: format!("not signed by ca.crt: {e}"),
        })
}

/// The raw public key of a PEM private key.
pub fn private_key_public_part(what: &'static str, key_pem: &str) -> Result<Vec<u8>, CertgenError> {
    let key = KeyPair::from_pem(key_pem).map_err(|e| CertgenError::Parse {
        what,
        reason: e.to_string(),
    })?;
    Ok(key.public_key_raw().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
    }

    #[test]
    fn dns_names_cover_every_form_the_apiserver_uses() {
        assert_eq!(
            service_dns_names("hami-webhook", "hami-system", "cluster.local"),
            vec![
                "hami-webhook",
                "hami-webhook.hami-system",
                "hami-webhook.hami-system.svc",
                "hami-webhook.hami-system.svc.cluster.local"
            ]
        );
    }

    #[test]
    fn bundle_is_a_ca_and_a_leaf_signed_by_it() {
        let names = service_dns_names("svc", "ns", "cluster.local");
        let bundle = new_bundle(&names, 3650, 365, now()).unwrap();
        let ca = inspect("ca.crt", &bundle.ca.cert_pem).unwrap();
        assert!(ca.is_ca);
        assert!(ca.subject.contains(CA_COMMON_NAME), "{}", ca.subject);
        assert_eq!(ca.not_after, now() + Duration::days(3650));
        assert_eq!(ca.not_before, now() - CLOCK_SKEW);
        let leaf = inspect("tls.crt", &bundle.serving.cert_pem).unwrap();
        assert!(!leaf.is_ca);
        assert_eq!(leaf.dns_names, names);
        assert!(leaf.subject.contains("svc.ns.svc"), "{}", leaf.subject);
        assert_eq!(leaf.not_after, now() + Duration::days(365));
        verify_signed_by(&bundle.serving.cert_pem, &bundle.ca.cert_pem).unwrap();
        assert_eq!(
            private_key_public_part("tls.key", &bundle.serving.key_pem).unwrap(),
            leaf.public_key
        );
        assert_eq!(
            private_key_public_part("ca.key", &bundle.ca.key_pem).unwrap(),
            ca.public_key
        );
    }

    #[test]
    fn a_leaf_from_another_ca_fails_verification() {
        let names = vec!["a".to_owned()];
        let one = new_bundle(&names, 10, 5, now()).unwrap();
        let two = new_bundle(&names, 10, 5, now()).unwrap();
        let err = verify_signed_by(&one.serving.cert_pem, &two.ca.cert_pem).unwrap_err();
        assert!(err.to_string().contains("not signed by ca.crt"), "{err}");
    }

    #[test]
    fn reissue_keeps_the_ca() {
        let names = vec!["a.b.svc".to_owned()];
        let ca = new_ca(100, now()).unwrap();
        let first = issue_serving(&ca, &names, 1, now()).unwrap();
        let later = now() + Duration::days(30);
        let second = issue_serving(&ca, &names, 1, later).unwrap();
        assert_ne!(first.cert_pem, second.cert_pem);
        verify_signed_by(&second.cert_pem, &ca.cert_pem).unwrap();
        assert_eq!(
            inspect("tls.crt", &second.cert_pem).unwrap().not_after,
            later + Duration::days(1)
        );
    }

    #[test]
    fn trust_bundle_keeps_valid_previous_cas_after_the_signing_one() {
        let old = new_ca(10, now()).unwrap();
        let expired = new_ca(1, now() - Duration::days(5)).unwrap();
        let new = new_ca(100, now()).unwrap();
        let previous = format!("{}{}", old.cert_pem, expired.cert_pem);
        let bundle = trust_bundle(&new.cert_pem, &previous, now());
        assert_eq!(
            certificate_blocks(&bundle),
            vec![new.cert_pem.clone(), old.cert_pem.clone()]
        );
        assert_eq!(
            inspect("ca.crt", &bundle).unwrap().public_key,
            inspect("x", &new.cert_pem).unwrap().public_key
        );
        // Idempotent, and the signing CA is never duplicated.
        assert_eq!(trust_bundle(&new.cert_pem, &bundle, now()), bundle);
        // Once the old CA has expired it is dropped.
        let later = now() + Duration::days(11);
        assert_eq!(trust_bundle(&new.cert_pem, &bundle, later), new.cert_pem);
        // Garbage in the previous text is ignored.
        assert_eq!(trust_bundle(&new.cert_pem, "junk", now()), new.cert_pem);
        // A serving certificate is not a CA: not kept.
        let leaf = issue_serving(&old, &["a".into()], 5, now()).unwrap();
        assert_eq!(
            trust_bundle(&new.cert_pem, &leaf.cert_pem, now()),
            new.cert_pem
        );
    }

    #[test]
    fn validity_window() {
        let info = inspect("x", &new_ca(10, now()).unwrap().cert_pem).unwrap();
        assert!(info.valid_for(now(), Duration::days(9)));
        assert!(!info.valid_for(now(), Duration::days(10)));
        assert!(
            !info.valid_for(now() - Duration::hours(2), Duration::ZERO),
            "not yet valid"
        );
    }

    #[test]
    fn garbage_is_a_parse_error_naming_the_field() {
        let err = inspect("tls.crt", "not a pem").unwrap_err();
        assert!(err.to_string().contains("tls.crt"), "{err}");
        let key = new_ca(1, now()).unwrap().key_pem;
        let err = inspect("ca.crt", &key).unwrap_err();
        assert!(err.to_string().contains("expected CERTIFICATE"), "{err}");
        assert!(issue_serving(&new_ca(1, now()).unwrap(), &[], 1, now()).is_err());
    }
}
