//! `locus meta migrate`: copies a whole namespace from a SQLite database into an empty
//! PostgreSQL database, table by table in one PostgreSQL transaction (the target
//! is whole or untouched), keeping the cluster id, then checks every table's row
//! count on both sides.

use crate::engine::{Located, located};
use crate::error::MetaError;
use postgres::types::ToSql;
use rusqlite::types::ValueRef;

/// A value of a SQLite column as PostgreSQL takes it (every integer is BIGINT there).
enum Cell {
    Null(AnyNull),
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
}

impl Cell {
    fn of(v: ValueRef<'_>) -> Result<Cell, MetaError> {
        Ok(match v {
            ValueRef::Null => Cell::Null(AnyNull),
            ValueRef::Integer(i) => Cell::Int(i),
            ValueRef::Text(t) => Cell::Text(
                String::from_utf8(t.to_vec()).map_err(|e| MetaError::Corrupt(format!("text column not UTF-8: {e}")))?,
            ),
            ValueRef::Blob(b) => Cell::Bytes(b.to_vec()),
            ValueRef::Real(r) => return Err(MetaError::Corrupt(format!("unexpected REAL value {r}"))),
        })
    }

    fn param(&self) -> &(dyn ToSql + Sync) {
        match self {
            Cell::Null(n) => n,
            Cell::Int(i) => i,
            Cell::Text(t) => t,
            Cell::Bytes(b) => b,
        }
    }
}

/// SQL NULL for a column of any type: a typed `None` is refused by a column of another
/// type (a session's `owner` TEXT is NULL when it was opened without TLS).
#[derive(Debug)]
struct AnyNull;

impl ToSql for AnyNull {
    fn to_sql(
        &self,
        _: &postgres::types::Type,
        _: &mut bytes::BytesMut,
    ) -> Result<postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        Ok(postgres::types::IsNull::Yes)
    }

    fn accepts(_: &postgres::types::Type) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}

/// The tables that hold no namespace of their own: the version row (the target has
/// its own) and the counters (ids become sequences there).
const NOT_COPIED: &[&str] = &["meta_version", "counters"];

