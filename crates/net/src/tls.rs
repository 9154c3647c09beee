//! Mutual TLS 1.3 on every connection: both ends present a certificate of the
//! cluster's CA, and what the certificate proves (name, role, site) travels with the
//! connection as a `PeerIdentity`. Role and site are SAN URIs `locus:ROLE/SITE`
//! (see `parse_role_uri`). A process installs its `Security` once; a revocation list
//! (serials or names) can be replaced at any time and drops matching connections.

use crate::conn::Conn;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use util::sync::{lock, read, write};

pub use proto::types::Role;

/// What a peer's certificate proves about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The certificate subject's common name (its whole DN when it has no CN): the
    /// global principal of the host; a node's is its node id.
    pub name: String,
    /// The role the certificate grants.
    pub role: Role,
    /// The site the certificate binds its holder to.
    pub site: String,
}

impl PeerIdentity {
    /// What a DER certificate says about its holder (its name and its one
    /// `locus:ROLE/SITE` URI). It does not check the signature or validity: the
    /// handshake does that before this is asked.
    pub fn from_der(der: &[u8]) -> Result<PeerIdentity, TlsError> {
        Ok(identity_of(der)?.identity.as_ref().clone())
    }
}

impl std::fmt::Display for PeerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({} of site {})", self.name, self.role, self.site)
    }
}

/// An identity as one handshake proved it, with the certificate serial that a
/// revocation may name.
#[derive(Debug, Clone)]
pub(crate) struct Proven {
    pub(crate) identity: Arc<PeerIdentity>,
    /// Lower-case hex, no separators, no leading zeros (`serial_of`).
    pub(crate) serial: String,
    /// The whole subject DN, as x509-parser prints it (`CN=Alice, O=Grid`).
    pub(crate) dn: String,
}

/// Why certificates could not be loaded, made or accepted.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// A certificate or key is malformed or lacks what Locus needs.
    #[error("certificate: {0}")]
    Certificate(String),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    /// Making a certificate failed.
    #[error("issuing a certificate: {0}")]
    Issue(#[from] rcgen::Error),
}

/// The URI scheme of the SAN that carries role and site.
pub const ROLE_URI_PREFIX: &str = "locus:";

/// The SAN URI that gives `role` at `site`.
pub fn role_uri(role: Role, site: &str) -> String {
    format!("{ROLE_URI_PREFIX}{role}/{site}")
}

/// Parses a SAN URI `locus:ROLE/SITE`; `None` for another URI. A site is 1 to 64
/// characters of `[A-Za-z0-9._-]`.
pub fn parse_role_uri(uri: &str) -> Option<Result<(Role, String), TlsError>> {
    let rest = uri.strip_prefix(ROLE_URI_PREFIX)?;
    let bad = || TlsError::Certificate(format!("malformed role URI {uri:?} (want locus:ROLE/SITE)"));
    let Some((role, site)) = rest.split_once('/') else { return Some(Err(bad())) };
    let role = match role.parse::<Role>() {
        Ok(r) => r,
        Err(e) => return Some(Err(TlsError::Certificate(e))),
    };
    let valid = !site.is_empty()
        && site.len() <= 64
        && site.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    Some(if valid { Ok((role, site.to_string())) } else { Err(bad()) })
}

/// What a DER certificate says about its holder: exactly one `locus:` SAN URI and a
/// subject name are required.
pub(crate) fn identity_of(der: &[u8]) -> Result<Proven, TlsError> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| TlsError::Certificate(format!("unparsable: {e}")))?;
    let mut found = None;
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::URI(uri) = name
                && let Some(parsed) = parse_role_uri(uri)
            {
                if found.is_some() {
                    return Err(TlsError::Certificate("more than one locus: role URI".into()));
                }
                found = Some(parsed?);
            }
        }
    }
    let Some((role, site)) = found else {
        return Err(TlsError::Certificate(format!(
            "no {ROLE_URI_PREFIX}ROLE/SITE URI in the subject alternative names of {}",
            cert.subject()
        )));
    };
    let cn = cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()).map(str::to_string);
    let name = cn.unwrap_or_else(|| cert.subject().to_string());
    if name.is_empty() {
        return Err(TlsError::Certificate("empty subject name".into()));
    }
    let serial = serial_of(&cert.raw_serial().iter().map(|b| format!("{b:02x}")).collect::<String>());
    Ok(Proven { identity: Arc::new(PeerIdentity { name, role, site }), serial, dn: cert.subject().to_string() })
}

