//! `locus doctor`: checks a host before (or while) it runs a Locus role — FUSE, its
//! certificates, the ports it listens on, its database, meta's reachability and the
//! clock against meta's — and says what to fix. What to check comes from the flags and
//! from every table of the config file (`listen`, `meta_listen`, `node_listen`, `db`,
//! `read_db`, `meta`, `ca`, `cert`, `key`), so `locus doctor --config /etc/locus/locus.toml` checks all the host runs.

use crate::cli::{DoctorArgs, TlsArgs};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Ok,
    Warn,
    Fail,
}

/// One check's outcome: what was checked, what was found, and what to do about it.
struct Finding {
    level: Level,
    what: String,
    said: String,
}

fn found(level: Level, what: impl Into<String>, said: impl Into<String>) -> Finding {
    Finding { level, what: what.into(), said: said.into() }
}

/// A certificate expiring sooner than this is worth a warning.
const RENEW_WITHIN: Duration = Duration::from_secs(30 * 86_400);
/// Clocks further apart than this upset sessions and leases.
const SKEW_WARN_MS: i64 = 1_000;
const SKEW_FAIL_MS: i64 = 30_000;

/// What the host is configured to run, gathered from flags and the config file.
#[derive(Default, Debug, PartialEq, Eq)]
struct Targets {
    metas: Vec<String>,
    listens: Vec<String>,
    databases: Vec<String>,
    certificates: Vec<(PathBuf, PathBuf, PathBuf)>,
}

/// The checks `args` and the config file at `config` ask for.
fn targets(args: &DoctorArgs, tls: &TlsArgs, config: Option<&str>) -> Result<Targets, String> {
    let mut t = Targets {
        metas: args.meta.clone(),
        listens: args.listen.clone(),
        databases: args.db.clone(),
        certificates: Vec::new(),
    };
    if let (Some(ca), Some(cert), Some(key)) = (&tls.ca, &tls.cert, &tls.key) {
        t.certificates.push((ca.clone(), cert.clone(), key.clone()));
    }
    let Some(text) = config else { return Ok(t) };
    let table: toml::Table = toml::from_str(text).map_err(|e| format!("not valid TOML: {e}"))?;
    for (_, section) in table.iter().filter_map(|(name, v)| v.as_table().map(|t| (name, t))) {
        let strings = |key: &str| -> Vec<String> {
            match section.get(key) {
                Some(toml::Value::String(s)) => vec![s.clone()],
                Some(toml::Value::Array(items)) => items.iter().filter_map(|i| i.as_str().map(String::from)).collect(),
                _ => Vec::new(),
            }
        };
        let add = |to: &mut Vec<String>, found: Vec<String>| {
            for value in found {
                if !to.contains(&value) {
                    to.push(value);
                }
            }
        };
        add(&mut t.metas, strings("meta"));
        add(&mut t.listens, [strings("listen"), strings("meta_listen"), strings("node_listen")].concat());
        add(&mut t.databases, [strings("db"), strings("read_db")].concat());
        if let ([ca], [cert], [key]) = (&strings("ca")[..], &strings("cert")[..], &strings("key")[..]) {
            let files = (PathBuf::from(ca), PathBuf::from(cert), PathBuf::from(key));
            if !t.certificates.contains(&files) {
                t.certificates.push(files);
            }
        }
    }
    Ok(t)
}

