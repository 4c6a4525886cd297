//! TLS material loaded from files, swappable at run time.
//!
//! rustls configurations are immutable once built, so instead of rebuilding them on every certificate change, the
//! configurations hold resolvers and verifiers that look up the *current* [`Material`] on every handshake. A reload
//! builds a complete new `Material` first and swaps it in only if every part is valid, so a half-copied or
//! mismatched set of files never replaces working material.

use std::fmt;
use std::io::Read;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, Weak};
use std::time::Duration;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use sha2::{Digest, Sha256};

use super::{Role, RoleKind, TlsError, TlsFiles, cert_role};

/// The largest PEM file read. A CA bundle of a few certificates is ~10 KiB; the bound keeps a wrong path (a log
/// file, a device) from being slurped into memory.
pub const MAX_PEM_FILE_BYTES: u64 = 1 << 20;
/// Reload polling never runs faster than this, whatever the caller asks.
pub const MIN_RELOAD_INTERVAL: Duration = Duration::from_millis(100);
/// A certificate this close to expiry is loaded with a warning, so rotation happens before peers start refusing it.
const EXPIRY_WARNING: Duration = Duration::from_secs(7 * 24 * 3600);

/// The ring provider, shared: no aws-lc (it needs cmake), and one provider for every configuration.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())).clone()
}

/// One consistent set of CA, certificate and key, ready for handshakes.
pub(crate) struct Material {
    /// Over the three files' bytes: "did anything change?" without parsing.
    digest: [u8; 32],
    pub certified: Arc<CertifiedKey>,
    pub client_verifier: Arc<dyn ClientCertVerifier>,
    pub server_verifier: Arc<WebPkiServerVerifier>,
    pub role: Option<Role>,
}

struct Contents {
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl Contents {
    fn read(files: &TlsFiles) -> Result<Contents, TlsError> {
        Ok(Contents {
            ca: read_limited("CA file", &files.ca)?,
            cert: read_limited("certificate", &files.cert)?,
            key: read_limited("private key", &files.key)?,
        })
    }

    fn digest(&self) -> [u8; 32] {
        let mut hash = Sha256::new();
        // Length prefixes, so bytes moving from one file to the next still change the digest.
        for part in [&self.ca, &self.cert, &self.key] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part);
        }
        hash.finalize().into()
    }
}

fn read_limited(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let read_err = |source| TlsError::Read { what, path: path.to_owned(), source };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(read_err)?;
    if bytes.len() as u64 > MAX_PEM_FILE_BYTES {
        return Err(TlsError::TooLarge { what, path: path.to_owned(), limit: MAX_PEM_FILE_BYTES });
    }
    Ok(bytes)
}

fn certificates(what: &'static str, path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>().map_err(|e| TlsError::BadPem {
        what,
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { what, path: path.to_owned() });
    }
    Ok(certs)
}

impl Material {
    fn build(files: &TlsFiles, contents: &Contents) -> Result<Material, TlsError> {
        let ca_certs = certificates("CA file", &files.ca, &contents.ca)?;
        let mut roots = RootCertStore::empty();
        for cert in ca_certs {
            roots.add(cert).map_err(|e| TlsError::BadCa { path: files.ca.clone(), reason: e.to_string() })?;
        }
        let roots = Arc::new(roots);

        let chain = certificates("certificate", &files.cert, &contents.cert)?;
        check_expiry(&files.cert, &chain[0])?;
        let role = cert_role(&chain[0]).ok();
        let key = PrivateKeyDer::from_pem_slice(&contents.key)
            .map_err(|e| TlsError::NoPrivateKey { path: files.key.clone(), reason: e.to_string() })?;
        let certified = CertifiedKey::from_der(chain, key, &provider()).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => {
                TlsError::KeyMismatch { cert: files.cert.clone(), key: files.key.clone() }
            }
            other => TlsError::BadKey { path: files.key.clone(), reason: other.to_string() },
        })?;

        let ca_err =
            |e: rustls::server::VerifierBuilderError| TlsError::BadCa { path: files.ca.clone(), reason: e.to_string() };
        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider()).build().map_err(ca_err)?;
        let server_verifier = WebPkiServerVerifier::builder_with_provider(roots, provider()).build().map_err(ca_err)?;
        Ok(Material {
            digest: contents.digest(),
            certified: Arc::new(certified),
            client_verifier,
            server_verifier,
            role,
        })
    }
}

