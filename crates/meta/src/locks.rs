//! POSIX byte-range locks (fcntl F_GETLK/F_SETLK): the pure algebra of conflicts,
//! splits and merges over one inode's held locks. The locks themselves are rows of
//! the store (`Txn::locks_on`/`put_locks`), so they survive a restart of meta and
//! every meta over one database sees the same ones; `ops::locks` applies this algebra
//! inside a transaction. A lock dies with the session that took them.

use proto::meta::{LockKind, LockRange};
use proto::types::{InodeId, SessionId};

/// One held lock, a row of the store's lock table. `end` is inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub session: SessionId,
    pub owner: u64,
    pub start: u64,
    pub end: u64,
    pub write: bool,
    pub pid: u32,
}

impl Held {
    fn same_owner(&self, session: SessionId, owner: u64) -> bool {
        self.session == session && self.owner == owner
    }

    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }

    /// The lock as the wire describes it (F_GETLK's answer).
    pub fn as_range(&self, ino: InodeId) -> LockRange {
        LockRange {
            ino,
            owner: self.owner,
            start: self.start,
            end: self.end,
            kind: if self.write { LockKind::Write } else { LockKind::Read },
            pid: self.pid,
        }
    }
}

/// The first lock in `held` that keeps `session`/`req.owner` from taking `req`.
/// Locks of the same (session, owner) never conflict; Read-Read does not conflict.
pub fn conflict<'a>(held: &'a [Held], session: SessionId, req: &LockRange) -> Option<&'a Held> {
    if req.kind == LockKind::Unlock {
        return None;
    }
    held.iter().find(|h| {
        !h.same_owner(session, req.owner) && h.overlaps(req.start, req.end) && (h.write || req.kind == LockKind::Write)
    })
}

