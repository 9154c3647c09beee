//! Unit tests of the chunk store against real temporary directories.

use super::*;
use proptest::prelude::*;

fn store(dir: &Path) -> ChunkStore {
    ChunkStore::open(dir, 1 << 20).unwrap()
}

fn put_new(s: &ChunkStore, data: &[u8]) -> ChunkId {
    let id = ChunkId::of(data);
    s.put(&id, data).unwrap();
    id
}

fn files_in(dir: &Path) -> usize {
    fs::read_dir(dir).unwrap().count()
}

#[test]
fn roundtrip_and_ranges() {
    let d = tempfile::tempdir().unwrap();
    let s = store(d.path());
    let data: Vec<u8> = (0..=255u8).collect();
    let id = put_new(&s, &data);
    assert_eq!(s.get(&id, 0, 256).unwrap(), data);
    assert_eq!(s.get(&id, 10, 5).unwrap(), &data[10..15]);
    // len is clipped at the end of the chunk.
    assert_eq!(s.get(&id, 250, 100).unwrap(), &data[250..]);
    assert_eq!(s.get(&id, 1, u64::MAX).unwrap(), &data[1..]);
    assert!(s.get(&id, 256, 10).unwrap().is_empty());
    assert!(matches!(s.get(&id, 257, 1), Err(ChunkError::Range { offset: 257, size: 256, .. })));
    let missing = ChunkId::of(b"nope");
    assert!(matches!(s.get(&missing, 0, 1), Err(ChunkError::NotFound { .. })));
    assert_eq!(s.has(&[id, missing]).unwrap(), vec![true, false]);
    let hex = id.to_hex();
    assert!(d.path().join("chunks").join(&hex[..2]).join(&hex).is_file());
    let st = s.stats();
    assert_eq!((st.capacity_bytes, st.used_bytes, st.chunk_count, st.corrupt_reads), (1 << 20, 256, 1, 0));
}

#[test]
fn empty_chunk_roundtrips() {
    let d = tempfile::tempdir().unwrap();
    let s = store(d.path());
    let id = put_new(&s, b"");
    assert!(s.get(&id, 0, 10).unwrap().is_empty());
    assert_eq!(s.stats().chunk_count, 1);
}

#[test]
fn put_is_idempotent() {
    let d = tempfile::tempdir().unwrap();
    let s = store(d.path());
    let id = put_new(&s, b"hello");
    s.put(&id, b"hello").unwrap();
    s.put(&id, b"hello").unwrap();
    let st = s.stats();
    assert_eq!((st.used_bytes, st.chunk_count), (5, 1));
    assert_eq!(files_in(&d.path().join("tmp")), 0);
}

#[test]
fn id_mismatch_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let s = store(d.path());
    let id = ChunkId::of(b"one");
    let err = s.put(&id, b"two").unwrap_err();
    assert!(
        matches!(err, ChunkError::IdMismatch { claimed, actual } if claimed == id && actual == ChunkId::of(b"two"))
    );
    assert_eq!(s.has(&[id, ChunkId::of(b"two")]).unwrap(), vec![false, false]);
    assert_eq!(s.stats().chunk_count, 0);
    assert_eq!(WireError::from(err).code, ErrorCode::InvalidArgument);
}