/// An expired certificate is refused outright (every peer would refuse it); one about to expire is loaded with a
/// warning.
fn check_expiry(path: &Path, leaf: &CertificateDer<'_>) -> Result<(), TlsError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(leaf).map_err(|e| TlsError::BadCertificate { reason: e.to_string() })?;
    let validity = cert.validity();
    match validity.time_to_expiration() {
        None => Err(TlsError::Expired { path: path.to_owned(), not_after: validity.not_after.to_string() }),
        Some(left) => {
            if left < EXPIRY_WARNING {
                tracing::warn!(cert = %path.display(), not_after = %validity.not_after, "TLS certificate expires within a week: issue a new one");
            }
            Ok(())
        }
    }
}

/// The files and whatever material was last loaded from them.
pub(crate) struct Shared {
    files: TlsFiles,
    current: RwLock<Arc<Material>>,
    /// The last reload error logged, so a broken file is reported once, not on every poll.
    last_failure: Mutex<Option<String>>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial").field("files", &self.files).field("role", &self.current().role).finish()
    }
}

impl Shared {
    pub fn load(files: TlsFiles) -> Result<Arc<Shared>, TlsError> {
        let material = Material::build(&files, &Contents::read(&files)?)?;
        tracing::info!(cert = %files.cert.display(), role = ?material.role, "loaded TLS material");
        Ok(Arc::new(Shared { files, current: RwLock::new(Arc::new(material)), last_failure: Mutex::new(None) }))
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The material handshakes use now. A poisoned lock still holds a whole `Arc` (swaps are one assignment), so
    /// it is safe to keep using.
    pub fn current(&self) -> Arc<Material> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Re-reads the files; swaps in new material if they changed and are valid. Ok(true) when swapped.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let result = Contents::read(&self.files).and_then(|contents| {
            if contents.digest() == self.current().digest {
                return Ok(None);
            }
            Material::build(&self.files, &contents).map(Some)
        });
        let mut last_failure = self.last_failure.lock().unwrap_or_else(PoisonError::into_inner);
        match result {
            Ok(None) => Ok(false),
            Ok(Some(material)) => {
                tracing::info!(cert = %self.files.cert.display(), role = ?material.role, "reloaded TLS material");
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(material);
                *last_failure = None;
                Ok(true)
            }
            Err(err) => {
                let message = err.to_string();
                if last_failure.as_deref() != Some(message.as_str()) {
                    tracing::error!(error = %message, "TLS files changed but cannot be used; still using the previous material");
                    *last_failure = Some(message);
                }
                Err(err)
            }
        }
    }
}

/// Polls the files every `interval` until every holder of the material is gone.
pub(crate) fn spawn_reloader(shared: &Arc<Shared>, interval: Duration) -> tokio::task::JoinHandle<()> {
    let weak: Weak<Shared> = Arc::downgrade(shared);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval.max(MIN_RELOAD_INTERVAL));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await; // the first tick is immediate, and the material was just loaded
        loop {
            ticks.tick().await;
            let Some(shared) = weak.upgrade() else { return };
            // File reads block: keep them off the async workers. Failures are logged inside.
            let _ = tokio::task::spawn_blocking(move || shared.reload_if_changed()).await;
        }
    })
}

/// Presents the current certificate, as a server and as a client.
#[derive(Debug)]
pub(crate) struct CurrentCert(pub Arc<Shared>);

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current().certified.clone())
    }
}

impl rustls::client::ResolvesClientCert for CurrentCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current().certified.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

fn verify_tls12(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    rustls::crypto::verify_tls12_signature(message, cert, dss, &provider().signature_verification_algorithms)
}

fn verify_tls13(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    rustls::crypto::verify_tls13_signature(message, cert, dss, &provider().signature_verification_algorithms)
}

fn schemes() -> Vec<SignatureScheme> {
    provider().signature_verification_algorithms.supported_schemes()
}

/// Requires a client certificate chained to the current CA.
#[derive(Debug)]
pub(crate) struct CurrentClientVerifier(pub Arc<Shared>);

impl ClientCertVerifier for CurrentClientVerifier {
    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Hints would have to borrow from material a reload may replace. An empty list means "any CA", and Drover
        // clients present their one certificate regardless.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0.current().client_verifier.verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12(m, c, d)
    }

    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13(m, c, d)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        schemes()
    }
}

