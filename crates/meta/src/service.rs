//! The RPC face of meta: dispatches `MetaRequest`s to the store (reads on its reader
//! threads, never on the async runtime; locks and open-file records are rows there
//! too), and expires silent sessions in the background.

use crate::audit::AuditLog;
use crate::cross;
use crate::engine::{self, Store};
use crate::error::MetaError;
use crate::homes::{self, Home, HomeId, Homes, home_of};
use crate::identity::{Acting, Identities};
use crate::ops::{self, Ctx};
use crate::store::Txn;
use bytes::Bytes;
use net::ConnHandle;
use proto::meta::{Access, Claim, Grants, MetaReply, MetaRequest, MetaResult};
use proto::meta::{AuditEntry, MetaCall, MetaPush, PendingNode, PushAnswer, RevocationList, SessionInfo};
use proto::policy::ReplicationLag;
use proto::types::{Caller, SessionId, WorkerStatus};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use util::sync::lock;
use util::worker::{Step, Worker, Workers, every};

/// How long `locus status` waits for a client to answer a push.
const PUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// What `locus meta` needs to run; the binary builds it from its config file.
#[derive(Debug, Clone)]
pub struct MetaConfig {
    /// Where the database is: `sqlite:///path/meta.db`, a bare path, or
    /// `postgres://user@host:port/database`.
    pub db_url: String,
    /// A hot standby of `db_url` at this site to read from (PostgreSQL only).
    pub read_db_url: Option<String>,
    /// Format a new cluster if the database is missing or empty (else that is refused).
    pub init: bool,
    /// How often clients should heartbeat; told to them in `Welcome`.
    pub heartbeat: Duration,
    /// A session silent for longer loses its locks and open-file records.
    pub session_expiry: Duration,
    /// PostgreSQL: hold a lease on the primary role of this duration; writes are
    /// refused once it could not be renewed for that long (failover fencing).
    pub primary_lease: Option<Duration>,
    /// PostgreSQL, with a lease: writes are refused once no standby has confirmed what
    /// the primary wrote this long ago (the metadata RPO under asynchronous
    /// replication: what a failover may lose).
    pub metadata_rpo: Option<Duration>,
    /// PostgreSQL: how long a request may wait for the server's answer before it is
    /// cancelled and fails with ETIMEDOUT, so that a stopped or unreachable server
    /// costs each caller a bounded wait.
    pub db_timeout: Duration,
    /// Where administrative actions are appended (`audit`); they are kept in memory
    /// for `locus status --audit` either way.
    pub audit_log: Option<std::path::PathBuf>,
    /// The policy a new cluster's root directory starts with when this meta formats the
    /// database (`None`: none, so the built-in default applies). `locus up` runs one
    /// node, and the default's two copies would leave every chunk under-replicated.
    pub root_policy: Option<proto::policy::Policy>,
    /// The meta at the primary's site (`host:port`), for a meta at another site: every
    /// write is forwarded to it as one request (one round trip across the WAN, where
    /// running it against the primary from here costs several), and read back here at
    /// the standby once it has replayed the commit.
    pub forward_writes_to: Option<String>,
    /// Metadata homes besides the root's: each an engine of its own (`homes`). A new
    /// (empty) database becomes a new home of this cluster; an existing one must be the
    /// home of that name of this cluster.
    pub homes: Vec<HomeConfig>,
    /// How this meta reaches each site's PostgreSQL server and meta, for homes that
    /// moved (`moving`): a moved home is placed by home 0's registry, not its flags.
    pub sites: Vec<crate::moving::SiteConfig>,
    /// The site this meta serves (`None`: its certificate's).
    pub site: Option<String>,
    /// When the homes this meta holds move by themselves to the site writing them.
    pub auto_move: crate::moving::AutoMove,
}

/// Where one metadata home besides the root's commits, as this meta reaches it: the
/// root's home is configured by `MetaConfig`'s own `db_url`, `read_db_url` and
/// `forward_writes_to`, and every other home by the same three, so that each site holds
/// the homes whose writes happen there and reads the others' at a standby of its own.
#[derive(Clone, Debug, Default)]
pub struct HomeConfig {
    /// The home's name (`locus home create PATH NAME`).
    pub name: String,
    /// Its engine's database (a PostgreSQL primary, or a SQLite file), as `db_url`.
    pub db_url: String,
    /// A hot standby of `db_url` at this site to read the home from.
    pub read_db_url: Option<String>,
    /// The meta at the site that holds the home (`host:port`): the home's writes are
    /// forwarded there as one request each, as `MetaConfig::forward_writes_to` does for
    /// the root's.
    pub forward_writes_to: Option<String>,
}

/// `MetaConfig::db_timeout` unless told otherwise: far above any one request's work
/// (point reads, a commit of one batch), below a client's patience.
pub const DEFAULT_DB_TIMEOUT: Duration = Duration::from_secs(30);

/// The metadata service: one per cluster, shared by every connection.
pub struct MetaService {
    /// Home 0's engine: sessions, nodes, the primary's lease and epoch (`homes.root()`).
    store: Arc<Store>,
    /// Every home's engine and where this meta forwards the writes of the homes it
    /// does not hold; requests run in the engine of the home they change. Swapped
    /// whole when a home moves.
    pub(crate) placed: std::sync::RwLock<Arc<Placed>>,
    /// Each home's gate: its writes pass it shared; a move closes it while the home
    /// changes engines.
    pub(crate) gates: HashMap<HomeId, Arc<tokio::sync::RwLock<()>>>,
    /// The gates of the homes this meta handed over to a mover, closed until it is done.
    pub(crate) handed_over: Mutex<HashMap<HomeId, crate::moving::HandedOverHome>>,
    /// The engines of homes this meta holds at their next place, opened for a move
    /// (and when).
    pub(crate) preparing: Mutex<HashMap<HomeId, (std::time::Instant, crate::moving::Opening)>>,
    /// How each home's engine was opened (where it is placed), by home.
    pub(crate) opened: Mutex<HashMap<HomeId, crate::moving::Opened>>,
    /// The sites and settings moves open engines with.
    pub(crate) moves: crate::moving::MoveSetup,
    /// Held by the move this meta is carrying out (one at a time).
    pub(crate) moving_now: Arc<tokio::sync::Mutex<()>>,
    /// That move's progress, for `locus status`.
    pub(crate) moving: Mutex<Option<crate::moving::MoveInProgress>>,
    /// Links to the other sites' metas that moves ask, by address (`meta_link`).
    pub(crate) meta_links: Mutex<HashMap<String, Arc<net::RpcClient>>>,
    /// Told when a move took this site's spare database, to make the next one.
    pub(crate) spare_taken: Arc<tokio::sync::Notify>,
    /// The writes of the homes this meta holds, by site, for automatic moves.
    pub(crate) tallies: Mutex<crate::moving::Tallies>,
    cluster_id: Arc<str>,
    heartbeat: Duration,
    session_expiry: Duration,
    workers: Workers,
    /// The latest worker report of each other process, and when it came.
    reports: Mutex<HashMap<String, (std::time::Instant, Vec<WorkerStatus>)>>,
    /// The latest replication lag report of each node, and when it came.
    lags: Mutex<HashMap<String, (std::time::Instant, Vec<ReplicationLag>)>>,
    /// The connection each session said `Hello` on, for pushes to that client.
    clients: Mutex<HashMap<SessionId, ConnHandle>>,
    /// The key chunk capabilities are signed with; nodes get it when they register.
    cap_key: proto::cap::CapKey,
    /// Each site's identity map (none configured: every site numbers owners itself).
    identities: std::sync::RwLock<Arc<Identities>>,
    /// The revocation list meta applies and distributes (`watch_revocations`).
    revoked: Mutex<Vec<String>>,
    /// Nodes refused for want of admission, by id, with their latest attempt: their
    /// heartbeat repeats it, so after a restart of meta they reappear within one.
    pending: Mutex<HashMap<String, (std::time::Instant, PendingNode)>>,
    /// Administrative actions: who, what, when, from where.
    audit: AuditLog,
    /// The key logins (`UserToken`) are signed with, derived from the database's secret
    /// like the capability key (so every meta over it accepts them).
    token_key: proto::cap::CapKey,
    /// How much client hosts are believed about their users.
    user_auth: std::sync::RwLock<crate::authority::UserAuth>,
    /// Under `locus up`: this process's node certificate, and the client identity its
    /// mount acts with (`own_mount`).
    own_mount: Option<(net::PeerIdentity, net::PeerIdentity)>,
}

/// Every home's engine, and where the writes of the homes this meta does not hold go
/// instead of its own writer (`forward_writes_to` of `MetaConfig` and `HomeConfig`, or
/// a move's placement), by home.
pub(crate) struct Placed {
    pub homes: Arc<Homes>,
    pub forwarding: HashMap<HomeId, Arc<Forwarding>>,
}

/// The link to the meta at the site holding a home, that this meta forwards the
/// home's writes to.
pub(crate) struct Forwarding {
    addr: String,
    /// Opened on the first write (that meta may start after this one); it reconnects
    /// by itself after a failure.
    link: tokio::sync::OnceCell<net::RpcClient>,
    /// How long a forwarded write may take: the database's own bound and a margin.
    timeout: Duration,
    /// Writes forwarded so far, for `locus status`.
    forwarded: std::sync::atomic::AtomicU64,
}

/// Connections to the meta that writes are forwarded to.
const FORWARD_CONNECTIONS: usize = 2;

impl Forwarding {
    pub(crate) fn new(addr: &str, db_timeout: Duration) -> Forwarding {
        Forwarding {
            addr: addr.to_string(),
            link: tokio::sync::OnceCell::new(),
            timeout: db_timeout + Duration::from_secs(5),
            forwarded: Default::default(),
        }
    }

    /// The root home's (`MetaConfig::forward_writes_to`), by home: the other homes'
    /// are added as each opens.
    fn of_root(config: &MetaConfig) -> HashMap<HomeId, Forwarding> {
        config.forward_writes_to.iter().map(|addr| (0, Forwarding::new(addr, config.db_timeout))).collect()
    }