/// ring with AES-128-GCM preferred: the strength TLS 1.3 requires at the lowest cost
/// per byte (ring's AES-256-GCM, its default first choice, costs about 30 % more CPU
/// on the bulk path).
fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::ring::cipher_suite::{
        TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
    };
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites = vec![TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256];
    Arc::new(provider)
}

/// This process's TLS set-up: the cluster CA it trusts, its own certificate chain and
/// key, and the revocation list it applies.
pub struct Tls {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
    own: PeerIdentity,
}

impl Tls {
    /// Loads the CA certificate(s) to trust, this process's certificate chain and its
    /// private key (PEM files).
    pub fn load(ca: &Path, cert: &Path, key: &Path) -> Result<Tls, TlsError> {
        let read = |p: &Path| std::fs::read(p).map_err(|source| TlsError::Io { path: p.display().to_string(), source });
        Tls::from_pem(&read(ca)?, &read(cert)?, &read(key)?).map_err(|e| {
            TlsError::Certificate(format!("{} / {} / {}: {e}", ca.display(), cert.display(), key.display()))
        })
    }

    /// Like `load`, from PEM text already in memory.
    pub fn from_pem(ca: &[u8], cert: &[u8], key: &[u8]) -> Result<Tls, TlsError> {
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsError::Certificate(format!("private key: {e}")))?;
        Tls::new(certificates(ca)?, certificates(cert)?, key)
    }

    /// Builds both configurations from DER parts.
    pub fn new(
        roots: Vec<CertificateDer<'static>>,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Tls, TlsError> {
        let own = identity_of(&chain[0])?.identity.as_ref().clone();
        let store = root_store(roots)?;
        let provider = provider();
        let webpki = client_verifier(&store, provider.clone())?;
        let clients = Arc::new(ClusterClientVerifier { inner: webpki });
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(clients)
            .with_single_cert(chain.clone(), key.clone_key())?;
        let verifier = Arc::new(ClusterServerVerifier { roots: store, provider: provider.clone() });
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_auth_cert(chain, key)?;
        Ok(Tls { server: Arc::new(server), client: Arc::new(client), own })
    }

    /// Checks a process's certificate files as its peers would (`locus doctor`): they
    /// load (the key is the certificate's), and the certificate chains to the CA and is
    /// valid now. Returns who the certificate names and when it expires (Unix seconds),
    /// that expiry also when the check fails for it.
    pub fn check_files(ca: &Path, cert: &Path, key: &Path) -> (Result<String, TlsError>, Option<i64>) {
        let read = |p: &Path| std::fs::read(p).map_err(|source| TlsError::Io { path: p.display().to_string(), source });
        let chain = read(cert).and_then(|pem| certificates(&pem));
        let expires = chain.as_ref().ok().and_then(|chain| {
            let (_, parsed) = x509_parser::parse_x509_certificate(&chain[0]).ok()?;
            Some(parsed.validity().not_after.timestamp())
        });
        // `load` says which files failed to load, and how.
        let checked = Tls::load(ca, cert, key).and_then(|tls| {
            let (roots, chain) = (root_store(certificates(&read(ca)?)?)?, chain?);
            client_verifier(&roots, provider())?
                .verify_client_cert(&chain[0], &chain[1..], UnixTime::now())
                .map_err(|e| TlsError::Certificate(format!("not accepted under this CA: {e}")))?;
            Ok(tls.identity().to_string())
        });
        (checked, expires)
    }

    /// Who this process is.
    pub fn identity(&self) -> &PeerIdentity {
        &self.own
    }

    /// The calling side's rustls configuration (cluster CA, this certificate), for
    /// tools and tests that speak the wire protocol over their own sockets.
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        self.client.clone()
    }
}

/// Verifies a server's chain against the cluster CA (validity period included).
/// Host names are not checked: Locus addresses are IPs and ports handed out by meta,
/// and what matters is the role and name the certificate proves, which the caller
/// checks after the handshake.
#[derive(Debug)]
struct ClusterServerVerifier {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for ClusterServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        admissible(end_entity)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not offered".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// Refuses, during the handshake (so the peer gets a TLS alert naming the reason),
/// a certificate without a Locus role or one the revocation list names.
fn admissible(end_entity: &CertificateDer<'_>) -> Result<(), rustls::Error> {
    use rustls::CertificateError;
    let proven = identity_of(end_entity).map_err(|e| {
        tracing::debug!("certificate refused: {e}");
        rustls::Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure)
    })?;
    if let Err(why) = check_revoked(&proven) {
        tracing::warn!("{why}");
        return Err(rustls::Error::InvalidCertificate(CertificateError::Revoked));
    }
    Ok(())
}

