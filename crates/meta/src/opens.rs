//! Which sessions have which files open. Kept in memory, beside the locks: opening
//! and closing a file then costs no transaction. It only decides when an unlinked
//! file (an orphan) may be reclaimed; the periodic reaper is the safety net.

use proto::types::{InodeId, SessionId};
use std::collections::HashMap;
use std::sync::Mutex;

/// One session's opens of one file.
#[derive(Debug, Default, Clone, Copy)]
struct Opens {
    count: u32,
    /// Whether one of them was opened for writing (permission checked then), so the
    /// session may commit data to it whatever its mode says now.
    write: bool,
}

/// Open counts per inode and session.
#[derive(Debug, Default)]
pub struct OpenTable {
    by_ino: Mutex<HashMap<InodeId, HashMap<SessionId, Opens>>>,
}

impl OpenTable {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<InodeId, HashMap<SessionId, Opens>>> {
        util::sync::lock(&self.by_ino)
    }

    /// Records one open; `write` when it was opened for writing.
    pub fn add(&self, session: SessionId, ino: InodeId, write: bool) {
        let mut table = self.table();
        let opens = table.entry(ino).or_default().entry(session).or_default();
        opens.count += 1;
        opens.write |= write;
    }

    /// Whether `session` has `ino` open for writing.
    pub fn writable(&self, session: SessionId, ino: InodeId) -> bool {
        self.table().get(&ino).and_then(|s| s.get(&session)).is_some_and(|o| o.write)
    }

    /// Drops one open; returns whether there was one.
    pub fn remove(&self, session: SessionId, ino: InodeId) -> bool {
        let mut table = self.table();
        let Some(sessions) = table.get_mut(&ino) else { return false };
        let Some(opens) = sessions.get_mut(&session) else { return false };
        opens.count -= 1;
        if opens.count == 0 {
            sessions.remove(&session);
            if sessions.is_empty() {
                table.remove(&ino);
            }
        }
        true
    }

    /// Opens of `ino` across all sessions.
    pub fn count(&self, ino: InodeId) -> u64 {
        self.table().get(&ino).map_or(0, |s| s.values().map(|o| u64::from(o.count)).sum())
    }

    /// Drops every open of a session, returning the inodes it had open.
    pub fn remove_session(&self, session: SessionId) -> Vec<InodeId> {
        let mut table = self.table();
        let mut inos = Vec::new();
        table.retain(|ino, sessions| {
            if sessions.remove(&session).is_some() {
                inos.push(*ino);
            }
            !sessions.is_empty()
        });
        inos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_session() {
        let t = OpenTable::default();
        t.add(1, 10, false);
        t.add(1, 10, true);
        t.add(2, 10, false);
        assert_eq!(t.count(10), 3);
        assert!(t.writable(1, 10) && !t.writable(2, 10) && !t.writable(1, 11));
        assert!(t.remove(1, 10));
        assert!(!t.remove(3, 10), "session 3 never opened it");
        assert_eq!(t.remove_session(2), vec![10]);
        assert_eq!(t.count(10), 1);
        assert!(t.remove(1, 10));
        assert_eq!(t.count(10), 0);
        assert!(!t.remove(1, 10));
    }
}