    /// Runs `req` at the meta holding `home`, the home it writes, for whom `ctx` acts
    /// for, from this meta's site `site`, and makes this meta's reads of that home
    /// wait for its commit.
    async fn write(
        &self,
        homes: &Homes,
        site: &str,
        home: HomeId,
        ctx: Ctx,
        req: MetaRequest,
    ) -> Result<MetaReply, MetaError> {
        let store = homes.store(home)?;
        let request = proto::frame::encode_payload(&req).map_err(|e| MetaError::Internal(e.to_string()))?;
        // A session's start, heartbeats and end write its session's rows: every
        // client's heartbeat, every couple of seconds, and every mount and unmount would
        // otherwise drop every row this meta keeps. An end may also reclaim files the
        // session held open after their last name went; nobody can name those, and the
        // primary's notification drops them here too.
        let namespace = !matches!(req, MetaRequest::Heartbeat(_) | MetaRequest::Hello(_) | MetaRequest::Goodbye(_));
        let link = self
            .link
            .get_or_try_init(|| net::RpcClient::connect(&self.addr, FORWARD_CONNECTIONS, self.timeout))
            .await
            .map_err(|e| MetaError::unreachable(&self.addr, &e))?;
        let forward = proto::meta::Forward {
            cluster: ctx.cluster_id.to_string(),
            caller: ctx.caller,
            certificate: ctx.certificate,
            oversees: ctx.oversees,
            site: site.to_string(),
            request,
            positions: homes.all().iter().map(|h| (h.id, h.store.commit_position())).filter(|p| p.1 > 0).collect(),
        };
        let answer = link.ask(forward).await;
        // Committed there (or perhaps, when the answer was lost): what this meta
        // remembers of other homes' rows may be older than the write.
        if !matches!(req, MetaRequest::Heartbeat(_)) {
            homes.forget_seen();
        }
        let answer = answer.map_err(|e| MetaError::unreachable(&self.addr, &e))?.map_err(MetaError::Remote)?;
        let reply = proto::frame::decode(&answer.reply)
            .map_err(|e| MetaError::Internal(format!("the answer to a forwarded write does not decode: {e}")))?;
        store.committed_elsewhere(answer.position, namespace);
        if crate::cross::joins_homes(&req) {
            // It may have changed other homes' rows too (`cross`): nothing kept of them
            // is answered any more.
            for other in homes.all().iter().filter(|h| h.id != home) {
                other.store.committed_elsewhere(0, true);
            }
        }
        self.forwarded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(reply)
    }
}

impl MetaService {
    /// Opens the database named by `config.db_url` (see `open_store`).
    pub fn open(config: &MetaConfig) -> Result<Arc<MetaService>, MetaError> {
        let lease = config.primary_lease.map(|duration| crate::store::LeaseTerms {
            holder: format!("meta-pid{}", std::process::id()),
            duration,
            rpo: config.metadata_rpo,
        });
        let audit = AuditLog::open(config.audit_log.as_deref())?;
        let store = engine::open_store(
            &config.db_url,
            config.read_db_url.as_deref(),
            config.init,
            lease.clone(),
            config.db_timeout,
        )?;
        if let (true, Some(policy)) = (store.formatted(), config.root_policy.clone()) {
            engine::write(&store, true, move |t| t.put_policy(proto::types::ROOT_INODE, &policy))?;
        }
        let store = Arc::new(store);
        let mut homes = vec![Home { id: 0, name: ROOT_HOME.into(), store: store.clone() }];
        let mut forwarding = Forwarding::of_root(config);
        let moves = crate::moving::MoveSetup {
            sites: config.sites.clone(),
            own_site: config.site.clone().or_else(|| net::own_identity().map(|me| me.site.clone())),
            lease: lease.clone(),
            db_timeout: config.db_timeout,
            auto: config.auto_move.clone(),
        };
        let mut opened = HashMap::new();
        for home in &config.homes {
            let from_flags =
                moves.flagged(&home.db_url, home.read_db_url.as_deref(), home.forward_writes_to.as_deref());
            // A home that moved is where the registry says, whatever its flags.
            let placed = match crate::moving::registered(&store, &home.name)? {
                Some(p) if p != from_flags.placement => moves.placed(&home.name, &p)?,
                _ => from_flags,
            };
            let engine = if placed.placement.moves > 0 {
                moves.opener(placed.clone())()?
            } else {
                engine::open_store(
                    &placed.writer,
                    placed.read.as_deref(),
                    config.init,
                    lease.clone(),
                    config.db_timeout,
                )?
            };
            let id = homes::adopt(&store, &engine, &home.name, &placed.writer)?;
            if let Some(addr) = &placed.forward {
                forwarding.insert(id, Forwarding::new(addr, config.db_timeout));
            }
            homes.push(Home { id, name: home.name.clone(), store: Arc::new(engine) });
            opened.insert(id, placed);
        }
        let homes = Arc::new(Homes::new(homes)?);
        // Opening the other homes (across the WAN, some) may take longer than a lease
        // lasts: each is renewed once all are open, before anything is written.
        for home in homes.all() {
            if let Some(lease) = home.store.primary_lease() {
                lease.renew()?;
            }
        }
        homes::settle_junctions(&homes)?;
        Ok(Self::build(homes, config, audit, forwarding, opened, moves))
    }

    /// A service over any backend's store (`db_url`, `init` and `audit_log` in `config`
    /// are unused: its audit log lives in memory).
    pub fn with_store(store: Arc<Store>, config: &MetaConfig) -> Arc<MetaService> {
        let moves = crate::moving::MoveSetup {
            sites: Vec::new(),
            own_site: None,
            lease: None,
            db_timeout: config.db_timeout,
            auto: Default::default(),
        };
        let (homes, forwarding) = (Arc::new(Homes::single(store)), Forwarding::of_root(config));
        Self::build(homes, config, AuditLog::in_memory(), forwarding, HashMap::new(), moves)
    }

    fn build(
        homes: Arc<Homes>,
        config: &MetaConfig,
        audit: AuditLog,
        forwarding: HashMap<HomeId, Forwarding>,
        opened: HashMap<HomeId, crate::moving::Opened>,
        moves: crate::moving::MoveSetup,
    ) -> Arc<MetaService> {
        let store = homes.root().clone();
        let gates = homes.all().iter().map(|h| (h.id, Arc::default())).collect();
        let forwarding = forwarding.into_iter().map(|(home, f)| (home, Arc::new(f))).collect();
        Arc::new(MetaService {
            cap_key: capability_key(store.cluster_secret()),
            token_key: blake3::derive_key("locus 2026-11 user token key", store.cluster_secret()),
            user_auth: Default::default(),
            own_mount: net::own_identity()
                .filter(|me| me.role == net::Role::Node)
                .map(|me| (me.clone(), net::PeerIdentity { role: net::Role::Client, ..me })),
            cluster_id: store.cluster_id().into(),
            store,
            heartbeat: config.heartbeat,
            session_expiry: config.session_expiry,
            workers: Workers::default(),
            reports: Mutex::default(),
            lags: Mutex::default(),
            clients: Mutex::default(),
            identities: std::sync::RwLock::new(Arc::new(Identities::empty())),
            revoked: Mutex::default(),
            pending: Mutex::default(),
            audit,
            placed: std::sync::RwLock::new(Arc::new(Placed { homes, forwarding })),
            gates,
            handed_over: Mutex::default(),
            preparing: Mutex::default(),
            opened: Mutex::new(opened),
            moves,
            moving_now: Arc::default(),
            meta_links: Default::default(),
            spare_taken: Arc::default(),
            moving: Mutex::default(),
            tallies: Mutex::default(),
        })
    }

    /// Every home's engine as placed now.
    pub(crate) fn homes(&self) -> Arc<Homes> {
        util::sync::read(&self.placed).homes.clone()
    }

    fn placed(&self) -> Arc<Placed> {
        util::sync::read(&self.placed).clone()
    }

    /// Home 0's engine (it never moves).
    pub(crate) fn root_store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Loads each site's identity map (`site`, file) and the sites whose root is not
    /// squashed; the principals they name get rows in the principal table. Blocking.
    pub fn configure_identities(
        &self,
        maps: Vec<(String, std::path::PathBuf)>,
        no_root_squash: Vec<String>,
    ) -> Result<(), MetaError> {
        let ids = Identities::load(maps, no_root_squash, &mut |names| self.principals(names))?;
        *util::sync::write(&self.identities) = Arc::new(ids);
        Ok(())
    }

    /// Sets which sites require logins and which ids hosts may claim (`UserAuth`).
    pub fn configure_user_auth(&self, auth: crate::authority::UserAuth) {
        *util::sync::write(&self.user_auth) = auth;
    }

    /// A login: the principal the user certificate proves, as the uid its site's map
    /// gives it, signed for at most `MAX_LOGIN_SECS`.
    async fn login(
        &self,
        who: Option<&net::PeerIdentity>,
        lifetime_secs: u64,
    ) -> Result<proto::cap::UserToken, MetaError> {
        let who = who.ok_or_else(|| MetaError::NotPermitted("a login needs TLS and a user certificate".into()))?;
        let name = who.name.clone();
        let row = engine::read_async(&self.store, true, move |t| t.principal(&name)).await?;
        let uid = row.and_then(|row| self.identities().local_uid(&who.site, crate::identity::PRINCIPAL_BASE + row));
        let uid = uid.ok_or_else(|| {
            MetaError::NotPermitted(format!(
                "{} has no account at site {}: its identity map (locus meta --identity-map {}=FILE) does not name it",
                who.name, who.site, who.site
            ))
        })?;
        let lifetime = lifetime_secs.clamp(60, proto::meta::MAX_LOGIN_SECS) as i64;
        let expires = self.ctx().now_ms + lifetime * 1000;
        Ok(proto::cap::UserToken::sign(&self.token_key, &who.name, &who.site, uid, expires))
    }

    /// The principal-table rows of `names`, adding the ones not there yet. Blocking.
    fn principals(&self, names: &[String]) -> Result<Vec<u32>, MetaError> {
        let names = names.to_vec();
        engine::write(&self.store, false, move |t| {
            names.iter().map(|n| if let Some(id) = t.principal(n)? { Ok(id) } else { t.add_principal(n) }).collect()
        })
    }

    fn identities(&self) -> Arc<Identities> {
        util::sync::read(&self.identities).clone()
    }

    /// Starts meta's workers (session expiry and orphan reaping, and identity-map
    /// reloading when maps are configured) on the current tokio runtime; they stop
    /// once the service is dropped.
    pub fn spawn_background(self: &Arc<Self>) {
        let period = (self.session_expiry / 4).clamp(Duration::from_millis(100), Duration::from_secs(10));
        self.workers.spawn(SessionExpiry { service: Arc::downgrade(self), period, expired: 0 });
        for home in self.homes().all() {
            if home.store.primary_lease().is_some() {
                let service = Arc::downgrade(self);
                self.workers.spawn(LeaseRenewal {
                    service,
                    home: home.id,
                    name: home.name.clone(),
                    renewed: 0,
                    epoch: 0,
                    standby_behind: None,
                });
            }
        }
        if self.identities().has_sources() {
            self.workers.spawn(IdentityReload { service: Arc::downgrade(self), reloads: 0 });
        }
        if let Some(mover) = self.home_mover() {
            self.workers.spawn(mover);
        }
        if let Some(spare) = self.spare_maker() {
            self.workers.spawn(spare);
        }
        if let Some(linker) = self.meta_linker() {
            self.workers.spawn(linker);
        }
        let homes = self.homes();
        if homes.all().len() > 1 && homes.all().iter().any(|h| h.store.has_two_phase()) {
            self.workers.spawn(CrossRecovery { service: Arc::downgrade(self), done: Default::default() });
        }
    }

