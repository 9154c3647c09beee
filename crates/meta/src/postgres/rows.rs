//! The row operations of `store::Txn` in PostgreSQL's SQL: each reads through the
//! transaction's row cache (`seen`) and the rows this meta keeps (`kept`) before
//! asking the server, and writes through the deferred-write queue (`conn`).

use crate::error::MetaError;
use crate::locks::Held;
use crate::store::values::{chunk_id, kind_code, off, policy_of};
use crate::store::{Counter, DentryRow, Inode, OpenRow, Prefetch, SessionRow, Txn, drop_open_read};
use postgres::types::ToSql;
use proto::meta::StoredChunk;
use proto::policy::Policy;
use proto::types::{ChunkId, ChunkRecord, Extent, FileKind, InodeId, NodeInfo, ROOT_INODE, SessionId};

use super::codec::{
    ENTRY_EXTENTS_SQL, ENTRY_READ_SQL, ENTRY_SQL, EXTENTS_SQL, LINKED_GUARD_SQL, OPEN_SQL, POLICIES_SQL, SESSION_SQL,
    at_most_one, extent_of, inode_of, inode_params, node_of, session_of,
};
use super::conn::{Params, PgConn, Probe};
use super::seen::KnownExtents;

impl Txn for PgConn {
    /// Ids come from sequences ID_BLOCK at a time, kept by this connection: a
    /// sequence is outside transactions anyway (a rolled-back id is never given
    /// again), and metas over one database each hold their own block.
    fn next_id(&mut self, counter: Counter) -> Result<u64, MetaError> {
        let sql = match counter {
            Counter::Inode => "SELECT nextval('next_inode') FROM generate_series(1, 64) ORDER BY 1 DESC",
            Counter::Cookie => "SELECT nextval('next_cookie') FROM generate_series(1, 64) ORDER BY 1 DESC",
            Counter::Session => "SELECT nextval('next_session') FROM generate_series(1, 64) ORDER BY 1 DESC",
            // A row write, so a durable commit has a WAL record to flush.
            Counter::Sync => {
                let v: i64 = self
                    .opt("UPDATE counters SET value = value + 1 WHERE name = 'syncs' RETURNING value", &[])?
                    .ok_or_else(|| MetaError::Corrupt(format!("counter {} missing", counter.name())))?
                    .try_get(0)?;
                return Ok(v as u64);
            }
        };
        let block = match self.ids.get_mut(sql) {
            Some(block) if !block.is_empty() => block,
            _ => {
                let fetched = self.query(sql, &[])?.iter().map(|r| r.try_get(0)).collect::<Result<Vec<i64>, _>>()?;
                self.ids.insert(sql, fetched);
                self.ids.get_mut(sql).expect("just inserted")
            }
        };
        let id = block.pop().ok_or_else(|| MetaError::Corrupt(format!("sequence {} gave no id", counter.name())))?;
        if matches!(counter, Counter::Inode) {
            let ino = id as u64;
            self.seen.no_extents.insert(ino);
            self.seen.no_xattrs.insert(ino);
            self.seen.open_counts.insert(ino, 0);
            self.seen.policies.insert(ino, None);
        }
        Ok(id as u64)
    }

    fn get_inode(&mut self, ino: InodeId) -> Result<Option<Inode>, MetaError> {
        if let Some(seen) = self.seen.inodes.get(&ino) {
            return Ok(seen.clone());
        }
        if let Some(kept) = self.cache.as_ref().and_then(|c| c.inode(ino)) {
            self.seen.inodes.insert(ino, Some(kept.clone()));
            return Ok(Some(kept));
        }
        let found = self
            .opt(concat!("SELECT ", inode_cols!(), " FROM inodes WHERE ino = $1"), &[&(ino as i64)])?
            .map(|r| inode_of(&r, 0))
            .transpose()?;
        self.seen.inodes.insert(ino, found.clone());
        Ok(found)
    }

    fn put_inode(&mut self, inode: &Inode) -> Result<(), MetaError> {
        let a = &inode.attr;
        let params = inode_params(inode);
        self.defer(
            concat!(
                "INSERT INTO inodes (",
                inode_cols!(),
                ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
                 ON CONFLICT (ino) DO UPDATE SET kind = excluded.kind, mode = excluded.mode, uid = excluded.uid,
                 gid = excluded.gid, size = excluded.size, nlink = excluded.nlink, rdev = excluded.rdev,
                 atime_s = excluded.atime_s, atime_ns = excluded.atime_ns, mtime_s = excluded.mtime_s,
                 mtime_ns = excluded.mtime_ns, ctime_s = excluded.ctime_s, ctime_ns = excluded.ctime_ns,
                 data_version = excluded.data_version, parent = excluded.parent, target = excluded.target"
            ),
            params,
        )?;
        self.seen.inodes.insert(a.ino, Some(inode.clone()));
        if self.publish.is_some() {
            self.written.inodes.insert(a.ino, Some(inode.clone()));
            match self.seen.no_xattrs.contains(&a.ino) {
                true => self.written.bare.insert(a.ino),
                false => self.written.bare.remove(&a.ino),
            };
        }
        Ok(())
    }

