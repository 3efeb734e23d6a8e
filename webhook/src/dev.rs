//! Throwaway certificates for `serve --dev` and tests: a CA and a serving certificate for
//! `localhost` and `127.0.0.1`, made in memory with rcgen.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

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

/// Make a fresh CA and a serving certificate for `names` (DNS names or IP addresses).
///
/// # Errors
/// [`rcgen::Error`] if a name is not a valid DNS name or IP address, or key generation fails.
pub fn generate(names: &[&str]) -> Result<DevCerts, rcgen::Error> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "hami-webhook throwaway CA");
    ca_params.distinguished_name = dn;

    // A year of validity (rcgen's default is the year 4096, which hides expiry handling).
    let now = time::OffsetDateTime::now_utc();
    ca_params.not_before = now - time::Duration::hours(1);
    ca_params.not_after = now + time::Duration::days(365);

    let leaf_key = KeyPair::generate()?;
    let mut params =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        names.first().copied().unwrap_or("localhost"),
    );
    params.distinguished_name = dn;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.not_before = ca_params.not_before;
    params.not_after = ca_params.not_after;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::from_params(&ca_params, &ca_key);
    let cert = params.signed_by(&leaf_key, &issuer)?;
    Ok(DevCerts {
        ca_pem: ca_cert.pem(),
        cert_pem: cert.pem(),
        key_pem: leaf_key.serialize_pem(),
    })
}

/// [`generate`] for `localhost` and `127.0.0.1`.
///
/// # Errors
/// As [`generate`].
pub fn generate_localhost() -> Result<DevCerts, rcgen::Error> {
    generate(&["localhost", "127.0.0.1"])
}

/// An example AdmissionReview (a HAMi GPU pod) for the printed `curl` command.
pub const EXAMPLE_REVIEW: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"00000000-0000-0000-0000-000000000001","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"namespace":"default","operation":"CREATE","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"cuda-demo","namespace":"default","annotations":{"hami.io/limit-delivery":"file"}},"spec":{"schedulerName":"default-scheduler","containers":[{"name":"cuda","image":"nvidia/cuda:12.4.1-base-ubuntu22.04","command":["sleep","infinity"],"resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpumem":"3000","nvidia.com/priority":"0"}}}]}}}}"#;
