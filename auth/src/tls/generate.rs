//! Making a cluster CA and issuing role certificates (rcgen, ring backend).

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};
use time::{Duration as TimeDuration, OffsetDateTime};

use super::{Pem, Role, TlsError};

/// How long a cluster CA lasts: rotating a CA touches every host, so it should be rare.
pub const CA_VALID_DAYS: u32 = 3650;
/// The longest validity `issue` grants a leaf certificate.
pub const MAX_VALID_DAYS: u32 = 3650;
/// Certificates start an hour in the past, so a peer whose clock lags a little does not see them as "not yet valid".
const BACKDATE: TimeDuration = TimeDuration::hours(1);

/// A new self-signed cluster CA (ECDSA P-256). It may sign leaf certificates only (path length 0).
pub fn generate_ca(common_name: &str) -> Result<Pem, TlsError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + TimeDuration::days(i64::from(CA_VALID_DAYS));
    let cert = params.self_signed(&key)?;
    Ok(Pem { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// Issues a certificate for `role`, signed by `ca`, usable both as a TLS server and as a TLS client (every Drover
/// process is both). `dns_names` and `ips` become SANs so ordinary hostname verification works for servers.
pub fn issue(ca: &Pem, role: &Role, dns_names: &[String], ips: &[IpAddr], valid_days: u32) -> Result<Pem, TlsError> {
    if valid_days == 0 || valid_days > MAX_VALID_DAYS {
        return Err(TlsError::InvalidRequest(format!("valid_days must be 1..={MAX_VALID_DAYS}, not {valid_days}")));
    }
    let ca_key = KeyPair::from_pem(&ca.key_pem)
        .map_err(|e| TlsError::InvalidRequest(format!("the CA's private key is unusable: {e}")))?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key)
        .map_err(|e| TlsError::InvalidRequest(format!("the CA certificate is unusable: {e}")))?;

    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, role.uri());
    let uri = role.uri().try_into().map_err(|e| TlsError::InvalidRequest(format!("role {role}: {e}")))?;
    params.subject_alt_names.push(SanType::URI(uri));
    for name in dns_names {
        let dns = name.clone().try_into().map_err(|e| TlsError::InvalidRequest(format!("DNS name {name:?}: {e}")))?;
        params.subject_alt_names.push(SanType::DnsName(dns));
    }
    params.subject_alt_names.extend(ips.iter().copied().map(SanType::IpAddress));
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + TimeDuration::days(i64::from(valid_days));

    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Pem { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// Writes a certificate (mode 0644) and its key (`key_mode`, normally 0600), each atomically (a temporary file
/// renamed into place), so a reloader never reads half a file. The key goes first: a reloader that sees the new
/// key with the old certificate refuses the pair and keeps the old material until the certificate lands.
pub fn write_pem(pem: &Pem, cert_path: &Path, key_path: &Path, key_mode: u32) -> Result<(), TlsError> {
    write_atomically(key_path, pem.key_pem.as_bytes(), key_mode)?;
    write_atomically(cert_path, pem.cert_pem.as_bytes(), 0o644)
}

fn write_atomically(path: &Path, contents: &[u8], mode: u32) -> Result<(), TlsError> {
    let err = |source| TlsError::Write { path: path.to_owned(), source };
    let mut tmp_name = path.file_name().unwrap_or_default().to_owned();
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let result = (|| {
        let mut file = OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(&tmp)?;
        // The umask may have narrowed `mode`, and a leftover temporary file keeps its old mode: set it explicitly.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::cert_role;
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    use x509_parser::extensions::GeneralName;

    #[test]
    fn an_issued_certificate_carries_its_role_and_names() {
        let ca = generate_ca("test CA").unwrap();
        let role = Role::Agent("gpu-1".into());
        let ips = ["10.0.0.7".parse().unwrap()];
        let leaf = issue(&ca, &role, &["gpu-1.cluster".into()], &ips, 30).unwrap();
        let der = CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap();
        assert_eq!(cert_role(&der).unwrap(), role);

        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        let names = &san.value.general_names;
        assert!(names.contains(&GeneralName::DNSName("gpu-1.cluster")), "{names:?}");
        assert!(names.contains(&GeneralName::IPAddress(&[10, 0, 0, 7])), "{names:?}");
    }

    #[test]
    fn a_ca_certificate_has_no_role_and_is_refused_as_a_peer() {
        let ca = generate_ca("test CA").unwrap();
        let der = CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap();
        assert!(matches!(cert_role(&der), Err(TlsError::NoRole)));
    }

    #[test]
    fn nonsense_requests_are_refused_before_anything_is_signed() {
        let ca = generate_ca("test CA").unwrap();
        let role = Role::Client("h".into());
        assert!(matches!(issue(&ca, &role, &[], &[], 0), Err(TlsError::InvalidRequest(_))));
        let bogus = Pem { cert_pem: "nope".into(), key_pem: ca.key_pem.clone() };
        assert!(matches!(issue(&bogus, &role, &[], &[], 1), Err(TlsError::InvalidRequest(_))));
    }

    #[test]
    fn written_files_have_the_requested_modes_and_no_debris() {
        let dir = tempfile::tempdir().unwrap();
        let ca = generate_ca("test CA").unwrap();
        let (cert, key) = (dir.path().join("ca.pem"), dir.path().join("ca.key"));
        write_pem(&ca, &cert, &key, 0o600).unwrap();
        write_pem(&ca, &cert, &key, 0o600).unwrap(); // overwriting in place is how rotation works
        assert_eq!(fs::read_to_string(&cert).unwrap(), ca.cert_pem);
        assert_eq!(fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::metadata(&cert).unwrap().permissions().mode() & 0o777, 0o644);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
        assert!(!format!("{ca:?}").contains("PRIVATE KEY"));
    }
}