    /// Applies and distributes the revocation list in `path` (one certificate serial
    /// in hex or subject name a line, `#` comments), read again whenever it changes:
    /// connections of the peers it names are dropped here at once, and at every
    /// node and client at their next heartbeat.
    pub fn watch_revocations(self: &Arc<Self>, path: std::path::PathBuf) {
        self.workers.spawn(RevocationWatch { service: Arc::downgrade(self), path, seen: None });
    }

    /// Meta's own workers, those of every connected client (asked on its connection
    /// now, at most `PUSH_TIMEOUT` each, all at once) and the latest report of every
    /// node still alive.
    async fn worker_reports(&self, sessions: &[(SessionId, SessionInfo, u64)]) -> Vec<(String, Vec<WorkerStatus>)> {
        let mut out = vec![("meta".to_string(), self.workers.statuses())];
        let asks: Vec<_> = {
            let mut clients = lock(&self.clients);
            clients.retain(|_, conn| conn.is_open());
            sessions
                .iter()
                .filter_map(|(id, info, _)| {
                    let conn = clients.get(id)?.clone();
                    let process = format!("session {id} ({})", info.purpose);
                    Some(tokio::spawn(async move {
                        match conn.call::<_, PushAnswer>(&MetaPush::Workers, PUSH_TIMEOUT).await {
                            Ok(PushAnswer::Workers(w)) => Some((process, w)),
                            Err(e) => {
                                tracing::debug!(%process, "no worker report: {e}");
                                None
                            }
                        }
                    }))
                })
                .collect()
        };
        for ask in asks {
            if let Ok(Some(report)) = ask.await {
                out.push(report);
            }
        }
        let mut reports = lock(&self.reports);
        reports.retain(|_, (at, _)| at.elapsed() < self.session_expiry);
        let mut others: Vec<(String, Vec<WorkerStatus>)> =
            reports.iter().map(|(process, (_, w))| (process.clone(), w.clone())).collect();
        others.sort_by(|a, b| a.0.cmp(&b.0));
        out.extend(others);
        out
    }

    /// Admits these node ids (`locus meta --admit-node`, and `locus up` for its own
    /// node), as `locus node admit` would.
    pub async fn admit_nodes(self: &Arc<Self>, ids: &[String]) -> Result<(), MetaError> {
        for id in ids {
            self.answer(Caller::ROOT, None, MetaRequest::AdmitNode(proto::meta::AdmitNode { node: id.clone() }))
                .await?;
        }
        Ok(())
    }

    /// Notes the outcome of a registration: a node refused for want of admission is
    /// listed as pending (with what its certificate proves); an accepted one is not.
    fn note_registration(
        &self,
        certificate: Option<(String, String)>,
        node: proto::types::NodeInfo,
        result: &Result<MetaReply, MetaError>,
    ) {
        let mut pending = lock(&self.pending);
        match result {
            Err(MetaError::NotAdmitted(_)) => {
                if !pending.contains_key(&node.id) {
                    tracing::warn!(node = %node.id, site = %node.site, addr = %node.addr, ?certificate,
                        "a node asks to join but is not admitted; `locus node admit {}` admits it", node.id);
                }
                let entry = PendingNode {
                    id: node.id.clone(),
                    site: node.site,
                    addr: node.addr,
                    certificate,
                    last_seen_secs: 0,
                };
                pending.insert(node.id, (std::time::Instant::now(), entry));
            }
            Ok(_) | Err(MetaError::Removed(_)) => {
                pending.remove(&node.id);
            }
            Err(_) => {}
        }
    }

