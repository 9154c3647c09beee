//! `locus nbd`: files of the namespace served as network block devices. Opens each
//! export through the client library, takes its lock (so another server, at any site,
//! cannot write the same file at once), and runs `nbd::Server` until a signal; then
//! commits and closes every export.

use crate::cli::{ExportSpec, NbdArgs};
use crate::roles::{StopSignals, bind_flag, client_config};
use anyhow::{Context, bail};
use client::{Client, OpenFile, OpenMode};
use proto::error::ErrorCode;
use proto::meta::AllocateMode;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub async fn serve(args: NbdArgs) -> anyhow::Result<ExitCode> {
    let mut stop = StopSignals::new()?;
    let tls = if args.plain {
        let loopback = args.listen.parse::<std::net::SocketAddr>().is_ok_and(|a| a.ip().is_loopback());
        if !loopback {
            bail!(
                "--plain serves NBD without TLS, to anybody who reaches the port: it is allowed only on a loopback \
                 address (--listen 127.0.0.1:PORT), not on {}",
                args.listen
            );
        }
        None
    } else {
        Some(net::server_config().context(
            "locus nbd serves NBD over TLS with this process's certificate: give --ca, --cert and --key (a \
             certificate issued with `locus ca issue --host` naming the address clients dial), or --plain on a \
             loopback address",
        )?)
    };
    for (i, spec) in args.exports.iter().enumerate() {
        if args.exports[..i].iter().any(|e| e.name == spec.name) {
            bail!("two exports are named {:?}: a client could reach only one of them", spec.name);
        }
    }
    let listener = bind_flag(&args.listen, "locus nbd", Some("--listen")).await?;
    let addr = listener.local_addr()?;
    let purpose = format!("nbd {addr}");
    let config = client_config(args.meta.clone(), args.site.clone(), purpose, &args.tuning);
    let client = Client::connect(config).await.with_context(|| format!("cannot reach meta at {}", args.meta))?;
    let mut exports = Vec::new();
    for spec in &args.exports {
        let file = open_export(&client, spec, &args).await.with_context(|| format!("export {}", spec.name))?;
        exports.push(file);
    }
    let names: Vec<String> =
        exports.iter().map(|e| format!("{}={} ({} bytes)", e.name, e.description, e.size)).collect();
    // Tools and tests read this line to learn the address (the port may be 0 = any).
    println!(
        "locus nbd listening on {addr} ({}): {}",
        if tls.is_some() { "TLS" } else { "plain, loopback" },
        names.join(", ")
    );
    let server = Arc::new(nbd::Server::new(exports, tls));
    server.clone().serve(listener, stop.recv()).await;
    let exports = server.exports();
    drop(server);
    let mut failed = false;
    for export in exports {
        // Everything the clients wrote is made durable, even when a connection dropped
        // after the stop's grace still holds the export (and it cannot be closed).
        let (name, synced) = (export.name.clone(), export.file.fsync().await);
        let closed = match Arc::into_inner(export) {
            Some(mut export) => export.file.close().await,
            None => Ok(()),
        };
        if let Err(e) = synced.and(closed) {
            eprintln!("locus nbd: export {name}: {e}");
            failed = true;
        }
    }
    client.shutdown().await;
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// Opens (and with `size=` creates or grows) an export's file and takes its lock.
async fn open_export(client: &Client, spec: &ExportSpec, args: &NbdArgs) -> anyhow::Result<nbd::Export> {
    let how = OpenMode { read: true, write: !spec.read_only, create: spec.size.is_some(), ..OpenMode::default() };
    let file = client.open(&spec.path, how, 0o600).await.with_context(|| format!("cannot open {}", spec.path))?;
    let mut size = file.size().await?;
    match spec.size {
        Some(wanted) if wanted < size => bail!(
            "{} is {size} bytes, more than size={wanted}: serving a device never shrinks it (truncate the file \
             first if that is meant)",
            spec.path
        ),
        Some(wanted) => {
            file.allocate(0, wanted, AllocateMode::Extend).await?;
            size = wanted;
        }
        None if size == 0 => bail!("{} is empty: give size=SIZE to make it a device of that size", spec.path),
        None => {}
    }
    if !args.shared {
        take_lock(&file, spec, args.lock_wait).await?;
    }
    Ok(nbd::Export { name: spec.name.clone(), description: spec.path.clone(), file, size, read_only: spec.read_only })
}

/// The export's lock on its whole file (shared when read-only), waited for up to
/// `wait`: a server killed moments ago holds it until its session expires.
async fn take_lock(file: &OpenFile, spec: &ExportSpec, wait: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + wait;
    let mut told = false;
    loop {
        match file.lock_whole(!spec.read_only).await {
            Ok(()) => return Ok(()),
            Err(e) if e.code == ErrorCode::WouldBlock && Instant::now() < deadline => {
                if !told {
                    eprintln!(
                        "locus nbd: {} is locked by another server of it; waiting up to {wait:?} (a killed one's \
                         lock goes when its session expires)",
                        spec.path
                    );
                    told = true;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) if e.code == ErrorCode::WouldBlock => bail!(
                "{} is served by another `locus nbd` (it holds the file's lock, at this site or another): stop \
                 that one, or pass --shared to serve it from both at once",
                spec.path
            ),
            Err(e) => return Err(e).context("cannot lock the file"),
        }
    }
}