pub async fn run(args: DoctorArgs, tls: TlsArgs, config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let text = match config {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read config file {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let t = targets(&args, &tls, text.as_deref()).map_err(|e| anyhow::anyhow!("config file: {e}"))?;
    // Meta is reached with the certificate given, else the first of the config's; one
    // that does not load is among the findings, not the end.
    let own = match (&tls, t.certificates.first()) {
        (tls, _) if tls.insecure_no_tls || tls.cert.is_some() => Some(tls.clone()),
        (_, Some((ca, cert, key))) => {
            Some(TlsArgs { ca: Some(ca.clone()), cert: Some(cert.clone()), key: Some(key.clone()), ..tls.clone() })
        }
        (_, None) => None,
    };
    if let Some(own) = own
        && let Err(e) = crate::pki::install(&own, "locus doctor")
    {
        tracing::debug!("the doctor's own certificate: {e:#}");
    }
    let mut findings = vec![fuse()];
    for (ca, cert, key) in &t.certificates {
        findings.push(certificate(ca, cert, key));
    }
    for addr in &t.listens {
        findings.push(port(addr).await);
    }
    for url in &t.databases {
        let url = url.clone();
        findings.push(
            tokio::task::spawn_blocking(move || database(&url))
                .await
                .unwrap_or_else(|e| found(Level::Fail, "database", e.to_string())),
        );
    }
    for addr in &t.metas {
        findings.extend(meta(addr, args.timeout).await);
    }
    let worst = findings.iter().map(|f| f.level).max().unwrap_or(Level::Ok);
    for f in &findings {
        let label = match f.level {
            Level::Ok => "ok  ",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        };
        println!("{label}  {}: {}", f.what, f.said);
    }
    let problems = findings.iter().filter(|f| f.level != Level::Ok).count();
    println!(
        "{}",
        match problems {
            0 => "nothing to fix".to_string(),
            n => format!("{n} thing(s) to look at"),
        }
    );
    // As fsck: 1 when something is wrong, 3 when there is only something to watch.
    Ok(match worst {
        Level::Ok => ExitCode::SUCCESS,
        Level::Warn => ExitCode::from(3),
        Level::Fail => ExitCode::from(1),
    })
}

/// Mounts need /dev/fuse (read-write) and, to be unmounted by their users, fusermount3.
fn fuse() -> Finding {
    let device = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse");
    let helper = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("fusermount3"))
        .find(|p| p.exists());
    match (device, helper) {
        (Err(e), _) => found(
            Level::Fail,
            "FUSE",
            format!("/dev/fuse cannot be opened read-write ({e}): `modprobe fuse`, install fuse3, run mounts as root"),
        ),
        (Ok(_), None) => found(Level::Warn, "FUSE", "/dev/fuse opens, but fusermount3 is not on PATH: install fuse3"),
        (Ok(_), Some(p)) => found(Level::Ok, "FUSE", format!("/dev/fuse opens read-write; {}", p.display())),
    }
}

/// A process's certificate files, as its peers will check them.
fn certificate(ca: &Path, cert: &Path, key: &Path) -> Finding {
    let what = format!("certificate {}", cert.display());
    let (checked, expires) = net::Tls::check_files(ca, cert, key);
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs() as i64;
    let left = expires.map(|at| at - now);
    let fix = "issue a new one: `locus ca issue --role ROLE --name NAME --site SITE --dir DIR`";
    match (checked, left) {
        (_, Some(left)) if left <= 0 => {
            found(Level::Fail, what, format!("expired {} ago: {fix}", human_duration((-left) as u64)))
        }
        (Err(e), _) => found(Level::Fail, what, format!("{e}: {fix} (or point --ca at the CA that issued it)")),
        (Ok(who), Some(left)) if (left as u64) < RENEW_WITHIN.as_secs() => found(
            Level::Warn,
            what,
            format!("{who}, accepted under {}, expires in {}: {fix}", ca.display(), human_duration(left as u64)),
        ),
        (Ok(who), left) => found(
            Level::Ok,
            what,
            format!(
                "{who}, accepted under {}{}",
                ca.display(),
                left.map(|l| format!(", valid {} more", human_duration(l as u64))).unwrap_or_default()
            ),
        ),
    }
}

/// An address this host's role listens on must be free (before the role starts).
async fn port(addr: &str) -> Finding {
    let what = format!("listen {addr}");
    match tokio::net::TcpListener::bind(addr).await {
        Ok(_) => found(Level::Ok, what, "free"),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => found(
            Level::Warn,
            what,
            "in use: by this role if it runs already, else another program holds it (`ss -ltnp`)",
        ),
        Err(e) => found(Level::Fail, what, format!("cannot be bound ({e}): is the address this host's?")),
    }
}

/// A database meta is configured with: reachable, and formatted by Locus.
fn database(url: &str) -> Finding {
    match meta::probe_database(url, Duration::from_secs(5)) {
        Ok(said) => found(Level::Ok, "database", said),
        Err(e) => found(Level::Fail, "database", e.to_string()),
    }
}

/// Meta at `addr`: reachable and accepting this host's certificate, its round trip,
/// and the clocks' difference.
async fn meta(addr: &str, timeout: Duration) -> Vec<Finding> {
    let what = format!("meta {addr}");
    let asked = async {
        let link = net::RpcClient::connect(addr, 1, timeout).await?;
        let sent = SystemTime::now();
        let t0 = Instant::now();
        let status = link.ask(proto::meta::Status {}).await?;
        Ok::<_, net::NetError>((status, sent, t0.elapsed()))
    };
    let (status, sent, rtt) = match tokio::time::timeout(timeout, asked).await {
        Ok(Ok((Ok(status), sent, rtt))) => (status, sent, rtt),
        Ok(Ok((Err(refused), _, _))) => {
            return vec![found(Level::Fail, what, format!("answers, but refused: {refused}"))];
        }
        Ok(Err(e)) => {
            return vec![found(
                Level::Fail,
                what,
                format!("unreachable ({e}): is it running, is the address right, does a firewall drop it?"),
            )];
        }
        Err(_) => return vec![found(Level::Fail, what, format!("no answer within {timeout:?}"))],
    };
    // Meta's clock read halfway through the round trip, against ours then.
    let ours = sent + rtt / 2;
    let ours_ms = ours.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_millis() as i64;
    let skew = status.now_ms - ours_ms;
    let clock = format!(
        "meta's clock is {:.3} s {} this host's",
        skew.abs() as f64 / 1000.0,
        if skew >= 0 { "ahead of" } else { "behind" }
    );
    let clock_level = match skew.abs() {
        s if s > SKEW_FAIL_MS => Level::Fail,
        s if s > SKEW_WARN_MS => Level::Warn,
        _ => Level::Ok,
    };
    let fix = if clock_level == Level::Ok {
        String::new()
    } else {
        ": run NTP (chrony, systemd-timesyncd) on both hosts; sessions and leases assume clocks within a second".into()
    };
    vec![
        found(
            Level::Ok,
            what.clone(),
            format!(
                "answers in {:.1} ms, cluster {}, {} node(s)",
                rtt.as_secs_f64() * 1000.0,
                status.cluster_id,
                status.nodes.len()
            ),
        ),
        found(clock_level, format!("clock against {what}"), format!("{clock}{fix}")),
    ]
}

/// A duration in the largest unit that keeps it readable: "3 days", "5 h", "40 min".
fn human_duration(secs: u64) -> String {
    match secs {
        s if s >= 2 * 86_400 => format!("{} days", s / 86_400),
        s if s >= 2 * 3_600 => format!("{} h", s / 3_600),
        s if s >= 120 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_to_check_comes_from_flags_and_every_table_of_the_config() {
        let args = DoctorArgs { meta: vec!["m:1".into()], ..DoctorArgs::default() };
        let tls = TlsArgs {
            ca: Some("ca.pem".into()),
            cert: Some("me.pem".into()),
            key: Some("me.key".into()),
            ..TlsArgs::default()
        };
        let config = r#"
[meta]
listen = "10.0.0.1:7070"
db = "postgres://locus@10.0.0.1/locus"
ca = "/etc/locus/ca.pem"
cert = "/etc/locus/meta.pem"
key = "/etc/locus/meta.key"
[node]
listen = "10.0.0.1:7071"
meta = "m:1"
[mount]
meta = "m:2"
[up]
meta_listen = "127.0.0.1:7070"
"#;
        let t = targets(&args, &tls, Some(config)).unwrap();
        assert_eq!(t.metas, ["m:1", "m:2"]);
        assert_eq!(t.listens, ["10.0.0.1:7070", "10.0.0.1:7071", "127.0.0.1:7070"]);
        assert_eq!(t.databases, ["postgres://locus@10.0.0.1/locus"]);
        assert_eq!(t.certificates.len(), 2);
        assert!(targets(&args, &tls, Some("[meta")).unwrap_err().contains("TOML"));
        assert_eq!(human_duration(3 * 86_400 + 5), "3 days");
        assert_eq!(human_duration(59), "59 s");
    }
}