    /// Nodes waiting for admission that tried within the session expiry.
    fn pending_nodes(&self) -> Vec<PendingNode> {
        let mut pending = lock(&self.pending);
        pending.retain(|_, (at, _)| at.elapsed() < self.session_expiry);
        let mut out: Vec<PendingNode> = pending
            .values()
            .map(|(at, p)| PendingNode { last_seen_secs: at.elapsed().as_secs(), ..p.clone() })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Each home this meta forwards the writes of, where to, and how many so far.
    fn forwarding_report(&self) -> Vec<(String, String, u64)> {
        let placed = self.placed();
        let mut out: Vec<_> = placed
            .homes
            .all()
            .iter()
            .filter_map(|home| {
                let f = placed.forwarding.get(&home.id)?;
                Some((home.name.clone(), f.addr.clone(), f.forwarded.load(std::sync::atomic::Ordering::Relaxed)))
            })
            .collect();
        out.sort();
        out
    }

    /// The latest lag report of every node still alive, by node.
    fn lag_reports(&self) -> Vec<(String, ReplicationLag)> {
        let mut lags = lock(&self.lags);
        lags.retain(|_, (at, _)| at.elapsed() < self.session_expiry);
        let mut out: Vec<(String, ReplicationLag)> =
            lags.iter().flat_map(|(node, (_, l))| l.iter().map(|l| (node.clone(), l.clone()))).collect();
        out.sort_by(|a, b| (&a.0, &a.1.site).cmp(&(&b.0, &b.1.site)));
        out
    }

    /// Lets `peer` act for `claimed`: its connection is bound to that session, or to
    /// none, or to one that has ended (the client opened a new session); a connection
    /// binding itself must come from the certificate the session said `Hello` with
    /// (kept in the session's row: it holds at every meta and after a restart).
    /// Without TLS a new connection may claim any session.
    async fn check_claim(&self, peer: &impl Origin, claimed: SessionId) -> Result<(), MetaError> {
        match peer.session() {
            Some(bound) if bound == claimed => Ok(()),
            Some(bound) if lock(&self.clients).contains_key(&bound) => Err(MetaError::NotPermitted(format!(
                "this connection acts for session {bound}; it may not act for session {claimed}"
            ))),
            _ => {
                let owner = match peer.identity() {
                    None => None,
                    Some(_) => {
                        engine::read_async(&self.store, true, move |t| {
                            Ok(t.get_session(claimed)?.and_then(|s| s.owner))
                        })
                        .await?
                    }
                };
                may_bind(owner.as_deref(), peer.identity(), claimed)?;
                peer.set_session(claimed);
                Ok(())
            }
        }
    }

    /// What the peer's certificate lets it do: the roles the request table permits
    /// (least privilege), and what the request claims of its peer (`Claim`): only a
    /// node registers, reports cached copies, lag or its workers, and only as itself
    /// (its certificate's name is its node id) at its own site; a session's site is
    /// its certificate's. Without TLS (`--insecure-no-tls`) nothing is proven and
    /// everything passes.
    fn check_identity(peer: &impl Origin, req: &MetaRequest) -> Result<(), MetaError> {
        let Some(who) = peer.identity() else { return Ok(()) };
        let not_a_node =
            || MetaError::NotPermitted(format!("{who} is not a node: only a node certificate may do this"));
        match req.claim() {
            Claim::None => {}
            Claim::AnyNode if who.role != net::Role::Node => return Err(not_a_node()),
            Claim::AnyNode => {}
            Claim::Node { .. } if who.role != net::Role::Node => return Err(not_a_node()),
            Claim::Node { id, .. } if who.name != id => {
                return Err(MetaError::NotPermitted(format!("{who} may not act as node {id}")));
            }
            Claim::Node { site: Some(site), .. } if site != who.site => {
                return Err(MetaError::NotPermitted(format!("{who} may not register at site {site}")));
            }
            Claim::Node { .. } => {}
            Claim::Site(site) if site != who.site => {
                return Err(MetaError::NotPermitted(format!("{who} may not open a session at site {site}")));
            }
            Claim::Site(_) => {}
        }
        let permitted = req.facts().roles;
        if !permitted.contains(&who.role) {
            let roles: Vec<&str> = permitted.iter().map(|r| r.as_str()).collect();
            return Err(MetaError::NotPermitted(format!(
                "{who} may not ask {}: that takes a certificate of role {} (locus ca issue --role {})",
                req.name(),
                roles.join(" or "),
                roles[0]
            )));
        }
        Ok(())
    }

    fn ctx(&self) -> Ctx {
        Ctx::now(self.heartbeat.as_millis() as u64, self.cluster_id.clone(), self.store.epoch())
    }

    /// The cluster this meta serves.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// Ends every session whose last heartbeat is older than `session_expiry` at
    /// `now_ms`, dropping its locks and open records, and reaps orphans nobody has
    /// open. Blocking.
    pub fn expire_sessions_at(&self, now_ms: i64) -> Result<Vec<SessionId>, MetaError> {
        let cutoff = now_ms.saturating_sub(self.session_expiry.as_millis() as i64);
        let expired = engine::write(&self.store, false, move |t| {
            let expired = ops::expire_sessions(t, cutoff)?;
            ops::reap_orphans(t)?;
            Ok(expired)
        })?;
        // A session's locks and opens in the other homes go with it; their orphans too.
        let homes = self.homes();
        expired.iter().for_each(|s| homes.forget_session(*s));
        for home in &homes.all()[1..] {
            let (homes, id, ended) = (homes.clone(), home.id, expired.clone());
            engine::write(&home.store, false, move |t| {
                let t = &mut homes.txn(id, t);
                for s in &ended {
                    ops::release_session(t, *s)?;
                }
                ops::reap_orphans(t).map(drop)
            })?;
        }
        let mut clients = lock(&self.clients);
        for s in &expired {
            clients.remove(s);
        }
        Ok(expired)
    }

    /// Answers one request from a blocking context (tests), on a per-thread runtime,
    /// as the superuser.
    #[cfg(any(test, feature = "conformance"))]
    pub fn handle_blocking(self: &Arc<Self>, req: MetaRequest) -> MetaResult {
        self.handle_blocking_as(Caller::ROOT, req)
    }

    /// Answers one request for `caller` (as resolved from a peer) from a blocking
    /// context (tests), on a per-thread runtime.
    #[cfg(any(test, feature = "conformance"))]
    pub fn handle_blocking_as(self: &Arc<Self>, caller: Caller, req: MetaRequest) -> MetaResult {
        thread_local! {
            static RT: tokio::runtime::Runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().expect("test runtime");
        }
        RT.with(|rt| rt.block_on(self.answer_as(None, caller, req))).map_err(Into::into)
    }

    /// Answers a request for `caller` from a peer whose certificate proved `peer`, noting a
    /// refused registration as pending.
    async fn answer_as(
        self: &Arc<Self>,
        peer: Option<&net::PeerIdentity>,
        caller: Caller,
        req: MetaRequest,
    ) -> Result<MetaReply, MetaError> {
        let (registering, removing) = match &req {
            MetaRequest::RegisterNode(m) => (Some(m.node.clone()), None),
            MetaRequest::RemoveNode(m) => (None, Some(m.node.clone())),
            _ => (None, None),
        };
        let result = self.answer(caller, peer, req).await;
        if let Some(node) = registering {
            self.note_registration(peer.map(|p| (p.name.clone(), p.site.clone())), node, &result);
        }
        // A removed node's last reports go with it from `locus status`.
        if let (Some(node), Ok(_)) = (removing, &result) {
            lock(&self.reports).remove(&format!("node {node}"));
            lock(&self.lags).remove(&node);
        }
        result
    }

    /// Answers one request for `caller` from a peer whose certificate proved `peer`.
    /// Writes are queued to the store's writer and awaited without holding a thread;
    /// reads run in `block_in_place` (see `engine`).
    async fn answer(
        self: &Arc<Self>,
        caller: Caller,
        peer: Option<&net::PeerIdentity>,
        req: MetaRequest,
    ) -> Result<MetaReply, MetaError> {
        let req = match req {
            // A forward names whom it acts for itself.
            MetaRequest::Forward(forward) => return self.answer_forward(forward).await.map(Into::into),
            MetaRequest::MoveHome(m) => {
                let relayed = peer.is_some_and(|p| p.role == net::Role::Meta);
                return self.move_home(m, relayed).await.map(Into::into);
            }
            MetaRequest::PrepareHome(m) => return self.prepare_home(m).await.map(Into::into),
            MetaRequest::HandOverHome(m) => return self.hand_over(m).await.map(Into::into),
            MetaRequest::HomeTaken(m) => return self.home_taken(m).await.map(Into::into),
            req => req,
        };
        let oversees = peer.is_none_or(|p| p.role != net::Role::Client);
        let ctx = self.ctx().acting_for(caller, peer.map(|p| p.name.clone()), oversees);
        match req.facts().access {
            Access::Reports => match req {
                MetaRequest::ReportWorkers(m) => ops::serve(m, |m| {
                    ops::perm::check_privileged(&ctx.caller, "reporting workers")?;
                    lock(&self.reports).insert(m.process, (std::time::Instant::now(), m.workers));
                    Ok(())
                }),
                MetaRequest::ReportLag(m) => ops::serve(m, |m| {
                    ops::perm::check_privileged(&ctx.caller, "reporting replication lag")?;
                    lock(&self.lags).insert(m.node, (std::time::Instant::now(), m.lag));
                    Ok(())
                }),
                MetaRequest::Revocations(m) => {
                    ops::serve(m, |_| Ok(RevocationList { entries: lock(&self.revoked).clone() }))
                }
                MetaRequest::Login(m) => self.login(peer, m.lifetime_secs).await.map(Into::into),
                other => Err(MetaError::Internal(format!("{other:?} is not a report"))),
            },
            Access::Read { .. } if matches!(req, MetaRequest::ListHomes(_)) => {
                let placed = self.placed();
                let mut listed = homes::list(&placed.homes).await?;
                let root = self.store.clone();
                let names: Vec<String> = listed.iter().map(|h| h.name.clone()).collect();
                // Every home's placement and past moves, in one read of home 0.
                let registry = engine::read_async(&root, false, move |t| {
                    let mut of = |n: &str| Ok((crate::moving::registered_in(t, n)?, crate::moving::records_in(t, n)?));
                    names.iter().map(|n| of(n)).collect::<Result<Vec<_>, MetaError>>()
                })
                .await?;
                for (home, (placement, moves)) in listed.iter_mut().zip(registry) {
                    home.writer = placed.forwarding.get(&home.id).map(|f| f.addr.clone());
                    home.placement = placement.map(|p| p.to_string());
                    home.site = match lock(&self.opened).get(&home.id) {
                        Some(o) => Some(o.placement.site.clone()),
                        // Home 0 stays where its flags put it.
                        None => match &home.writer {
                            None => self.moves.own_site.clone(),
                            Some(addr) => self.moves.site_of_meta(addr).map(String::from),
                        },
                    };
                    home.moving = self.move_step(home.id);
                    home.moves = moves;
                    home.recent_writes = lock(&self.tallies).recent(home.id);
                }
                Ok(listed.into())
            }
            Access::Read { point } => {
                let (homes, home) = (self.homes(), writing_home(&req));
                let store = homes.store(home)?.clone();
                let read = move |t: &mut dyn Txn| ops::read(&mut homes.txn(home, t), &ctx, req.clone());
                Ok(match engine::read_async(&store, point, read).await? {
                    // Worker reports live in memory, beside the store.
                    MetaReply::Status(mut status) => {
                        status.workers = self.worker_reports(&status.sessions).await;
                        status.lag = self.lag_reports();
                        status.forwarding = self.forwarding_report();
                        if oversees {
                            status.pending = self.pending_nodes();
                            status.audit = self.audit.recent();
                        }
                        MetaReply::Status(status)
                    }
                    other => other,
                })
            }
            Access::Write { durable } => {
                let goodbye = match &req {
                    MetaRequest::Goodbye(m) => Some(m.session),
                    _ => None,
                };
                let home = writing_home(&req);
                let _passed = self.pass_gate(home).await?;
                let placed = self.placed();
                let own_site = self.moves.own_site.as_deref().unwrap_or_default();
                let reply = match placed.forwarding.get(&home) {
                    Some(forwarding) => forwarding.write(&placed.homes, own_site, home, ctx, req).await?,
                    None => {
                        self.tally(home, own_site);
                        self.commit(&placed.homes, ctx, durable, req).await?
                    }
                };
                if let Some(session) = goodbye {
                    lock(&self.clients).remove(&session);
                }
                Ok(reply)
            }
        }
    }
}

impl MetaService {
    /// Commits a write in the engine of the home it changes (`writing_home`); the few
    /// that concern every home run in each, home 0 first (a session's end, a node's
    /// removal, gc's forgetting, a sync, a node's report of its copies); a junction in
    /// the two homes it joins.
    async fn commit(
        &self,
        homes: &Arc<Homes>,
        ctx: Ctx,
        durable: bool,
        req: MetaRequest,
    ) -> Result<MetaReply, MetaError> {
        if let MetaRequest::MakeJunction(m) = req {
            return homes::make_junction(homes, ctx, m).await.map(Into::into);
        }
        let all = homes.clone();
        let (homes, home) = (homes.clone(), writing_home(&req));
        let store = homes.store(home)?.clone();
        // Kept for the other homes only by the few writes that concern them all.
        let again = every_home(&req).then(|| req.clone());
        let req = match req {
            MetaRequest::UpdateLocations(mut m) if all.all().len() > 1 => {
                m.added = homes::root_only(&all, m.added).await?;
                MetaRequest::UpdateLocations(m)
            }
            req => req,
        };
        let first_ctx = ctx.clone();
        let removing = matches!(req, MetaRequest::Rmdir(_));
        let spanning = (all.all().len() > 1 && cross::spans_homes(&req)).then(|| (req.clone(), ctx.clone()));
        let written =
            engine::write_async(store, durable, move |t| ops::write(&mut homes.txn(home, t), &first_ctx, req.clone()))
                .await;
        let reply = match (written, spanning) {
            // A rename or link between homes: two-phase commit across their engines.
            (Err(MetaError::CrossHome(_)), Some((req, ctx))) if all.all().iter().all(|h| h.store.has_two_phase()) => {
                engine::blocking_here(|| cross::run(|| self.homes(), home, &ctx, &req))?
            }
            // Only a home's root lies in another home than its directory: like a mount
            // point, it stays.
            (Err(MetaError::CrossHome(why)), _) if removing => {
                return Err(MetaError::Busy(format!("the directory is the root of a metadata home ({why})")));
            }
            (written, _) => written?,
        };
        let Some(again) = again else { return Ok(reply) };
        for other in all.all().iter().skip(1) {
            let (homes, id, ctx, req) = (all.clone(), other.id, ctx.clone(), again.clone());
            let in_other = move |t: &mut dyn Txn| {
                // The copies of the chunks this home's files use, in its own catalogue.
                if let MetaRequest::UpdateLocations(m) = &req {
                    return ops::update_locations(t, m, true);
                }
                let t = &mut homes.txn(id, t);
                match &req {
                    MetaRequest::Goodbye(m) => ops::release_session(t, m.session),
                    MetaRequest::RemoveNode(m) => t.delete_node(&m.node),
                    MetaRequest::ForgetChunks(_) | MetaRequest::SyncAll(_) => {
                        ops::write(t, &ctx, req.clone()).map(drop)
                    }
                    _ => Ok(()),
                }
            };
            engine::write_async(other.store.clone(), durable, in_other).await?;
        }
        Ok(reply)
    }
}

/// The name home 0, the root's, goes by.
pub const ROOT_HOME: &str = "root";

/// The home whose engine a request runs in: the home of the inode it changes (or
/// reads), home 0 for everything that is not about one inode.
fn writing_home(req: &MetaRequest) -> HomeId {
    use MetaRequest as R;
    let ino = match req {
        R::Lookup(m) => m.parent,
        R::GetAttr(m) => m.ino,
        R::SetAttr(m) => m.ino,
        R::Create(m) => m.parent,
        R::CreateOpen(m) => m.create.parent,
        R::Link(m) => m.new_parent,
        R::Unlink(m) => m.parent,
        R::Rmdir(m) => m.parent,
        R::Rename(m) => m.parent,
        R::ReadLink(m) => m.ino,
        R::ReadDir(m) => m.ino,
        R::GetXattr(m) => m.ino,
        R::SetXattr(m) => m.ino,
        R::ListXattr(m) => m.ino,
        R::RemoveXattr(m) => m.ino,
        R::Open(m) => m.ino,
        R::Release(m) => m.ino,
        R::Extents(m) => m.ino,
        R::CommitWrite(m) => m.ino,
        R::Fallocate(m) => m.ino,
        R::Compact(m) => m.ino,
        R::GetLock(m) => m.lock.ino,
        R::SetLock(m) => m.lock.ino,
        R::ReleaseLocks(m) => m.ino,
        R::SetPolicy(m) => m.ino,
        R::GetPolicy(m) => m.ino,
        _ => return 0,
    };
    home_of(ino)
}

/// Writes that change every home's rows besides home 0's (`commit`).
fn every_home(req: &MetaRequest) -> bool {
    use MetaRequest as R;
    matches!(req, R::Goodbye(_) | R::RemoveNode(_) | R::ForgetChunks(_) | R::SyncAll(_) | R::UpdateLocations(_))
}

impl MetaService {
    /// Commits a write another meta forwarded (its checks of the client were made
    /// there), flushed so that it reaches that meta's standby, and answers where it is
    /// in the log. It runs here whatever this meta's own `forwarding`: a forward never
    /// travels on.
    async fn answer_forward(&self, forward: proto::meta::Forward) -> Result<proto::meta::Forwarded, MetaError> {
        if forward.cluster != *self.cluster_id {
            return Err(MetaError::WrongCluster(format!(
                "a write forwarded from a meta of cluster {} reached the meta of cluster {}: check \
                 --forward-writes-to",
                forward.cluster, self.cluster_id
            )));
        }
        let req: MetaRequest = proto::frame::decode(&forward.request)
            .map_err(|e| MetaError::InvalidArgument(format!("a forwarded request that does not decode: {e}")))?;
        if !matches!(req.facts().access, Access::Write { .. }) || matches!(req, MetaRequest::Forward(_)) {
            return Err(MetaError::InvalidArgument(format!(
                "only a write is forwarded, and only once: not {:?}",
                req.kind()
            )));
        }
        let _passed = self.pass_gate(writing_home(&req)).await?;
        self.tally(writing_home(&req), &forward.site);
        let homes = self.homes();
        // What the client saw through the forwarding meta, this one reads no older.
        for (home, position) in forward.positions {
            if let Ok(store) = homes.store(home) {
                store.committed_elsewhere(position, false);
            }
        }
        let ctx = self.ctx().acting_for(forward.caller, forward.certificate, forward.oversees);
        // The position is the one in the log of the engine the write changed.
        let store = homes.store(writing_home(&req))?.clone();
        let reply = self.commit(&homes, ctx, true, req).await?;
        let reply = proto::frame::encode_payload(&reply).map_err(|e| MetaError::Internal(e.to_string()))?;
        Ok(proto::meta::Forwarded { reply, position: store.commit_position() })
    }
}

/// The `identity-maps` worker: rereads a site's map file when it changes (a broken
/// file keeps the previous map and shows as this worker's last error).
struct IdentityReload {
    service: Weak<MetaService>,
    reloads: u64,
}

impl Worker for IdentityReload {
    type Error = MetaError;