    fn delete_inode(&mut self, ino: InodeId) -> Result<(), MetaError> {
        self.defer("DELETE FROM inodes WHERE ino = $1", vec![Box::new(ino as i64)])?;
        self.seen.inodes.insert(ino, None);
        if self.publish.is_some() {
            self.written.inodes.insert(ino, None);
        }
        Ok(())
    }

    fn count_inodes(&mut self) -> Result<u64, MetaError> {
        Ok(self.one("SELECT COUNT(*) FROM inodes", &[])?.try_get::<_, i64>(0)? as u64)
    }

    /// Reads the entry's inode, how often it is open and whether it has extents in
    /// the same round trip: every op that looks a name up goes on to its inode, and an
    /// unlink to its opens and extents (answered from `seen`).
    fn get_dentry(&mut self, parent: InodeId, name: &[u8]) -> Result<Option<InodeId>, MetaError> {
        if let Some(&seen) = self.seen.dentries.get(&(parent, name.to_vec())) {
            return Ok(seen);
        }
        if let Some(ino) = self.cache.as_ref().and_then(|c| c.entry(parent, name)) {
            self.seen.dentries.insert((parent, name.to_vec()), Some(ino));
            return Ok(Some(ino));
        }
        let row = self.opt(
            "SELECT d.ino, i.ino, i.kind, i.mode, i.uid, i.gid, i.size, i.nlink, i.rdev, i.atime_s, \
             i.atime_ns, i.mtime_s, i.mtime_ns, i.ctime_s, i.ctime_ns, i.data_version, i.parent, i.target, \
             (SELECT COALESCE(SUM(o.count), 0)::BIGINT FROM opens o WHERE o.ino = d.ino), \
             EXISTS (SELECT 1 FROM extents e WHERE e.ino = d.ino), \
             EXISTS (SELECT 1 FROM xattrs x WHERE x.ino = d.ino), EXISTS (SELECT 1 FROM policies y WHERE y.ino = d.ino) \
             FROM dentries d LEFT JOIN inodes i ON i.ino = d.ino WHERE d.parent = $1 AND d.name = $2",
            &[&(parent as i64), &name],
        )?;
        self.entry_seen(parent, name, row.as_ref(), 0)
    }

