//! `locus home create|list|move`: metadata homes, the subtrees whose metadata commits in an
//! engine of its own (`locus meta --home NAME=URL`).

use crate::cli::{HomeArgs, HomeCommand};
use crate::policy::{path_of, resolve};
use anyhow::{Context, bail};
use proto::meta::{ListHomes, MakeJunction, MoveHome};
use std::process::ExitCode;
use std::time::Duration;

pub async fn run(args: HomeArgs) -> anyhow::Result<ExitCode> {
    let addr = crate::local::meta_addr(args.meta.as_deref());
    let meta = crate::admin::connect_meta(&addr, Duration::from_secs(30)).await?;
    match args.command {
        HomeCommand::Create { path, home, mode } => {
            let trimmed = path.trim_end_matches('/');
            let Some((parent, name)) = trimmed.rsplit_once('/').filter(|(_, name)| !name.is_empty()) else {
                bail!("{path:?} names no new directory: give its path in the namespace, e.g. /projects/x");
            };
            let parent_ino = resolve(&meta, parent).await?;
            let made = meta
                .ask(MakeJunction { parent: parent_ino, name: name.as_bytes().to_vec(), home: home.clone(), mode })
                .await?
                .with_context(|| format!("{path}: making it the root of home {home}"))?;
            println!("{trimmed}: the root of home {home} (inode {})", made.ino);
        }
        HomeCommand::List => {
            println!("{:>5}  {:<16} {:>17}  {:<34} ROOTS", "HOME", "NAME", "INODES", "WRITES COMMITTED BY");
            for home in meta.ask(ListHomes {}).await?? {
                let mut roots = Vec::new();
                for ino in &home.junctions {
                    roots.push(path_of(&meta, *ino).await.unwrap_or_else(|e| format!("inode {ino} ({e})")));
                }
                let roots = if home.id == 0 { "/".to_string() } else { roots.join(", ") };
                let writer = home.writer.map_or_else(|| "this meta".to_string(), |meta| format!("meta {meta}"));
                println!(
                    "{:>5}  {:<16} {:>10} inodes  written by {writer:<24} {roots}",
                    home.id, home.name, home.inodes
                );
                if let Some(placement) = home.placement {
                    println!("       moved: {placement}");
                }
            }
        }
        HomeCommand::Move { home, to_site } => {
            let moved = meta
                .ask(MoveHome { home: home.clone(), to_site: to_site.clone() })
                .await?
                .with_context(|| format!("moving home {home} to site {to_site}"))?;
            println!(
                "home {} moved from site {} to site {} (database {}): {} rows copied, writes paused {} ms",
                moved.home, moved.from_site, moved.to_site, moved.database, moved.rows, moved.paused_ms
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