    fn name(&self) -> String {
        "identity-maps".into()
    }

    fn progress(&self) -> String {
        format!("{} map reloads", self.reloads)
    }

    async fn work(&mut self) -> Result<Step, MetaError> {
        let Some(service) = self.service.upgrade() else { return Ok(Step::Done) };
        let reloaded = tokio::task::spawn_blocking(move || {
            let ids = service.identities();
            ids.reload(&mut |names| service.principals(names))
        })
        .await
        .map_err(|e| MetaError::Internal(format!("identity map reload task failed: {e}")))??;
        self.reloads += reloaded.len() as u64;
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) -> Step {
        every(Duration::from_secs(2)).await
    }
}

/// The `session-expiry` worker: ends sessions that stopped heartbeating (dropping their
/// locks and open records) and reaps orphans nobody has open any more.
struct SessionExpiry {
    service: Weak<MetaService>,
    period: Duration,
    expired: u64,
}

impl Worker for SessionExpiry {
    type Error = MetaError;

    fn name(&self) -> String {
        "session-expiry".into()
    }

    fn progress(&self) -> String {
        format!("{} silent sessions expired", self.expired)
    }

    async fn work(&mut self) -> Result<Step, MetaError> {
        let Some(service) = self.service.upgrade() else { return Ok(Step::Done) };
        let expired = tokio::task::spawn_blocking(move || {
            let now_ms = service.ctx().now_ms;
            service.expire_sessions_at(now_ms)
        })
        .await
        .map_err(|e| MetaError::Internal(format!("session expiry task failed: {e}")))??;
        if !expired.is_empty() {
            tracing::info!(?expired, "expired silent sessions");
            self.expired += expired.len() as u64;
        }
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) -> Step {
        every(self.period).await
    }
}

/// The `cross-home-recovery` worker: settles the prepared parts of renames and links
/// between homes that their coordinator left in doubt (a crash, a cut), in the homes
/// this meta holds, once they are older than `recovery_age` (`cross::recover`).
struct CrossRecovery {
    service: Weak<MetaService>,
    done: cross::Recovered,
}

impl Worker for CrossRecovery {
    type Error = MetaError;

    fn name(&self) -> String {
        "cross-home-recovery".into()
    }

    fn progress(&self) -> String {
        let d = &self.done;
        format!(
            "{} in-doubt parts committed, {} rolled back, {} old decisions dropped",
            d.committed, d.rolled_back, d.decisions_dropped
        )
    }

    async fn work(&mut self) -> Result<Step, MetaError> {
        let Some(service) = self.service.upgrade() else { return Ok(Step::Done) };
        let placed = service.placed();
        let handed_over: Vec<HomeId> = lock(&service.handed_over).keys().copied().collect();
        let held: Vec<HomeId> = placed
            .homes
            .all()
            .iter()
            .map(|h| h.id)
            .filter(|h| !placed.forwarding.contains_key(h) && !handed_over.contains(h))
            .collect();
        let (age, now_ms) = (recovery_age(service.moves.db_timeout), service.ctx().now_ms);
        let homes = placed.homes.clone();
        let done = tokio::task::spawn_blocking(move || cross::recover(&homes, &held, age, now_ms))
            .await
            .map_err(|e| MetaError::Internal(format!("cross-home recovery task failed: {e}")))??;
        self.done.committed += done.committed;
        self.done.rolled_back += done.rolled_back;
        self.done.decisions_dropped += done.decisions_dropped;
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) -> Step {
        let period = self.service.upgrade().map_or(Duration::from_secs(1), |s| recovery_age(s.moves.db_timeout) / 2);
        every(period.max(Duration::from_millis(500))).await
    }
}

/// How old a prepared part must be before recovery settles it: a coordinator needs a
/// round trip or two between preparing and deciding, and one slower than this loses
/// nothing (its decision then conflicts with recovery's abort); meanwhile the part's
/// rows stay locked, so not the whole database timeout.
fn recovery_age(db_timeout: Duration) -> Duration {
    db_timeout.min(Duration::from_secs(5))
}

/// The `primary-lease` worker: renews this meta's lease on the primary role at a
/// third of its duration. A renewal blocked on a cut-off primary or synchronous
/// standby simply never returns in time, and the writes it guards are refused.
/// One per metadata home whose engine this meta writes (each home's primary may be
/// promoted elsewhere on its own).
struct LeaseRenewal {
    service: Weak<MetaService>,
    home: HomeId,
    name: String,
    renewed: u64,
    /// The epoch of the latest renewal (a moved home's engine starts a new one).
    epoch: i64,
    /// As the latest renewal saw them (`WriterLease::standby_behind`).
    standby_behind: Option<Duration>,
}

impl Worker for LeaseRenewal {
    type Error = MetaError;

    fn name(&self) -> String {
        match self.name.as_str() {
            ROOT_HOME => "primary-lease".into(),
            home => format!("primary-lease of home {home}"),
        }
    }

    fn progress(&self) -> String {
        let behind = match self.standby_behind {
            Some(behind) => format!(", standbys {:.1} s behind", behind.as_secs_f64()),
            None => String::new(),
        };
        format!("epoch {}, {} renewals{behind}", self.epoch, self.renewed)
    }

    async fn work(&mut self) -> Result<Step, MetaError> {
        let Some(service) = self.service.upgrade() else { return Ok(Step::Done) };
        // A home handed over to a move has a fenced engine until it is placed anew.
        if lock(&service.handed_over).contains_key(&self.home) {
            return Ok(Step::Idle);
        }
        // The home's engine now: a move swaps it.
        let store = service.homes().store(self.home)?.clone();
        let Some(lease) = store.primary_lease() else { return Ok(Step::Idle) };
        self.epoch = lease.epoch();
        let (renewed, behind) = tokio::task::spawn_blocking(move || (lease.renew(), lease.standby_behind()))
            .await
            .map_err(|e| MetaError::Internal(format!("lease renewal task failed: {e}")))?;
        self.standby_behind = behind;
        match renewed {
            // Fenced by a move that has swapped the engine since: nothing to say.
            Err(MetaError::Fenced(_)) if !Arc::ptr_eq(&store, service.homes().store(self.home)?) => {}
            renewed => renewed?,
        }
        self.renewed += 1;
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) -> Step {
        let lease = self.service.upgrade().and_then(|s| s.homes().store(self.home).ok()?.primary_lease());
        every(lease.map_or(Duration::from_secs(1), |l| l.renew_every())).await
    }
}

/// The `revocations` worker: reads the revocation list whenever the file changes.
struct RevocationWatch {
    service: Weak<MetaService>,
    path: std::path::PathBuf,
    /// The file's text when last applied.
    seen: Option<String>,
}

impl Worker for RevocationWatch {
    type Error = MetaError;

    fn name(&self) -> String {
        "revocations".into()
    }

    fn progress(&self) -> String {
        let n = self.service.upgrade().map_or(0, |s| lock(&s.revoked).len());
        format!("{n} revoked, from {}", self.path.display())
    }

    async fn work(&mut self) -> Result<Step, MetaError> {
        // A missing file is an empty list (nothing revoked yet).
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(MetaError::Internal(format!("{}: {e}", self.path.display()))),
        };
        if self.seen.as_ref() != Some(&text) {
            let entries: Vec<String> = text
                .lines()
                .map(|l| l.split('#').next().unwrap_or("").trim().to_string())
                .filter(|l| !l.is_empty())
                .collect();
            let dropped = net::set_revoked(entries.clone());
            tracing::info!(revoked = entries.len(), dropped, "revocation list {} applied", self.path.display());
            if let Some(service) = self.service.upgrade() {
                *lock(&service.revoked) = entries;
            }
            self.seen = Some(text);
        }
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) -> Step {
        every(Duration::from_secs(1)).await
    }
}

impl net::Service for MetaService {
    type Request = MetaCall;
    type Reply = MetaResult;

    /// A session's `Welcome` binds that session to the connection it came on; a
    /// request acting for a session must come on a connection bound to it (or bind an
    /// unbound one), so one connection never acts for two live sessions. The request
    /// acts for the caller the peer may act as (`authority::resolve`).
    async fn handle(self: Arc<Self>, peer: net::Peer, call: MetaCall, _bulk: Bytes) -> (MetaResult, Bytes) {
        (self.answer_from(&peer, call).await, Bytes::new())
    }
}

/// Where a request came from, as meta checks it: a connection (`net::Peer`) or a
/// client in meta's own process (`InProcessClient`).
trait Origin: Send + Sync {
    /// What the peer's certificate proves (`None` without TLS).
    fn identity(&self) -> Option<&net::PeerIdentity>;
    /// The session bound to it (`MetaService::check_claim`).
    fn session(&self) -> Option<SessionId>;
    fn set_session(&self, session: SessionId);
    /// The connection meta pushes its requests to a session on (`MetaPush`).
    fn push_handle(&self) -> Option<ConnHandle>;
    /// Who it is, for logs.
    fn describe(&self) -> String;
}

impl Origin for net::Peer {
    fn identity(&self) -> Option<&net::PeerIdentity> {
        net::Peer::identity(self)
    }
    fn session(&self) -> Option<SessionId> {
        net::Peer::session(self)
    }
    fn set_session(&self, session: SessionId) {
        net::Peer::set_session(self, session)
    }
    fn push_handle(&self) -> Option<ConnHandle> {
        Some(self.handle())
    }
    fn describe(&self) -> String {
        self.addr().to_string()
    }
}

/// A client in meta's own process (`locus up`'s mount): its requests are calls, not
/// frames on a connection, and are checked as a connection's: it proves what this
/// process's certificate proves and is bound to one session at a time. Meta pushes to
/// its session on the connection the session said `Hello` on.
pub struct InProcessClient {
    service: Arc<MetaService>,
    identity: Option<net::PeerIdentity>,
    session: Mutex<Option<SessionId>>,
}