    /// Asks for everything `want` names that this transaction has not seen yet, in
    /// one round trip.
    fn prefetch(&mut self, want: Prefetch<'_>) -> Result<(), MetaError> {
        if let Some((parent, name)) = want.entry {
            self.assume_entry(parent, name)?;
        }
        if let (true, Some((session, ino)), Some((_, start, end))) = (want.writing, want.open, want.extents) {
            self.assume_data_write(session, ino, start, end)?;
        }
        // A read finds the directory and its entry in memory if its meta keeps them:
        // nothing to ask for then (the rest comes from the kept rows or the server).
        if let (Some(cache), Some((parent, name))) = (&self.cache, want.entry)
            && !self.seen.inodes.contains_key(&parent)
            && let Some(dir) = cache.inode(parent)
        {
            self.seen.inodes.insert(parent, Some(dir));
            if let Some(ino) = cache.entry(parent, name) {
                self.seen.dentries.insert((parent, name.to_vec()), Some(ino));
            }
        }
        let seen = &self.seen;
        let entry = want.entry.filter(|&(parent, name)| {
            !seen.inodes.contains_key(&parent) && !seen.dentries.contains_key(&(parent, name.to_vec()))
        });
        let session = want.session.filter(|id| !seen.sessions.contains_key(id));
        let open = want.open.filter(|key| !seen.opens.contains_key(key) && seen.open_counts.get(&key.1) != Some(&0));
        let extents = want.extents.filter(|(ino, start, end)| {
            !seen.no_extents.contains(ino) && seen.extents.get(ino).is_none_or(|k| k.within(*start, *end).is_none())
        });
        let policies = want.policies.filter(|ino| !seen.no_policies && !seen.policies.contains_key(ino));

        // The entry's or the open's statement brings the session along.
        let session_along = session.filter(|&s| entry.is_some() || open.is_some_and(|(o, _)| o == s));
        let session = session.filter(|_| session_along.is_none());
        let (parent, name) = entry.map_or((0, &[][..]), |(p, n)| (p as i64, n));
        let entry_session = session_along.map_or(0, |s| s as i64);
        let session_id = session.map_or(0, |s| s as i64);
        let (open_session, open_ino) = open.map_or((0, 0), |(s, i)| (s as i64, i as i64));
        let (extents_ino, extents_start, extents_end) =
            extents.map_or((0, 0, 0), |(ino, start, end)| (ino as i64, off(start), off(end)));
        let policies_ino = policies.map_or(0, |i| i as i64);
        let root = ROOT_INODE as i64;
        let entry_params: [&(dyn ToSql + Sync); 3] = [&parent, &name, &entry_session];
        // A point read's one statement (a lookup) needs none of the facts for a write.
        let entry_sql = if self.probe == Probe::Ready { ENTRY_READ_SQL } else { ENTRY_SQL };
        let session_params: [&(dyn ToSql + Sync); 1] = [&session_id];
        let open_params: [&(dyn ToSql + Sync); 2] = [&open_session, &open_ino];
        let extents_params: [&(dyn ToSql + Sync); 3] = [&extents_ino, &extents_start, &extents_end];
        let policies_params: [&(dyn ToSql + Sync); 2] = [&policies_ino, &root];
        let entry_extents = entry.filter(|_| want.entry_extents && self.probe == Probe::Off);
        let queries: Vec<(&'static str, Params<'_>)> = [
            entry.map(|_| (entry_sql, &entry_params[..])),
            entry_extents.map(|_| (ENTRY_EXTENTS_SQL, &entry_params[..2])),
            session.map(|_| (SESSION_SQL, &session_params[..])),
            open.map(|_| (OPEN_SQL, &open_params[..])),
            extents.map(|_| (EXTENTS_SQL, &extents_params[..])),
            policies.map(|_| (POLICIES_SQL, &policies_params[..])),
        ]
        .into_iter()
        .flatten()
        .collect();
        if queries.is_empty() {
            return Ok(());
        }
        let mut answers = self.query_all(&queries)?.into_iter();
        let mut next = || answers.next().expect("one answer per query");

        if let Some((parent, name)) = entry {
            match at_most_one(next(), entry_sql)? {
                None => {
                    self.seen.inodes.insert(parent, None);
                }
                Some(row) => {
                    self.seen.inodes.insert(parent, Some(inode_of(&row, 0)?));
                    self.entry_seen(parent, name, Some(&row), 17)?;
                    self.policies_exist_seen(&row, 39)?;
                    if let Some(id) = session_along {
                        self.seen.sessions.insert(id, session_of(&row, 40)?);
                    }
                }
            }
        }
        if let Some((parent, name)) = entry_extents {
            let rows = next();
            if let Some(Some(ino)) = self.seen.dentries.get(&(parent, name.to_vec())).copied()
                && !rows.is_empty()
            {
                let extents = rows.iter().map(|r| extent_of(r).map(|(_, e)| e)).collect::<Result<Vec<_>, _>>()?;
                self.seen.extents.insert(ino, KnownExtents { start: 0, end: u64::MAX, extents });
            }
        }
        if let Some(id) = session {
            let row = at_most_one(next(), SESSION_SQL)?;
            let session = match row {
                Some(r) => session_of(&r, 0)?,
                None => None,
            };
            self.seen.sessions.insert(id, session);
        }
        if let Some((session, ino)) = open {
            let row = at_most_one(next(), OPEN_SQL)?
                .ok_or_else(|| MetaError::Corrupt(format!("no row where one was expected: {OPEN_SQL}")))?;
            if let std::collections::hash_map::Entry::Vacant(slot) = self.seen.inodes.entry(ino) {
                let inode = match row.try_get::<_, Option<i64>>(2)? {
                    Some(_) => Some(inode_of(&row, 2)?),
                    None => None,
                };
                slot.insert(inode);
            }
            let o = match row.try_get::<_, Option<i64>>(0)? {
                Some(count) => OpenRow { count: count as u32, writable: row.try_get::<_, i64>(1)? != 0 },
                None => OpenRow::default(),
            };
            self.seen.opens.insert((session, ino), o);
            self.policies_exist_seen(&row, 19)?;
            self.seen.sessions.insert(session, session_of(&row, 20)?);
        }
        if let Some((ino, start, end)) = extents {
            let mut found = next().iter().map(|r| extent_of(r).map(|(_, e)| e)).collect::<Result<Vec<_>, _>>()?;
            if found.is_empty() && start == 0 && off(end) == i64::MAX {
                self.seen.no_extents.insert(ino);
            }
            found.retain(|e| e.end() > start);
            found.sort_by_key(|e| e.file_offset);
            self.seen.extents.insert(ino, KnownExtents { start, end, extents: found });
        }
        if let Some(ino) = policies {
            for r in &next() {
                let at = r.try_get::<_, i64>(0)? as u64;
                let policy = match r.try_get::<_, Option<String>>(1)? {
                    Some(sites) => Some(policy_of((sites, r.try_get(2)?, r.try_get(3)?, r.try_get(4)?))?),
                    None => None,
                };
                self.seen.policies.entry(at).or_insert(policy);
                if let std::collections::hash_map::Entry::Vacant(slot) = self.seen.inodes.entry(at) {
                    let inode = match r.try_get::<_, Option<i64>>(5)? {
                        Some(_) => Some(inode_of(r, 5)?),
                        None => None,
                    };
                    slot.insert(inode);
                }
            }
            self.seen.policies.entry(ino).or_insert(None);
        }
        Ok(())
    }

    fn put_dentry(&mut self, parent: InodeId, name: &[u8], ino: InodeId, cookie: u64) -> Result<(), MetaError> {
        self.seen.dentries.insert((parent, name.to_vec()), Some(ino));
        if self.publish.is_some() {
            self.written.entries.insert((parent, name.to_vec()), Some(ino));
        }
        self.defer(
            "INSERT INTO dentries (parent, name, ino, cookie) VALUES ($1, $2, $3, $4)",
            vec![Box::new(parent as i64), Box::new(name.to_vec()), Box::new(ino as i64), Box::new(cookie as i64)],
        )
    }

