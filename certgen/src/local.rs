//! `hami-certgen local`: PEM files for development (`hami-webhook serve --tls-cert/--tls-key`).

use std::path::{Path, PathBuf};

use time::OffsetDateTime;

use crate::error::CertgenError;
use crate::pki::{self, CertBundle};
use crate::secret::{KEY_CA_CRT, KEY_CA_KEY, KEY_TLS_CRT, KEY_TLS_KEY};

/// Writes `ca.crt`, `ca.key`, `tls.crt`, `tls.key` into `out` (created when absent). Private keys get
/// mode 0600. Returns the paths written, in that order.
pub fn write_local(
    out: &Path,
    dns_names: &[String],
    ca_days: u32,
    cert_days: u32,
    now: OffsetDateTime,
) -> Result<(CertBundle, Vec<PathBuf>), CertgenError> {
    let bundle = pki::new_bundle(dns_names, ca_days, cert_days, now)?;
    std::fs::create_dir_all(out).map_err(|source| CertgenError::Io {
        path: out.to_owned(),
        source,
    })?;
    let files = [
        (KEY_CA_CRT, &bundle.ca.cert_pem, 0o644),
        (KEY_CA_KEY, &bundle.ca.key_pem, 0o600),
        (KEY_TLS_CRT, &bundle.serving.cert_pem, 0o644),
        (KEY_TLS_KEY, &bundle.serving.key_pem, 0o600),
    ];
    let mut written = Vec::with_capacity(files.len());
    for (name, contents, mode) in files {
        let path = out.join(name);
        write_with_mode(&path, contents.as_bytes(), mode).map_err(|source| CertgenError::Io {
            path: path.clone(),
            source,
        })?;
        written.push(path);
    }
    Ok((bundle, written))
}

#[cfg(unix)]
fn write_with_mode(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)?;
    // An existing file keeps its old mode through open(); set it explicitly.
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    file.write_all(contents)?;
    file.sync_all()
}

#[cfg(not(unix))]
fn write_with_mode(path: &Path, contents: &[u8], _mode: u32) -> std::io::Result<()> {
    std::fs::write(path, contents)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_four_pem_files_with_private_keys_protected() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("pki");
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let (bundle, paths) = write_local(&out, &names, 30, 7, OffsetDateTime::now_utc()).unwrap();
        assert_eq!(paths.len(), 4);
        let crt = std::fs::read_to_string(out.join("tls.crt")).unwrap();
        assert_eq!(crt, bundle.serving.cert_pem);
        let ca = std::fs::read_to_string(out.join("ca.crt")).unwrap();
        pki::verify_signed_by(&crt, &ca).unwrap();
        let info = pki::inspect("tls.crt", &crt).unwrap();
        assert_eq!(
            info.dns_names,
            vec!["localhost"],
            "IP addresses are IP SANs, not DNS names"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode =
                |n: &str| std::fs::metadata(out.join(n)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode("tls.key"), 0o600);
            assert_eq!(mode("ca.key"), 0o600);
            assert_eq!(mode("tls.crt"), 0o644);
        }
    }

    #[test]
    fn unwritable_directory_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, b"x").unwrap();
        let err = write_local(
            &blocker.join("sub"),
            &["a".into()],
            1,
            1,
            OffsetDateTime::now_utc(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("file/sub"), "{err}");
    }
}
