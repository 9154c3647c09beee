//! `locus policy set|get|list`: replication policies of directories, named by their
//! path in the namespace (`/projects/x`), kept by meta.

use crate::cli::{PolicyArgs, PolicyCommand};
use anyhow::{Context, bail};
use net::RpcClient;
use proto::meta::{GetAttr, GetPolicy, ListPolicies, Lookup, MetaMessage, ReadDir, SetPolicy};
use proto::policy::Policy;
use proto::types::{InodeId, ROOT_INODE};
use std::process::ExitCode;
use std::time::Duration;

async fn ask<M: MetaMessage>(meta: &RpcClient, msg: M) -> anyhow::Result<M::Response> {
    Ok(meta.ask(msg).await??)
}

/// The inode a namespace path names (`/` is the root; relative paths start there too).
pub async fn resolve(meta: &RpcClient, path: &str) -> anyhow::Result<InodeId> {
    let mut ino = ROOT_INODE;
    for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        ino = ask(meta, Lookup { parent: ino, name: part.as_bytes().to_vec() })
            .await
            .with_context(|| format!("{path}: no {part:?} in the namespace"))?
            .ino;
    }
    Ok(ino)
}

/// The path of a directory, found by walking `..` up to the root and looking for each
/// step's name in its parent (for listings; directories have one name).
pub async fn path_of(meta: &RpcClient, dir: InodeId) -> anyhow::Result<String> {
    let mut parts = Vec::new();
    let mut cur = dir;
    while cur != ROOT_INODE {
        let parent = ask(meta, Lookup { parent: cur, name: b"..".to_vec() }).await?.ino;
        let mut after = 0;
        let name = 'find: loop {
            let page = ask(meta, ReadDir { ino: parent, after, limit: 1024 }).await?;
            let Some(last) = page.last() else { bail!("directory {cur} is not listed in its parent {parent}") };
            after = last.cookie;
            if let Some(e) = page.iter().find(|e| e.attr.ino == cur) {
                break 'find String::from_utf8_lossy(&e.name).into_owned();
            }
        };
        parts.push(name);
        cur = parent;
    }
    parts.reverse();
    Ok(format!("/{}", parts.join("/")))
}

pub async fn run(args: PolicyArgs) -> anyhow::Result<ExitCode> {
    let addr = crate::local::meta_addr(args.meta.as_deref());
    let meta = crate::admin::connect_meta(&addr, Duration::from_secs(30)).await?;
    match args.command {
        PolicyCommand::Set { path, sites, copies, mode, rpo, clear } => {
            let ino = resolve(&meta, &path).await?;
            let policy = (!clear).then(|| Policy {
                sites: sites.iter().flat_map(|s| s.split(',')).filter(|s| !s.is_empty()).map(String::from).collect(),
                copies,
                mode,
                rpo_secs: rpo.as_secs(),
            });
            let warnings = ask(&meta, SetPolicy { ino, policy: policy.clone() }).await.with_context(|| path.clone())?;
            for w in warnings {
                eprintln!("warning: {path}: {w}");
            }
            match policy {
                Some(p) => println!("{path}: {p}"),
                None => println!("{path}: policy cleared (inherits its parent's)"),
            }
        }
        PolicyCommand::Get { path } => {
            let ino = resolve(&meta, &path).await?;
            let kind = ask(&meta, GetAttr { ino }).await?.kind;
            let effective = ask(&meta, GetPolicy { ino }).await?;
            let from = match effective.set_on {
                Some(dir) if dir == ino => "set here".to_string(),
                Some(dir) => format!("inherited from {}", path_of(&meta, dir).await?),
                None => "cluster default".to_string(),
            };
            println!("{path} ({kind:?}): {} ({from})", effective.policy);
        }
        PolicyCommand::List => {
            for (ino, p) in ask(&meta, ListPolicies {}).await? {
                println!("{:<40} {p}", path_of(&meta, ino).await?);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
