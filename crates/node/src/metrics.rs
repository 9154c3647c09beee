//! A Prometheus text endpoint: `GET /metrics` on the address given with `--metrics`,
//! answered by hand (one fixed response shape, no HTTP library needed).

use crate::replicate::Replicator;
use crate::site::SiteLink;
use chunk::ChunkStore;
use proto::types::{WorkerState, WorkerStatus};
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use util::worker::Workers;

/// What the metrics are read from.
pub(crate) struct Parts {
    pub store: Arc<ChunkStore>,
    pub link: Arc<SiteLink>,
    pub replicator: Arc<Replicator>,
    pub workers: Arc<Workers>,
}

/// The counters as Prometheus exposition text.
pub(crate) fn render(node: &str, site: &str, parts: &Parts) -> String {
    let Parts { store, link, replicator, workers } = parts;
    let s = store.stats();
    let w = &link.stats;
    let r = &replicator.stats;
    let (lag_chunks, _, lag_oldest) = replicator.lag();
    let labels = format!("node=\"{node}\",site=\"{site}\"");
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, v: u64| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {v}");
    };
    gauge("locus_node_capacity_bytes", "Capacity of the chunk store.", s.capacity_bytes);
    gauge("locus_node_used_bytes", "Bytes of chunks stored.", s.used_bytes);
    gauge("locus_node_chunks", "Chunks stored.", s.chunk_count);
    gauge("locus_node_corrupt_reads_total", "Reads refused because a chunk failed its hash.", s.corrupt_reads);
    gauge("locus_site_cache_bytes", "Bytes of other sites' chunks cached here.", link.cache_bytes());
    gauge("locus_site_cache_hits_total", "Reads served from the site cache.", w.cache_hits.load(Ordering::Relaxed));
    gauge(
        "locus_wan_fetched_chunks_total",
        "Chunks fetched from other nodes.",
        w.fetched_chunks.load(Ordering::Relaxed),
    );
    gauge("locus_wan_fetched_bytes_total", "Bytes fetched from other nodes.", w.fetched_bytes.load(Ordering::Relaxed));
    gauge(
        "locus_wan_corrupt_transfers_total",
        "Transfers that arrived corrupted and were fetched again.",
        w.corrupt_in_transit.load(Ordering::Relaxed),
    );
    gauge(
        "locus_replication_shipped_chunks_total",
        "Chunks this node sent to other nodes as replicas.",
        r.shipped_chunks.load(Ordering::Relaxed),
    );
    gauge(
        "locus_replication_shipped_bytes_total",
        "Bytes this node sent to other nodes as replicas.",
        r.shipped_bytes.load(Ordering::Relaxed),
    );
    gauge(
        "locus_replication_already_there_total",
        "Replicas not sent because the target already held the chunk.",
        r.already_there.load(Ordering::Relaxed),
    );
    gauge(
        "locus_replication_failures_total",
        "Replications that could not make a required copy in time.",
        r.failures.load(Ordering::Relaxed),
    );
    gauge("locus_replication_lag_chunks", "Chunks whose copies are queued, not yet made.", lag_chunks);
    gauge("locus_replication_lag_oldest_seconds", "Age of the oldest queued copy.", lag_oldest.as_secs());
    let _ = writeln!(
        out,
        "# HELP locus_replication_owed_chunks Chunks owed to a site under a policy.\n\
         # TYPE locus_replication_owed_chunks gauge"
    );
    let owed = replicator.owed();
    for l in &owed {
        let _ = writeln!(
            out,
            "locus_replication_owed_chunks{{{labels},to=\"{}\",policy=\"{}\"}} {}",
            l.site, l.policy, l.chunks
        );
    }
    let _ = writeln!(
        out,
        "# HELP locus_replication_owed_oldest_seconds Age of the oldest copy owed to a site.\n\
         # TYPE locus_replication_owed_oldest_seconds gauge"
    );
    for l in &owed {
        let _ = writeln!(
            out,
            "locus_replication_owed_oldest_seconds{{{labels},to=\"{}\",policy=\"{}\",rpo=\"{}\"}} {}",
            l.site, l.policy, l.policy.rpo_secs, l.oldest_secs
        );
    }
    let statuses = workers.statuses();
    for (name, kind, help, value) in [
        (
            "locus_worker_busy",
            "gauge",
            "1 while a background worker runs a step.",
            (|w| u64::from(w.state == WorkerState::Busy)) as fn(&WorkerStatus) -> u64,
        ),
        ("locus_worker_steps_total", "counter", "Steps a background worker finished.", |w| w.steps),
        ("locus_worker_errors_total", "counter", "Steps of a background worker that failed.", |w| w.errors),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for w in &statuses {
            let _ = writeln!(out, "{name}{{{labels},worker=\"{}\"}} {}", w.name, value(w));
        }
    }
    out
}

/// Serves the metrics until the listener fails; each connection gets one response.
pub(crate) async fn serve(listener: TcpListener, node: String, site: String, parts: Parts) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { return };
        let body = render(&node, &site, &parts);
        tokio::spawn(async move {
            // Read (and ignore) the request head; bounded so a slow peer cannot hold memory.
            let mut head = [0u8; 4096];
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), stream.read(&mut head)).await;
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}
