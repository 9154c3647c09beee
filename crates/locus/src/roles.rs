//! The long-running roles: meta, node, mount, and `up` which embeds all three.

use crate::cli::{ClientTuning, LostArgs, MetaArgs, MigrateArgs, MountArgs, NodeArgs, PromoteArgs, TlsArgs, UpArgs};
use crate::local::LocalCluster;
use crate::pki::{LOCAL_NODE, LOCAL_SITE, LocalPki};
use anyhow::{Context, anyhow, bail};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

async fn bind(addr: &str, what: &str) -> anyhow::Result<TcpListener> {
    bind_flag(addr, what, None).await
}

/// Binds `addr`; when the address is taken, the error names the `flag` that changes it.
pub(crate) async fn bind_flag(addr: &str, what: &str, flag: Option<&str>) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| match flag {
        Some(flag) if e.kind() == std::io::ErrorKind::AddrInUse => anyhow!(
            "{what} cannot listen on {addr}: the port is taken (another `locus up`?); choose another address with {flag}"
        ),
        _ => anyhow!(e).context(format!("{what} cannot listen on {addr}")),
    })
}

/// Resolves `~/` against $HOME.
fn expand_home(p: &str) -> PathBuf {
    match (p.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => Path::new(&home).join(rest),
        _ => PathBuf::from(p),
    }
}

/// How often meta tells clients to heartbeat.
const HEARTBEAT: Duration = Duration::from_secs(2);

/// Each site's identity map file and the sites whose root is trusted.
type IdentityConfig = (Vec<(String, PathBuf)>, Vec<String>);

/// Starts meta on `listener` over the database `config` names (formatting a new one
/// with `init`) with the sites' identity maps, admits the node ids `admit`; returns
/// the address clients use.
async fn start_meta(
    listener: TcpListener,
    config: meta::MetaConfig,
    (maps, no_root_squash): IdentityConfig,
    revoked: Option<PathBuf>,
    admit: &[String],
) -> anyhow::Result<(String, Arc<meta::MetaService>)> {
    let addr = listener.local_addr()?.to_string();
    let service = tokio::task::spawn_blocking(move || {
        let service = meta::MetaService::open(&config)?;
        service.configure_identities(maps, no_root_squash)?;
        Ok::<_, meta::MetaError>(service)
    })
    .await??;
    tracing::info!(cluster = service.cluster_id(), "meta opened its database");
    service.admit_nodes(admit).await.context("cannot admit the nodes named by --admit-node")?;
    service.spawn_background();
    if let Some(path) = revoked {
        service.watch_revocations(path);
    }
    tokio::spawn(net::serve(listener, service.clone()));
    Ok((addr, service))
}

/// Meta in the mount's process (`locus up`), which the client calls directly.
struct InProcessMeta(meta::InProcessClient);

impl client::InProcessMeta for InProcessMeta {
    fn call(&self, call: proto::meta::MetaCall) -> client::InProcessAnswer<'_> {
        Box::pin(self.0.call(call))
    }
}