#[test]
fn corrupt_chunk_is_never_served_and_can_be_repaired() {
    let d = tempfile::tempdir().unwrap();
    let s = store(d.path());
    let bad = put_new(&s, b"the quick brown fox");
    let good = put_new(&s, b"jumps over the lazy dog");
    let path = s.path_of(&bad);
    let mut bytes = fs::read(&path).unwrap();
    bytes[3] ^= 0x01;
    fs::write(&path, &bytes).unwrap();

    let err = s.get(&bad, 0, 4).unwrap_err();
    assert!(matches!(&err, ChunkError::Corrupt { id, .. } if *id == bad));
    assert!(err.to_string().contains(&bad.to_hex()), "{err}");
    assert_eq!(WireError::from(err).code, ErrorCode::Corrupt);
    assert!(s.get(&bad, 0, 4).is_err());
    assert_eq!(s.stats().corrupt_reads, 2);
    assert_eq!(s.get(&good, 0, 5).unwrap(), &b"jumps"[..]);

    let missing = ChunkId::of(b"missing");
    assert_eq!(s.verify(&[good, bad, missing]), vec![bad, missing]);
    assert_eq!(s.stats().corrupt_reads, 2, "verify serves nothing");

    // Putting the right bytes again replaces the corrupt copy.
    s.put(&bad, b"the quick brown fox").unwrap();
    assert_eq!(s.get(&bad, 4, 5).unwrap(), &b"quick"[..]);
    assert!(s.verify(&[good, bad]).is_empty());
    let st = s.stats();
    assert_eq!((st.chunk_count, st.used_bytes), (2, 19 + 23));
}

#[test]
fn capacity_cap_refuses_and_leaves_nothing_behind() {
    let d = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(d.path(), 100).unwrap();
    put_new(&s, &[1u8; 60]);
    let big = [2u8; 41];
    let id = ChunkId::of(&big);
    let err = s.put(&id, &big).unwrap_err();
    assert!(matches!(err, ChunkError::NoSpace { len: 41, .. }), "{err}");
    assert_eq!(WireError::from(err).code, ErrorCode::NoSpace);
    assert_eq!(s.has(&[id]).unwrap(), vec![false]);
    assert_eq!(files_in(&d.path().join("tmp")), 0);
    let st = s.stats();
    assert_eq!((st.used_bytes, st.chunk_count), (60, 1));
    // Exactly filling the capacity is allowed.
    put_new(&s, &[3u8; 40]);
    assert_eq!(s.stats().used_bytes, 100);
}

#[test]
fn list_pages_in_ascending_order() {
    let d = tempfile::tempdir().unwrap();
    let s = store(d.path());
    let mut ids: Vec<ChunkId> = (0..60u32).map(|i| put_new(&s, &i.to_le_bytes())).collect();
    ids.sort();
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = s.list(after, 7).unwrap();
        assert!(page.len() <= 7);
        if page.is_empty() {
            break;
        }
        after = page.last().copied();
        seen.extend(page);
    }
    assert_eq!(seen, ids);
    assert_eq!(s.list(None, 1000).unwrap(), ids);
    assert!(s.list(None, 0).unwrap().is_empty());
    assert!(s.list(Some(ChunkId([0xff; 32])), 10).unwrap().is_empty());
    // Stray files are not chunks.
    fs::write(d.path().join("chunks").join(&ids[0].to_hex()[..2]).join("junk"), b"x").unwrap();
    assert_eq!(s.list(None, 1000).unwrap(), ids);
}

#[test]
fn delete_respects_min_age() {
    let d = tempfile::tempdir().unwrap();
    let s = store(d.path());
    let old = put_new(&s, b"old chunk");
    let young = put_new(&s, b"young");
    let hour = Duration::from_secs(3600);
    assert_eq!(s.delete(&[old, young], hour).unwrap(), 0);

    let backdate = |id: &ChunkId| {
        let f = OpenOptions::new().write(true).open(s.path_of(id)).unwrap();
        f.set_modified(SystemTime::now() - 2 * hour).unwrap();
    };
    backdate(&old);
    let missing = ChunkId::of(b"missing");
    assert_eq!(s.delete(&[old, young, missing], hour).unwrap(), 1);
    assert_eq!(s.has(&[old, young]).unwrap(), vec![false, true]);
    let st = s.stats();
    assert_eq!((st.used_bytes, st.chunk_count), (5, 1));

    // Re-putting an old chunk makes it young again, so gc racing a writer keeps it.
    backdate(&young);
    s.put(&young, b"young").unwrap();
    assert_eq!(s.delete(&[young], hour).unwrap(), 0);
    assert_eq!(s.delete(&[young], Duration::ZERO).unwrap(), 1);
    assert_eq!(s.stats().chunk_count, 0);
}

