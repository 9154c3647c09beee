//! `locus bench`: creates, stats, unlinks and a sequential read through the client
//! library (`client::Client`, no mount), as a program that links Locus sees them;
//! bench/library.sh runs it beside the mount and the Python package.

use crate::cli::BenchArgs;
use anyhow::Context;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.threads > 0 && args.files > 0, "--threads and --files must be at least 1");
    let config = client::ClientConfig {
        meta_addr: args.meta.clone(),
        site: args.site.clone(),
        purpose: "locus bench".into(),
        ..client::ClientConfig::default()
    };
    let client =
        Arc::new(client::Client::connect(config).await.with_context(|| format!("cannot reach meta at {}", args.meta))?);
    let dir = format!("/locus-bench-{}-{}", std::process::id(), proto::types::Timestamp::now().millis());
    client.mkdir(&dir, 0o755).await.with_context(|| format!("cannot make {dir}"))?;
    println!("{:<8} {:>8} {:>9} {:>10}", "OP", "FILES", "SECONDS", "PER SECOND");
    for op in [Op::Create, Op::Stat, Op::Unlink] {
        let started = Instant::now();
        let tasks: Vec<_> = (0..args.threads)
            .map(|t| {
                let (client, dir, files, threads) = (client.clone(), dir.clone(), args.files, args.threads);
                tokio::spawn(async move {
                    for i in (t..files).step_by(threads) {
                        op.run(&client, &format!("{dir}/f{i}")).await?;
                    }
                    Ok::<(), client::VfsError>(())
                })
            })
            .collect();
        for task in tasks {
            task.await?.with_context(|| format!("{op:?} failed"))?;
        }
        let secs = started.elapsed().as_secs_f64();
        println!("{:<8} {:>8} {:>9.3} {:>10.0}", op.name(), args.files, secs, args.files as f64 / secs);
    }
    client.rmdir(&dir).await?;
    if let Some(path) = &args.read {
        let mut file = client.open(path, client::OpenMode { read: true, ..Default::default() }, 0).await?;
        let started = Instant::now();
        let mut bytes = 0u64;
        loop {
            let part = file.read(8 << 20).await?;
            if part.is_empty() {
                break;
            }
            bytes += part.len() as u64;
        }
        file.close().await?;
        let secs = started.elapsed().as_secs_f64();
        println!("read {path}: {bytes} bytes in {secs:.3} s, {:.1} MB/s", bytes as f64 / secs / 1e6);
    }
    client.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// One measured operation on one path.
#[derive(Debug, Clone, Copy)]
enum Op {
    Create,
    Stat,
    Unlink,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Stat => "stat",
            Op::Unlink => "unlink",
        }
    }

    async fn run(self, client: &client::Client, path: &str) -> Result<(), client::VfsError> {
        match self {
            Op::Create => {
                let how = client::OpenMode { write: true, create: true, exclusive: true, ..Default::default() };
                client.open(path, how, 0o644).await?.close().await
            }
            Op::Stat => client.stat(path).await.map(drop),
            Op::Unlink => client.remove(path).await,
        }
    }
}
