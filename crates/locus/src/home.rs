//! `locus home create|list|move`: metadata homes, the subtrees whose metadata commits in an
//! engine of its own (`locus meta --home NAME=URL`).

use crate::cli::{HomeArgs, HomeCommand};
use crate::policy::{path_of, resolve};
use anyhow::{Context, bail};
use net::RpcClient;
use proto::meta::{HomeInfo, ListHomes, MakeJunction, MoveHome};
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
        HomeCommand::List => print_homes(&meta, meta.ask(ListHomes {}).await??).await,
        HomeCommand::Move { home, to_site } => {
            // The meta bounds each step of a move by its database timeout, and a move has
            // several: this waits for its answer, error or not, and shows its steps.
            let mover = crate::admin::connect_meta(&addr, MOVE_WAIT).await?;
            // map-check: not a worker (the command's own progress lines, aborted once the move is answered)
            let progress = tokio::spawn(show_move_steps(meta, home.clone()));
            let moved = mover.ask(MoveHome { home: home.clone(), to_site: to_site.clone(), reason: None }).await;
            progress.abort();
            let moved = moved?.with_context(|| format!("moving home {home} to site {to_site}"))?;
            println!(
                "home {} moved from site {} to site {} (database {}): {} rows copied, writes paused {} ms",
                moved.home, moved.from_site, moved.to_site, moved.database, moved.rows, moved.paused_ms
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The longest `locus home move` waits for the meta's answer.
const MOVE_WAIT: Duration = Duration::from_secs(600);

/// Prints each step a move of home `name` goes through, as the meta shows it (to
/// stderr, once a second at most; until aborted).
async fn show_move_steps(meta: RpcClient, name: String) {
    let mut shown = None;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Ok(Ok(homes)) = meta.ask(ListHomes {}).await else { continue };
        let step = homes.into_iter().find(|h| h.name == name).and_then(|h| h.moving);
        if step.is_some() && step != shown {
            eprintln!("home {name}: {}", step.as_deref().unwrap_or_default());
            shown = step;
        }
    }
}

/// Every home as the meta at the other end sees it: which site writes it and through
/// which meta, its roots, a move in progress, its writes by site over the window of
/// automatic moves, and its latest moves (`locus home list`, `locus status`).
pub async fn print_homes(meta: &RpcClient, homes: Vec<HomeInfo>) {
    println!("{:>5}  {:<16} {:>17}  {:<34} ROOTS", "HOME", "NAME", "INODES", "WRITES COMMITTED BY");
    for home in homes {
        let mut roots = Vec::new();
        for ino in &home.junctions {
            roots.push(path_of(meta, *ino).await.unwrap_or_else(|e| format!("inode {ino} ({e})")));
        }
        let roots = if home.id == 0 { "/".to_string() } else { roots.join(", ") };
        let site = home.site.map(|s| format!("site {s}, ")).unwrap_or_default();
        let writer = home.writer.map_or_else(|| format!("{site}this meta"), |meta| format!("{site}meta {meta}"));
        println!("{:>5}  {:<16} {:>10} inodes  written by {writer:<24} {roots}", home.id, home.name, home.inodes);
        if let Some(placement) = home.placement {
            println!("       moved: {placement}");
        }
        if let Some(moving) = home.moving {
            println!("       now: {moving}");
        }
        if !home.recent_writes.is_empty() {
            let by_site: Vec<String> = home.recent_writes.iter().map(|(s, n)| format!("site {s} {n}")).collect();
            println!("       recent writes: {}", by_site.join(", "));
        }
        for m in &home.moves {
            println!(
                "       {} moved from site {} to site {}: {} rows, recorded {} ms into the pause ({})",
                crate::admin::utc(m.at_ms as i64),
                m.from_site,
                m.to_site,
                m.rows,
                m.paused_ms,
                m.reason
            );
        }
    }
}