/// Applies `req` for its owner, assuming `conflict` found nothing: the range is first
/// removed from the owner's locks (splitting them), then a Read or Write lock is added
/// and merged with the owner's adjacent locks of the same kind.
pub fn apply(held: &mut Vec<Held>, session: SessionId, req: &LockRange) {
    let mut out = Vec::with_capacity(held.len() + 2);
    for h in held.drain(..) {
        if !h.same_owner(session, req.owner) || !h.overlaps(req.start, req.end) {
            out.push(h);
            continue;
        }
        if h.start < req.start {
            out.push(Held { end: req.start - 1, ..h });
        }
        if h.end > req.end {
            out.push(Held { start: req.end + 1, ..h });
        }
    }
    if req.kind != LockKind::Unlock {
        let mut new = Held {
            session,
            owner: req.owner,
            start: req.start,
            end: req.end,
            write: req.kind == LockKind::Write,
            pid: req.pid,
        };
        // After the removal nothing of this owner overlaps `new`; merge the touching ones.
        out.retain(|h| {
            let touches = h.same_owner(session, req.owner)
                && h.write == new.write
                && (h.end.checked_add(1) == Some(new.start) || new.end.checked_add(1) == Some(h.start));
            if touches {
                new.start = new.start.min(h.start);
                new.end = new.end.max(h.end);
            }
            !touches
        });
        out.push(new);
    }
    *held = out;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn req(owner: u64, start: u64, end: u64, kind: LockKind) -> LockRange {
        LockRange { ino: 7, owner, start, end, kind, pid: owner as u32 }
    }

    /// One inode's locks, with F_GETLK and F_SETLK as `ops::locks` runs them.
    #[derive(Default)]
    struct Table {
        held: Vec<Held>,
    }

    impl Table {
        fn get(&self, session: SessionId, req: &LockRange) -> Option<LockRange> {
            conflict(&self.held, session, req).map(|h| h.as_range(req.ino))
        }

        fn set(&mut self, session: SessionId, req: &LockRange) -> Result<(), LockRange> {
            if let Some(h) = conflict(&self.held, session, req) {
                return Err(h.as_range(req.ino));
            }
            apply(&mut self.held, session, req);
            Ok(())
        }
    }

    #[test]
    fn read_locks_share_write_locks_exclude() {
        let mut t = Table::default();
        t.set(1, &req(1, 0, 99, LockKind::Read)).unwrap();
        t.set(2, &req(1, 50, 150, LockKind::Read)).unwrap();
        let err = t.set(2, &req(2, 10, 10, LockKind::Write)).unwrap_err();
        assert_eq!((err.owner, err.start, err.end, err.kind), (1, 0, 99, LockKind::Read));
        assert!(t.get(3, &req(9, 200, u64::MAX, LockKind::Write)).is_none());
        assert_eq!(t.get(3, &req(9, 120, u64::MAX, LockKind::Write)).map(|l| l.start), Some(50));
    }

    #[test]
    fn same_owner_converts_and_splits() {
        let mut t = Table::default();
        t.set(1, &req(1, 0, u64::MAX, LockKind::Write)).unwrap();
        // Converting the middle to Read splits the write lock into three pieces.
        t.set(1, &req(1, 10, 19, LockKind::Read)).unwrap();
        let mut held = t.held.clone();
        held.sort_by_key(|h| h.start);
        let shape: Vec<_> = held.iter().map(|h| (h.start, h.end, h.write)).collect();
        assert_eq!(shape, vec![(0, 9, true), (10, 19, false), (20, u64::MAX, true)]);
        // Another owner may now read in the middle but not elsewhere.
        assert!(t.set(2, &req(1, 12, 15, LockKind::Read)).is_ok());
        assert!(t.set(2, &req(1, 5, 15, LockKind::Read)).is_err());
        // Unlocking everything of owner 1 leaves only the other session's lock.
        t.set(1, &req(1, 0, u64::MAX, LockKind::Unlock)).unwrap();
        assert_eq!(t.held.len(), 1);
    }

    #[test]
    fn adjacent_locks_of_one_owner_merge() {
        let mut held = Vec::new();
        apply(&mut held, 1, &req(1, 0, 9, LockKind::Read));
        apply(&mut held, 1, &req(1, 20, 29, LockKind::Read));
        apply(&mut held, 1, &req(1, 10, 19, LockKind::Read));
        assert_eq!(held.len(), 1);
        assert_eq!((held[0].start, held[0].end), (0, 29));
    }

    const BYTES: usize = 48;
    /// (session, owner) pairs the law test draws from.
    const OWNERS: [(u64, u64); 4] = [(1, 1), (1, 2), (2, 1), (3, 7)];

    fn kind_of(k: u8) -> LockKind {
        match k % 3 {
            0 => LockKind::Read,
            1 => LockKind::Write,
            _ => LockKind::Unlock,
        }
    }

    proptest! {
        /// Law: the lock table behaves like a byte-level model recording, for every byte
        /// and owner, whether that owner holds nothing, a read or a write lock.
        #[test]
        fn table_matches_byte_model(ops in prop::collection::vec((0usize..4, 0u64..BYTES as u64, 0u64..16, 0u8..3, any::<bool>()), 1..60)) {
            let mut table = Table::default();
            // model[byte][owner] = 0 none, 1 read, 2 write
            let mut model = vec![[0u8; 4]; BYTES];
            for (who, start, len, kind, probe) in ops {
                let (session, owner) = OWNERS[who];
                let end = (start + len).min(BYTES as u64 - 1);
                let kind = kind_of(kind);
                let r = LockRange { ino: 1, owner, start, end, kind, pid: 0 };
                let model_conflict = kind != LockKind::Unlock && (start..=end).any(|b| {
                    (0..4).any(|o| o != who && (model[b as usize][o] == 2 || (model[b as usize][o] == 1 && kind == LockKind::Write)))
                });
                let got = table.get(session, &r);
                prop_assert_eq!(got.is_some(), model_conflict);
                if let Some(c) = got {
                    prop_assert!(c.start <= end && start <= c.end);
                    prop_assert!(c.kind == LockKind::Write || kind == LockKind::Write);
                    let held = &table.held;
                    prop_assert!(held.iter().any(|h| h.owner == c.owner && h.start == c.start && h.end == c.end && !(h.session == session && h.owner == owner)));
                }
                if probe {
                    continue;
                }
                let set = table.set(session, &r);
                prop_assert_eq!(set.is_err(), model_conflict);
                if !model_conflict {
                    let v = match kind { LockKind::Read => 1, LockKind::Write => 2, LockKind::Unlock => 0 };
                    for b in start..=end { model[b as usize][who] = v; }
                }
                // Compare every byte, and check an owner's locks never overlap each other.
                let held = table.held.clone();
                let mut seen = vec![[0u8; 4]; BYTES];
                for h in &held {
                    let o = OWNERS.iter().position(|&(s, ow)| s == h.session && ow == h.owner).unwrap();
                    for b in h.start..=h.end {
                        prop_assert_eq!(seen[b as usize][o], 0, "overlapping locks of one owner");
                        seen[b as usize][o] = if h.write { 2 } else { 1 };
                    }
                }
                prop_assert_eq!(&seen, &model);
            }
        }
    }
}
