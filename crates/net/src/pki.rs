//! A small certificate authority for one cluster (rcgen): a CA made here or brought
//! by the operator (any PEM CA certificate and key), and certificates it issues with
//! the holder's role and site as a SAN URI `locus:ROLE/SITE`.

use crate::tls::{Role, TlsError, role_uri};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// File names a CA directory holds.
pub const CA_CERT: &str = "ca.pem";
/// The CA's private key, mode 0600.
pub const CA_KEY: &str = "ca.key";

/// A CA that can issue certificates.
pub struct Ca {
    cert_pem: String,
    key: KeyPair,
}

/// One issued certificate and its private key, PEM.
pub struct Issued {
    /// The certificate, followed by nothing (the CA is distributed separately).
    pub cert_pem: String,
    /// The holder's private key.
    pub key_pem: String,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TlsError + '_ {
    move |source| TlsError::Io { path: path.display().to_string(), source }
}

fn time_at(t: SystemTime) -> time::OffsetDateTime {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    // Any failure leaves zeros, which the time stamp below still makes distinct.
    let _ = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()) as u64;
    for (b, n) in bytes.iter_mut().zip(nanos.to_le_bytes()) {
        *b ^= n;
    }
    bytes[0] &= 0x7f; // a positive INTEGER
    bytes[0] |= 0x01; // never a leading zero byte
    SerialNumber::from_slice(&bytes)
}

/// Writes `text` to `path`, readable by the owner only when `secret`.
pub fn write_file(path: &Path, text: &str, secret: bool) -> Result<(), TlsError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true).mode(if secret { 0o600 } else { 0o644 });
    let mut f = opts.open(path).map_err(io(path))?;
    std::io::Write::write_all(&mut f, text.as_bytes()).map_err(io(path))
}

impl Ca {
    /// A new self-signed CA named `name`, valid for ten years.
    pub fn create(name: &str) -> Result<Ca, TlsError> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "Locus");
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        params.not_before = time_at(SystemTime::now() - Duration::from_secs(3600));
        params.not_after = time_at(SystemTime::now() + Duration::from_secs(10 * 365 * 86400));
        params.serial_number = Some(random_serial());
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Ca { cert_pem: cert.pem(), key })
    }

    /// Creates a CA in `dir` (`ca.pem`, `ca.key`); refuses to overwrite one.
    pub fn init(dir: &Path, name: &str) -> Result<Ca, TlsError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let key_path = dir.join(CA_KEY);
        if key_path.exists() || dir.join(CA_CERT).exists() {
            return Err(TlsError::Certificate(format!("{} already holds a CA", dir.display())));
        }
        let ca = Ca::create(name)?;
        write_file(&key_path, &ca.key.serialize_pem(), true)?;
        write_file(&dir.join(CA_CERT), &ca.cert_pem, false)?;
        Ok(ca)
    }

    /// Loads a CA certificate and its key (PEM), ours or the operator's own.
    pub fn load(cert: &Path, key: &Path) -> Result<Ca, TlsError> {
        let cert_pem = std::fs::read_to_string(cert).map_err(io(cert))?;
        let key_pem = std::fs::read_to_string(key).map_err(io(key))?;
        let key = KeyPair::from_pem(&key_pem)?;
        // Checks now that the certificate parses as a CA for this key's algorithm.
        Issuer::from_ca_cert_pem(&cert_pem, &key)?;
        Ok(Ca { cert_pem, key })
    }

    /// The CA certificate, PEM: what every process trusts.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Issues a certificate for `name` with `role` at `site`, valid from `not_before`
    /// for `valid_for`. Every role may authenticate as a TLS client; meta and nodes
    /// also as servers, and so may a holder given `hosts` (DNS names or IP addresses,
    /// which clients that check host names, such as NBD's, compare with the address
    /// they dialled).
    pub fn issue_between(
        &self,
        role: Role,
        name: &str,
        site: &str,
        not_before: SystemTime,
        valid_for: Duration,
        hosts: &[String],
    ) -> Result<Issued, TlsError> {
        let uri = role_uri(role, site);
        if crate::tls::parse_role_uri(&uri).is_some_and(|r| r.is_err()) {
            return Err(TlsError::Certificate(format!("invalid site {site:?}: use [A-Za-z0-9._-], at most 64")));
        }
        if name.is_empty() {
            return Err(TlsError::Certificate("a certificate needs a name".into()));
        }
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "Locus");
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        let uri = uri.try_into().map_err(|e| TlsError::Certificate(format!("role URI: {e}")))?;
        params.subject_alt_names = vec![SanType::URI(uri)];
        for host in hosts {
            params.subject_alt_names.push(match host.parse::<std::net::IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(
                    host.clone().try_into().map_err(|e| TlsError::Certificate(format!("host name {host:?}: {e}")))?,
                ),
            });
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = match role {
            Role::Client | Role::Admin | Role::User if hosts.is_empty() => vec![ExtendedKeyUsagePurpose::ClientAuth],
            _ => vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
        };
        params.not_before = time_at(not_before);
        params.not_after = time_at(not_before + valid_for);
        params.serial_number = Some(random_serial());
        let key = KeyPair::generate()?;
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, &self.key)?;
        let cert = params.signed_by(&key, &issuer)?;
        Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    /// Issues a certificate valid from an hour ago for `days` days.
    pub fn issue(&self, role: Role, name: &str, site: &str, days: u64) -> Result<Issued, TlsError> {
        self.issue_for_hosts(role, name, site, days, &[])
    }

    /// `issue`, also naming the `hosts` the holder serves at (`issue_between`).
    pub fn issue_for_hosts(
        &self,
        role: Role,
        name: &str,
        site: &str,
        days: u64,
        hosts: &[String],
    ) -> Result<Issued, TlsError> {
        let start = SystemTime::now() - Duration::from_secs(3600);
        self.issue_between(role, name, site, start, Duration::from_secs(days * 86400 + 3600), hosts)
    }
}

impl Issued {
    /// Writes `STEM.pem` and `STEM.key` (0600) into `dir`; returns both paths.
    pub fn write(&self, dir: &Path, stem: &str) -> Result<(PathBuf, PathBuf), TlsError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let (cert, key) = (dir.join(format!("{stem}.pem")), dir.join(format!("{stem}.key")));
        write_file(&key, &self.key_pem, true)?;
        write_file(&cert, &self.cert_pem, false)?;
        Ok((cert, key))
    }
}