/// Requires a server certificate chained to the current CA, valid for the dialled name, and (when `expect` is set)
/// carrying a role of that kind, so a node never mistakes, say, a client's certificate for a controller.
#[derive(Debug)]
pub(crate) struct CurrentServerVerifier {
    pub shared: Arc<Shared>,
    pub expect: Option<RoleKind>,
}

impl ServerCertVerifier for CurrentServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.shared.current().server_verifier.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        let Some(expected) = self.expect else { return Ok(verified) };
        let refuse = |err: TlsError| {
            tracing::warn!(server = ?server_name, error = %err, "refused a server certificate");
            rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(err))))
        };
        match cert_role(end_entity) {
            Ok(found) if found.kind() == expected => Ok(verified),
            Ok(found) => Err(refuse(TlsError::WrongRole { expected, found })),
            Err(err) => Err(refuse(err)),
        }
    }

    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12(m, c, d)
    }

    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13(m, c, d)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{Pem, generate_ca, issue, write_pem};

    fn install(dir: &Path, ca: &Pem, leaf: &Pem) -> TlsFiles {
        let files = TlsFiles { ca: dir.join("ca.pem"), cert: dir.join("node.pem"), key: dir.join("node.key") };
        std::fs::write(&files.ca, &ca.cert_pem).unwrap();
        write_pem(leaf, &files.cert, &files.key, 0o600).unwrap();
        files
    }

    #[test]
    fn unchanged_files_are_not_reloaded_and_changed_ones_are() {
        let dir = tempfile::tempdir().unwrap();
        let ca = generate_ca("ca").unwrap();
        let files = install(dir.path(), &ca, &issue(&ca, &Role::Agent("a".into()), &[], &[], 1).unwrap());
        let shared = Shared::load(files.clone()).unwrap();
        assert!(!shared.reload_if_changed().unwrap());

        let next = issue(&ca, &Role::Agent("b".into()), &[], &[], 1).unwrap();
        write_pem(&next, &files.cert, &files.key, 0o600).unwrap();
        assert!(shared.reload_if_changed().unwrap());
        assert_eq!(shared.current().role, Some(Role::Agent("b".into())));
    }

    #[test]
    fn a_half_replaced_pair_keeps_the_old_material_until_the_pair_is_whole() {
        let dir = tempfile::tempdir().unwrap();
        let ca = generate_ca("ca").unwrap();
        let files = install(dir.path(), &ca, &issue(&ca, &Role::Agent("a".into()), &[], &[], 1).unwrap());
        let shared = Shared::load(files.clone()).unwrap();

        let next = issue(&ca, &Role::Agent("b".into()), &[], &[], 1).unwrap();
        std::fs::write(&files.cert, &next.cert_pem).unwrap(); // the key has not arrived yet
        let err = shared.reload_if_changed().unwrap_err();
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
        assert!(err.to_string().contains("node.key"), "the message names the file: {err}");
        assert_eq!(shared.current().role, Some(Role::Agent("a".into())), "still serving the old pair");

        std::fs::write(&files.key, &next.key_pem).unwrap();
        assert!(shared.reload_if_changed().unwrap());
        assert_eq!(shared.current().role, Some(Role::Agent("b".into())));
    }

    #[test]
    fn broken_files_are_refused_with_the_file_named() {
        let dir = tempfile::tempdir().unwrap();
        let ca = generate_ca("ca").unwrap();
        let files = install(dir.path(), &ca, &issue(&ca, &Role::Agent("a".into()), &[], &[], 1).unwrap());

        std::fs::write(&files.ca, "not pem at all").unwrap();
        let err = Shared::load(files.clone()).unwrap_err();
        assert!(matches!(err, TlsError::NoCertificate { .. }) && err.to_string().contains("ca.pem"), "{err}");

        std::fs::write(&files.ca, &ca.cert_pem).unwrap();
        std::fs::write(&files.key, &ca.cert_pem).unwrap(); // a certificate where the key should be
        let err = Shared::load(files.clone()).unwrap_err();
        assert!(matches!(err, TlsError::NoPrivateKey { .. }) && err.to_string().contains("node.key"), "{err}");

        let missing = TlsFiles { cert: dir.path().join("absent.pem"), ..files };
        let err = Shared::load(missing).unwrap_err();
        assert!(matches!(err, TlsError::Read { .. }) && err.to_string().contains("absent.pem"), "{err}");
    }
}