/// The cluster CA's client verifier (chain and validity), plus `admissible`.
#[derive(Debug)]
struct ClusterClientVerifier {
    inner: Arc<dyn rustls::server::danger::ClientCertVerifier>,
}

impl rustls::server::danger::ClientCertVerifier for ClusterClientVerifier {
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        admissible(end_entity)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The certificates in PEM text, at least one.
fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let all = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Certificate(e.to_string()))?;
    if all.is_empty() {
        return Err(TlsError::Certificate("no certificate in the PEM text".into()));
    }
    Ok(all)
}

/// The cluster CA's certificates as rustls trusts them.
fn root_store(roots: Vec<CertificateDer<'static>>) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for root in roots {
        store.add(root)?;
    }
    Ok(Arc::new(store))
}

/// The check a serving side makes of a client's certificate (chain to `roots`, validity).
fn client_verifier(
    roots: &Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    WebPkiClientVerifier::builder_with_provider(roots.clone(), provider)
        .build()
        .map_err(|e| TlsError::Certificate(format!("client verifier: {e}")))
}

/// How this process's connections are secured.
pub enum Security {
    /// Mutual TLS with the cluster CA.
    Tls(Arc<Tls>),
    /// Plain TCP, chosen explicitly (`--insecure-no-tls`): anybody who can reach a
    /// port can speak for anyone.
    Insecure,
}

static SECURITY: OnceLock<Security> = OnceLock::new();

/// Installs this process's security; the first call wins (the binary calls it once,
/// before any connection). A process that never calls it speaks plain TCP, which only
/// in-process tests do.
pub fn secure(security: Security) {
    let _ = SECURITY.set(security);
}

/// The TLS set-up in force, if any.
pub(crate) fn current() -> Option<Arc<Tls>> {
    match SECURITY.get() {
        Some(Security::Tls(t)) => Some(t.clone()),
        _ => None,
    }
}

/// What this process's own certificate proves (`None` without TLS): the identity of a
/// peer in this same process, whose requests are calls rather than connections
/// (`locus up`'s mount at its meta).
pub fn own_identity() -> Option<PeerIdentity> {
    current().map(|tls| tls.identity().clone())
}

/// The serving side's rustls configuration (this process's certificate shown, the
/// peer's verified against the cluster CA), for adapters that serve another protocol
/// with the cluster's certificates (NBD's STARTTLS); `None` without TLS.
pub fn server_config() -> Option<Arc<rustls::ServerConfig>> {
    current().map(|tls| tls.server.clone())
}

/// Whether this process was told to run without TLS.
pub(crate) fn insecure() -> bool {
    matches!(SECURITY.get(), Some(Security::Insecure))
}

/// Revoked certificates, and every live authenticated connection, so a new revocation
/// drops the ones it names.
#[derive(Default)]
struct Revocation {
    revoked: RwLock<RevokedSet>,
    live: Mutex<HashMap<u64, (Proven, Weak<Conn>)>>,
}

fn revocation() -> &'static Revocation {
    static R: OnceLock<Revocation> = OnceLock::new();
    R.get_or_init(Revocation::default)
}

/// A revocation list as the operator wrote it, in the forms a certificate is matched
/// against: serials in any common spelling (`0x1A2B`, `1a:2b`, `1A 2B`, leading zeros
/// or not), and names exactly as the certificate has them (case counts, as in X.509):
/// the subject's CN, or its whole DN in either the comma form (`CN=Alice, O=Grid`) or
/// the slash form grid tools print (`/O=Grid/CN=Alice`), in either order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct RevokedSet {
    serials: HashSet<String>,
    names: HashSet<String>,
}

impl RevokedSet {
    fn new(list: impl IntoIterator<Item = String>) -> RevokedSet {
        let mut set = RevokedSet::default();
        for entry in list {
            let entry = entry.trim();
            if entry.is_empty() {
                continue;
            }
            if let Some(serial) = serial_spelling(entry) {
                set.serials.insert(serial);
            }
            set.names.insert(entry.to_string());
            if let Some(dn) = dn_components(entry) {
                set.names.insert(dn);
            }
        }
        set
    }

