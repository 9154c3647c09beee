//! `passthrough BACKING_DIR MOUNTPOINT`: mounts a FUSE mirror of BACKING_DIR, configured like a
//! Locus mount (two request threads with cloned fds, 1 MiB max_write, 1 s TTLs), so benchmarks
//! can tell the cost of FUSE itself from the cost of Locus. SIGINT or SIGTERM unmounts and exits.

mod fs;

use fuser::{Config, MountOption, Session, SessionACL};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Same defaults as `fuse::MountConfig` in the Locus workspace.
const THREADS: usize = 2;
const TTL: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let [backing, mountpoint] = args.as_slice() else {
        eprintln!("usage: passthrough BACKING_DIR MOUNTPOINT");
        return ExitCode::from(2);
    };
    match run(PathBuf::from(backing), PathBuf::from(mountpoint)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("passthrough: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(backing: PathBuf, mountpoint: PathBuf) -> std::io::Result<()> {
    let backing = backing.canonicalize()?;
    // Block the stop signals before any thread starts so that every thread inherits the mask
    // and only the main thread's sigtimedwait sees them.
    let signals = stop_signals();
    // SAFETY: `signals` is an initialised signal set; a null old-set pointer is allowed.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &signals, std::ptr::null_mut()) };

    let fs = fs::Passthrough::new(backing.clone(), TTL)?;
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("passthrough".into()),
        MountOption::Subtype("passthrough".into()),
        MountOption::DefaultPermissions,
        MountOption::Dev,
        MountOption::Suid,
    ];
    config.acl = SessionACL::All;
    config.n_threads = Some(THREADS);
    config.clone_fd = THREADS > 1;
    let mut session = Session::new(fs, &mountpoint, &config)?;
    let mut unmounter = session.unmount_callable();
    let worker = std::thread::Builder::new().name("fuse".into()).spawn(move || session.run())?;
    println!("passthrough: {} mounted on {}; SIGINT/SIGTERM to stop", backing.display(), mountpoint.display());

    let tick = libc::timespec { tv_sec: 0, tv_nsec: 200_000_000 };
    while !worker.is_finished() {
        // SAFETY: valid signal set and timeout; the siginfo pointer may be null.
        let sig = unsafe { libc::sigtimedwait(&signals, std::ptr::null_mut(), &tick) };
        if sig > 0 {
            if let Err(e) = unmounter.unmount() {
                eprintln!("passthrough: unmount failed: {e}; try `fusermount3 -u {}`", mountpoint.display());
            }
            break;
        }
    }
    // The request threads only see the end of the session once the kernel drops the connection,
    // which never happens while another mount namespace still holds a copy of the mount. Give
    // them a moment, then exit anyway: closing /dev/fuse at exit ends the connection.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !worker.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if !worker.is_finished() {
        eprintln!("passthrough: unmounted; the FUSE connection is still referenced elsewhere, exiting anyway");
        return Ok(());
    }
    worker.join().map_err(|_| std::io::Error::other("FUSE session thread panicked"))?
}

fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}
