//! A full chunk store recovers by itself: chunks of writes that never committed and of
//! deleted files are reclaimed by the node's `reclaim` worker, with no `locus gc`.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};
use testkit::{Cluster, files_under, pattern, write_synced};

#[test]
fn a_full_store_recovers_once_files_are_deleted() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let mut c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_locus")), 0);
    c.add_node_with("n0", "default", &["--capacity", "64M", "--reclaim-grace", "1s"]);
    c.wait_for_nodes(1);
    c.set_root_copies(1);
    let m = c.mount();
    write_synced(&m.join("kept"), &pattern(1 << 20, 1)).unwrap();
    write_synced(&m.join("first"), &pattern(40 << 20, 2)).unwrap();
    let err = write_synced(&m.join("second"), &pattern(40 << 20, 3)).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    let chunks = c.node_dir("n0").join("chunks");
    assert!(files_under(&chunks).1 > 56 << 20, "the store should be nearly full");

    fs::remove_file(m.join("first")).unwrap();
    let _ = fs::remove_file(m.join("second"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while files_under(&chunks).1 > 8 << 20 {
        assert!(Instant::now() < deadline, "the store was not reclaimed: {} bytes left", files_under(&chunks).1);
        std::thread::sleep(Duration::from_millis(200));
    }
    let again = pattern(48 << 20, 4);
    write_synced(&m.join("third"), &again).unwrap();
    assert!(fs::read(m.join("third")).unwrap() == again);
    assert!(fs::read(m.join("kept")).unwrap() == pattern(1 << 20, 1), "a referenced chunk was reclaimed");
    let out = c.locus(&["fsck", "--meta", &c.meta.addr]);
    assert!(out.status.success(), "fsck: {}", String::from_utf8_lossy(&out.stdout));
}