/// `locus meta promote`: makes a PostgreSQL standby the primary of a new epoch and
/// prints what it did (the failover drill reads the epoch and the time).
pub async fn promote(args: PromoteArgs) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    let done = tokio::task::spawn_blocking(move || meta::promote(&args.db)).await??;
    println!(
        "promoted: epoch {} (was standby: {}; waited {} ms for the old leases; {} ms in all); restart the metas \
         with --db at this server",
        done.epoch,
        done.was_standby,
        done.waited_for_leases.as_millis(),
        started.elapsed().as_millis()
    );
    // What a failover from an asynchronous standby loses, for the operator to tell.
    if let Some((at, lsn)) = &done.replayed {
        println!(
            "the standby had replayed every commit up to {at} (log position {lsn}): under asynchronous \
             replication, writes the lost primary acknowledged after that are lost (once its server is back, \
             `locus meta lost --old URL --new URL` lists them); under sync, none was"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `locus meta lost`: what a failover from an asynchronous standby lost, path by path.
pub async fn lost(args: LostArgs) -> anyhow::Result<ExitCode> {
    let found = tokio::task::spawn_blocking(move || meta::lost(&args.old, &args.new, args.since_ms)).await??;
    println!(
        "failover point: the promoted standby had replayed every commit up to {} UTC",
        crate::admin::utc(found.since_ms)
    );
    for change in &found.changes {
        println!("lost  {}  {}", change.path, change.what);
    }
    if found.changes.is_empty() {
        println!("nothing the old primary acknowledged after it is missing");
        return Ok(ExitCode::SUCCESS);
    }
    println!("{} change(s) acknowledged at the old primary are missing at the promoted one", found.changes.len());
    Ok(ExitCode::from(3))
}

/// `locus meta migrate`: copies a SQLite namespace into an empty PostgreSQL database
/// and prints each table's row count (checked equal on both sides).
pub async fn migrate(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let copied = tokio::task::spawn_blocking(move || meta::migrate(&args.from, &args.to)).await??;
    for (table, rows) in &copied {
        println!("{table}: {rows} rows");
    }
    println!("migrated {} tables; start meta with the new --db", copied.len());
    Ok(ExitCode::SUCCESS)
}

/// The value of `--read-db` or `--forward-writes-to` for `home` (`None`: the root's).
fn for_home(values: &[(Option<String>, String)], home: Option<&String>) -> Option<String> {
    values.iter().find(|(name, _)| name.as_ref() == home).map(|(_, value)| value.clone())
}

/// The sites `--site-db`, `--site-read-db` and `--site-meta` name, each once per flag.
fn sites(args: &MetaArgs) -> anyhow::Result<Vec<meta::SiteConfig>> {
    let mut sites: Vec<meta::SiteConfig> = Vec::new();
    let flags = [
        ("--site-db", &args.sites.site_dbs),
        ("--site-read-db", &args.sites.site_read_dbs),
        ("--site-meta", &args.sites.site_metas),
    ];
    for (flag, values) in flags {
        for (site, value) in values {
            let i = match sites.iter().position(|s| &s.name == site) {
                Some(i) => i,
                None => {
                    sites.push(meta::SiteConfig { name: site.clone(), ..Default::default() });
                    sites.len() - 1
                }
            };
            let slot = match flag {
                "--site-db" => &mut sites[i].db_url,
                "--site-read-db" => &mut sites[i].read_db_url,
                _ => &mut sites[i].meta,
            };
            anyhow::ensure!(slot.replace(value.clone()).is_none(), "{flag} is given twice for site {site}");
        }
    }
    Ok(sites)
}

pub async fn meta(args: MetaArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(!args.db_timeout.is_zero(), "--db-timeout must be longer than 0, e.g. 30s");
    if let Some(rpo) = args.metadata_rpo {
        anyhow::ensure!(
            args.primary_lease_ms > 0 && args.db.starts_with("postgres"),
            "--metadata-rpo {rpo:?} needs a PostgreSQL --db and a lease (--primary-lease-ms > 0): it is watched \
             by the lease's renewals"
        );
        anyhow::ensure!(
            !rpo.is_zero(),
            "--metadata-rpo must be more than 0 (for no loss at all, replicate synchronously)"
        );
    }
    for (flag, values) in [("--read-db", &args.read_db), ("--forward-writes-to", &args.forward_writes_to)] {
        for (i, (name, value)) in values.iter().enumerate() {
            let home = name.as_deref().unwrap_or(meta::ROOT_HOME);
            anyhow::ensure!(
                values[..i].iter().all(|(other, _)| other != name),
                "{flag} is given twice for home {home}"
            );
            if let Some(name) = name {
                anyhow::ensure!(
                    args.homes.iter().any(|(home, _)| home == name),
                    "{flag} {name}={value} names no home of this meta: give it --home {name}=URL too"
                );
            }
        }
    }
    let listener = bind(&args.listen, "meta").await?;
    let identities = (args.identity_maps.clone(), args.no_root_squash.clone());
    let expiry = Duration::from_secs(args.session_expiry_secs);
    let lease = (args.primary_lease_ms > 0).then(|| Duration::from_millis(args.primary_lease_ms));
    let config = meta::MetaConfig {
        db_url: args.db.clone(),
        read_db_url: for_home(&args.read_db, None),
        init: args.init,
        heartbeat: HEARTBEAT,
        session_expiry: expiry,
        primary_lease: lease,
        metadata_rpo: args.metadata_rpo,
        db_timeout: args.db_timeout,
        audit_log: args.audit_log.clone(),
        root_policy: None,
        forward_writes_to: for_home(&args.forward_writes_to, None),
        homes: args
            .homes
            .iter()
            .map(|(name, url)| meta::HomeConfig {
                name: name.clone(),
                db_url: url.clone(),
                read_db_url: for_home(&args.read_db, Some(name)),
                forward_writes_to: for_home(&args.forward_writes_to, Some(name)),
            })
            .collect(),
        sites: sites(&args)?,
        site: args.sites.site.clone(),
        auto_move: meta::AutoMove {
            after: args.sites.auto_move_after,
            share_percent: args.sites.auto_move_share,
            min_writes: args.sites.auto_move_min_writes,
            hold: args.sites.auto_move_hold,
        },
    };
    let (addr, service) = start_meta(listener, config, identities, args.revoked.clone(), &args.admit_nodes).await?;
    service.configure_user_auth(meta::authority::UserAuth {
        token_sites: args.user_auth.clone(),
        host_ids: args.host_ids.iter().cloned().collect(),
    });
    // Tools and tests read this line to learn the address (the port may be 0 = any).
    println!("locus meta listening on {addr}");
    tracing::info!("meta serving on {addr} with database {}", args.db);
    wait_for_signal().await;
    Ok(ExitCode::SUCCESS)
}

fn node_config(args: &NodeArgs, advertise: String) -> node::NodeConfig {
    node::NodeConfig {
        id: args.id.clone().unwrap_or_else(|| advertise.clone()),
        site: args.site.clone(),
        data_dir: args.data_dir.clone().unwrap_or_default(),
        capacity_bytes: args.capacity,
        meta_addr: args.meta.clone(),
        advertise_addr: advertise,
        heartbeat: Duration::from_secs(2),
        wan: node::WanConfig {
            cache_bytes: args.cache,
            connections: args.wan_connections.map(|n| n.max(1)),
            connections_to: args.wan_connections_to.clone(),
            path_rate: args.wan_rate,
            ..node::WanConfig::default()
        },
        reclaim: node::ReclaimConfig {
            high_water: args.reclaim_above.clamp(0.0, 100.0) / 100.0,
            grace: args.reclaim_grace,
            ..node::ReclaimConfig::default()
        },
        replication: node::ReplicationConfig {
            sync_timeout: args.sync_timeout,
            repair_rate: args.repair_rate,
            repair_every: args.repair_every,
            scrub_rate: args.scrub_rate,
            scrub_every: args.scrub_every,
        },
        metrics: None,
        join_token: args.join_token.clone(),
        encrypt_key: args.encrypt_key.clone(),
    }
}

pub async fn node(args: NodeArgs) -> anyhow::Result<ExitCode> {
    if let Some(action) = args.action {
        return crate::admin::node_action(action).await;
    }
    if args.data_dir.is_none() {
        anyhow::bail!("locus node needs --data-dir (the chunk store directory)");
    }
    let listener = bind(&args.listen, "node").await?;
    let advertise = args.advertise.clone().unwrap_or(listener.local_addr()?.to_string());
    let mut config = node_config(&args, advertise);
    if let Some(addr) = &args.metrics {
        config.metrics = Some(bind(addr, "node metrics").await?);
    }
    println!("locus node listening on {}", config.advertise_addr);
    tracing::info!("node {} (site {}) serving on {}", config.id, config.site, config.advertise_addr);
    tokio::select! {
        r = node::run(config, listener) => r.context("node stopped")?,
        _ = wait_for_signal() => {}
    }
    Ok(ExitCode::SUCCESS)
}

/// Makes the logins directory if it is missing: sticky and writable by all, as /tmp, so
/// every user can leave their login there and none can remove another's.
fn prepare_logins(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if dir.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot make the logins directory {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777))
        .with_context(|| format!("cannot open the logins directory {} to its users", dir.display()))
}

pub(crate) fn client_config(
    meta_addr: String,
    site: String,
    purpose: String,
    t: &ClientTuning,
) -> client::ClientConfig {
    client::ClientConfig {
        meta_addr,
        site,
        purpose,
        chunk_size: t.chunk_size.max(4096),
        cache_bytes: t.cache as usize,
        readahead_chunks: t.readahead_chunks,
        upload_window: t.upload_window.max(1),
        attr_ttl: Duration::from_secs_f64(t.attr_ttl.max(0.0)),
        timeout: t.rpc_timeout,
        ..client::ClientConfig::default()
    }
}

/// Refuses a missing, non-directory or already mounted mount point up front, and
/// clears a dead mount a stopped Locus left behind.
fn check_mountpoint(path: &Path) -> anyhow::Result<PathBuf> {
    let meta = match std::fs::metadata(path) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            clear_dead_mount(path)?;
            std::fs::metadata(path)
        }
        other => other,
    };
    let meta = meta.map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => anyhow!("mount point {} does not exist", path.display()),
        _ => anyhow!(e).context(format!("cannot use mount point {}", path.display())),
    })?;
    if !meta.is_dir() {
        bail!("mount point {} is not a directory", path.display());
    }
    let canonical = path.canonicalize()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if mounts.lines().any(|l| l.split(' ').nth(4) == Some(&canonical.to_string_lossy())) {
        bail!("mount point {} is busy: something is already mounted there", canonical.display());
    }
    Ok(canonical)
}

