//! How a node reaches other sites: the operator's settings and the connection count
//! chosen from a path's round trip.

use std::time::Duration;

/// How a node reaches other sites.
#[derive(Debug, Clone)]
pub struct WanConfig {
    /// Bytes of chunks cached for this site (copies of other sites' chunks).
    pub cache_bytes: u64,
    /// TCP connections to each node of another site; `None`: chosen per node from its
    /// measured round trip (`auto_connections`).
    pub connections: Option<usize>,
    /// Overrides of `connections` for particular sites (site, connections).
    pub connections_to: Vec<(String, usize)>,
    /// Bytes per second the path to another site should carry: with the round trip
    /// and the kernel's largest TCP window it sizes the automatic connection count.
    pub path_rate: u64,
    /// Bytes per second one connection's receiving task keeps up with (decryption,
    /// framing; ~40 MB/s measured on the 2-core bench machine under load, see
    /// bench/results/wan-read.md): the automatic count never leaves the path to fewer.
    pub connection_rate: u64,
    /// Most connections the automatic count opens to one node.
    pub max_connections: usize,
    /// Smallest stripe a chunk is cut into for a parallel fetch.
    pub min_stripe: u64,
    /// How long one stripe may take before the copy counts as failed.
    pub timeout: Duration,
}

impl Default for WanConfig {
    fn default() -> Self {
        WanConfig {
            cache_bytes: 16 << 30,
            connections: None,
            connections_to: Vec::new(),
            path_rate: 125_000_000,
            connection_rate: 40_000_000,
            max_connections: 16,
            min_stripe: 512 << 10,
            timeout: Duration::from_secs(30),
        }
    }
}

impl WanConfig {
    /// Connections fixed by the operator towards `site`, if any.
    pub fn connections_for(&self, site: &str) -> Option<usize> {
        self.connections_to.iter().find(|(s, _)| s == site).map(|(_, n)| *n).or(self.connections).map(|n| n.max(1))
    }
}

/// Connections that keep a path of `rate` bytes/s and round trip `rtt` full: enough
/// windows of `window` bytes for the bandwidth-delay product, enough connections of
/// `per_connection` bytes/s each for the rate, at least 2 (one loss does not stall
/// the transfer) and at most `max`. Loss does not enter: the connections run BBR
/// (`--tcp-congestion`), whose rate does not fall with random loss, and more flows than
/// this only deepen the bottleneck's queue (8 at line rate overflow a 1 x BDP queue).
pub fn auto_connections(rtt: Duration, rate: u64, window: u64, per_connection: u64, max: usize) -> usize {
    let bdp = rate as f64 * rtt.as_secs_f64();
    let for_window = (bdp / window.max(1) as f64).ceil() as usize;
    let for_rate = rate.div_ceil(per_connection.max(1)) as usize;
    for_window.max(for_rate).clamp(2, max.max(2))
}

/// Payload one TCP connection can keep in flight here: the smaller of the kernel's
/// largest send and receive buffers (`tcp_wmem`/`tcp_rmem` maxima, autotuning's
/// ceiling), half of which holds payload (the rest is the kernel's per-packet overhead).
pub(super) fn flow_window() -> u64 {
    let max_of = |path: &str| std::fs::read_to_string(path).ok()?.split_whitespace().nth(2)?.parse::<u64>().ok();
    let wmem = max_of("/proc/sys/net/ipv4/tcp_wmem").unwrap_or(4 << 20);
    let rmem = max_of("/proc/sys/net/ipv4/tcp_rmem").unwrap_or(6 << 20);
    wmem.min(rmem) / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_count_covers_the_bandwidth_delay_product_within_bounds() {
        let ms = Duration::from_millis;
        // 1 Gbit/s, 2 MiB of payload per connection, connections as fast as the path.
        let (rate, window, fast) = (125_000_000, 2 << 20, 1 << 40);
        assert_eq!(auto_connections(ms(100), rate, window, fast, 16), 6, "12.5 MB in flight / 2 MiB each");
        assert_eq!(auto_connections(ms(200), rate, window, fast, 16), 12);
        assert_eq!(auto_connections(ms(10), rate, window, fast, 16), 2, "never fewer than 2");
        assert_eq!(auto_connections(Duration::ZERO, rate, window, fast, 16), 2);
        assert_eq!(auto_connections(ms(1000), rate, window, fast, 16), 16, "capped");
        assert_eq!(auto_connections(ms(100), rate, 0, fast, 16), 16, "no window known: the cap");
        // Larger windows need fewer connections, but never fewer than the rate needs.
        assert_eq!(auto_connections(ms(100), rate, 32 << 20, fast, 16), 2);
        assert_eq!(auto_connections(ms(100), rate, 32 << 20, 40_000_000, 16), 4, "125 / 40 MB/s");
        assert_eq!(auto_connections(ms(200), rate, window, 40_000_000, 16), 12, "the window still rules");
        assert_eq!(auto_connections(ms(10), rate, window, 0, 16), 16, "no rate known: the cap");
    }

    #[test]
    fn operator_counts_override_the_automatic_one() {
        let auto = WanConfig::default();
        assert_eq!(auto.connections_for("a"), None);
        let fixed = WanConfig { connections: Some(8), connections_to: vec![("c".into(), 3)], ..WanConfig::default() };
        assert_eq!(fixed.connections_for("a"), Some(8));
        assert_eq!(fixed.connections_for("c"), Some(3));
        let only_c = WanConfig { connections_to: vec![("c".into(), 0)], ..WanConfig::default() };
        assert_eq!(only_c.connections_for("c"), Some(1), "at least one");
        assert_eq!(only_c.connections_for("a"), None);
    }

    #[test]
    fn the_flow_window_comes_from_the_kernel_limits() {
        let w = flow_window();
        assert!((2048..=1 << 31).contains(&w), "{w}");
    }
}
