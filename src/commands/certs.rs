//! `sluice certs`: the cluster's certificates, so that a cluster speaks
//! TLS without an outside PKI (`ca`, then `node` per node); what
//! CockroachDB's `cert create-ca` / `create-node` do.
//!
//! - `ca DIR`: a self-signed CA, `DIR/ca.pem` and `DIR/ca.key`;
//! - `node DIR NAME HOST...`: `DIR/NAME.pem` and `DIR/NAME.key`, an
//!   ECDSA P-256 key and a certificate signed by DIR's CA, valid for the
//!   hosts given (DNS names or IP addresses) as a TLS server and client.
//!
//! Keys are written 0600 and nothing is overwritten. The CA's subject is
//! always [`CA_NAME`]: a node certificate's issuer is built from it and
//! the CA's key, so `node` needs only `ca.key` (trust is the key's, not
//! the name's). Certificates from another PKI work as well: the flags
//! take any PEM files.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::cli::CertsAction;

/// The CA's subject common name.
pub const CA_NAME: &str = "sluice cluster CA";

/// Runs `action`.
pub fn run(action: &CertsAction) -> anyhow::Result<()> {
    match action {
        CertsAction::Ca { dir, years } => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let (cert, key) = make_ca(*years)?;
            let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
            write_new(&key_path, key.as_bytes(), true)?;
            write_new(&cert_path, cert.as_bytes(), false)?;
            println!(
                "{}: the CA certificate (give it as --tls-ca to every node and client)\n\
                 {}: its key (keep it where certificates are issued)",
                cert_path.display(),
                key_path.display()
            );
            Ok(())
        }
        CertsAction::Node {
            dir,
            name,
            hosts,
            days,
        } => {
            anyhow::ensure!(
                !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                    && !name.starts_with('.')
                    && name != "ca",
                "{name:?}: a node's name is letters, digits, '.', '-' and '_' (and not \"ca\")"
            );
            for h in hosts {
                anyhow::ensure!(
                    rustls_pki_types::ServerName::try_from(h.as_str()).is_ok(),
                    "{h:?} is not a host name or an IP address"
                );
            }
            let ca_key = std::fs::read_to_string(dir.join("ca.key")).with_context(|| {
                format!(
                    "cannot read {}: make the CA first (sluice certs ca {})",
                    dir.join("ca.key").display(),
                    dir.display()
                )
            })?;
            let (cert, key) = issue(&ca_key, name, hosts, *days)?;
            let (cert_path, key_path) = paths(dir, name);
            write_new(&key_path, key.as_bytes(), true)?;
            write_new(&cert_path, cert.as_bytes(), false)?;
            println!(
                "{}: {name}'s certificate, for {} (--tls-cert)\n{}: its key (--tls-key)",
                cert_path.display(),
                hosts.join(", "),
                key_path.display()
            );
            Ok(())
        }
    }
}

/// Where node `name`'s certificate and key go.
fn paths(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    )
}

/// The CA's parameters: the same every time, so that a node's issuer can
/// be built from them and the CA's key.
fn ca_params(years: u32) -> anyhow::Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_NAME);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(365 * i64::from(years.max(1)));
    Ok(params)
}

/// A new CA: its certificate and key, PEM.
fn make_ca(years: u32) -> anyhow::Result<(String, String)> {
    let key = KeyPair::generate()?;
    let cert = ca_params(years)?.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A node certificate for `hosts`, signed with the CA key `ca_key`
/// (PEM): the certificate and its new key, PEM.
fn issue(
    ca_key: &str,
    name: &str,
    hosts: &[String],
    days: u32,
) -> anyhow::Result<(String, String)> {
    let ca_key = KeyPair::from_pem(ca_key).context("ca.key is not a private key")?;
    let issuer = Issuer::new(ca_params(1)?, ca_key);
    let mut params = CertificateParams::new(hosts.to_vec())
        .with_context(|| format!("{}: not host names or addresses", hosts.join(", ")))?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(i64::from(days.max(1)));
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Writes `bytes` to a new file at `path` (0600 when `secret`); an
/// existing file is never overwritten.
fn write_new(path: &Path, bytes: &[u8], secret: bool) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(path)
        .with_context(|| format!("cannot create {} (it is never overwritten)", path.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_certificate_verifies_against_its_ca_only() {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
        use tokio_rustls::rustls::RootCertStore;
        use tokio_rustls::rustls::client::WebPkiServerVerifier;
        use tokio_rustls::rustls::client::danger::ServerCertVerifier;

        let verify = |ca_pem: &str, cert_pem: &str, host: &str| {
            let mut roots = RootCertStore::empty();
            roots
                .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
                .unwrap();
            let provider =
                std::sync::Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
            let verifier = WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
                .build()
                .unwrap();
            let cert = CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
            verifier.verify_server_cert(
                &cert,
                &[],
                &ServerName::try_from(host.to_string()).unwrap(),
                &[],
                UnixTime::now(),
            )
        };
        let (ca, ca_key) = make_ca(10).unwrap();
        let hosts = vec!["127.0.0.1".to_string(), "node-1.example".to_string()];
        let (cert, _) = issue(&ca_key, "node-1", &hosts, 30).unwrap();
        verify(&ca, &cert, "127.0.0.1").unwrap();
        verify(&ca, &cert, "node-1.example").unwrap();
        // Not for a host it was not issued for, nor under another CA.
        assert!(verify(&ca, &cert, "10.0.0.9").is_err());
        let (other, _) = make_ca(10).unwrap();
        assert!(verify(&other, &cert, "127.0.0.1").is_err());
    }

    #[test]
    fn a_key_that_is_not_the_certificates_and_a_host_that_is_none_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        run(&CertsAction::Ca {
            dir: pki.clone(),
            years: 1,
        })
        .unwrap();
        for name in ["a", "b"] {
            run(&CertsAction::Node {
                dir: pki.clone(),
                name: name.into(),
                hosts: vec!["127.0.0.1".into()],
                days: 1,
            })
            .unwrap();
        }
        let err =
            sluice_flight::Tls::load(None, Some(&pki.join("a.pem")), Some(&pki.join("b.key")))
                .unwrap_err();
        assert!(err.contains("a.pem") && err.contains("b.key"), "{err}");
        assert!(err.contains("do not go together"), "{err}");
        let bad = run(&CertsAction::Node {
            dir: pki.clone(),
            name: "c".into(),
            hosts: vec!["not a host!".into()],
            days: 1,
        })
        .unwrap_err();
        assert!(bad.to_string().contains("not a host name"), "{bad}");
        assert!(!pki.join("c.pem").exists() && !pki.join("c.key").exists());
    }

    #[test]
    fn nothing_is_overwritten_and_keys_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("ca.key");
        write_new(&key, b"k", true).unwrap();
        assert_eq!(
            std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(write_new(&key, b"again", true).is_err());
        assert_eq!(std::fs::read(&key).unwrap(), b"k");
    }
}