impl Origin for InProcessClient {
    fn identity(&self) -> Option<&net::PeerIdentity> {
        self.identity.as_ref()
    }
    fn session(&self) -> Option<SessionId> {
        *lock(&self.session)
    }
    fn set_session(&self, session: SessionId) {
        *lock(&self.session) = Some(session);
    }
    fn push_handle(&self) -> Option<ConnHandle> {
        None
    }
    fn describe(&self) -> String {
        "a client in this process".into()
    }
}

impl InProcessClient {
    /// Answers one request as `handle` answers a connection's.
    pub async fn call(&self, call: MetaCall) -> MetaResult {
        self.service.answer_from(self, call).await
    }
}

impl MetaService {
    /// A client in this process (see `InProcessClient`).
    pub fn in_process_client(self: &Arc<Self>) -> InProcessClient {
        InProcessClient { service: self.clone(), identity: net::own_identity(), session: Mutex::new(None) }
    }

    /// Checks and answers a request from `peer`.
    async fn answer_from(self: &Arc<Self>, peer: &impl Origin, call: MetaCall) -> MetaResult {
        let audited = crate::audit::action(&call.request);
        let result = match self.own_mount(peer.identity(), &call.request) {
            Some(identity) => self.checked_answer(&Relabeled { origin: peer, identity }, call).await,
            None => self.checked_answer(peer, call).await,
        };
        if let Some(action) = audited {
            self.audit.record(AuditEntry {
                at_ms: self.ctx().now_ms,
                who: peer
                    .identity()
                    .map_or_else(|| "an unauthenticated peer (--insecure-no-tls)".into(), |w| w.to_string()),
                from: peer.describe(),
                action,
                outcome: match &result {
                    Ok(_) => "ok".into(),
                    Err(e) => format!("refused: {e}"),
                },
            });
        }
        result.map_err(Into::into)
    }

    /// `answer_from` before the audit: every check on the peer, then the answer.
    async fn checked_answer(self: &Arc<Self>, peer: &impl Origin, call: MetaCall) -> Result<MetaReply, MetaError> {
        let MetaCall { caller, site, request: mut req, epoch, token } = call;
        if let Err(e) = Self::check_identity(peer, &req) {
            tracing::warn!(peer = %peer.describe(), "refused: {e}");
            return Err(e);
        }
        if let Err(e) = self.check_receipts(peer.identity(), &req) {
            tracing::warn!(peer = %peer.describe(), "refused: {e}");
            return Err(e);
        }
        if let Some(epoch) = believed_epoch(peer.identity(), epoch)
            && let Err(e) = self.store.check_node_epoch(epoch)
        {
            tracing::warn!(peer = %peer.describe(), "refused a node's request: {e}");
            return Err(e);
        }
        if let Some(claimed) = req.claimed_session() {
            self.check_claim(peer, claimed).await?;
        }
        let ids = self.identities();
        let caller = util::sync::read(&self.user_auth).admit(
            &ids,
            peer.identity(),
            caller,
            token.as_ref(),
            &self.token_key,
            proto::types::Timestamp::now().millis(),
        );
        let acting = crate::authority::resolve(&ids, peer.identity(), site.as_deref(), caller);
        match &mut req {
            MetaRequest::SetAttr(m) => (m.set.uid, m.set.gid) = acting.owner_in(m.set.uid, m.set.gid)?,
            MetaRequest::SetXattr(m) if crate::acl::is_acl(&m.name) => m.value = acting.acl_in(&m.value)?,
            _ => {}
        }
        let reads_acl = matches!(&req, MetaRequest::GetXattr(m) if crate::acl::is_acl(&m.name));
        if let (MetaRequest::ChunkLocations(m), Some(who)) = (&mut req, peer.identity())
            && who.role == net::Role::Client
        {
            self.readable_chunks(who, m);
        }
        let grants = req.grants();
        let result = self.answer_as(peer.identity(), acting.caller.clone(), req).await.map(|reply| {
            let holder = peer.identity().map_or("", |i| i.name.as_str());
            self.with_caps(localize(reply, &acting, reads_acl), grants, holder, peer.identity())
        });
        if let Ok(MetaReply::Welcome(welcome)) = &result {
            peer.set_session(welcome.session);
            if let Some(handle) = peer.push_handle() {
                lock(&self.clients).insert(welcome.session, handle);
            }
        }
        result
    }
}

impl MetaService {
    /// Keeps of a client's `ChunkLocations` only the chunks it shows a read capability
    /// for (signed for it, for that chunk, not expired; of any epoch: this only says
    /// where copies are): an unknown and an unreadable chunk look alike.
    fn readable_chunks(&self, who: &net::PeerIdentity, m: &mut proto::meta::ChunkLocations) {
        use proto::cap::{CapOp, verify};
        let now = proto::types::Timestamp::now().millis();
        let caps = std::mem::take(&mut m.caps);
        let mut caps = caps.into_iter();
        m.ids.retain(|id| {
            let cap = caps.next().flatten();
            verify(&self.cap_key, CapOp::Read, &who.name, Some(id), cap.as_ref(), now, 0).is_ok()
        });
    }

    /// A chunk bound to a file must be proven held by the caller: every chunk a
    /// request binds carries the storing node's receipt for the peer's certificate,
    /// which also makes the sizes and holders the catalogue records the nodes' word.
    /// (Without TLS nothing is proven and the claim is believed.) Extents naming chunks
    /// outside the request's list are held to the file's own chunks by `ops`.
    fn check_receipts(&self, peer: Option<&net::PeerIdentity>, req: &MetaRequest) -> Result<(), MetaError> {
        let Some(who) = peer.filter(|_| !req.bound_chunks().is_empty()) else { return Ok(()) };
        let now = self.ctx().now_ms;
        for c in req.bound_chunks() {
            proto::cap::verify_receipt(&self.cap_key, &who.name, &c.id, c.size, &c.nodes, c.receipt.as_ref(), now)
                .map_err(|e| MetaError::PermissionDenied(format!("chunk {} named by {who}: {e}", c.id)))?;
        }
        Ok(())
    }
}

impl MetaService {
    /// `locus up` is meta, node and mount in one process with one node certificate: a
    /// peer proving this very process's node certificate is its node when it asks what
    /// a node may, and otherwise its mount (in process or on its connection to meta),
    /// which acts as a client of its site, never with a node's standing. The identity a
    /// request of the mount acts with, or `None` for every other request and peer.
    fn own_mount(&self, peer: Option<&net::PeerIdentity>, req: &MetaRequest) -> Option<&net::PeerIdentity> {
        let (me, as_client) = self.own_mount.as_ref()?;
        (peer == Some(me) && !req.facts().roles.contains(&net::Role::Node)).then_some(as_client)
    }
}

/// A peer seen with another identity than its certificate's role (`own_mount`).
struct Relabeled<'a, O: Origin> {
    origin: &'a O,
    identity: &'a net::PeerIdentity,
}

impl<O: Origin> Origin for Relabeled<'_, O> {
    fn identity(&self) -> Option<&net::PeerIdentity> {
        Some(self.identity)
    }
    fn session(&self) -> Option<SessionId> {
        self.origin.session()
    }
    fn set_session(&self, session: SessionId) {
        self.origin.set_session(session)
    }
    fn push_handle(&self) -> Option<ConnHandle> {
        self.origin.push_handle()
    }
    fn describe(&self) -> String {
        self.origin.describe()
    }
}

/// Whether a connection of `peer` may bind itself to `session`, which said `Hello`
/// with the certificate named `owner` (`None`: the session was opened without TLS, or
/// does not exist).
fn may_bind(owner: Option<&str>, peer: Option<&net::PeerIdentity>, session: SessionId) -> Result<(), MetaError> {
    match (owner, peer) {
        (Some(owner), Some(peer)) if owner != peer.name => Err(MetaError::NotPermitted(format!(
            "session {session} belongs to {owner}; {} may not act for it",
            peer.name
        ))),
        _ => Ok(()),
    }
}

/// The epoch a request claims its sender has seen, if meta believes it: from a node or
/// meta certificate, or from anyone without TLS. A client's claim is ignored: one
/// could otherwise make meta read-only by claiming any epoch.
fn believed_epoch(peer: Option<&net::PeerIdentity>, epoch: Option<u64>) -> Option<u64> {
    epoch.filter(|_| peer.is_none_or(|who| matches!(who.role, net::Role::Node | net::Role::Meta)))
}

/// The capability key of every meta over one database: derived from the database's
/// shared secret, so a capability one meta signs is good at every node, also after a
/// restart of meta.
fn capability_key(secret: &[u8; 32]) -> proto::cap::CapKey {
    blake3::derive_key("locus 2026-11 chunk capability key", secret)
}

impl MetaService {
    /// Adds the capabilities `grants` allows to an `Opened` answer, bound to `holder`
    /// (the peer's certificate name) and signed with this meta's epoch (a node that
    /// has seen a newer one refuses them), and the capability key to a node's
    /// registration (only a node, meta or a peer of an insecure cluster gets it).
    fn with_caps(
        &self,
        mut reply: MetaReply,
        Grants { read, put }: Grants,
        holder: &str,
        peer: Option<&net::PeerIdentity>,
    ) -> MetaReply {
        use proto::cap::{CAP_LIFETIME_MS, CapOp, sign};
        let (expires, epoch) = (self.ctx().now_ms + CAP_LIFETIME_MS, self.store.epoch());
        match &mut reply {
            MetaReply::Opened(o) => {
                if read {
                    o.caps.read = o
                        .extents
                        .iter()
                        .map(|e| sign(&self.cap_key, CapOp::Read, holder, Some(&e.chunk), expires, epoch))
                        .collect();
                }
                if put {
                    o.caps.put = Some(sign(&self.cap_key, CapOp::Write, holder, None, expires, epoch));
                }
            }
            MetaReply::Registered(r) if peer.is_none_or(|p| matches!(p.role, net::Role::Meta | net::Role::Node)) => {
                r.cap_key = Some(self.cap_key);
            }
            _ => {}
        }
        reply
    }
}