    fn covers(&self, proven: &Proven) -> bool {
        self.serials.contains(&proven.serial)
            || self.names.contains(&proven.identity.name)
            || dn_components(&proven.dn).is_some_and(|dn| self.names.contains(&dn))
    }
}

/// A serial's canonical form: lower-case hex without leading zeros.
fn serial_of(hex: &str) -> String {
    let trimmed = hex.trim_start_matches('0');
    if trimmed.is_empty() { "0".into() } else { trimmed.to_ascii_lowercase() }
}

/// `entry` read as a serial (hex, with an optional `0x`, colons or spaces between
/// bytes), if it can be one.
fn serial_spelling(entry: &str) -> Option<String> {
    let hex: String = entry.strip_prefix("0x").unwrap_or(entry).chars().filter(|c| !matches!(c, ':' | ' ')).collect();
    (!hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| serial_of(&hex))
}

/// A DN's attributes in a canonical order-free form (`TYPE=value` sorted, joined by
/// `,`), from the comma or the slash spelling; `None` when `text` is no DN.
fn dn_components(text: &str) -> Option<String> {
    let parts: Vec<&str> = match text.strip_prefix('/') {
        Some(rest) => rest.split('/').collect(),
        None => text.split(',').collect(),
    };
    let mut parts: Vec<String> = parts.iter().map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect();
    if parts.is_empty() || !parts.iter().all(|p| p.contains('=')) {
        return None;
    }
    parts.sort();
    Some(format!("dn:{}", parts.join(",")))
}

/// Whether a revocation list holding only `entry` covers the certificate `pem` (the
/// first one in it): for `locus ca revoke`, which says what each entry now covers.
pub fn revocation_covers(entry: &str, pem: &[u8]) -> Result<bool, TlsError> {
    Ok(RevokedSet::new([entry.to_string()]).covers(&proven_of_pem(pem)?))
}

/// The name the first certificate in `pem` proves (its subject's CN, else its DN).
pub fn certificate_name(pem: &[u8]) -> Result<String, TlsError> {
    Ok(proven_of_pem(pem)?.identity.name.clone())
}

fn proven_of_pem(pem: &[u8]) -> Result<Proven, TlsError> {
    let der = CertificateDer::pem_slice_iter(pem)
        .next()
        .ok_or_else(|| TlsError::Certificate("no certificate in the file".into()))?
        .map_err(|e| TlsError::Certificate(e.to_string()))?;
    identity_of(&der)
}

/// Replaces the revocation list (certificate serials in hex, or subject names or DNs;
/// see `RevokedSet`) and closes every live connection whose peer it names. Returns how
/// many were closed.
pub fn set_revoked(list: impl IntoIterator<Item = String>) -> usize {
    let set = RevokedSet::new(list);
    let r = revocation();
    let unchanged = *read(&r.revoked) == set;
    *write(&r.revoked) = set;
    if unchanged {
        return 0;
    }
    let doomed: Vec<(Proven, Arc<Conn>)> = {
        let set = read(&r.revoked);
        let live = lock(&r.live);
        live.values().filter(|(p, _)| set.covers(p)).filter_map(|(p, c)| c.upgrade().map(|c| (p.clone(), c))).collect()
    };
    for (proven, conn) in &doomed {
        tracing::warn!(addr = %conn.addr, peer = %proven.identity, "closing the connection of a revoked certificate");
        conn.close();
    }
    doomed.len()
}

/// Refuses a revoked peer.
pub(crate) fn check_revoked(proven: &Proven) -> Result<(), String> {
    if read(&revocation().revoked).covers(proven) {
        return Err(format!("certificate of {} (serial {}) is revoked", proven.identity, proven.serial));
    }
    Ok(())
}

/// Records a live authenticated connection until it closes.
pub(crate) fn track(conn: &Arc<Conn>, proven: &Proven) {
    lock(&revocation().live).insert(conn.id, (proven.clone(), Arc::downgrade(conn)));
}

/// Forgets a closed connection.
pub(crate) fn untrack(id: u64) {
    lock(&revocation().live).remove(&id);
}

/// The first byte of every TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// Bytes a TLS connection reads from its socket at once. rustls asks its transport for
/// about 4 KiB at a time; below it, this buffer turns a chunk's thousands of small
/// reads (each a system call and often a wake-up of the runtime) into a few large ones
/// (measured on the sync replication path: bench/results/replication-profile.txt).
const SOCKET_READ_BUFFER: usize = 64 << 10;

