//! TLS for the API's port (REST and the agents' gRPC alike), with rustls:
//! the certificate chain and key from PEM files, HTTP/2 and HTTP/1.1 by
//! ALPN.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The server's TLS settings from a certificate chain and a private key
/// (PEM files); with `client_ca`, a client may present a certificate signed
/// by it (agents must: see [`dagcron_agents::ClientCertificate`]).
pub(crate) fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading the certificate {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading the certificate {}", cert.display()))?;
    anyhow::ensure!(!chain.is_empty(), "{} holds no certificate", cert.display());
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading the private key {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca)
                .with_context(|| format!("reading the client CA {}", ca.display()))?
            {
                roots
                    .add(c.with_context(|| format!("reading the client CA {}", ca.display()))?)
                    .context("the client CA certificate")?;
            }
            // Browsers and the command line need no certificate; agents do.
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .context("the client CA")?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .context("the certificate and the key do not go together")?;
    // gRPC needs HTTP/2; browsers and curl may speak either.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
