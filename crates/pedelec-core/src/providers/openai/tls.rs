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
    let native = rustls_native_certs::load_native_certs();
    let (added, _ignored) = roots.add_parsable_certificates(native.certs);
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
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
