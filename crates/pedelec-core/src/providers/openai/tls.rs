//! TLS for `https://` endpoints: rustls with the ring provider, trusting
//! the system's roots plus, when `ca_file` is set, the CA certificates in
//! that PEM file (a company gateway, a local proxy, a test CA).

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

/// The client configuration for one provider.
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    // A system store that cannot be read, or holds certificates rustls
    // refuses, leaves the others (and the CA file) in force.
    let (added, _ignored) = roots.add_parsable_certificates(system_roots());
    if let Some(file) = ca_file {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(file)
            .map_err(|e| format!("cannot read ca_file {}: {e}", file.display()))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("ca_file {} is not PEM certificates: {e}", file.display()))?;
        if certs.is_empty() {
            return Err(format!("ca_file {} holds no certificate", file.display()));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| format!("ca_file {}: {e}", file.display()))?;
        }
    } else if added == 0 {
        return Err("no trusted CA certificates: the system store is empty; set ca_file".into());
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup failed: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // HTTP/2 where the server offers it (one connection for concurrent
    // sessions' requests), HTTP/1.1 otherwise.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The system's trusted roots (Linux: the distribution's bundle; Windows:
/// the user's certificate store).
#[cfg(not(target_os = "macos"))]
fn system_roots() -> Vec<CertificateDer<'static>> {
    rustls_native_certs::load_native_certs().certs
}

/// macOS: the PEM bundle the system keeps for its command-line tools
/// (`/etc/ssl/cert.pem`, or `$SSL_CERT_FILE`). Reading the keychain instead
/// would link the Security framework, which only Apple's SDK provides and
/// which cross builds here cannot link; a CA added to the keychain alone
/// (a company's) is given to a provider as `ca_file`.
#[cfg(target_os = "macos")]
fn system_roots() -> Vec<CertificateDer<'static>> {
    let file = std::env::var_os("SSL_CERT_FILE").map_or_else(|| Path::new("/etc/ssl/cert.pem").to_owned(), Into::into);
    CertificateDer::pem_file_iter(&file).map(|certs| certs.filter_map(Result::ok).collect()).unwrap_or_default()
}
