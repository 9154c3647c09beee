//! `locus`: one binary for every role of a Locus cluster (meta, node, mount, or all
//! three embedded with `up`) and the commands people run against it.

mod admin;
mod bench;
mod block;
mod cli;
mod doctor;
mod home;
mod local;
mod mount_helper;
mod pki;
mod policy;
mod roles;

use anyhow::Context;

/// Keeps chunk-sized buffers (MiBs) in the heap and the heap from being trimmed, so a
/// buffer freed after one transfer is reused by the next instead of being unmapped and
/// faulted in again (first touch of fresh memory runs at a tenth of memcpy speed).
fn tune_allocator() {
    // SAFETY: mallopt only sets allocator parameters; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

fn main() -> std::process::ExitCode {
    tune_allocator();
    // Test builds only: arms the crash points named in FAILPOINTS (see util::failpoint).
    let _crash_points = util::failpoint::fail::FailScenario::setup();
    let (args, argv) = match cli::parse() {
        Ok(Some(parsed)) => parsed,
        Ok(None) => return std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("locus: {}", report(&e));
            return std::process::ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LOCUS_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_log(&args.command))),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal: not in journald, files or pipes.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // (A config file's `background = true` reaches the started process too: it is
    // the detached one and mounts itself.)
    if let cli::Command::Mount(m) = &args.command
        && m.background
        && !m.detached
    {
        // Bounded by the mount's own wait for meta, and a margin for mounting.
        let wait = m.tuning.rpc_timeout + std::time::Duration::from_secs(30);
        return mount_helper::start_in_background(&argv, wait).unwrap_or_else(|e| {
            eprintln!("locus: {}", report(&e));
            std::process::ExitCode::FAILURE
        });
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("locus: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = match rt.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("locus: {}", report(&e));
            std::process::ExitCode::FAILURE
        }
    };
    // Blocking work still under way (a database call waiting on a hung server, up to
    // --db-timeout) must not hold the exit: nothing of it was acknowledged to anyone.
    rt.shutdown_timeout(EXIT_GRACE);
    code
}

/// How long a process that was told to stop waits for its blocking work to finish.
const EXIT_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// What is logged unless `LOCUS_LOG` says otherwise: a service (`up`, `meta`, `node`,
/// `mount`) tells what it does; a command a person runs and reads (`status`, `fsck`,
/// `policy`, ...) prints its answer and only warnings beside it.
fn default_log(command: &cli::Command) -> &'static str {
    use cli::Command::*;
    match command {
        Meta(cli::MetaArgs { action: None, .. }) | Up(_) | Mount(_) => "warn,locus=info,meta=info,node=info",
        // GnuTLS clients (qemu, libnbd) send an IP address as SNI, which rustls warns of.
        Nbd(_) => "warn,rustls=error,locus=info",
        Node(a) if a.action.is_none() => "warn,locus=info,meta=info,node=info",
        Meta(_)
        | Node(_)
        | Status(_)
        | Doctor(_)
        | Fsck(_)
        | Gc(_)
        | Policy(_)
        | Home(_)
        | Ca(_)
        | Login(_)
        | Bench(_)
        | Completions { .. }
        | Man { .. } => "warn",
    }
}

/// An error and its causes on one line, each message once: library errors often
/// repeat their source's message in their own, and the chain would say it twice.
fn report(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let msg = cause.to_string();
        if line.contains(&msg) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&msg);
    }
    line
}

async fn run(args: cli::Cli) -> anyhow::Result<std::process::ExitCode> {
    use cli::Command::*;
    net::configure(net::Transport {
        congestion: Some(args.tcp_congestion.clone()).filter(|c| !c.is_empty()),
        buffer_bytes: args.socket_buffer.map(|b| b as usize),
    });
    net::set_limits(net::Limits {
        idle_timeout: args.idle_timeout,
        frame_timeout: args.frame_timeout,
        handshake_timeout: args.handshake_timeout,
        ..net::Limits::default()
    });
    match credentials(&args.command) {
        Some(Credentials::Own(what)) => pki::install(&args.tls, what)?,
        Some(Credentials::Operator(what, meta)) => pki::install(&local::admin_tls(args.tls.clone(), meta), what)?,
        None => {}
    }
    match args.command {
        Up(a) => roles::up(a, args.tls).await,
        Meta(cli::MetaArgs { action: Some(cli::MetaAction::Migrate(m)), .. }) => roles::migrate(m).await,
        Meta(cli::MetaArgs { action: Some(cli::MetaAction::Promote(p)), .. }) => roles::promote(p).await,
        Meta(cli::MetaArgs { action: Some(cli::MetaAction::Lost(l)), .. }) => roles::lost(l).await,
        Meta(a) => roles::meta(a).await,
        Node(a) => roles::node(*a).await,
        Mount(a) => roles::mount(a).await,
        Status(a) => admin::status(a).await,
        Doctor(a) => doctor::run(a, args.tls, args.config.as_deref()).await,
        Fsck(a) => admin::fsck(a).await,
        Gc(a) => admin::gc(a).await,
        Policy(a) => policy::run(a).await,
        Home(a) => home::run(a).await,
        Ca(c) => pki::command(c),
        Login(a) => admin::login(a).await,
        Bench(a) => bench::run(a).await,
        Nbd(a) => block::serve(a).await,
        Completions { shell } => {
            cli::completions(shell);
            Ok(std::process::ExitCode::SUCCESS)
        }
        Man { dir } => {
            let pages =
                cli::man_pages(&dir).with_context(|| format!("cannot write man pages into {}", dir.display()))?;
            println!("{pages} man pages in {}", dir.display());
            Ok(std::process::ExitCode::SUCCESS)
        }
    }
}

/// The certificate a command installs before it runs; the name is what its errors say.
enum Credentials<'a> {
    /// A service's own (`--ca --cert --key`).
    Own(&'static str),
    /// An operator's command (status, fsck, gc, policy, node admission) talking to the
    /// meta at `--meta`: the certificate given, or else the admin certificate of the
    /// cluster `locus up` started here when that is the meta it talks to.
    Operator(&'static str, Option<&'a str>),
}

/// `up`, `ca`, `meta migrate` and `meta promote` install none (`up` makes its own).
fn credentials(command: &cli::Command) -> Option<Credentials<'_>> {
    use Credentials::*;
    use cli::Command::*;
    match command {
        Up(_) | Ca(_) | Meta(cli::MetaArgs { action: Some(_), .. }) | Completions { .. } | Man { .. } => None,
        // It checks the certificate files itself, and uses them only if they load.
        Doctor(_) => None,
        Meta(_) => Some(Own("locus meta")),
        Node(a) => Some(match &a.action {
            Some(action) => Operator("locus node", action.meta()),
            None => Own("locus node"),
        }),
        Mount(_) => Some(Own("locus mount")),
        Login(_) => Some(Own("locus login")),
        Bench(_) => Some(Own("locus bench")),
        Nbd(_) => Some(Own("locus nbd")),
        Status(a) => Some(Operator("locus status", a.admin.meta.as_deref())),
        Fsck(a) => Some(Operator("locus fsck", a.meta.as_deref())),
        Gc(a) => Some(Operator("locus gc", a.meta.as_deref())),
        Policy(a) => Some(Operator("locus policy", a.meta.as_deref())),
        Home(a) => Some(Operator("locus home", a.meta.as_deref())),
    }
}