/// The socket under a TLS session: reads are buffered, writes pass straight through.
type Transport = tokio::io::BufReader<tokio::net::TcpStream>;

fn transport(stream: tokio::net::TcpStream) -> Transport {
    tokio::io::BufReader::with_capacity(SOCKET_READ_BUFFER, stream)
}

/// A connection after its handshake: the stream halves and, with TLS, who is at the
/// other end.
pub(crate) struct Secured {
    pub(crate) reader: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    pub(crate) writer: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
    pub(crate) proven: Option<Proven>,
    /// The TCP socket under it, for options set while it lives (`Conn::send`).
    pub(crate) socket: std::os::fd::RawFd,
}

pub(crate) fn plain(stream: tokio::net::TcpStream) -> Secured {
    let socket = std::os::fd::AsRawFd::as_raw_fd(&stream);
    let (r, w) = stream.into_split();
    Secured { reader: Box::new(r), writer: Box::new(w), proven: None, socket }
}

/// Takes what the handshake proved about the peer.
fn proven_peer(certs: Option<&[CertificateDer<'static>]>) -> Result<Proven, String> {
    let leaf = certs.and_then(|c| c.first()).ok_or("the peer presented no certificate")?;
    let proven = identity_of(leaf).map_err(|e| e.to_string())?;
    check_revoked(&proven)?;
    Ok(proven)
}

/// The server's side of a new connection: the TLS handshake with a client
/// certificate required. The error is the line to log.
pub(crate) async fn accept(stream: tokio::net::TcpStream, tls: Arc<Tls>) -> Result<Secured, String> {
    let mut first = [0u8; 1];
    let n = stream.peek(&mut first).await.map_err(|e| format!("before the handshake: {e}"))?;
    if n == 0 {
        return Err("closed before the handshake".into());
    }
    if first[0] != TLS_HANDSHAKE {
        return Err("refusing a plaintext connection: this cluster requires TLS (the peer runs without it, \
             or is not a Locus process)"
            .into());
    }
    let socket = std::os::fd::AsRawFd::as_raw_fd(&stream);
    let stream = tokio_rustls::TlsAcceptor::from(tls.server.clone())
        .accept(transport(stream))
        .await
        .map_err(|e| format!("TLS handshake refused: {e}"))?;
    let proven = proven_peer(stream.get_ref().1.peer_certificates())?;
    let (r, w) = tokio::io::split(stream);
    Ok(Secured { reader: Box::new(r), writer: Box::new(w), proven: Some(proven), socket })
}

/// Whether a frame header that does not decode starts like a TLS handshake: a TLS
/// peer talking to a server run with `--insecure-no-tls`.
pub(crate) fn looks_like_tls(head: &[u8]) -> bool {
    head.first() == Some(&TLS_HANDSHAKE)
}

/// The calling side: the TLS handshake, then the server's certificate must name a
/// role that serves (meta or node). The error is the line to log and report.
pub(crate) async fn connect(stream: tokio::net::TcpStream, tls: Option<Arc<Tls>>) -> Result<Secured, String> {
    let Some(tls) = tls else { return Ok(plain(stream)) };
    let name = ServerName::try_from("locus.invalid").map_err(|e| e.to_string())?;
    let socket = std::os::fd::AsRawFd::as_raw_fd(&stream);
    let stream = tokio_rustls::TlsConnector::from(tls.client.clone())
        .connect(name, transport(stream))
        .await
        .map_err(|e| format!("TLS handshake failed: {e} (is the server of this cluster, and running TLS?)"))?;
    let proven = proven_peer(stream.get_ref().1.peer_certificates())?;
    if matches!(proven.identity.role, Role::Client | Role::Admin | Role::User) {
        return Err(format!("the server presented a {} certificate ({})", proven.identity.role, proven.identity));
    }
    let (r, w) = tokio::io::split(stream);
    Ok(Secured { reader: Box::new(r), writer: Box::new(w), proven: Some(proven), socket })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::pki::Ca;
    use crate::{NetError, Peer, RpcClient, Service, serve_as};
    use bytes::Bytes;
    use std::time::{Duration, SystemTime};

    fn tls_of(ca: &Ca, role: Role, name: &str, site: &str) -> Arc<Tls> {
        let issued = ca.issue(role, name, site, 1).unwrap();
        Arc::new(
            Tls::from_pem(ca.cert_pem().as_bytes(), issued.cert_pem.as_bytes(), issued.key_pem.as_bytes()).unwrap(),
        )
    }

    /// Answers with the name and role the peer's certificate proved.
    struct WhoAmI;
    impl Service for WhoAmI {
        type Request = ();
        type Reply = Option<(String, Role, String)>;
        async fn handle(self: Arc<Self>, peer: Peer, _: (), _bulk: Bytes) -> (Self::Reply, Bytes) {
            (peer.identity().map(|i| (i.name.clone(), i.role, i.site.clone())), Bytes::new())
        }
    }

    async fn server(tls: Option<Arc<Tls>>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve_as(listener, Arc::new(WhoAmI), crate::Limits::default(), tls));
        addr
    }

    const T: Duration = Duration::from_secs(5);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn both_ends_learn_what_the_other_proved() {
        let ca = Ca::create("test").unwrap();
        let addr = server(Some(tls_of(&ca, Role::Node, "n1", "a"))).await;
        let client =
            RpcClient::connect_as(&addr, 1, T, Some(tls_of(&ca, Role::Client, "alice-host", "b"))).await.unwrap();
        let seen: Option<(String, Role, String)> = client.call(&()).await.unwrap();
        assert_eq!(seen, Some(("alice-host".into(), Role::Client, "b".into())));
        let server = client.server_identity().await.unwrap();
        assert_eq!(server, PeerIdentity { name: "n1".into(), role: Role::Node, site: "a".into() });
        assert!(provider().cipher_suites[0].suite() == rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        // Bulk bytes cross TLS intact, in both directions.
        let data: Vec<u8> = (0..5_000_000u32).map(|i| (i * 7) as u8).collect();
        let (_, back): (Option<(String, Role, String)>, Bytes) =
            client.call_bulk(&(), Bytes::from(data.clone())).await.unwrap();
        assert!(back.is_empty());
    }

    /// The issue's row: `ca revoke Mallory` must cover the certificate named Mallory
    /// (case counts: `mallory` is another name), and a serial in any spelling covers it.
    #[test]
    fn a_revocation_matches_names_as_written_and_serials_in_any_spelling() {
        let ca = Ca::create("test").unwrap();
        let pem = ca.issue(Role::Client, "Mallory", "a", 1).unwrap().cert_pem;
        let der = CertificateDer::pem_slice_iter(pem.as_bytes()).next().unwrap().unwrap();
        let proven = identity_of(&der).unwrap();
        let covers = |entry: &str| revocation_covers(entry, pem.as_bytes()).unwrap();
        assert!(covers("Mallory") && covers("  Mallory  "));
        assert!(!covers("mallory") && !covers("MALLORY") && !covers("Mall"));
        let hex = proven.serial.clone();
        let colons: Vec<String> = format!("{hex:0>width$}", width = hex.len() + hex.len() % 2)
            .as_bytes()
            .chunks(2)
            .map(|b| String::from_utf8(b.to_vec()).unwrap().to_ascii_uppercase())
            .collect();
        for spelling in
            [hex.clone(), hex.to_ascii_uppercase(), format!("0x{hex}"), format!("00{hex}"), colons.join(":")]
        {
            assert!(covers(&spelling), "{spelling}");
        }
        assert!(!covers("0x1234"));
        // The whole DN, in the comma and the slash form, either order.
        assert!(covers(&proven.dn), "{}", proven.dn);
        let parts: Vec<&str> = proven.dn.split(',').map(str::trim).collect();
        assert!(covers(&format!("/{}", parts.join("/"))));
        let mut reversed = parts.clone();
        reversed.reverse();
        assert!(covers(&format!("/{}", reversed.join("/"))));
    }

    async fn refused(addr: &str, tls: Option<Arc<Tls>>) -> NetError {
        match RpcClient::connect_as(addr, 1, T, tls).await {
            Err(e) => e,
            Ok(c) => c.call::<_, Option<(String, Role, String)>>(&()).await.expect_err("the server answered"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn strangers_plaintext_and_clients_posing_as_servers_are_refused() {
        let ca = Ca::create("test").unwrap();
        let other = Ca::create("other").unwrap();
        let addr = server(Some(tls_of(&ca, Role::Meta, "meta", "a"))).await;
        let e = refused(&addr, Some(tls_of(&other, Role::Client, "mallory", "a"))).await;
        assert!(matches!(e, NetError::Refused { .. } | NetError::Disconnected { .. }), "{e}");
        let e = refused(&addr, None).await;
        assert!(matches!(e, NetError::Disconnected { .. }), "plaintext: {e}");
        // A server with a client certificate is refused by the caller.
        let fake = server(Some(tls_of(&ca, Role::Client, "fake-node", "a"))).await;
        let e = refused(&fake, Some(tls_of(&ca, Role::Client, "c", "a"))).await;
        assert!(matches!(&e, NetError::Refused { reason, .. } if reason.contains("server authentication")), "{e}");
        // A TLS caller is refused by a plaintext server (and told so).
        let plain = server(None).await;
        let e = refused(&plain, Some(tls_of(&ca, Role::Client, "c", "a"))).await;
        assert!(matches!(e, NetError::Refused { .. } | NetError::Disconnected { .. }), "{e}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_expired_certificate_is_refused() {
        let ca = Ca::create("test").unwrap();
        let addr = server(Some(tls_of(&ca, Role::Node, "n1", "a"))).await;
        let day = Duration::from_secs(86400);
        let old = ca.issue_between(Role::Client, "old", "a", SystemTime::now() - 3 * day, day, &[]).unwrap();
        let tls = Tls::from_pem(ca.cert_pem().as_bytes(), old.cert_pem.as_bytes(), old.key_pem.as_bytes()).unwrap();
        let e = refused(&addr, Some(Arc::new(tls))).await;
        assert!(matches!(e, NetError::Refused { .. } | NetError::Disconnected { .. }), "{e}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn revoking_a_name_drops_its_live_connections_and_refuses_new_ones() {
        let ca = Ca::create("test").unwrap();
        let addr = server(Some(tls_of(&ca, Role::Node, "n1", "a"))).await;
        let doomed =
            RpcClient::connect_as(&addr, 1, T, Some(tls_of(&ca, Role::Client, "revoke-me", "a"))).await.unwrap();
        let fine = RpcClient::connect_as(&addr, 1, T, Some(tls_of(&ca, Role::Client, "keep-me", "a"))).await.unwrap();
        let _: Option<(String, Role, String)> = doomed.call(&()).await.unwrap();
        let _: Option<(String, Role, String)> = fine.call(&()).await.unwrap();
        assert!(set_revoked(["revoke-me".to_string()]) >= 1);
        let again = refused(&addr, Some(tls_of(&ca, Role::Client, "revoke-me", "a"))).await;
        assert!(matches!(again, NetError::Refused { .. } | NetError::Disconnected { .. }), "{again}");
        let _: Option<(String, Role, String)> = fine.call(&()).await.unwrap();
        set_revoked(Vec::new());
    }

    /// Bounded stand-in for the `certificate` fuzz target, run by `cargo test`:
    /// arbitrary bytes and mutated real certificates never panic the parser.
    #[test]
    fn certificate_parsing_never_panics_on_mutated_input() {
        let ca = Ca::create("fuzz").unwrap();
        let issued = ca.issue(Role::Node, "n1", "a", 1).unwrap();
        let der = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).unwrap().to_vec();
        assert_eq!(PeerIdentity::from_der(&der).unwrap().name, "n1");
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..3000 {
            let mut m = der.clone();
            for _ in 0..(next() % 8 + 1) {
                let at = next() as usize % m.len();
                m[at] = next() as u8;
            }
            m.truncate(next() as usize % (m.len() + 1));
            let _ = PeerIdentity::from_der(&m);
            let junk: Vec<u8> = (0..next() % 64).map(|_| next() as u8).collect();
            let _ = PeerIdentity::from_der(&junk);
            let _ = parse_role_uri(&String::from_utf8_lossy(&junk));
        }
    }

    #[test]
    fn role_uris_round_trip_and_reject_junk() {
        let (role, site) = parse_role_uri(&role_uri(Role::Node, "site-a")).unwrap().unwrap();
        assert_eq!((role, site.as_str()), (Role::Node, "site-a"));
        let (role, _) = parse_role_uri(&role_uri(Role::Admin, "a")).unwrap().unwrap();
        assert_eq!(role, Role::Admin);
        assert!(parse_role_uri("https://example.org").is_none());
        for bad in ["locus:", "locus:node", "locus:node/", "locus:root/a", "locus:node/a/b", "locus:node/ä"] {
            assert!(matches!(parse_role_uri(bad), Some(Err(_))), "{bad}");
        }
    }
}
