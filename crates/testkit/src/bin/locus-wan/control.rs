//! Run-time control: the impairment settings of one direction, their `key=value`
//! syntax (shared by the command-line flags and the control socket), and the
//! `set`/`stats` requests the forwarder answers on its Unix datagram socket.

use std::time::Duration;

use testkit::wan::Impairment;

use crate::forwarder::Forwarder;

/// Settings of one direction plus whether its queue follows 1.5 × BDP.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// One-way delay in milliseconds.
    pub delay_ms: f64,
    /// Random loss in percent.
    pub loss_pct: f64,
    /// Rate limit in Mbit/s (0 = unlimited).
    pub rate_mbit: f64,
    /// Queue in bytes; `None` = 1.5 × BDP.
    pub queue: Option<u64>,
}

impl Default for Setting {
    fn default() -> Self {
        Setting { delay_ms: 0.0, loss_pct: 0.0, rate_mbit: 1000.0, queue: None }
    }
}

fn non_negative(v: &str) -> Result<f64, String> {
    v.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0).ok_or(format!("{v:?} is not a non-negative number"))
}

/// A one-way delay in ms (capped at one minute).
pub fn parse_delay_ms(v: &str) -> Result<f64, String> {
    Ok(non_negative(v)?.min(60_000.0))
}

/// A loss percentage (capped at 100).
pub fn parse_loss_pct(v: &str) -> Result<f64, String> {
    Ok(non_negative(v)?.min(100.0))
}

/// A rate in Mbit/s (capped at 1 Tbit/s).
pub fn parse_rate_mbit(v: &str) -> Result<f64, String> {
    Ok(non_negative(v)?.min(1_000_000.0))
}

/// A rate limiter's queue: a size in bytes, or `None` for 1.5 × BDP (`auto`).
#[derive(Clone, Copy, Debug)]
pub struct QueueBytes(pub Option<u64>);

/// A queue size in bytes, or `auto`.
pub fn parse_queue(v: &str) -> Result<QueueBytes, String> {
    if v == "auto" {
        return Ok(QueueBytes(None));
    }
    v.parse().map(|q| QueueBytes(Some(q))).map_err(|_| format!("{v:?} is not a byte count or auto"))
}

impl Setting {
    /// The pipeline configuration for these settings.
    pub fn impairment(&self) -> Impairment {
        let mut imp = Impairment::new(Duration::from_secs_f64(self.delay_ms / 1000.0), self.loss_pct, self.rate_mbit);
        if let Some(q) = self.queue {
            imp.queue_bytes = q;
        }
        imp
    }

    /// Applies one `key=value` of a `set` request; `Ok(false)` for an unknown key.
    fn apply(&mut self, key: &str, val: &str) -> Result<bool, String> {
        let bad = |e: String| format!("bad {key}: {e}");
        match key {
            "delay_ms" => self.delay_ms = parse_delay_ms(val).map_err(bad)?,
            "loss_pct" => self.loss_pct = parse_loss_pct(val).map_err(bad)?,
            "rate_mbit" => self.rate_mbit = parse_rate_mbit(val).map_err(bad)?,
            "queue_bytes" => self.queue = parse_queue(val).map_err(bad)?.0,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// Answers one control request: `set [from=I] [to=J] KEY=VALUE...` or `stats`.
pub fn answer(fw: &mut Forwarder, msg: &str) -> String {
    let mut words = msg.split_whitespace();
    match words.next() {
        Some("set") => set(fw, words),
        Some("stats") => stats(fw),
        _ => "err commands: set KEY=VALUE..., stats".into(),
    }
}

fn set<'a>(fw: &mut Forwarder, words: impl Iterator<Item = &'a str>) -> String {
    let n = fw.n();
    let (mut from, mut to) = (None, None);
    let mut kv = vec![];
    for w in words {
        let Some((k, v)) = w.split_once('=') else { return format!("err bad word {w}") };
        match k {
            "from" => match v.parse::<usize>() {
                Ok(i) if i < n => from = Some(i),
                _ => return format!("err bad from {v}"),
            },
            "to" => match v.parse::<usize>() {
                Ok(i) if i < n => to = Some(i),
                _ => return format!("err bad to {v}"),
            },
            _ => kv.push((k, v)),
        }
    }
    for i in 0..n {
        for j in 0..n {
            if i == j || from.is_some_and(|f| f != i) || to.is_some_and(|t| t != j) {
                continue;
            }
            let mut s = fw.settings[i * n + j];
            for (k, v) in &kv {
                match s.apply(k, v) {
                    Ok(true) => {}
                    Ok(false) => return format!("err unknown key {k}"),
                    Err(e) => return format!("err {e}"),
                }
            }
            fw.settings[i * n + j] = s;
            if let Some(p) = fw.pipes[i * n + j].as_mut() {
                p.set_config(s.impairment());
            }
        }
    }
    "ok".into()
}

fn stats(fw: &Forwarder) -> String {
    let n = fw.n();
    let mut out = format!("ok oversize={} send_errors={}\n", fw.oversize, fw.send_errors);
    for (k, p) in fw.pipes.iter().enumerate() {
        let Some(p) = p else { continue };
        let (s, c) = (p.stats(), p.config());
        out.push_str(&format!(
            "{}->{} received={} released={} released_bytes={} lost={} queue_drops={} overflow_drops={} \
             waiting={} delay_ns={} loss={} rate_bps={} queue_bytes={}\n",
            fw.ports[k / n].name,
            fw.ports[k % n].name,
            s.received,
            s.released,
            s.released_bytes,
            s.lost,
            s.queue_drops,
            s.overflow_drops,
            p.len(),
            c.delay_ns,
            c.loss,
            c.rate_bps,
            c.queue_bytes
        ));
    }
    out
}
