//! Certificates for the binary: the `locus ca` commands, the set-up `locus up` makes
//! in its data directory on first start, and installing this process's TLS (or the
//! explicit, loudly warned `--insecure-no-tls`) before any connection.

use crate::cli::{CaCommand, IssueArgs, TlsArgs};
use anyhow::{Context, bail};
use net::Role;
use net::pki::{CA_CERT, CA_KEY, Ca};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The revocation list's file name in a CA directory.
pub const REVOKED: &str = "revoked";

/// Runs `locus ca ...`.
pub fn command(cmd: CaCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        CaCommand::Init { dir, name } => {
            Ca::init(&dir, &name)?;
            println!("CA created: {} (keep {} secret)", dir.join(CA_CERT).display(), dir.join(CA_KEY).display());
        }
        CaCommand::Issue(args) => {
            let (cert, key) = issue(&args)?;
            println!("issued {} {} of site {}: {} {}", args.role, args.name, args.site, cert.display(), key.display());
        }
        CaCommand::Revoke { dir, entries } => {
            let path = dir.join(REVOKED);
            let issued = issued_certificates(&dir);
            let mut list = std::fs::read_to_string(&path).unwrap_or_default();
            for e in &entries {
                list.push_str(e.trim());
                list.push('\n');
            }
            net::pki::write_file(&path, &list, false)?;
            println!("{} now lists {} revoked certificates or names", path.display(), read_revoked(&path).len());
            for e in &entries {
                let covered: Vec<&str> = issued
                    .iter()
                    .filter(|(_, pem)| net::revocation_covers(e, pem).unwrap_or(false))
                    .map(|(file, _)| file.as_str())
                    .collect();
                if covered.is_empty() {
                    let near: Vec<String> = issued
                        .iter()
                        .filter_map(|(_, pem)| net::certificate_name(pem).ok())
                        .filter(|name| name.eq_ignore_ascii_case(e.trim()))
                        .collect();
                    eprintln!(
                        "warning: {e:?} matches no certificate issued in {}{} (names and DNs are matched exactly, \
                         case included; serials in hex); it is listed anyway, for certificates issued elsewhere",
                        dir.display(),
                        if near.is_empty() {
                            String::new()
                        } else {
                            format!(" (differing only in case: {})", near.join(", "))
                        }
                    );
                } else {
                    println!("{e:?} covers {}", covered.join(", "));
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn issue(args: &IssueArgs) -> anyhow::Result<(PathBuf, PathBuf)> {
    let (cert, key) = match (&args.ca_cert, &args.ca_key) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        _ => (args.dir.join(CA_CERT), args.dir.join(CA_KEY)),
    };
    let ca = Ca::load(&cert, &key).with_context(|| format!("cannot use the CA {}", cert.display()))?;
    let issued = ca.issue_for_hosts(args.role, &args.name, &args.site, args.days, &args.hosts)?;
    let out = args.out.clone().unwrap_or_else(|| args.dir.clone());
    Ok(issued.write(&out, &args.name)?)
}

/// The certificates `ca issue` wrote into a CA directory (every `*.pem` but the CA's
/// own), by file name, with their PEM text.
fn issued_certificates(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name() != CA_CERT && e.path().extension().is_some_and(|x| x == "pem"))
        .filter_map(|e| Some((e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).ok()?)))
        .collect();
    out.sort();
    out
}

/// Reads a revocation list: one serial (hex) or name a line; `#` starts a comment.
pub fn read_revoked(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// The CA and certificates `locus up` keeps in `DATA_DIR/tls`, made on first start:
/// one certificate for the process (a node certificate named after the embedded node:
/// the process is meta, node and mount at once) and one for the admin commands run
/// beside it (node role: `gc` and `fsck` list and delete chunks on nodes).
pub struct LocalPki {
    /// The directory.
    pub dir: PathBuf,
}

/// The embedded node's id, and the name of the process's certificate.
pub const LOCAL_NODE: &str = "local";
/// The certificate admin commands use against a `locus up` cluster.
const LOCAL_ADMIN: &str = "admin";
/// The site of a `locus up` cluster.
pub const LOCAL_SITE: &str = "default";

impl LocalPki {
    /// Opens, or on first start creates, the set-up in `data_dir/tls`.
    pub fn ensure(data_dir: &Path) -> anyhow::Result<LocalPki> {
        let dir = data_dir.join("tls");
        let pki = LocalPki { dir };
        if !pki.dir.join(CA_CERT).exists() {
            let ca = Ca::init(&pki.dir, "Locus local CA").context("cannot create the local CA")?;
            ca.issue(Role::Node, LOCAL_NODE, LOCAL_SITE, 3650)?.write(&pki.dir, LOCAL_NODE)?;
            ca.issue(Role::Admin, LOCAL_ADMIN, LOCAL_SITE, 3650)?.write(&pki.dir, LOCAL_ADMIN)?;
            tracing::info!("made a CA and certificates in {}", pki.dir.display());
        }
        Ok(pki)
    }

    /// The TLS arguments of the `up` process itself.
    pub fn process(&self) -> TlsArgs {
        self.args(LOCAL_NODE)
    }

    /// The TLS arguments of admin commands.
    pub fn admin(&self) -> TlsArgs {
        self.args(LOCAL_ADMIN)
    }

    fn args(&self, stem: &str) -> TlsArgs {
        TlsArgs {
            ca: Some(self.dir.join(CA_CERT)),
            cert: Some(self.dir.join(format!("{stem}.pem"))),
            key: Some(self.dir.join(format!("{stem}.key"))),
            insecure_no_tls: false,
        }
    }
}

/// Installs this process's security from `args`; `what` names the command for the
/// error that says how to get certificates.
pub fn install(args: &TlsArgs, what: &str) -> anyhow::Result<()> {
    if args.insecure_no_tls {
        tracing::warn!(
            "RUNNING WITHOUT TLS (--insecure-no-tls): nothing is encrypted and anybody who can reach these \
             ports can read, change and delete every file and act as any node"
        );
        eprintln!("locus: WARNING: running without TLS (--insecure-no-tls); use only on a closed test network");
        net::secure(net::Security::Insecure);
        return Ok(());
    }
    let (Some(ca), Some(cert), Some(key)) = (&args.ca, &args.cert, &args.key) else {
        bail!(
            "{what} needs a certificate: pass --ca, --cert and --key (or LOCUS_CA, LOCUS_CERT, LOCUS_KEY); make \
             them with `locus ca init` and `locus ca issue`, or run with --insecure-no-tls on a closed test network"
        );
    };
    let tls = net::Tls::load(ca, cert, key)?;
    tracing::info!(identity = %tls.identity(), "TLS: this process is {}", tls.identity());
    net::secure(net::Security::Tls(std::sync::Arc::new(tls)));
    Ok(())
}