/// A mount whose process died stays behind and answers every access with ENOTCONN
/// ("Transport endpoint is not connected"); detach it, or say which command does.
fn clear_dead_mount(path: &Path) -> anyhow::Result<()> {
    match fuse::detach(path) {
        Ok(()) => {
            tracing::warn!("{}: cleared a dead mount left by a Locus process that stopped", path.display());
            Ok(())
        }
        Err(e) => bail!(
            "mount point {0} holds a dead mount (transport endpoint is not connected) that could not be cleared \
             ({e}); run `fusermount3 -u -z {0}` (or `umount -l {0}`) and start again",
            path.display()
        ),
    }
}

/// Serves the mount until a signal or an unmount from outside. A busy mount (a
/// process has its cwd or a file in it) is detached lazily on a signal, and that is
/// an error: the processes inside lose their files.
/// `detach`: started by `--background`, whose starter stops reading this process's
/// output once it is mounted: the output goes there from then on.
async fn serve_mount(
    vfs: Arc<client::Vfs>,
    mountpoint: &Path,
    ttl: f64,
    detach: Option<std::fs::File>,
) -> anyhow::Result<()> {
    let mut stop = StopSignals::new()?;
    let config = fuse::MountConfig { ttl: Duration::from_secs_f64(ttl.max(0.0)), ..fuse::MountConfig::default() };
    let mut mounted = fuse::mount(vfs.clone(), tokio::runtime::Handle::current(), mountpoint, &config)
        .with_context(|| format!("cannot mount on {} (is fuse available, and are you root?)", mountpoint.display()))?;
    let at = mountpoint.to_path_buf();
    match tokio::task::spawn_blocking(move || fuse::raise_read_ahead(&at)).await {
        Ok(Ok(())) => tracing::debug!("read-ahead of {} raised to {} KiB", mountpoint.display(), fuse::READ_AHEAD_KB),
        Ok(Err(e)) => tracing::info!("read-ahead of {} left at the kernel's default: {e}", mountpoint.display()),
        Err(e) => tracing::warn!("raising the read-ahead of {} failed: {e}", mountpoint.display()),
    }
    println!("{} {}", crate::mount_helper::MOUNTED, mountpoint.display());
    if let Some(target) = &detach {
        crate::mount_helper::detach_output(target)?;
    }
    let ended_elsewhere = async {
        while !mounted.is_finished() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let mut failure = None;
    tokio::select! {
        _ = stop.recv() => {
            tracing::info!("unmounting {}", mountpoint.display());
            if let Err(busy) = mounted.unmount() {
                let mp = mountpoint.display();
                failure = Some(match fuse::detach(mountpoint) {
                    Ok(()) => anyhow!(
                        "{mp} was busy ({busy}): detached it lazily; processes still using it get errors"
                    ),
                    Err(e) => anyhow!(
                        "{mp} is busy ({busy}) and could not be detached ({e}); run `umount -l {mp}`"
                    ),
                });
            }
        }
        _ = ended_elsewhere => tracing::info!("{} was unmounted", mountpoint.display()),
    }
    // Let requests still in the kernel's queue finish before the runtime goes away
    // (a detached busy mount stays in use: no point waiting for it).
    for _ in 0..50 {
        if failure.is_some() || mounted.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    vfs.shutdown().await;
    failure.map_or(Ok(()), Err)
}

pub async fn mount(args: MountArgs) -> anyhow::Result<ExitCode> {
    let mountpoint = check_mountpoint(&args.mountpoint)?;
    if args.log_file.is_some() && !args.detached {
        bail!("--log-file is where a mount started with --background logs; in the foreground it logs to stderr");
    }
    let detach = args.detached.then(|| crate::mount_helper::output_target(args.log_file.as_deref())).transpose()?;
    let purpose = format!("mount {}", mountpoint.display());
    let logins = match prepare_logins(&args.logins) {
        Ok(()) => Some(args.logins.clone()),
        Err(e) => {
            tracing::warn!("users' logins are off: {e:#} (at a site that requires logins, they act as nobody)");
            None
        }
    };
    let config = client::ClientConfig { logins, ..client_config(args.meta.clone(), args.site, purpose, &args.tuning) };
    let vfs = client::Vfs::connect(config).await.with_context(|| format!("cannot reach meta at {}", args.meta))?;
    serve_mount(vfs, &mountpoint, args.tuning.attr_ttl, detach).await?;
    Ok(ExitCode::SUCCESS)
}

pub async fn up(args: UpArgs, tls: TlsArgs) -> anyhow::Result<ExitCode> {
    let mountpoint = check_mountpoint(&args.mountpoint)?;
    let data_dir = expand_home(&args.data_dir);
    let (db, chunks) = (data_dir.join("meta.db"), data_dir.join("chunks"));
    // A new data directory formats a new cluster; one that has chunks but lost its
    // database is refused by meta rather than silently given an empty namespace.
    let init = !db.exists() && !chunks.exists();
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("cannot create the data directory {}", data_dir.display()))?;
    let probe = data_dir.join(".write-test");
    std::fs::write(&probe, b"ok").with_context(|| format!("data directory {} is not writable", data_dir.display()))?;
    let _ = std::fs::remove_file(probe);
    // Loopback needs no set-up: a CA and certificates are made in the data directory
    // on first start, unless the operator gave certificates or chose no TLS.
    let explicit = tls.insecure_no_tls || tls.ca.is_some() || tls.cert.is_some() || tls.key.is_some();
    let local_pki = if explicit { None } else { Some(LocalPki::ensure(&data_dir)?) };
    crate::pki::install(&local_pki.as_ref().map_or(tls, LocalPki::process), "locus up")?;

    // Both ports first: a taken port is reported before anything starts.
    let meta_listener = bind_flag(&args.meta_listen, "meta", Some("--meta-listen")).await?;
    let node_listener = bind_flag(&args.node_listen, "node", Some("--node-listen")).await?;
    let revoked = local_pki.as_ref().map(|p| p.dir.join(crate::pki::REVOKED));
    let config = meta::MetaConfig {
        db_url: db.display().to_string(),
        read_db_url: None,
        init,
        heartbeat: HEARTBEAT,
        session_expiry: Duration::from_secs(30),
        primary_lease: None,
        metadata_rpo: None,
        db_timeout: meta::DEFAULT_DB_TIMEOUT,
        audit_log: Some(data_dir.join("audit.log")),
        // One node: one copy is what its site can hold (the default wants two).
        root_policy: Some(proto::policy::Policy { copies: 1, ..Default::default() }),
        forward_writes_to: None,
        homes: Vec::new(),
        sites: Vec::new(),
        site: None,
        auto_move: meta::AutoMove::default(),
    };
    let (meta_addr, meta_service) =
        // The mount is the machine's own: its root is root (as with a local disk).
        start_meta(meta_listener, config, (Vec::new(), vec![LOCAL_SITE.to_string()]), revoked, &[LOCAL_NODE.to_string()])
            .await?;
    let node_addr = node_listener.local_addr()?.to_string();
    let node_args = NodeArgs {
        listen: node_addr.clone(),
        advertise: None,
        meta: meta_addr.clone(),
        data_dir: Some(chunks),
        id: Some(LOCAL_NODE.into()),
        site: LOCAL_SITE.into(),
        capacity: args.capacity,
        cache: 0,
        wan_connections: Some(1),
        wan_rate: 125 << 20,
        wan_connections_to: Vec::new(),
        metrics: None,
        reclaim_above: 90.0,
        reclaim_grace: Duration::from_secs(300),
        encrypt_key: None,
        sync_timeout: Duration::from_secs(10),
        repair_rate: 64 << 20,
        repair_every: Duration::from_secs(10),
        scrub_rate: 16 << 20,
        scrub_every: Duration::from_secs(24 * 3600),
        join_token: None,
        action: None,
    };
    let (node_failed_tx, node_failed) = tokio::sync::oneshot::channel();
    let config = node_config(&node_args, node_addr.clone());
    // The mount reads the node's store in process (no loopback TLS, no second hash).
    let store = Arc::new(node::open_store(&config, false).await.context("the storage node did not start")?);
    let local_node = client::LocalNode { id: LOCAL_NODE.into(), store: store.clone() };
    tokio::spawn(async move {
        if let Err(e) = node::run_on(store, config, node_listener).await {
            let _ = node_failed_tx.send(e);
        }
    });
    wait_for_node(&meta_addr, &node_addr, node_failed).await?;
    let purpose = format!("mount {}", mountpoint.display());
    let client = client::ClientConfig {
        local_node: Some(local_node),
        in_process_meta: Some(client::InProcessMetaHandle(Arc::new(InProcessMeta(meta_service.in_process_client())))),
        ..client_config(meta_addr.clone(), LOCAL_SITE.into(), purpose, &args.tuning)
    };
    let vfs = client::Vfs::connect(client).await?;
    println!(
        "locus: meta {meta_addr}, node {node_addr}, data in {}, mounted on {}; Ctrl-C to stop",
        data_dir.display(),
        mountpoint.display()
    );
    let record = LocalCluster {
        meta: meta_addr,
        node: node_addr,
        mountpoint: mountpoint.clone(),
        pid: std::process::id(),
        tls: local_pki.map(|p| p.dir),
    };
    record.save(&data_dir)?;
    let served = serve_mount(vfs, &mountpoint, args.tuning.attr_ttl, None).await;
    record.remove(&data_dir);
    served?;
    Ok(ExitCode::SUCCESS)
}

/// Waits until the embedded node has registered with meta (or failed to).
/// Waits until the embedded node has registered at `node_addr` (an entry from before a
/// restart, with an old address, does not count) or failed to.
async fn wait_for_node(
    meta_addr: &str,
    node_addr: &str,
    mut failed: tokio::sync::oneshot::Receiver<node::NodeError>,
) -> anyhow::Result<()> {
    let meta = net::RpcClient::connect(meta_addr, 1, Duration::from_secs(10)).await?;
    for _ in 0..200 {
        if let Ok(e) = failed.try_recv() {
            return Err(anyhow::Error::new(e).context("the storage node did not start"));
        }
        if let Ok(nodes) = meta.ask(proto::meta::ListNodes {}).await?
            && nodes.iter().any(|n| n.addr == node_addr)
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the storage node did not register with meta within 10 s")
}

/// SIGINT and SIGTERM, caught from the moment this is created: a signal that arrives
/// before the first wait (say, right after "mounted" is printed) is not lost and does
/// not kill the process.
pub(crate) struct StopSignals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl StopSignals {
    pub(crate) fn new() -> anyhow::Result<StopSignals> {
        use tokio::signal::unix::{SignalKind, signal};
        let int = signal(SignalKind::interrupt()).context("cannot catch SIGINT")?;
        let term = signal(SignalKind::terminate()).context("cannot catch SIGTERM")?;
        Ok(StopSignals { int, term })
    }

    pub(crate) async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

async fn wait_for_signal() {
    match StopSignals::new() {
        Ok(mut stop) => stop.recv().await,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
