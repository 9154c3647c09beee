//! How mount(8) and fstab start a Locus mount: `mount -t fuse.locus META DIR -o OPTIONS`
//! runs `/sbin/mount.fuse.locus` (a link to this binary), whose arguments become `locus
//! mount DIR --meta META --background ...`; and `--background`, which returns once the
//! file system is mounted and leaves it served by a process of its own, as mount(8)
//! expects of a helper.

use anyhow::{Context, anyhow, bail};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

/// The names this binary answers to as mount(8)'s helper.
const HELPER_NAMES: [&str; 2] = ["mount.fuse.locus", "mount.locus"];

/// Mount options mount(8), fstab and systemd use for themselves, which a helper is
/// handed and must accept without acting on them.
const GENERIC_OPTIONS: [&str; 22] = [
    "defaults",
    "auto",
    "noauto",
    "nofail",
    "_netdev",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
    "rw",
    "exec",
    "noexec",
    "suid",
    "nosuid",
    "dev",
    "nodev",
    "atime",
    "noatime",
    "relatime",
    "nodiratime",
    "lazytime",
];

/// `key=value` mount options and the flag of `locus mount` (or of locus itself, when
/// `global`) each stands for.
const OPTIONS: [(&str, &str, bool); 13] = [
    ("config", "--config", true),
    ("ca", "--ca", true),
    ("cert", "--cert", true),
    ("key", "--key", true),
    ("site", "--site", false),
    ("logins", "--logins", false),
    ("log", "--log-file", false),
    ("cache", "--cache", false),
    ("chunk_size", "--chunk-size", false),
    ("attr_ttl", "--attr-ttl", false),
    ("readahead_chunks", "--readahead-chunks", false),
    ("upload_window", "--upload-window", false),
    ("rpc_timeout", "--rpc-timeout", false),
];

/// What to do with this process's arguments: run them as given, run the arguments of
/// `locus` that a helper invocation stands for, or nothing (mount(8)'s `-f`, a fake
/// mount).
#[derive(Debug, PartialEq, Eq)]
pub enum Invocation {
    Run(Vec<String>),
    Nothing,
}

/// This process's arguments as `locus` reads them: unchanged, unless it was started
/// as mount(8)'s helper (`argv[0]` named `mount.fuse.locus`), whose form
/// `SOURCE DIR [-sfnv] [-o OPTIONS] [-t TYPE]` is translated.
pub fn invocation(argv: Vec<String>) -> Result<Invocation, String> {
    let called = argv.first().map(|a| Path::new(a).file_name().unwrap_or_default().to_string_lossy().into_owned());
    match called {
        Some(name) if HELPER_NAMES.contains(&name.as_str()) => helper_arguments(&argv[1..]),
        _ => Ok(Invocation::Run(argv)),
    }
}

/// `locus`'s arguments for a helper invocation's.
fn helper_arguments(args: &[String]) -> Result<Invocation, String> {
    let usage = "usage: mount.fuse.locus META_HOST:PORT MOUNTPOINT [-o OPTION[,OPTION...]]";
    let (mut positional, mut options, mut fake) = (Vec::new(), Vec::new(), false);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-o" => options.extend(args.next().ok_or(format!("-o needs options; {usage}"))?.split(',')),
            "-t" | "-N" => drop(args.next()),
            flags if flags.starts_with('-') && flags.len() > 1 => {
                if !flags[1..].chars().all(|c| "sfnvi".contains(c)) {
                    return Err(format!("unknown flag {flags}; {usage}"));
                }
                fake |= flags.contains('f');
            }
            _ => positional.push(arg.as_str()),
        }
    }
    let [source, mountpoint] = positional[..] else {
        return Err(usage.to_string());
    };
    let (mut global, mut flags) = (Vec::new(), Vec::new());
    for option in options.iter().map(|o| o.trim()).filter(|o| !o.is_empty()) {
        let (key, value) = option.split_once('=').map_or((option, None), |(k, v)| (k, Some(v)));
        if key.starts_with("x-") {
            continue;
        }
        let key = key.replace('-', "_");
        if GENERIC_OPTIONS.contains(&key.as_str()) || key == "comment" {
            continue;
        }
        if key == "ro" {
            return Err("a read-only Locus mount is not supported: mount it read-write (`rw`)".into());
        }
        let Some((_, flag, is_global)) = OPTIONS.iter().find(|(name, _, _)| *name == key) else {
            let known: Vec<&str> = OPTIONS.iter().map(|(name, _, _)| *name).collect();
            return Err(format!("unknown mount option {option:?}; Locus takes {}=VALUE", known.join("=, ")));
        };
        let value = value.filter(|v| !v.is_empty()).ok_or(format!("mount option {key} needs a value ({key}=...)"))?;
        (if *is_global { &mut global } else { &mut flags }).push(format!("{flag}={value}"));
    }
    if fake {
        return Ok(Invocation::Nothing);
    }
    let mut argv = vec!["locus".to_string()];
    argv.extend(global);
    argv.extend(["mount".into(), mountpoint.into(), "--meta".into(), source.into(), "--background".into()]);
    argv.extend(flags);
    Ok(Invocation::Run(argv))
}