#[test]
fn second_open_fails_while_first_is_alive() {
    let d = tempfile::tempdir().unwrap();
    let first = store(d.path());
    let err = ChunkStore::open(d.path(), 1 << 20).unwrap_err();
    assert!(matches!(err, ChunkError::InUse { .. }));
    let msg = err.to_string();
    assert!(msg.contains("in use by another process") && msg.contains(&d.path().display().to_string()), "{msg}");
    drop(first);
    store(d.path());
}

#[test]
fn format_marker_is_checked() {
    let d = tempfile::tempdir().unwrap();
    drop(store(d.path()));
    let format = d.path().join("FORMAT");
    assert_eq!(fs::read_to_string(&format).unwrap().trim(), "locus-chunk-store 1");

    fs::write(&format, "locus-chunk-store 2\n").unwrap();
    let msg = ChunkStore::open(d.path(), 1 << 20).unwrap_err().to_string();
    assert!(msg.contains("newer") && msg.contains("format 2"), "{msg}");

    fs::write(&format, "something else\n").unwrap();
    let msg = ChunkStore::open(d.path(), 1 << 20).unwrap_err().to_string();
    assert!(msg.contains("not a Locus chunk store"), "{msg}");

    // A non-empty directory without FORMAT is not taken over.
    let other = tempfile::tempdir().unwrap();
    fs::write(other.path().join("precious.txt"), b"data").unwrap();
    let err = ChunkStore::open(other.path(), 1 << 20).unwrap_err();
    assert!(matches!(err, ChunkError::Format { .. }), "{err}");
    assert!(!other.path().join("FORMAT").exists());
}

#[test]
fn reopen_scans_usage_and_cleans_tmp() {
    let d = tempfile::tempdir().unwrap();
    let ids = {
        let s = store(d.path());
        vec![put_new(&s, b"a"), put_new(&s, b"bb"), put_new(&s, b"ccc")]
    };
    fs::write(d.path().join("tmp").join("leftover.1.2"), b"half written").unwrap();
    fs::create_dir(d.path().join("tmp").join("leftover-dir")).unwrap();
    let s = store(d.path());
    assert_eq!(files_in(&d.path().join("tmp")), 0);
    let st = s.stats();
    assert_eq!((st.used_bytes, st.chunk_count, st.corrupt_reads), (6, 3, 0));
    assert_eq!(s.get(&ids[2], 0, 3).unwrap(), &b"ccc"[..]);
}

#[test]
fn opening_creates_missing_directories() {
    let d = tempfile::tempdir().unwrap();
    let nested = d.path().join("a").join("b");
    let s = store(&nested);
    assert_eq!(s.dir(), nested);
    for sub in ["chunks", "tmp", "LOCK", "FORMAT"] {
        assert!(nested.join(sub).exists(), "{sub} missing");
    }
}