/// Shows the owners in an answer in the numbering of the caller's site (and the ids
/// in an ACL, when `reads_acl` says the answer is one).
fn localize(mut reply: MetaReply, acting: &Acting, reads_acl: bool) -> MetaReply {
    match &mut reply {
        MetaReply::Bytes(value) if reads_acl => acting.localize_acl(value),
        MetaReply::Attr(a) => acting.localize(a),
        MetaReply::Opened(o) => {
            acting.localize(&mut o.attr);
            o.parent.iter_mut().for_each(|p| acting.localize(p));
        }
        MetaReply::Unlinked(u) => acting.localize(&mut u.parent),
        MetaReply::Made(m) => {
            acting.localize(&mut m.attr);
            acting.localize(&mut m.parent);
        }
        MetaReply::Entries(entries) => entries.iter_mut().for_each(|e| acting.localize(&mut e.attr)),
        _ => {}
    }
    reply
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::test_config;
    use proto::meta::*;
    use proto::meta::{NewNode, SessionInfo};
    use proto::types::{Attr, Caller, ROOT_INODE};

    /// `root_policy` is the root's policy from the moment the cluster is formatted, and
    /// only then: reopening with another never overrides what an operator set since.
    #[test]
    fn a_root_policy_is_set_when_formatting_and_only_then() {
        let dir = tempfile::tempdir().unwrap();
        let one = proto::policy::Policy { copies: 1, ..Default::default() };
        let config = MetaConfig { root_policy: Some(one.clone()), ..test_config(dir.path().join("meta.db")) };
        let root = |s: &Arc<MetaService>| match s.handle_blocking(MetaRequest::GetPolicy(GetPolicy { ino: ROOT_INODE }))
        {
            Ok(MetaReply::Policy(p)) => p,
            other => panic!("GetPolicy answered {other:?}"),
        };
        let s = MetaService::open(&config).unwrap();
        assert_eq!(root(&s), proto::policy::EffectivePolicy { policy: one.clone(), set_on: Some(ROOT_INODE) });
        let three = proto::policy::Policy { copies: 3, ..Default::default() };
        s.handle_blocking(MetaRequest::SetPolicy(SetPolicy { ino: ROOT_INODE, policy: Some(three.clone()) })).unwrap();
        drop(s);
        let s = MetaService::open(&config).unwrap();
        assert_eq!(root(&s).policy, three, "reopening replaced the operator's policy");
        drop(s);
        let plain = tempfile::tempdir().unwrap();
        let s = MetaService::open(&test_config(plain.path().join("meta.db"))).unwrap();
        assert_eq!(root(&s).set_on, None, "no root_policy: the default applies, set nowhere");
    }

    /// Every attribute an answer carries is shown in the caller's site numbering: a
    /// parent's attributes in an unlink's or create's answer too (the client answers
    /// the kernel's GETATTR of the parent from them).
    #[test]
    fn every_attribute_of_an_answer_is_localized() {
        let dir = tempfile::tempdir().unwrap();
        let ids = crate::identity::tests::two_sites(dir.path());
        let alice = ids.acting(Some("a"), true, Some(Caller { uid: 1001, gid: 300, groups: vec![] })).caller;
        let attr = crate::identity::tests::owned_by(alice.uid, alice.gid);
        let at_b = ids.acting(Some("b"), true, Some(Caller::new(5004, 7000)));
        let shown = |a: &Attr| (a.uid, a.gid);
        let opened = Opened {
            attr: attr.clone(),
            extents: Vec::new(),
            caps: ChunkCaps::default(),
            policy: Default::default(),
            parent: Some(attr.clone()),
            created: true,
        };
        let MetaReply::Opened(o) = localize(MetaReply::Opened(opened), &at_b, false) else { unreachable!() };
        assert_eq!([shown(&o.attr), shown(o.parent.as_ref().unwrap())], [(5003, 7000); 2]);
        let unlinked = Unlinked { ino: 8, orphaned: false, parent: attr.clone() };
        let MetaReply::Unlinked(u) = localize(MetaReply::Unlinked(unlinked), &at_b, false) else { unreachable!() };
        assert_eq!(shown(&u.parent), (5003, 7000));
        let MetaReply::Attr(a) = localize(MetaReply::Attr(attr), &at_b, false) else { unreachable!() };
        assert_eq!(shown(&a), (5003, 7000));
    }

    /// A `Forward` carries one write, decoded once: a forward inside it, a read, bytes
    /// that are no request, or a forward from a meta of another cluster are refused and
    /// change nothing; a write is committed and answered encoded (SQLite has no log
    /// position: 0).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_forward_carries_one_write_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let service = MetaService::open(&test_config(dir.path().join("meta.db"))).unwrap();
        let cluster = service.cluster_id().to_string();
        let forward = |request: Vec<u8>| proto::meta::Forward {
            cluster: cluster.clone(),
            caller: Caller::ROOT,
            certificate: None,
            oversees: true,
            site: "b".into(),
            request,
            // Of a home this meta does not know: nothing to wait for here.
            positions: vec![(7, 1 << 40)],
        };
        let encoded = |req: &MetaRequest| proto::frame::encode_payload(req).unwrap();
        let nested = MetaRequest::Forward(forward(encoded(&create(ROOT_INODE, "inner".into()))));
        let read = MetaRequest::GetAttr(GetAttr { ino: ROOT_INODE });
        for refused in [encoded(&nested), encoded(&read), vec![0xff, 0xff, 0xff]] {
            let answer = service.answer_forward(forward(refused)).await;
            assert!(matches!(answer, Err(MetaError::InvalidArgument(_))), "{answer:?}");
        }
        let lookup = |name: &str| {
            service.answer(Caller::ROOT, None, MetaRequest::Lookup(Lookup { parent: ROOT_INODE, name: name.into() }))
        };
        assert!(lookup("inner").await.is_err(), "a nested forward ran");
        let elsewhere = proto::meta::Forward {
            cluster: "another".into(),
            ..forward(encoded(&create(ROOT_INODE, "elsewhere".into())))
        };
        let answer = service.answer_forward(elsewhere).await;
        assert!(matches!(answer, Err(MetaError::WrongCluster(_))), "{answer:?}");
        assert!(lookup("elsewhere").await.is_err(), "a forward from another cluster ran");
        let answer = service.answer_forward(forward(encoded(&create(ROOT_INODE, "f".into())))).await.unwrap();
        let reply: MetaReply = proto::frame::decode(&answer.reply).unwrap();
        assert!(matches!(reply, MetaReply::Made(_)), "{reply:?}");
        assert_eq!(answer.position, 0);
        assert!(lookup("f").await.is_ok());
    }

    fn create(parent: u64, name: String) -> MetaRequest {
        MetaRequest::Create(Create {
            parent,
            name: name.into_bytes(),
            node: NewNode::File,
            mode: 0o644,
            umask: 0,
            exclusive: true,
        })
    }

    /// A connection that said `Hello` for one session cannot act for another live
    /// session (the "Goodbye for somebody else" attack); a fresh connection binds to
    /// the session its first request names. A client in meta's own process
    /// (`InProcessClient`) is held to the same rule.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_acts_for_one_live_session_only() {
        let dir = tempfile::tempdir().unwrap();
        let service = MetaService::open(&test_config(dir.path().join("meta.db"))).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(net::serve(listener, service.clone()));
        let info = SessionInfo { site: "s".into(), host: "h".into(), pid: 9, purpose: "test".into() };
        let hello = || Hello { protocol: proto::PROTOCOL_VERSION, session: info.clone() };
        let alice = net::RpcClient::connect(&addr, 1, Duration::from_secs(10)).await.unwrap();
        let bob = net::RpcClient::connect(&addr, 1, Duration::from_secs(10)).await.unwrap();
        let a = alice.ask(hello()).await.unwrap().unwrap().session;
        let b = bob.ask(hello()).await.unwrap().unwrap().session;
        let lock = LockRange { ino: ROOT_INODE, owner: 1, start: 0, end: 9, kind: LockKind::Write, pid: 1 };
        bob.ask(SetLock { session: b, lock }).await.unwrap().unwrap();

        let refused = alice.ask(Goodbye { session: b }).await.unwrap().unwrap_err();
        assert_eq!(refused.code, proto::error::ErrorCode::NotPermitted, "{refused:?}");
        let stolen = alice.ask(SetLock { session: b, lock: LockRange { owner: 2, ..lock } }).await.unwrap();
        assert!(stolen.is_err(), "alice's connection took a lock as bob: {stolen:?}");
        // Bob's lock still stands against alice.
        let held = alice.ask(GetLock { session: a, lock: LockRange { owner: 3, ..lock } }).await.unwrap().unwrap();
        assert!(held.is_some(), "bob's lock was dropped");
        alice.ask(Heartbeat { session: a }).await.unwrap().unwrap();

        let local = service.in_process_client();
        let call = |r: MetaRequest| local.call(MetaCall::from(r));
        call(MetaRequest::Heartbeat(Heartbeat { session: a })).await.unwrap();
        let refused = call(MetaRequest::Goodbye(Goodbye { session: b })).await.unwrap_err();
        assert_eq!(refused.code, proto::error::ErrorCode::NotPermitted, "{refused:?}");
        let root = call(MetaRequest::GetAttr(GetAttr { ino: ROOT_INODE })).await.unwrap();
        assert_eq!(root, MetaReply::Attr(alice.ask(GetAttr { ino: ROOT_INODE }).await.unwrap().unwrap()));

        // A new connection of bob's (a pooled one) binds to bob's session.
        let bob_again = net::RpcClient::connect(&addr, 1, Duration::from_secs(10)).await.unwrap();
        bob_again.ask(Heartbeat { session: b }).await.unwrap().unwrap();
        let refused = bob_again.ask(Heartbeat { session: a }).await.unwrap().unwrap_err();
        assert_eq!(refused.code, proto::error::ErrorCode::NotPermitted);
        // Once bob's session ends, its connection may move on to a new session.
        bob.ask(Goodbye { session: b }).await.unwrap().unwrap();
        let b2 = bob_again.ask(hello()).await.unwrap().unwrap().session;
        bob.ask(Heartbeat { session: b2 }).await.unwrap().unwrap();
    }

    /// A session remembers the certificate it was opened with in its row, so the
    /// binding rule holds after meta restarts (and at every meta over one database).
    #[test]
    fn a_sessions_owner_survives_a_restart_of_meta() {
        let dir = tempfile::tempdir().unwrap();
        let config = test_config(dir.path().join("meta.db"));
        let info = SessionInfo { site: "a".into(), host: "h".into(), pid: 1, purpose: "/mnt".into() };
        let hello = MetaRequest::Hello(Hello { protocol: proto::PROTOCOL_VERSION, session: info });
        let session = {
            let service = MetaService::open(&config).unwrap();
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let host = net::PeerIdentity { name: "/CN=host.a".into(), role: net::Role::Client, site: "a".into() };
            match rt.block_on(service.answer(Caller::ROOT, Some(&host), hello)).unwrap() {
                MetaReply::Welcome(w) => w.session,
                other => panic!("expected Welcome, got {other:?}"),
            }
        };
        let again = MetaService::open(&config).unwrap();
        let owner = again.store.read(move |t| Ok(t.get_session(session)?.and_then(|s| s.owner))).unwrap();
        assert_eq!(owner.as_deref(), Some("/CN=host.a"));
    }

    /// A connection from another certificate cannot take over a session (a Goodbye
    /// or a lock for somebody else's session); the same host's pooled connections can.
    #[test]
    fn only_the_sessions_own_certificate_binds_new_connections_to_it() {
        let ident = |name: &str| net::PeerIdentity { name: name.into(), role: net::Role::Client, site: "a".into() };
        let refused = may_bind(Some("/CN=host.a"), Some(&ident("/CN=host.b")), 7).unwrap_err();
        assert!(matches!(refused, MetaError::NotPermitted(_)), "{refused}");
        assert!(refused.to_string().contains("session 7 belongs to /CN=host.a"));
        assert!(may_bind(Some("/CN=host.a"), Some(&ident("/CN=host.a")), 7).is_ok());
        assert!(may_bind(None, Some(&ident("/CN=host.b")), 7).is_ok(), "opened without TLS");
        assert!(may_bind(None, None, 7).is_ok(), "TLS disabled");
    }

    /// A node's request carrying a newer epoch than meta's is refused and fences meta:
    /// every write after it is refused (EROFS), reads still work; a node of meta's own
    /// epoch is served. Only node and meta certificates (or anyone without TLS) are
    /// believed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_of_a_newer_epoch_fences_meta() {
        use proto::error::ErrorCode;
        let dir = tempfile::tempdir().unwrap();
        let service = MetaService::open(&test_config(dir.path().join("meta.db"))).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(net::serve(listener, service));
        let client = net::RpcClient::connect(&addr, 1, Duration::from_secs(10)).await.unwrap();
        let mkdir = |name: &str| {
            MetaRequest::Create(Create {
                parent: ROOT_INODE,
                name: name.into(),
                node: NewNode::Dir,
                mode: 0o755,
                umask: 0,
                exclusive: true,
            })
        };
        client.ask(Envelope::at_epoch(1, ListNodes {})).await.unwrap().unwrap();
        let made: MetaResult = client.call(&MetaCall::from(mkdir("before"))).await.unwrap();
        assert!(made.is_ok(), "{made:?}");

        let refused = client.ask(Envelope::at_epoch(2, ListNodes {})).await.unwrap().unwrap_err();
        assert_eq!(refused.code, ErrorCode::ReadOnly, "{refused:?}");
        assert!(refused.message.contains("a node has seen epoch 2"), "{}", refused.message);
        let write: MetaResult = client.call(&MetaCall::from(mkdir("after"))).await.unwrap();
        assert_eq!(write.map_err(|e| e.code), Err(ErrorCode::ReadOnly), "a fenced meta accepts no write");
        let read: MetaResult = client
            .call(&MetaCall::from(MetaRequest::Lookup(Lookup { parent: ROOT_INODE, name: b"before".to_vec() })))
            .await
            .unwrap();
        assert!(read.is_ok(), "reads still work: {read:?}");

        let who = |role| net::PeerIdentity { name: "x".into(), role, site: "a".into() };
        assert_eq!(believed_epoch(Some(&who(net::Role::Node)), Some(3)), Some(3));
        assert_eq!(believed_epoch(Some(&who(net::Role::Meta)), Some(3)), Some(3));
        assert_eq!(believed_epoch(None, Some(3)), Some(3), "TLS disabled: trusted");
        assert_eq!(believed_epoch(Some(&who(net::Role::Client)), Some(3)), None, "a client's claim is ignored");
        assert_eq!(believed_epoch(Some(&who(net::Role::Admin)), Some(3)), None);
    }

    /// Opens hand out capabilities for what meta allowed, bound to the peer's name;
    /// only nodes and meta (or anyone, with TLS disabled) learn the key.
    #[test]
    fn capabilities_follow_the_grants_and_the_key_goes_to_nodes_only() {
        use proto::cap::{CapOp, verify};
        let dir = tempfile::tempdir().unwrap();
        let service = MetaService::open(&test_config(dir.path().join("meta.db"))).unwrap();
        let ident = |role| net::PeerIdentity { name: "/CN=host.a".into(), role, site: "a".into() };
        let registered = || MetaReply::Registered(Registered { cluster_id: "c".into(), cap_key: None, epoch: 1 });
        let key_for =
            |peer: Option<&net::PeerIdentity>| match service.with_caps(registered(), Grants::default(), "", peer) {
                MetaReply::Registered(r) => r.cap_key,
                other => panic!("{other:?}"),
            };
        assert_eq!(key_for(Some(&ident(net::Role::Client))), None, "a client never learns the key");
        let key = key_for(Some(&ident(net::Role::Node))).expect("a node learns the key");
        assert_eq!(key_for(None), Some(key));
        let chunk = proto::types::ChunkId([3; 32]);
        let extent = proto::types::Extent { file_offset: 0, len: 1, chunk, chunk_offset: 0 };
        let attr = match service.handle_blocking(MetaRequest::GetAttr(GetAttr { ino: ROOT_INODE })).unwrap() {
            MetaReply::Attr(a) => a,
            other => panic!("{other:?}"),
        };
        let opened = MetaReply::Opened(Opened {
            attr,
            extents: vec![extent],
            caps: ChunkCaps::default(),
            policy: Default::default(),
            parent: None,
            created: false,
        });
        let now = proto::types::Timestamp::now().millis();
        let MetaReply::Opened(read) =
            service.with_caps(opened.clone(), Grants { read: true, put: false }, "/CN=host.a", None)
        else {
            panic!()
        };
        let first = read.caps.read.first();
        assert_eq!(first.map(|c| c.epoch), Some(1), "signed with meta's epoch (a SQLite database's is always 1)");
        assert_eq!(verify(&key, CapOp::Read, "/CN=host.a", Some(&chunk), first, now, 1), Ok(()));
        assert!(verify(&key, CapOp::Read, "/CN=host.b", Some(&chunk), first, now, 1).is_err());
        assert_eq!(read.caps.put, None, "no put capability without an open for writing");
        let MetaReply::Opened(write) = service.with_caps(opened, Grants { read: false, put: true }, "/CN=host.a", None)
        else {
            panic!()
        };
        assert!(write.caps.read.is_empty(), "no read capabilities without read permission");
        assert_eq!(verify(&key, CapOp::Write, "/CN=host.a", None, write.caps.put.as_ref(), now, 1), Ok(()));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_over_rpc_with_concurrent_creates() {
        let dir = tempfile::tempdir().unwrap();
        let service = MetaService::open(&test_config(dir.path().join("meta.db"))).unwrap();
        service.spawn_background();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let cluster = service.cluster_id().to_string();
        tokio::spawn(net::serve(listener, service));
        let client = Arc::new(net::RpcClient::connect(&addr, 2, Duration::from_secs(30)).await.unwrap());

        let info = SessionInfo { site: "s".into(), host: "h".into(), pid: 9, purpose: "test".into() };
        let hello: MetaResult = client
            .call(&MetaCall::from(MetaRequest::Hello(Hello { protocol: proto::PROTOCOL_VERSION, session: info })))
            .await
            .unwrap();
        let Ok(MetaReply::Welcome(Welcome { heartbeat_ms: 5000, cluster_id, .. })) = hello else { panic!("{hello:?}") };
        assert_eq!(cluster_id, cluster);

        let made: MetaResult = client.call(&MetaCall::from(create(ROOT_INODE, "one".into()))).await.unwrap();
        let Ok(MetaReply::Made(Made { attr: one, parent })) = made else { panic!("create failed: {made:?}") };
        assert_eq!((parent.ino, parent.mtime), (ROOT_INODE, one.mtime), "the parent as the create left it");
        let found: MetaResult = client
            .call(&MetaCall::from(MetaRequest::Lookup(Lookup { parent: ROOT_INODE, name: b"one".to_vec() })))
            .await
            .unwrap();
        assert_eq!(found, Ok(MetaReply::Attr(one)));
        let missing: MetaResult = client
            .call(&MetaCall::from(MetaRequest::Lookup(Lookup { parent: ROOT_INODE, name: b"two".to_vec() })))
            .await
            .unwrap();
        assert_eq!(missing.map_err(|e| e.code), Err(proto::error::ErrorCode::NotFound));

        // Many concurrent creates: the writer group-commits them.
        let tasks: Vec<_> = (0..40)
            .map(|t| {
                let client = client.clone();
                tokio::spawn(async move {
                    let mut inos = Vec::new();
                    for i in 0..25 {
                        let r: MetaResult =
                            client.call(&MetaCall::from(create(ROOT_INODE, format!("t{t}-{i}")))).await.unwrap();
                        match r {
                            Ok(MetaReply::Made(m)) => inos.push(m.attr.ino),
                            other => panic!("create failed: {other:?}"),
                        }
                    }
                    inos
                })
            })
            .collect();
        let mut inos = Vec::new();
        for t in tasks {
            inos.extend(t.await.unwrap());
        }
        inos.sort();
        inos.dedup();
        assert_eq!(inos.len(), 1000);
        let root: MetaResult =
            client.call(&MetaCall::from(MetaRequest::GetAttr(GetAttr { ino: ROOT_INODE }))).await.unwrap();
        let Ok(MetaReply::Attr(Attr { nlink: 2, .. })) = root else { panic!("{root:?}") };
        let listed: MetaResult = client
            .call(&MetaCall::from(MetaRequest::ReadDir(ReadDir { ino: ROOT_INODE, after: 0, limit: 5000 })))
            .await
            .unwrap();
        let Ok(MetaReply::Entries(entries)) = listed else { panic!("{listed:?}") };
        assert_eq!(entries.len(), 1001);
    }

    /// Reports create throughput with several threads issuing requests at once, as
    /// FUSE worker threads do. Measures only; asserts nothing about speed.
    #[test]
    fn create_throughput_report() {
        let dir = tempfile::tempdir().unwrap();
        let service = MetaService::open(&test_config(dir.path().join("meta.db"))).unwrap();
        let threads = 8;
        let per_thread = 500;
        let started = std::time::Instant::now();
        std::thread::scope(|scope| {
            for t in 0..threads {
                let service = &service;
                scope.spawn(move || {
                    for i in 0..per_thread {
                        let r = service.handle_blocking(create(ROOT_INODE, format!("f{t}-{i}")));
                        assert!(r.is_ok(), "{r:?}");
                    }
                });
            }
        });
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "meta: {} creates from {threads} threads in {secs:.2} s = {:.0}/s",
            threads * per_thread,
            f64::from(threads * per_thread) / secs
        );
    }

    /// Reports point-read (GetAttr) throughput through the async path, with more
    /// concurrent requests than runtime workers, as a busy meta sees them. Measures only.
    #[test]
    fn point_read_throughput_report() {
        let dir = tempfile::tempdir().unwrap();
        let service = MetaService::open(&test_config(dir.path().join("meta.db"))).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (tasks, per_task) = (16, 2000);
        let started = std::time::Instant::now();
        rt.block_on(async {
            let handles: Vec<_> = (0..tasks)
                .map(|_| {
                    let service = service.clone();
                    tokio::spawn(async move {
                        for _ in 0..per_task {
                            let r = service
                                .answer(Caller::ROOT, None, MetaRequest::GetAttr(GetAttr { ino: ROOT_INODE }))
                                .await;
                            assert!(r.is_ok(), "{r:?}");
                        }
                    })
                })
                .collect();
            for h in handles {
                h.await.unwrap();
            }
        });
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "meta: {} point reads from {tasks} tasks in {secs:.2} s = {:.0}/s",
            tasks * per_task,
            f64::from(tasks * per_task) / secs
        );
    }
}