/// The hidden flag that tells a mount started by `--background` to let go of its
/// starter's output once it is mounted.
pub const DETACHED: &str = "--detached";

/// `locus mount --background`: starts the same mount in a process of its own (its own
/// process group, so the starter's terminal signals do not reach it) and returns once
/// it is mounted; if it fails first, its error is this process's. `argv` is this
/// process's arguments; `wait` bounds the start (meta unreachable).
pub fn start_in_background(argv: &[String], wait: Duration) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find the locus binary to start the mount")?;
    let args: Vec<&String> = argv[1..].iter().filter(|a| *a != "--background").collect();
    let mut child = std::process::Command::new(exe)
        .args(args)
        .arg(DETACHED)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .context("cannot start the mount's process")?;
    let (stdout, mut stderr) = (child.stdout.take(), child.stderr.take());
    // Its error output, should it fail (read aside: a full pipe would stall it).
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_string(&mut text);
        }
        text
    });
    let (ready_tx, ready) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.map(BufReader::new).into_iter().flat_map(|r| r.lines()).map_while(Result::ok) {
            if line.starts_with(MOUNTED) {
                let _ = ready_tx.send(line);
                return;
            }
        }
    });
    let started = Instant::now();
    loop {
        match ready.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => {
                println!("{line} (process {})", child.id());
                return Ok(ExitCode::SUCCESS);
            }
            // Its output ended: it is exiting.
            Err(RecvTimeoutError::Disconnected) => std::thread::sleep(Duration::from_millis(50)),
            Err(RecvTimeoutError::Timeout) => {}
        }
        if let Some(status) = child.try_wait()? {
            let text = errors.join().unwrap_or_default();
            let said = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message");
            bail!("the mount's process exited ({status}) before mounting: {}", said.trim_start_matches("locus: "));
        }
        if started.elapsed() > wait {
            let _ = child.kill();
            let _ = child.wait();
            return Err(anyhow!("not mounted within {wait:?}; stopped the mount's process"));
        }
    }
}

/// The line a mount prints once it is mounted (what `start_in_background` waits for).
pub const MOUNTED: &str = "locus mounted on";

/// Where a mount started by `--background` sends its output once mounted (its
/// starter stops reading it then): `log`, appended (made if need be), or /dev/null.
/// Opened before mounting, so that a log it cannot write is the starter's error.
pub fn output_target(log: Option<&Path>) -> anyhow::Result<std::fs::File> {
    match log {
        Some(path) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open the log file {}", path.display())),
        None => Ok(std::fs::OpenOptions::new().write(true).open("/dev/null")?),
    }
}

/// Points this process's standard output and error at `target` (`output_target`).
pub fn detach_output(target: &std::fs::File) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    for fd in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
        // SAFETY: dup2 of a descriptor `target` keeps open onto the standard ones; Rust's
        // own handles to them stay valid (they refer to the descriptor numbers).
        if unsafe { libc::dup2(target.as_raw_fd(), fd) } < 0 {
            return Err(std::io::Error::last_os_error()).context("cannot redirect the mount's output");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn a_helper_invocation_becomes_a_background_mount() {
        let as_helper = invocation(args(
            "/sbin/mount.fuse.locus meta-a:7070 /mnt/locus -o rw,_netdev,nofail,x-systemd.automount,site=a,config=/etc/locus/locus.toml,cache=1G",
        ));
        let expected =
            "locus --config=/etc/locus/locus.toml mount /mnt/locus --meta meta-a:7070 --background --site=a --cache=1G";
        assert_eq!(as_helper, Ok(Invocation::Run(args(expected))));
        // Flags mount(8) passes, options given twice, dashes in keys.
        let as_helper = invocation(args("mount.locus m:1 /x -n -o site=b -o attr-ttl=2 -t fuse.locus"));
        let expected = "locus mount /x --meta m:1 --background --site=b --attr-ttl=2";
        assert_eq!(as_helper, Ok(Invocation::Run(args(expected))));
        assert_eq!(invocation(args("mount.fuse.locus m:1 /x -f -o site=a")), Ok(Invocation::Nothing));
        // Any other name: the arguments as given.
        assert_eq!(invocation(args("locus status")), Ok(Invocation::Run(args("locus status"))));
    }

    #[test]
    fn a_helper_invocation_that_makes_no_sense_is_refused_with_the_reason() {
        let refused = |line: &str| invocation(args(line)).expect_err(line);
        assert!(refused("mount.fuse.locus m:1").contains("usage"));
        assert!(refused("mount.fuse.locus m:1 /x /y").contains("usage"));
        assert!(refused("mount.fuse.locus m:1 /x -o").contains("-o needs"));
        assert!(refused("mount.fuse.locus m:1 /x -q").contains("unknown flag"));
        assert!(refused("mount.fuse.locus m:1 /x -o ro").contains("read-only"));
        assert!(refused("mount.fuse.locus m:1 /x -o site").contains("needs a value"));
        let unknown = refused("mount.fuse.locus m:1 /x -o sitte=a");
        assert!(unknown.contains("sitte") && unknown.contains("site="), "{unknown}");
    }
}
