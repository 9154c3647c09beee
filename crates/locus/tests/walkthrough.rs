//! The README's two-site walkthrough (`deploy/two-sites/walkthrough.sh all`) runs as
//! written, with this build's binaries: two sites in network namespaces joined by the
//! WAN emulator, a PostgreSQL server per site with a hot standby of the other's, a home
//! at each site, writes at both, a move, a cut and a rejoin, a move back, fsck clean.

use std::path::Path;
use std::process::Command;

#[test]
fn the_two_site_walkthrough_runs_as_written() {
    if !testkit::can_mount()
        || !testkit::netns::available()
        || !testkit::netns::have_ethtool()
        || !testkit::postgres::available()
    {
        eprintln!("SKIPPED: needs root, /dev/fuse, `ip netns`, ethtool and PostgreSQL");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/two-sites/walkthrough.sh");
    let dir = std::env::temp_dir().join(format!("locus-walkthrough-{}", std::process::id()));
    let out = Command::new(&script)
        .arg("all")
        .arg(&dir)
        .env("LOCUS", env!("CARGO_BIN_EXE_locus"))
        .env("LOCUS_WAN", testkit::netns::locus_wan_bin())
        .output()
        .expect("run the walkthrough");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let tail = |s: &str| s.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    assert!(
        out.status.success() && stdout.contains("walkthrough done"),
        "the walkthrough failed:\n--- stdout:\n{}\n--- stderr:\n{}",
        tail(&stdout),
        tail(&stderr)
    );
    assert!(!dir.exists(), "the walkthrough's `down` left {}", dir.display());
}
