//! Metadata homes through real processes: `locus meta --home`, `locus home create`, a
//! mount writing in two homes, a rename between them refused with EXDEV (so `mv`
//! copies), gc keeping a home's chunks, and the homes known again after a restart.

use std::fs;
use std::path::Path;
use testkit::Cluster;

fn text(out: &std::process::Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_subtree_in_a_home_of_its_own_behaves_as_one_namespace() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let dbs = tempfile::tempdir().unwrap();
    let home = format!("b=sqlite://{}", dbs.path().join("home-b.db").display());
    let mut c = Cluster::start_with(Path::new(env!("CARGO_BIN_EXE_locus")), 1, &["--home", &home]);
    let mnt = c.mount();
    fs::create_dir(mnt.join("top")).unwrap();
    let made = text(&c.locus(&["home", "create", "/proj", "b", "--mode", "775", "--meta", &c.meta.addr]));
    assert!(made.contains("/proj: the root of home b"), "{made}");
    // Refused: a name that exists, an unknown home, a parent that is not there.
    for (path, home) in [("/proj", "b"), ("/other", "nowhere"), ("/missing/x", "b")] {
        let out = c.locus(&["home", "create", path, home, "--meta", &c.meta.addr]);
        assert!(!out.status.success(), "{path} in {home} was accepted");
    }
    // Files in both homes, through one mount.
    let data: Vec<u8> = (0..(5u32 << 20)).map(|i| (i % 251) as u8).collect();
    fs::create_dir_all(mnt.join("proj/run/1")).unwrap();
    fs::write(mnt.join("proj/run/1/out"), &data).unwrap();
    fs::write(mnt.join("top/in"), b"input").unwrap();
    assert_eq!(fs::read(mnt.join("proj/run/1/out")).unwrap(), data);
    let mut names: Vec<_> = fs::read_dir(&mnt).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["proj", "top"]);
    // A rename inside a home works; between homes it is EXDEV, and mv copies instead.
    fs::rename(mnt.join("proj/run/1/out"), mnt.join("proj/out")).unwrap();
    let err = fs::rename(mnt.join("top/in"), mnt.join("proj/in")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EXDEV));
    let err = fs::hard_link(mnt.join("top/in"), mnt.join("proj/in")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EXDEV));
    let mv = std::process::Command::new("mv").arg(mnt.join("top/in")).arg(mnt.join("proj/in")).status().unwrap();
    assert!(mv.success());
    assert_eq!(fs::read(mnt.join("proj/in")).unwrap(), b"input");
    assert!(!mnt.join("top/in").exists());
    // gc deletes nothing a home references.
    text(&c.locus(&["gc", "--meta", &c.meta.addr]));
    text(&c.locus(&["fsck", "--meta", &c.meta.addr]));
    let list = text(&c.locus(&["home", "list", "--meta", &c.meta.addr]));
    assert!(list.contains("root") && list.contains("/proj"), "{list}");
    // Meta restarted: the home is its database's again; everything reads back.
    c.restart_meta();
    let mnt = c.mount();
    assert_eq!(fs::read(mnt.join("proj/out")).unwrap(), data);
    assert_eq!(fs::read(mnt.join("proj/in")).unwrap(), b"input");
    fs::write(mnt.join("proj/after"), b"later").unwrap();
    assert_eq!(fs::read(mnt.join("proj/after")).unwrap(), b"later");
}