#[test]
fn error_codes_on_the_wire() {
    let id = ChunkId::of(b"x");
    let cases = [
        (ChunkError::NotFound { id }, ErrorCode::NotFound),
        (ChunkError::Range { id, offset: 9, size: 1 }, ErrorCode::InvalidArgument),
        (ChunkError::Io { action: "read", path: "/x".into(), source: io::Error::other("boom") }, ErrorCode::Io),
    ];
    for (err, code) in cases {
        let msg = err.to_string();
        let wire = WireError::from(err);
        assert_eq!((wire.code, wire.message), (code, msg));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Law: a ranged get answers exactly the clipped slice of what was put.
    #[test]
    fn get_is_the_clipped_slice(data in prop::collection::vec(any::<u8>(), 0..300), offset in 0u64..320, len in 0u64..400) {
        let d = tempfile::tempdir().unwrap();
        let s = store(d.path());
        let id = put_new(&s, &data);
        let got = s.get(&id, offset, len);
        if offset as usize > data.len() {
            prop_assert!(matches!(got, Err(ChunkError::Range { .. })), "expected a Range error");
        } else {
            let end = (offset + len).min(data.len() as u64) as usize;
            prop_assert_eq!(got.unwrap(), &data[offset as usize..end]);
        }
    }
}

#[test]
fn an_encrypted_store_holds_no_plaintext_and_refuses_a_tampered_file() {
    let dir = tempfile::tempdir().unwrap();
    let key = seal::AtRest::new(&[42; 32]);
    let s = store(dir.path()).encrypted(key);
    let secret: Vec<u8> = b"the launch codes are 0000 ".iter().copied().cycle().take(64 << 10).collect();
    let id = put_new(&s, &secret);
    let on_disk = fs::read(s.path_of(&id)).unwrap();
    assert!(on_disk.starts_with(seal::MAGIC));
    assert!(!on_disk.windows(20).any(|w| w == &secret[..20]), "plaintext found in the chunk file");
    assert_eq!(s.get(&id, 0, u64::MAX).unwrap(), secret, "reads decrypt");
    // Idempotent put keeps the sealed copy; the same bytes put twice are sealed with
    // different nonces (no equal ciphertexts to compare).
    s.put(&id, &secret).unwrap();
    assert_eq!(fs::read(s.path_of(&id)).unwrap(), on_disk);
    let other = seal::AtRest::new(&[42; 32]).seal(&id, &secret);
    assert_ne!(other, on_disk);

    // One flipped bit anywhere is refused, counted, and reported by verify.
    let mut bad = on_disk.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    fs::write(s.path_of(&id), &bad).unwrap();
    assert!(matches!(s.get(&id, 0, 1), Err(ChunkError::Corrupt { .. })));
    assert_eq!(s.verify(&[id]), vec![id]);
    assert_eq!(s.stats().corrupt_reads, 1);
    // A sealed file moved under another id does not open either.
    let twin = put_new(&s, b"another chunk");
    fs::write(s.path_of(&twin), &on_disk).unwrap();
    assert!(matches!(s.get(&twin, 0, 1), Err(ChunkError::Corrupt { .. })));
    // A put of the right bytes replaces the tampered file.
    s.put(&id, &secret).unwrap();
    assert_eq!(s.get(&id, 0, u64::MAX).unwrap(), secret);
    drop(s);

    // Another key opens nothing; no key at all serves no ciphertext.
    let wrong = store(dir.path()).encrypted(seal::AtRest::new(&[7; 32]));
    assert!(matches!(wrong.get(&id, 0, 1), Err(ChunkError::Corrupt { .. })));
    drop(wrong);
    let plain = store(dir.path());
    assert!(matches!(plain.get(&id, 0, 1), Err(ChunkError::Corrupt { .. })));
}

#[test]
fn turning_encryption_on_keeps_plaintext_chunks_readable() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let old = put_new(&s, b"written before the key");
    drop(s);
    let s = store(dir.path()).encrypted(seal::AtRest::new(&[1; 32]));
    assert_eq!(s.get(&old, 0, u64::MAX).unwrap(), &b"written before the key"[..]);
    assert!(s.verify(&[old]).is_empty());
}

#[test]
fn key_files_are_64_hex_digits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("key");
    fs::write(&path, format!("{}\n", "ab".repeat(32))).unwrap();
    assert!(seal::AtRest::from_key_file(&path).is_ok());
    fs::write(&path, "not a key").unwrap();
    let e = seal::AtRest::from_key_file(&path).unwrap_err().to_string();
    assert!(e.contains("expected 64 hex digits"), "{e}");
    let e = seal::AtRest::from_key_file(&dir.path().join("missing")).unwrap_err().to_string();
    assert!(e.contains("cannot read it"), "{e}");
}