/// Copies the SQLite database `from` (a `sqlite://` URL or path, which must not be in
/// use by a running meta) into the PostgreSQL database `to`, which must be empty.
/// Returns each copied table with its row count (equal on both sides).
pub fn migrate(from: &str, to: &str) -> Result<Vec<(String, u64)>, MetaError> {
    let path = match located(from) {
        Ok(Located::Sqlite(path)) => path,
        _ => {
            return Err(MetaError::UnsupportedUrl {
                url: from.into(),
                reason: "migrate reads from a SQLite database".into(),
            });
        }
    };
    if !matches!(located(to), Ok(Located::Postgres)) {
        return Err(MetaError::UnsupportedUrl {
            url: to.into(),
            reason: "migrate writes to a PostgreSQL database".into(),
        });
    }
    // Opening checks the source (a Locus database, not damaged), upgrades it to this
    // binary's schema, and holds its lock: no meta writes to it while it is copied.
    let _source = crate::sqlite::open(path, false)?;
    let src = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let mut dst = crate::postgres::connect_empty(to)?;
    dst.batch("BEGIN ISOLATION LEVEL SERIALIZABLE")?; // the whole copy or nothing
    let copied = (|| {
        crate::postgres::create_tables(&mut dst)?;
        let tables: Vec<String> = src
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let mut copied = Vec::new();
        for table in tables.iter().filter(|t| !NOT_COPIED.contains(&t.as_str())) {
            let mut st = src.prepare(&format!("SELECT * FROM {table}"))?;
            let columns: Vec<String> = st.column_names().map(String::from).collect();
            let placeholders: Vec<String> = (1..=columns.len()).map(|i| format!("${i}")).collect();
            let insert = dst.prepare_dynamic(&format!(
                "INSERT INTO {table} ({}) VALUES ({})",
                columns.join(", "),
                placeholders.join(", ")
            ))?;
            let mut rows = st.query([])?;
            let mut n = 0u64;
            while let Some(row) = rows.next()? {
                let cells =
                    (0..columns.len()).map(|i| Cell::of(row.get_ref(i)?)).collect::<Result<Vec<_>, MetaError>>()?;
                let params: Vec<&(dyn ToSql + Sync)> = cells.iter().map(Cell::param).collect();
                dst.execute_prepared(&insert, &params)?;
                n += 1;
            }
            let target = dst.count_rows(table)?;
            if target != n {
                return Err(MetaError::Internal(format!(
                    "table {table}: copied {n} rows but the target holds {target}"
                )));
            }
            copied.push((table.clone(), n));
        }
        let counters: Vec<(String, i64)> = src
            .prepare("SELECT name, value FROM counters")?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        for (name, value) in counters {
            dst.set_counter(&name, value)?;
        }
        Ok(copied)
    })();
    match copied {
        Ok(copied) => {
            dst.batch("COMMIT")?;
            Ok(copied)
        }
        Err(e) => {
            let _ = dst.batch("ROLLBACK");
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::test_config;
    use crate::service::{MetaConfig, MetaService};
    use proto::meta::*;
    use proto::types::*;
    use std::sync::Arc;

    fn ask(s: &Arc<MetaService>, req: MetaRequest) -> MetaReply {
        let shown = format!("{req:?}");
        s.handle_blocking(req).unwrap_or_else(|e| panic!("{shown}: {e}"))
    }

    fn create(s: &Arc<MetaService>, parent: InodeId, name: &str, node: NewNode) -> Attr {
        let req =
            MetaRequest::Create(Create { parent, name: name.into(), node, mode: 0o640, umask: 0, exclusive: true });
        let ino = match ask(s, req) {
            MetaReply::Made(m) => m.attr.ino,
            other => panic!("expected Made, got {other:?}"),
        };
        let chown = AttrChanges { uid: Some(7), gid: Some(8), ..Default::default() };
        match ask(s, MetaRequest::SetAttr(SetAttr { ino, set: chown, session: None })) {
            MetaReply::Attr(a) => a,
            other => panic!("expected Attr, got {other:?}"),
        }
    }

    /// Everything a client or admin can list, to compare two databases whole.
    fn everything(s: &Arc<MetaService>) -> Vec<MetaReply> {
        let mut out = vec![
            ask(s, MetaRequest::ListExtents(ListExtents { after: None, limit: 10_000 })),
            ask(s, MetaRequest::ListChunks(ListChunks { after: None, limit: 10_000 })),
            // Without the age of the last heartbeat, which grows while the test runs.
            match ask(s, MetaRequest::ListNodes(ListNodes {})) {
                MetaReply::Nodes(nodes) => {
                    MetaReply::Nodes(nodes.into_iter().map(|n| NodeInfo { last_seen_secs: 0, ..n }).collect())
                }
                other => other,
            },
        ];
        let mut dirs = vec![ROOT_INODE];
        while let Some(dir) = dirs.pop() {
            let MetaReply::Entries(entries) =
                ask(s, MetaRequest::ReadDir(ReadDir { ino: dir, after: 0, limit: 10_000 }))
            else {
                panic!("expected entries")
            };
            for e in &entries {
                if e.attr.kind == FileKind::Dir {
                    dirs.push(e.attr.ino);
                }
                out.push(ask(s, MetaRequest::ListXattr(ListXattr { ino: e.attr.ino })));
            }
            out.push(MetaReply::Entries(entries));
        }
        out
    }

    #[test]
    fn a_sqlite_namespace_moves_whole_to_postgres_and_an_occupied_target_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("meta.db");
        let source = MetaService::open(&test_config(db.clone())).unwrap();
        let docs = create(&source, ROOT_INODE, "docs", NewNode::Dir);
        let mut files = Vec::new();
        for i in 0..40u8 {
            let f = create(&source, docs.ino, &format!("f{i}"), NewNode::File);
            let chunk = ChunkId([i; 32]);
            let extent = Extent { file_offset: 0, len: 100 + u64::from(i), chunk, chunk_offset: 0 };
            ask(
                &source,
                MetaRequest::CommitWrite(CommitWrite {
                    session: 0,
                    ino: f.ino,
                    extents: vec![extent],
                    chunks: vec![StoredChunk { id: chunk, size: 1 << 20, nodes: vec!["n1".into()], receipt: None }],
                    min_size: 0,
                    mtime: Timestamp { secs: 5, nanos: 6 },
                }),
            );
            files.push(f);
        }
        let req = SetXattr { ino: files[3].ino, name: b"user.k".to_vec(), value: b"v".to_vec(), mode: XattrMode::Any };
        ask(&source, MetaRequest::SetXattr(req));
        create(&source, ROOT_INODE, "link", NewNode::Symlink { target: b"docs/f1".to_vec() });
        let node = NodeInfo {
            id: "n1".into(),
            store_id: "s1".into(),
            site: "a".into(),
            addr: "127.0.0.1:1".into(),
            capacity_bytes: 1000,
            used_bytes: 10,
            chunk_count: 40,
            last_seen_secs: 0,
            site_rtts: vec![("b".into(), 50_000)],
            cache_bytes: 0,
            drained: false,
        };
        ask(&source, MetaRequest::AdmitNode(AdmitNode { node: node.id.clone() }));
        ask(&source, MetaRequest::RegisterNode(RegisterNode { node, cluster_id: None }));
        // A session opened without a certificate (no TLS): its owner column is NULL.
        let info = SessionInfo { site: "a".into(), host: "h".into(), pid: 1, purpose: "/mnt".into() };
        ask(&source, MetaRequest::Hello(Hello { protocol: proto::PROTOCOL_VERSION, session: info }));
        let before = everything(&source);
        let cluster = source.cluster_id().to_string();
        let err = migrate(&db.display().to_string(), "postgres://x@127.0.0.1:1/x").unwrap_err();
        assert!(matches!(err, MetaError::InUse { .. }), "a source a meta serves is refused: {err}");
        drop(source);

        let server = testkit::postgres::shared();
        let url = server.create_database();
        let copied = migrate(&format!("sqlite://{}", db.display()), &url).unwrap();
        let count = |t: &str| copied.iter().find(|(n, _)| n == t).map(|(_, n)| *n);
        assert_eq!((count("inodes"), count("dentries"), count("extents")), (Some(43), Some(42), Some(40)));
        assert_eq!(count("sessions"), Some(1));
        let target =
            MetaService::open(&MetaConfig { db_url: url.clone(), init: false, ..test_config(db.clone()) }).unwrap();
        assert_eq!(target.cluster_id(), cluster, "the cluster id moves along");
        let after = everything(&target);
        assert_eq!(after.len(), before.len());
        for (a, b) in after.iter().zip(&before) {
            assert_eq!(a, b, "the namespace moves whole");
        }
        assert_eq!(
            ask(&target, MetaRequest::GetXattr(GetXattr { ino: files[3].ino, name: b"user.k".to_vec() })),
            MetaReply::Bytes(b"v".to_vec())
        );
        let new = create(&target, ROOT_INODE, "after", NewNode::File);
        assert!(new.ino > files.last().unwrap().ino, "ids continue after the copied ones: {}", new.ino);

        let err = migrate(&db.display().to_string(), &url).unwrap_err();
        assert!(matches!(err, MetaError::TargetNotEmpty { .. }) && err.to_string().contains("not empty"), "{err}");
    }
}
