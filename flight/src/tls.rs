//! [`Tls`]: what a process needs to speak TLS on its links — the
//! cluster's CA (whom it trusts) and its own certificate and key (what it
//! presents) — as the configurations of tonic (Flight, both sides) and of
//! rustls (the REST API and its clients).
//!
//! One certificate per node, issued by the cluster's CA (`sluice certs`),
//! is both the node's server certificate and its client certificate:
//! - a node verifies every node it calls against the CA and the host name
//!   in the location it calls, so a location is bound to the identity the
//!   cluster issued for that host;
//! - a storage node given the CA accepts only callers presenting a
//!   certificate the CA issued ([`ClientCerts::Required`]); a server that
//!   also serves trainers accepts them without one
//!   ([`ClientCerts::Optional`]).
//!
//! URLs say whether a link is encrypted: `grpc+tls://` and `https://` are,
//! `grpc://`, `grpc+tcp://` and `http://` are not ([`is_tls`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// Whether a server asks its callers for a certificate of the cluster's CA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCerts {
    /// Callers must present one (a storage node: only nodes call it).
    Required,
    /// Callers may present one (trainers have none).
    Optional,
}

/// See the module docs.
#[derive(Clone)]
pub struct Tls {
    /// The cluster CA, PEM, and its certificates.
    ca: Option<(Vec<u8>, Vec<CertificateDer<'static>>)>,
    /// This process's certificate chain and key, PEM.
    identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The rustls client configuration, made once at load (every REST
    /// call and identity probe dials with it).
    client: Option<Arc<ClientConfig>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Tls")
            .field("ca", &self.ca.is_some())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

/// How long a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE: Duration = Duration::from_secs(10);

impl Tls {
    /// The TLS the files describe: `ca` (the cluster's CA certificate),
    /// `cert` and `key` (this process's, given together). `None` when no
    /// file is given; an error naming the file that cannot be read or
    /// holds no certificate or key.
    pub fn load(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Option<Self>, String> {
        let read =
            |p: &Path| std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
        let ca = match ca {
            Some(p) => {
                let pem = read(p)?;
                let certs = certificates(&pem).map_err(|e| format!("{}: {e}", p.display()))?;
                Some((pem, certs))
            }
            None => None,
        };
        let identity = match (cert, key) {
            (None, None) => None,
            (Some(c), Some(k)) => {
                let (cert, key) = (read(c)?, read(k)?);
                certificates(&cert).map_err(|e| format!("{}: {e}", c.display()))?;
                private_key(&key).map_err(|e| format!("{}: {e}", k.display()))?;
                Some((cert, key))
            }
            _ => return Err("--tls-cert and --tls-key are given together".into()),
        };
        let mut tls = Self {
            ca,
            identity,
            client: None,
        };
        if tls.ca.is_some() {
            tls.client = Some(tls.make_client()?);
        }
        if let (Some(c), Some(k)) = (cert, key) {
            // A key that is not the certificate's is refused now, naming
            // both, not when the first connection arrives.
            tls.rustls_server().map_err(|e| {
                format!(
                    "--tls-cert {} and --tls-key {}: {e}",
                    c.display(),
                    k.display()
                )
            })?;
        }
        Ok((tls.ca.is_some() || tls.identity.is_some()).then_some(tls))
    }

    /// Whether this process has a certificate to serve TLS with.
    pub fn serves(&self) -> bool {
        self.identity.is_some()
    }

    /// Whether this process trusts a cluster CA (and so checks peers).
    pub fn trusts(&self) -> bool {
        self.ca.is_some()
    }

    /// The cluster CA, PEM (what a process hands its own clients).
    pub fn ca_pem(&self) -> Option<&[u8]> {
        self.ca.as_ref().map(|(pem, _)| pem.as_slice())
    }

    /// A tonic server's TLS: this process's certificate, and the CA its
    /// callers' certificates are checked against when it has one.
    pub fn tonic_server(&self, client_certs: ClientCerts) -> Result<ServerTlsConfig, String> {
        let (cert, key) = self
            .identity
            .as_ref()
            .ok_or("serving TLS needs --tls-cert and --tls-key")?;
        let mut config = ServerTlsConfig::new()
            .identity(Identity::from_pem(cert, key))
            .timeout(HANDSHAKE);
        if let Some((pem, _)) = &self.ca {
            config = config
                .client_ca_root(Certificate::from_pem(pem))
                .client_auth_optional(client_certs == ClientCerts::Optional);
        }
        Ok(config)
    }

    /// A tonic client's TLS: the CA it checks servers against, and this
    /// process's certificate when it has one.
    pub fn tonic_client(&self) -> Result<ClientTlsConfig, String> {
        let (pem, _) = self
            .ca
            .as_ref()
            .ok_or("a TLS location needs the cluster's CA (--tls-ca)")?;
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(pem))
            .timeout(HANDSHAKE);
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        Ok(config)
    }

    /// A rustls server's configuration (the REST API): this process's
    /// certificate, HTTP/1.1; callers' certificates are not asked for
    /// (REST callers present tokens).
    pub fn rustls_server(&self) -> Result<Arc<ServerConfig>, String> {
        let (cert, key) = self
            .identity
            .as_ref()
            .ok_or("serving TLS needs --tls-cert and --tls-key")?;
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(certificates(cert)?, private_key(key)?)
            .map_err(|e| format!("the certificate and key do not go together: {e}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// A rustls client's configuration (REST calls, identity probes):
    /// servers checked against the CA; this process's certificate
    /// presented when it has one.
    pub fn rustls_client(&self) -> Result<Arc<ClientConfig>, String> {
        self.client
            .clone()
            .ok_or_else(|| "an https:// URL needs the cluster's CA (--tls-ca)".to_string())
    }

    /// Builds [`Tls::rustls_client`]'s configuration.
    fn make_client(&self) -> Result<Arc<ClientConfig>, String> {
        let (_, anchors) = self
            .ca
            .as_ref()
            .ok_or("an https:// URL needs the cluster's CA (--tls-ca)")?;
        let mut roots = RootCertStore::empty();
        for cert in anchors {
            roots
                .add(cert.clone())
                .map_err(|e| format!("the CA certificate: {e}"))?;
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
        let config = match &self.identity {
            Some((cert, key)) => builder
                .with_client_auth_cert(certificates(cert)?, private_key(key)?)
                .map_err(|e| format!("the certificate and key do not go together: {e}"))?,
            None => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
    }

    /// Opens a TLS connection to `authority` (`host:port`), checking its
    /// certificate against the CA and `host`: whether the process there
    /// holds an identity the cluster issued for that host.
    pub async fn connect(
        &self,
        authority: &str,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
        let host = host_of(authority);
        let name = ServerName::try_from(host.to_string())
            .map_err(|_| format!("{host:?} is not a host name or address"))?;
        let connector = tokio_rustls::TlsConnector::from(self.rustls_client()?);
        let handshake = async {
            let tcp = tokio::net::TcpStream::connect(authority)
                .await
                .map_err(|e| format!("cannot reach {authority}: {e}"))?;
            let _ = tcp.set_nodelay(true);
            connector
                .connect(name, tcp)
                .await
                .map_err(|e| format!("{authority}: TLS refused: {e}"))
        };
        tokio::time::timeout(HANDSHAKE, handshake)
            .await
            .map_err(|_| format!("{authority}: no TLS handshake within {HANDSHAKE:?}"))?
    }
}

/// The provider every configuration of sluice uses (ring, as tonic's).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM file (at least one).
fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate in it".into());
    }
    Ok(certs)
}

/// The private key of a PEM file.
fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("no private key in it: {e}"))
}

/// The host of `host:port` (`[v6]:port` gives the bare address).
fn host_of(authority: &str) -> &str {
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Whether `url` names an encrypted link (`grpc+tls://`, `https://`).
pub fn is_tls(url: &str) -> bool {
    url.starts_with("grpc+tls://") || url.starts_with("https://")
}

/// `url` as tonic dials it: `grpc+tls://` is `https://`, `grpc://` and
/// `grpc+tcp://` are `http://`, a bare `host:port` is `http://host:port`.
pub fn dial_url(url: &str) -> String {
    match url.split_once("://") {
        Some(("grpc+tls", rest)) => format!("https://{rest}"),
        Some(("grpc" | "grpc+tcp", rest)) => format!("http://{rest}"),
        Some(_) => url.to_string(),
        None => format!("http://{url}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_say_whether_a_link_is_encrypted() {
        assert!(is_tls("grpc+tls://a:1") && is_tls("https://a:1"));
        assert!(!is_tls("grpc://a:1") && !is_tls("http://a:1") && !is_tls("a:1"));
        assert_eq!(dial_url("grpc+tls://a:1"), "https://a:1");
        assert_eq!(dial_url("grpc+tcp://a:1"), "http://a:1");
        assert_eq!(dial_url("a:1"), "http://a:1");
        assert_eq!(dial_url("https://a:1"), "https://a:1");
        assert_eq!(host_of("[::1]:80"), "::1");
        assert_eq!(host_of("node-3.example:80"), "node-3.example");
    }

    #[test]
    fn files_that_are_not_pem_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("ca.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let err = Tls::load(Some(&junk), None, None).unwrap_err();
        assert!(
            err.contains("ca.pem") && err.contains("no certificate"),
            "{err}"
        );
        let err = Tls::load(None, Some(&junk), None).unwrap_err();
        assert!(err.contains("together"), "{err}");
        assert!(Tls::load(None, None, None).unwrap().is_none());
    }
}