    fn delete_dentry(&mut self, parent: InodeId, name: &[u8]) -> Result<(), MetaError> {
        self.seen.dentries.insert((parent, name.to_vec()), None);
        if self.publish.is_some() {
            self.written.entries.insert((parent, name.to_vec()), None);
        }
        self.defer(
            "DELETE FROM dentries WHERE parent = $1 AND name = $2",
            vec![Box::new(parent as i64), Box::new(name.to_vec())],
        )
    }

    /// Reads each entry's inode, and whether it has extended attributes, in the same
    /// statement: a listing's `get_inode`s, and the kernel's lookups and
    /// `security.capability` asks after it, then cost no round trip of their own.
    fn list_dentries(&mut self, parent: InodeId, after: u64, limit: u32) -> Result<Vec<DentryRow>, MetaError> {
        let rows = self.query(
            concat!(
                "SELECT d.name, d.ino, d.cookie, NOT EXISTS (SELECT 1 FROM xattrs x WHERE x.ino = d.ino), i.* \
                 FROM dentries d LEFT JOIN LATERAL (SELECT ",
                inode_cols!(),
                " FROM inodes WHERE inodes.ino = d.ino) i ON true \
                 WHERE d.parent = $1 AND d.cookie > $2 ORDER BY d.cookie LIMIT $3"
            ),
            &[&(parent as i64), &off(after), &i64::from(limit)],
        )?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let bare: bool = r.try_get(3)?;
            let row = DentryRow {
                name: r.try_get(0)?,
                ino: r.try_get::<_, i64>(1)? as u64,
                cookie: r.try_get::<_, i64>(2)? as u64,
                has_xattrs: !bare,
            };
            // What this transaction wrote itself is known already.
            if r.try_get::<_, Option<i64>>(4)?.is_some() && !self.seen.inodes.contains_key(&row.ino) {
                self.seen.inodes.insert(row.ino, Some(inode_of(r, 4)?));
                if bare {
                    self.seen.no_xattrs.insert(row.ino);
                }
            }
            self.seen.dentries.entry((parent, row.name.clone())).or_insert(Some(row.ino));
            out.push(row);
        }
        Ok(out)
    }

    fn extents_overlapping(&mut self, ino: InodeId, start: u64, end: u64) -> Result<Vec<Extent>, MetaError> {
        if start >= end || self.seen.no_extents.contains(&ino) {
            return Ok(Vec::new());
        }
        self.prefetch(Prefetch { extents: Some((ino, start, end)), ..Prefetch::default() })?;
        let known = self.seen.extents.get(&ino).and_then(|k| k.within(start, end));
        known.ok_or_else(|| MetaError::Internal(format!("the extents of inode {ino} were read but not kept")))
    }

    fn insert_extent(&mut self, ino: InodeId, e: &Extent) -> Result<(), MetaError> {
        self.seen.no_extents.remove(&ino);
        if let Some(known) = self.seen.extents.get_mut(&ino) {
            let at = known.extents.partition_point(|k| k.file_offset < e.file_offset);
            known.extents.insert(at, *e);
        }
        self.defer(
            "INSERT INTO extents (ino, file_offset, len, chunk, chunk_offset) VALUES ($1, $2, $3, $4, $5)",
            vec![
                Box::new(ino as i64),
                Box::new(off(e.file_offset)),
                Box::new(e.len as i64),
                Box::new(e.chunk.0.to_vec()),
                Box::new(e.chunk_offset as i64),
            ],
        )
    }

    fn delete_extent(&mut self, ino: InodeId, file_offset: u64) -> Result<(), MetaError> {
        if let Some(known) = self.seen.extents.get_mut(&ino) {
            known.extents.retain(|k| k.file_offset != file_offset);
        }
        self.defer(
            "DELETE FROM extents WHERE ino = $1 AND file_offset = $2",
            vec![Box::new(ino as i64), Box::new(off(file_offset))],
        )
    }

    fn list_extents(&mut self, after: Option<(InodeId, u64)>, limit: u32) -> Result<Vec<(InodeId, Extent)>, MetaError> {
        let (ino, offset) = match after {
            Some((ino, o)) => (ino as i64, off(o)),
            None => (i64::MIN, i64::MIN),
        };
        let rows = self.query(
            "SELECT ino, file_offset, len, chunk, chunk_offset FROM extents
             WHERE ino > $1 OR (ino = $1 AND file_offset > $2) ORDER BY ino, file_offset LIMIT $3",
            &[&ino, &offset, &i64::from(limit)],
        )?;
        rows.iter().map(extent_of).collect()
    }

    fn upsert_chunk(&mut self, chunk: &StoredChunk) -> Result<(), MetaError> {
        self.defer(
            "INSERT INTO chunks (id, size, refcount) VALUES ($1, $2, 0)
             ON CONFLICT (id) DO UPDATE SET size = excluded.size",
            vec![Box::new(chunk.id.0.to_vec()), Box::new(chunk.size as i64)],
        )?;
        for node in &chunk.nodes {
            self.defer(
                "INSERT INTO chunk_nodes (chunk, node, cached) VALUES ($1, $2, 0)
                 ON CONFLICT (chunk, node) DO UPDATE SET cached = 0",
                vec![Box::new(chunk.id.0.to_vec()), Box::new(node.clone())],
            )?;
        }
        Ok(())
    }

    fn add_cached(&mut self, id: &ChunkId, size: u64, node: &str) -> Result<(), MetaError> {
        self.defer(
            "INSERT INTO chunks (id, size, refcount) VALUES ($1, $2, 0) ON CONFLICT (id) DO NOTHING",
            vec![Box::new(id.0.to_vec()), Box::new(size as i64)],
        )?;
        self.defer(
            "INSERT INTO chunk_nodes (chunk, node, cached) VALUES ($1, $2, 1) ON CONFLICT (chunk, node) DO NOTHING",
            vec![Box::new(id.0.to_vec()), Box::new(node.to_string())],
        )
    }

    fn adjust_refcount(&mut self, id: &ChunkId, delta: i64) -> Result<(), MetaError> {
        self.defer(
            "INSERT INTO chunks (id, size, refcount) VALUES ($1, 0, $2)
             ON CONFLICT (id) DO UPDATE SET refcount = chunks.refcount + excluded.refcount",
            vec![Box::new(id.0.to_vec()), Box::new(delta)],
        )
    }

    fn get_chunk(&mut self, id: &ChunkId) -> Result<Option<ChunkRecord>, MetaError> {
        let Some(row) = self.opt("SELECT size, refcount FROM chunks WHERE id = $1", &[&&id.0[..]])? else {
            return Ok(None);
        };
        let (size, refcount) = (row.try_get(0)?, row.try_get(1)?);
        Ok(Some(self.chunk_record(id, size, refcount)?))
    }

    fn list_chunks(&mut self, after: Option<&ChunkId>, limit: u32) -> Result<Vec<ChunkRecord>, MetaError> {
        let after: &[u8] = after.map(|a| &a.0[..]).unwrap_or(&[]);
        let rows = self.query(
            "SELECT id, size, refcount FROM chunks WHERE id > $1 ORDER BY id LIMIT $2",
            &[&after, &i64::from(limit)],
        )?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let id = chunk_id(row.try_get(0)?)?;
            out.push(self.chunk_record(&id, row.try_get(1)?, row.try_get(2)?)?);
        }
        Ok(out)
    }

    fn delete_chunk(&mut self, id: &ChunkId) -> Result<(), MetaError> {
        self.defer("DELETE FROM chunk_nodes WHERE chunk = $1", vec![Box::new(id.0.to_vec())])?;
        self.defer("DELETE FROM chunks WHERE id = $1", vec![Box::new(id.0.to_vec())])
    }

    fn remove_location(&mut self, id: &ChunkId, node: &str) -> Result<(), MetaError> {
        self.defer(
            "DELETE FROM chunk_nodes WHERE chunk = $1 AND node = $2 AND cached = 1",
            vec![Box::new(id.0.to_vec()), Box::new(node.to_string())],
        )
    }

    fn site_rtts(&mut self) -> Result<Vec<(String, String, u64)>, MetaError> {
        let rows = self.query("SELECT from_site, to_site, micros FROM site_rtts ORDER BY 1, 2", &[])?;
        rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get::<_, i64>(2)? as u64))).collect()
    }

    fn parents_of(&mut self, ino: InodeId) -> Result<Vec<InodeId>, MetaError> {
        let rows = self.query("SELECT DISTINCT parent FROM dentries WHERE ino = $1", &[&(ino as i64)])?;
        rows.iter().map(|r| Ok(r.try_get::<_, i64>(0)? as u64)).collect()
    }

    fn chunk_totals(&mut self) -> Result<(u64, u64), MetaError> {
        let row = self.one("SELECT COUNT(*), COALESCE(SUM(size), 0)::BIGINT FROM chunks", &[])?;
        Ok((row.try_get::<_, i64>(0)? as u64, row.try_get::<_, i64>(1)? as u64))
    }

    /// A read answers from what its meta keeps when that says the inode has none, and
    /// learns whether it has any at all when it asks (`SharedRows::bare`).
    fn get_xattr(&mut self, ino: InodeId, name: &[u8]) -> Result<Option<Vec<u8>>, MetaError> {
        if self.bare(ino) {
            return Ok(None);
        }
        let row = self.one(
            "SELECT (SELECT value FROM xattrs WHERE ino = $1 AND name = $2), EXISTS (SELECT 1 FROM xattrs WHERE ino = $1)",
            &[&(ino as i64), &name],
        )?;
        if !row.try_get::<_, bool>(1)? {
            self.seen.no_xattrs.insert(ino);
        }
        Ok(row.try_get(0)?)
    }

    fn set_xattr(&mut self, ino: InodeId, name: &[u8], value: &[u8]) -> Result<(), MetaError> {
        self.seen.no_xattrs.remove(&ino);
        self.written.bare.remove(&ino);
        // Known bare no more, here and at every meta keeping rows: inode 0's notes (the
        // registry of homes) change with no inode row beside them.
        self.written.inodes.entry(ino).or_insert(None);
        self.defer(
            "INSERT INTO xattrs (ino, name, value) VALUES ($1, $2, $3)
             ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value",
            vec![Box::new(ino as i64), Box::new(name.to_vec()), Box::new(value.to_vec())],
        )
    }

    fn list_xattrs(&mut self, ino: InodeId) -> Result<Vec<Vec<u8>>, MetaError> {
        if self.bare(ino) {
            return Ok(Vec::new());
        }
        let rows = self.query("SELECT name FROM xattrs WHERE ino = $1 ORDER BY name", &[&(ino as i64)])?;
        if rows.is_empty() {
            self.seen.no_xattrs.insert(ino);
        }
        Ok(rows.iter().map(|r| r.try_get(0)).collect::<Result<Vec<_>, _>>()?)
    }

    fn delete_xattr(&mut self, ino: InodeId, name: &[u8]) -> Result<bool, MetaError> {
        Ok(self.exec("DELETE FROM xattrs WHERE ino = $1 AND name = $2", &[&(ino as i64), &name])? > 0)
    }

    fn delete_all_xattrs(&mut self, ino: InodeId) -> Result<(), MetaError> {
        if !self.seen.no_xattrs.insert(ino) {
            return Ok(());
        }
        self.defer("DELETE FROM xattrs WHERE ino = $1", vec![Box::new(ino as i64)])
    }

    fn orphans(&mut self) -> Result<Vec<InodeId>, MetaError> {
        let rows = self.query("SELECT ino FROM inodes WHERE nlink = 0 AND kind <> $1", &[&kind_code(FileKind::Dir)])?;
        Ok(rows.iter().map(|r| r.try_get::<_, i64>(0).map(|v| v as u64)).collect::<Result<Vec<_>, _>>()?)
    }

    fn put_session(&mut self, s: &SessionRow) -> Result<(), MetaError> {
        self.exec(
            "INSERT INTO sessions (id, site, host, pid, purpose, last_seen, owner) VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (id) DO UPDATE SET site = excluded.site, host = excluded.host, pid = excluded.pid,
             purpose = excluded.purpose, last_seen = excluded.last_seen, owner = excluded.owner",
            &[
                &(s.id as i64),
                &s.info.site,
                &s.info.host,
                &i64::from(s.info.pid),
                &s.info.purpose,
                &s.last_seen_ms,
                &s.owner,
            ],
        )?;
        self.seen.sessions.insert(s.id, Some(s.clone()));
        Ok(())
    }

    fn get_session(&mut self, id: SessionId) -> Result<Option<SessionRow>, MetaError> {
        self.prefetch(Prefetch { session: Some(id), ..Prefetch::default() })?;
        Ok(self.seen.sessions.get(&id).cloned().flatten())
    }

    fn list_sessions(&mut self) -> Result<Vec<SessionRow>, MetaError> {
        let rows =
            self.query("SELECT id, site, host, pid, purpose, last_seen, owner FROM sessions ORDER BY id", &[])?;
        rows.iter()
            .map(|r| session_of(r, 0)?.ok_or_else(|| MetaError::Corrupt("a session without id".into())))
            .collect()
    }

    fn delete_session(&mut self, id: SessionId) -> Result<(), MetaError> {
        self.exec("DELETE FROM sessions WHERE id = $1", &[&(id as i64)])?;
        self.seen.sessions.insert(id, None);
        Ok(())
    }

    fn locks_on(&mut self, ino: InodeId) -> Result<Vec<Held>, MetaError> {
        let rows = self.query(
            "SELECT session, owner, range_start, range_end, is_write, pid FROM locks WHERE ino = $1",
            &[&(ino as i64)],
        )?;
        rows.iter()
            .map(|r| {
                let int = |i: usize| r.try_get::<_, i64>(i);
                Ok(Held {
                    session: int(0)? as u64,
                    owner: int(1)? as u64,
                    start: int(2)? as u64,
                    end: int(3)? as u64,
                    write: int(4)? != 0,
                    pid: int(5)? as u32,
                })
            })
            .collect()
    }

    fn put_locks(&mut self, ino: InodeId, held: &[Held]) -> Result<(), MetaError> {
        self.exec("DELETE FROM locks WHERE ino = $1", &[&(ino as i64)])?;
        for h in held {
            // u64 values (an owner, an end of u64::MAX) are kept bit for bit in the BIGINT column.
            self.exec(
                "INSERT INTO locks (ino, session, owner, range_start, range_end, is_write, pid)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                &[
                    &(ino as i64),
                    &(h.session as i64),
                    &(h.owner as i64),
                    &(h.start as i64),
                    &(h.end as i64),
                    &i64::from(h.write),
                    &i64::from(h.pid),
                ],
            )?;
        }
        Ok(())
    }

    fn delete_session_locks(&mut self, session: SessionId) -> Result<(), MetaError> {
        self.exec("DELETE FROM locks WHERE session = $1", &[&(session as i64)])?;
        Ok(())
    }

    /// Reads the inode in the same round trip (a release goes on to check it).
    fn get_open(&mut self, session: SessionId, ino: InodeId) -> Result<OpenRow, MetaError> {
        if self.seen.open_counts.get(&ino) == Some(&0) {
            return Ok(OpenRow::default());
        }
        self.prefetch(Prefetch { open: Some((session, ino)), ..Prefetch::default() })?;
        Ok(self.seen.opens.get(&(session, ino)).copied().unwrap_or_default())
    }

    /// Without reading the record when the kept rows hold the inode with links (the
    /// release then reclaims nothing; `LINKED_GUARD_SQL` checks it at the server): the
    /// record is counted down at the server.
    fn drop_open(&mut self, session: SessionId, ino: InodeId) -> Result<(), MetaError> {
        let linked = self.kept_untouched(ino).filter(|i| i.attr.nlink > 0 || i.attr.kind == FileKind::Dir);
        let (Some(inode), false) = (linked, self.seen.opens.contains_key(&(session, ino))) else {
            return drop_open_read(self, session, ino);
        };
        self.defer(LINKED_GUARD_SQL, inode_params(&inode))?;
        self.assume_inode(inode);
        self.seen.open_counts.remove(&ino);
        // One statement: its two parts see the same snapshot, so a record is either
        // deleted (its last open) or counted down, never both.
        self.defer(
            "WITH last AS (DELETE FROM opens WHERE session = $1 AND ino = $2 AND count <= 1)
             UPDATE opens SET count = count - 1 WHERE session = $1 AND ino = $2 AND count > 1",
            vec![Box::new(session as i64), Box::new(ino as i64)],
        )
    }

    fn put_open(&mut self, session: SessionId, ino: InodeId, open: OpenRow) -> Result<(), MetaError> {
        self.seen.open_counts.remove(&ino);
        self.seen.opens.insert((session, ino), open);
        if open.count == 0 {
            self.defer(
                "DELETE FROM opens WHERE session = $1 AND ino = $2",
                vec![Box::new(session as i64), Box::new(ino as i64)],
            )
        } else {
            self.defer(
                "INSERT INTO opens (session, ino, count, writable) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (session, ino) DO UPDATE SET count = excluded.count, writable = excluded.writable",
                vec![
                    Box::new(session as i64),
                    Box::new(ino as i64),
                    Box::new(i64::from(open.count)),
                    Box::new(i64::from(open.writable)),
                ],
            )
        }
    }

    fn count_opens(&mut self, ino: InodeId) -> Result<u64, MetaError> {
        if let Some(&n) = self.seen.open_counts.get(&ino) {
            return Ok(n);
        }
        let row = self.one("SELECT COALESCE(SUM(count), 0)::BIGINT FROM opens WHERE ino = $1", &[&(ino as i64)])?;
        let n = row.try_get::<_, i64>(0)? as u64;
        self.seen.open_counts.insert(ino, n);
        Ok(n)
    }

    fn delete_session_opens(&mut self, session: SessionId) -> Result<Vec<InodeId>, MetaError> {
        self.seen.open_counts.clear();
        self.seen.opens.clear();
        let rows = self.query("DELETE FROM opens WHERE session = $1 RETURNING ino", &[&(session as i64)])?;
        Ok(rows.iter().map(|r| r.try_get::<_, i64>(0).map(|v| v as u64)).collect::<Result<Vec<_>, _>>()?)
    }

    fn put_node(&mut self, n: &NodeInfo, last_seen_ms: i64) -> Result<(), MetaError> {
        self.exec(
            "INSERT INTO nodes (id, store_id, site, addr, capacity, used, chunk_count, cache_bytes, last_seen)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (id) DO UPDATE SET store_id = excluded.store_id, site = excluded.site, addr = excluded.addr,
             capacity = excluded.capacity, used = excluded.used, chunk_count = excluded.chunk_count,
             cache_bytes = excluded.cache_bytes, last_seen = excluded.last_seen",
            &[
                &n.id,
                &n.store_id,
                &n.site,
                &n.addr,
                &(n.capacity_bytes as i64),
                &(n.used_bytes as i64),
                &(n.chunk_count as i64),
                &(n.cache_bytes as i64),
                &last_seen_ms,
            ],
        )?;
        for (to, micros) in &n.site_rtts {
            self.exec(
                "INSERT INTO site_rtts (from_site, to_site, micros) VALUES ($1, $2, $3)
                 ON CONFLICT (from_site, to_site) DO UPDATE SET micros = excluded.micros",
                &[&n.site, to, &(*micros as i64)],
            )?;
        }
        Ok(())
    }

    fn get_node(&mut self, id: &str) -> Result<Option<(NodeInfo, i64)>, MetaError> {
        self.opt(
            "SELECT id, store_id, site, addr, capacity, used, chunk_count, cache_bytes, last_seen FROM nodes WHERE id = $1",
            &[&id],
        )?
        .map(|r| node_of(&r))
        .transpose()
    }

    fn list_nodes(&mut self) -> Result<Vec<(NodeInfo, i64)>, MetaError> {
        let rows = self.query(
            "SELECT id, store_id, site, addr, capacity, used, chunk_count, cache_bytes, last_seen FROM nodes ORDER BY id",
            &[],
        )?;
        rows.iter().map(node_of).collect()
    }

    /// The policy is looked for up the chain of parents (`effective_policy`): the
    /// ancestors' policies and inodes come along in the same round trip.
    fn get_policy(&mut self, ino: InodeId) -> Result<Option<Policy>, MetaError> {
        if self.seen.no_policies {
            return Ok(None);
        }
        self.prefetch(Prefetch { policies: Some(ino), ..Prefetch::default() })?;
        Ok(self.seen.policies.get(&ino).cloned().flatten())
    }

    fn may_have_policies(&mut self) -> Result<bool, MetaError> {
        Ok(!self.seen.no_policies)
    }

    fn put_policy(&mut self, ino: InodeId, p: &Policy) -> Result<(), MetaError> {
        self.seen.no_policies = false;
        self.defer(
            "INSERT INTO policies (ino, sites, copies, mode, rpo_secs) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (ino) DO UPDATE SET sites = excluded.sites, copies = excluded.copies,
             mode = excluded.mode, rpo_secs = excluded.rpo_secs",
            vec![
                Box::new(ino as i64),
                Box::new(p.sites.join(",")),
                Box::new(p.copies as i64),
                Box::new(p.mode.to_string()),
                Box::new(p.rpo_secs as i64),
            ],
        )?;
        self.seen.policies.insert(ino, Some(p.clone()));
        Ok(())
    }

    fn delete_policy(&mut self, ino: InodeId) -> Result<(), MetaError> {
        if self.seen.policies.insert(ino, None) != Some(None) {
            self.defer("DELETE FROM policies WHERE ino = $1", vec![Box::new(ino as i64)])?;
        }
        Ok(())
    }

    fn list_policies(&mut self) -> Result<Vec<(InodeId, Policy)>, MetaError> {
        let rows = self.query("SELECT sites, copies, mode, rpo_secs, ino FROM policies ORDER BY ino", &[])?;
        rows.iter()
            .map(|r| {
                let policy = policy_of((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?))?;
                Ok((r.try_get::<_, i64>(4)? as u64, policy))
            })
            .collect()
    }

    fn set_drained(&mut self, node: &str, drained: bool) -> Result<(), MetaError> {
        if drained {
            self.exec("INSERT INTO drained_nodes (id) VALUES ($1) ON CONFLICT (id) DO NOTHING", &[&node])?;
        } else {
            self.exec("DELETE FROM drained_nodes WHERE id = $1", &[&node])?;
        }
        Ok(())
    }

    fn drained_nodes(&mut self) -> Result<Vec<String>, MetaError> {
        let rows = self.query("SELECT id FROM drained_nodes ORDER BY id", &[])?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    fn get_admission(&mut self, node: &str) -> Result<Option<bool>, MetaError> {
        let rows = self.query("SELECT admitted FROM node_admissions WHERE id = $1", &[&node])?;
        rows.first().map(|r| Ok(r.try_get::<_, i64>(0)? != 0)).transpose()
    }

    fn set_admission(&mut self, node: &str, admitted: bool) -> Result<(), MetaError> {
        self.exec(
            "INSERT INTO node_admissions (id, admitted) VALUES ($1, $2)
             ON CONFLICT (id) DO UPDATE SET admitted = excluded.admitted",
            &[&node, &i64::from(admitted)],
        )?;
        Ok(())
    }

    fn put_join_token(&mut self, hash: &[u8; 32], expires_ms: i64) -> Result<(), MetaError> {
        self.exec("INSERT INTO join_tokens (hash, expires) VALUES ($1, $2)", &[&&hash[..], &expires_ms])?;
        Ok(())
    }

    fn take_join_token(&mut self, hash: &[u8; 32]) -> Result<Option<i64>, MetaError> {
        let rows = self.query("DELETE FROM join_tokens WHERE hash = $1 RETURNING expires", &[&&hash[..]])?;
        rows.first().map(|r| Ok(r.try_get::<_, i64>(0)?)).transpose()
    }

    fn delete_node(&mut self, node: &str) -> Result<(), MetaError> {
        self.exec("DELETE FROM nodes WHERE id = $1", &[&node])?;
        self.exec("DELETE FROM drained_nodes WHERE id = $1", &[&node])?;
        self.exec("DELETE FROM chunk_nodes WHERE node = $1", &[&node])?;
        Ok(())
    }

    fn principal(&mut self, name: &str) -> Result<Option<u32>, MetaError> {
        let row = self.opt("SELECT id FROM principals WHERE name = $1", &[&name])?;
        Ok(row.map(|r| r.try_get::<_, i64>(0)).transpose()?.map(|id| id as u32))
    }

    fn add_principal(&mut self, name: &str) -> Result<u32, MetaError> {
        // Numbered like SQLite's rowid (principals are never deleted, so never reused),
        // which keeps the numbers of a migrated database.
        let row = self.one(
            "INSERT INTO principals (id, name) SELECT COALESCE(MAX(id), 0) + 1, $1 FROM principals RETURNING id",
            &[&name],
        )?;
        Ok(row.try_get::<_, i64>(0)? as u32)
    }
}