#[test]
fn a_file_system_without_direct_io_stores_and_serves_through_the_page_cache() {
    // A ramfs refuses O_DIRECT, both at open and through F_SETFL.
    let ramfs = tempfile::tempdir().unwrap();
    let Some(_mounted) = testkit::scratch::Mount::new(ramfs.path(), "ramfs", None) else {
        eprintln!("SKIPPED: needs root to mount a ramfs");
        return;
    };
    // The premise: both ways of asking for O_DIRECT are refused.
    use std::os::unix::fs::OpenOptionsExt;
    let probe = ramfs.path().join("probe");
    let refused = fs::OpenOptions::new().write(true).create(true).custom_flags(libc::O_DIRECT).open(&probe);
    assert_eq!(refused.unwrap_err().raw_os_error(), Some(libc::EINVAL), "ramfs took O_DIRECT at open");
    let plain = fs::File::create(&probe).unwrap();
    assert!(disk::set_direct(&plain, true).is_err(), "ramfs took O_DIRECT through F_SETFL");
    fs::remove_file(&probe).unwrap();

    let s = ChunkStore::open(ramfs.path(), 64 << 20).unwrap();
    // Small files never ask for O_DIRECT; the others are written and read by the
    // fallbacks, across the direct minimum and a partial last block.
    for len in [100, disk::DIRECT_MIN, disk::DIRECT_MIN + 1, (4 << 20) + 123] {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096 + len) as u8).collect();
        let id = put_new(&s, &data);
        assert_eq!(s.get(&id, 0, u64::MAX).unwrap(), data, "{len} bytes");
        assert_eq!(s.get(&id, 5, 10).unwrap(), &data[5..15], "{len} bytes, a range");
    }
    assert_eq!(s.stats().corrupt_reads, 0);
}

#[test]
fn parts_of_a_chunk_read_and_check_only_their_blocks() {
    let d = tempfile::tempdir().unwrap();
    let block = outboard::BLOCK as usize;
    let data: Vec<u8> = (0..5 * block + 3000).map(|i| (i * 7 + i / 999) as u8).collect();
    let id = {
        let s = ChunkStore::open(d.path(), 1 << 30).unwrap();
        let id = put_new(&s, &data);
        // Known from the put: parts anywhere, across blocks, at the short end, clipped.
        assert_eq!(s.get(&id, 4096, 4096).unwrap(), &data[4096..8192]);
        assert_eq!(s.get(&id, block as u64 - 10, 20).unwrap(), &data[block - 10..block + 10]);
        assert_eq!(s.get(&id, 5 * block as u64 + 100, 1 << 20).unwrap(), &data[5 * block + 100..]);
        assert_eq!(s.get(&id, data.len() as u64, 10).unwrap(), &b""[..]);
        assert!(matches!(s.get(&id, data.len() as u64 + 1, 1), Err(ChunkError::Range { .. })));
        id
    };
    // A bit flipped on disk in block 2: parts of other blocks are still served, a part
    // of block 2 is refused, and so is the whole chunk.
    let path = d.path().join("chunks").join(disk::fan_out_name(&id)).join(id.to_hex());
    let mut bytes = fs::read(&path).unwrap();
    bytes[2 * block + 5] ^= 1;
    fs::write(&path, &bytes).unwrap();
    let s = ChunkStore::open(d.path(), 1 << 30).unwrap();
    // Reopened, the outboard is gone: the first part read checks the whole chunk.
    assert!(matches!(s.get(&id, 0, 100), Err(ChunkError::Corrupt { .. })));
    bytes[2 * block + 5] ^= 1;
    fs::write(&path, &bytes).unwrap();
    assert_eq!(s.get(&id, 0, 100).unwrap(), &data[..100]);
    bytes[2 * block + 5] ^= 1;
    fs::write(&path, &bytes).unwrap();
    assert_eq!(s.get(&id, 3 * block as u64, 100).unwrap(), &data[3 * block..3 * block + 100]);
    assert!(matches!(s.get(&id, 2 * block as u64, 100), Err(ChunkError::Corrupt { .. })));
    assert!(matches!(s.get(&id, 0, u64::MAX), Err(ChunkError::Corrupt { .. })));
    // Truncated: the last block's part is refused.
    fs::write(&path, &data[..5 * block]).unwrap();
    assert!(matches!(s.get(&id, 5 * block as u64, 10), Err(ChunkError::Corrupt { .. })));
    assert_eq!(s.stats().corrupt_reads, 4);
    fs::remove_file(&path).unwrap();
    assert!(matches!(s.get(&id, 0, 10), Err(ChunkError::NotFound { .. })));
}
