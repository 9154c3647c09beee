//! The WAN emulator's pure core: one direction of an emulated link as a pipeline of
//! random loss → bounded FIFO (tail drop) → serialization at a fixed rate → one-way
//! delay line. No I/O and no clock: every call takes `now` in nanoseconds, so the
//! forwarder (`locus-wan`) and the tests drive it with real or simulated time.
//!
//! The model is netem's without reordering or jitter: a frame arriving at `t` is lost
//! with probability `loss`; otherwise it waits behind the frames already accepted
//! (tail-dropped if that backlog would exceed `queue_bytes`), is serialized in
//! `len * 8 / rate` seconds, and leaves `delay` after its serialization ends. Frames
//! leave in arrival order. Frame bytes live in one preallocated byte ring per
//! pipeline, so the steady state allocates nothing per frame.

use std::collections::VecDeque;
use std::time::Duration;

/// A small, fast, seedable PRNG (SplitMix64) so a run's losses are reproducible from
/// its seed without pulling in a crate.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// Starts the sequence at `seed` (any value, including 0, is fine).
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform float in [0, 1), from the top 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The impairments of one direction of a link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Impairment {
    /// One-way propagation delay in nanoseconds (RTT = twice this on a symmetric link).
    pub delay_ns: u64,
    /// Probability in [0, 1] that a frame is dropped on arrival.
    pub loss: f64,
    /// Link rate in bits per second; 0 means unlimited (no serialization time, no queue).
    pub rate_bps: u64,
    /// Maximum backlog waiting for the rate limiter, in bytes; a frame arriving at an
    /// idle link is always accepted.
    pub queue_bytes: u64,
}

/// Smallest default queue: 256 KiB (2 ms at 1 Gbit/s), so a zero-delay link still
/// absorbs a TCP burst.
pub const MIN_DEFAULT_QUEUE: u64 = 256 * 1024;

/// Byte budget of the delay line when the rate is unlimited (nothing else bounds it).
pub const UNLIMITED_RING_BYTES: usize = 64 * 1024 * 1024;

impl Impairment {
    /// An impairment from human units (one-way delay, loss in percent, rate in Mbit/s,
    /// 0 = unlimited) with the default queue of 1.5 × the bandwidth-delay product.
    pub fn new(delay: Duration, loss_pct: f64, rate_mbit: f64) -> Self {
        let delay_ns = delay.as_nanos().min(u64::MAX as u128) as u64;
        let rate_bps = (rate_mbit.max(0.0) * 1e6) as u64;
        Impairment {
            delay_ns,
            loss: (loss_pct / 100.0).clamp(0.0, 1.0),
            rate_bps,
            queue_bytes: Self::default_queue_bytes(rate_bps, delay_ns),
        }
    }

    /// 1.5 × BDP for an RTT of twice the one-way delay, at least [`MIN_DEFAULT_QUEUE`]:
    /// enough for one loss-based TCP flow to keep the link busy.
    pub fn default_queue_bytes(rate_bps: u64, delay_ns: u64) -> u64 {
        let bdp = rate_bps as u128 * 2 * delay_ns as u128 / 8 / 1_000_000_000;
        ((bdp * 3 / 2).min(u64::MAX as u128) as u64).max(MIN_DEFAULT_QUEUE)
    }

    /// Bytes of frame storage that can never overflow under this impairment: the queue,
    /// the frames in flight on the delay line (`rate × delay`), and slack for the frame
    /// being accepted and for the ring's wrap-around waste.
    pub fn ring_bytes(&self, max_frame: usize) -> usize {
        if self.rate_bps == 0 {
            return UNLIMITED_RING_BYTES;
        }
        let in_flight = self.rate_bps as u128 * self.delay_ns as u128 / 8 / 1_000_000_000;
        let total = self.queue_bytes as u128 + in_flight + 4 * max_frame as u128 + 4096;
        total.min(1 << 30) as usize
    }

    /// Serialization time of `len` bytes, rounded up so the rate is never exceeded.
    fn tx_ns(&self, len: usize) -> u64 {
        if self.rate_bps == 0 {
            return 0;
        }
        let bits = len as u128 * 8 * 1_000_000_000;
        bits.div_ceil(self.rate_bps as u128).min(u64::MAX as u128) as u64
    }
}

/// What happened to a frame offered to [`Pipeline::push`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Accepted; it will be released at its due time.
    Queued,
    /// Dropped by the random-loss stage.
    Lost,
    /// Dropped because the rate limiter's backlog was full (tail drop).
    QueueFull,
    /// Dropped because the frame storage was full (only reachable at unlimited rate).
    Overflow,
    /// Dropped because the frame is empty or longer than the pipeline's maximum frame.
    Invalid,
}

/// Counters of one pipeline, for the forwarder's report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub received: u64,
    pub lost: u64,
    pub queue_drops: u64,
    pub overflow_drops: u64,
    pub invalid: u64,
    pub released: u64,
    pub released_bytes: u64,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    due: u64,
    off: usize,
    len: usize,
}

/// One direction of an emulated link (see the module comment for the model).
pub struct Pipeline {
    cfg: Impairment,
    rng: SplitMix64,
    max_frame: usize,
    /// When the serializer finishes the last accepted frame.
    busy_until: u64,
    /// Due time of the newest frame, so a runtime delay decrease cannot reorder.
    last_due: u64,
    buf: Vec<u8>,
    slots: VecDeque<Slot>,
    /// Where the next frame's bytes go (end of the newest frame).
    write: usize,
    stats: Stats,
}

impl Pipeline {
    /// A pipeline for frames of at most `max_frame` bytes; losses follow `seed`.
    pub fn new(cfg: Impairment, seed: u64, max_frame: usize) -> Self {
        let cap = cfg.ring_bytes(max_frame);
        Pipeline {
            cfg,
            rng: SplitMix64::new(seed),
            max_frame,
            busy_until: 0,
            last_due: 0,
            buf: vec![0; cap],
            slots: VecDeque::with_capacity(1024),
            write: 0,
            stats: Stats::default(),
        }
    }

    /// The current impairment.
    pub fn config(&self) -> Impairment {
        self.cfg
    }

    /// Changes the impairment at run time. Frames already accepted keep their due
    /// times; the frame storage grows if the new setting needs more.
    pub fn set_config(&mut self, cfg: Impairment) {
        self.cfg = cfg;
        let need = cfg.ring_bytes(self.max_frame);
        if need > self.buf.len() {
            let mut buf = vec![0u8; need];
            let mut w = 0;
            for s in self.slots.iter_mut() {
                buf[w..w + s.len].copy_from_slice(&self.buf[s.off..s.off + s.len]);
                s.off = w;
                w += s.len;
            }
            self.buf = buf;
            self.write = w;
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Frames waiting (in the queue or on the delay line).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no frame is waiting.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Offers a frame that arrived at `now`; copies it in if accepted.
    pub fn push(&mut self, now: u64, frame: &[u8]) -> Verdict {
        self.stats.received += 1;
        let len = frame.len();
        if len == 0 || len > self.max_frame {
            self.stats.invalid += 1;
            return Verdict::Invalid;
        }
        if self.cfg.loss > 0.0 && self.rng.next_f64() < self.cfg.loss {
            self.stats.lost += 1;
            return Verdict::Lost;
        }
        let start = if self.cfg.rate_bps == 0 {
            now
        } else if self.busy_until > now {
            let backlog = (self.busy_until - now) as u128 * self.cfg.rate_bps as u128 / 8 / 1_000_000_000;
            if backlog + len as u128 > self.cfg.queue_bytes as u128 {
                self.stats.queue_drops += 1;
                return Verdict::QueueFull;
            }
            self.busy_until
        } else {
            now
        };
        let Some(off) = self.place(len) else {
            self.stats.overflow_drops += 1;
            return Verdict::Overflow;
        };
        let done = start.saturating_add(self.cfg.tx_ns(len));
        if self.cfg.rate_bps != 0 {
            self.busy_until = done;
        }
        let due = done.saturating_add(self.cfg.delay_ns).max(self.last_due);
        self.last_due = due;
        self.buf[off..off + len].copy_from_slice(frame);
        self.write = off + len;
        self.slots.push_back(Slot { due, off, len });
        Verdict::Queued
    }

    /// Where a frame of `len` bytes fits contiguously in the ring, if anywhere. The
    /// write position never catches up with the oldest frame's start, so "write ==
    /// oldest" only ever means empty.
    fn place(&mut self, len: usize) -> Option<usize> {
        let cap = self.buf.len();
        let Some(front) = self.slots.front() else {
            self.write = 0;
            return (len <= cap).then_some(0);
        };
        let oldest = front.off;
        if self.write >= oldest {
            if cap - self.write >= len {
                Some(self.write)
            } else if len < oldest {
                Some(0)
            } else {
                None
            }
        } else if oldest - self.write > len {
            Some(self.write)
        } else {
            None
        }
    }

    /// When the oldest waiting frame is due, if any: the forwarder sleeps until then.
    pub fn next_due(&self) -> Option<u64> {
        self.slots.front().map(|s| s.due)
    }

    /// Takes the oldest frame if it is due at `now`. The slice is valid until the next
    /// call that changes the pipeline.
    pub fn pop_due(&mut self, now: u64) -> Option<&[u8]> {
        let s = *self.slots.front()?;
        if s.due > now {
            return None;
        }
        self.slots.pop_front();
        self.stats.released += 1;
        self.stats.released_bytes += s.len as u64;
        Some(&self.buf[s.off..s.off + s.len])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    fn frame(seq: u32, len: usize) -> Vec<u8> {
        let mut f = vec![(seq % 251) as u8; len.max(4)];
        f[..4].copy_from_slice(&seq.to_le_bytes());
        f
    }

    fn seq_of(f: &[u8]) -> u32 {
        u32::from_le_bytes([f[0], f[1], f[2], f[3]])
    }

    #[test]
    fn delay_only_releases_exactly_after_delay() {
        let mut p = Pipeline::new(Impairment::new(Duration::from_millis(20), 0.0, 0.0), 1, 1600);
        assert_eq!(p.push(5 * MS, &frame(1, 100)), Verdict::Queued);
        assert_eq!(p.next_due(), Some(25 * MS));
        assert!(p.pop_due(25 * MS - 1).is_none());
        let f = p.pop_due(25 * MS).expect("due");
        assert_eq!(seq_of(f), 1);
        assert!(p.is_empty());
    }

    #[test]
    fn rate_limit_serializes_back_to_back_frames() {
        // 8 Mbit/s: 1000 bytes take 1 ms.
        let cfg = Impairment { delay_ns: 0, loss: 0.0, rate_bps: 8_000_000, queue_bytes: 1 << 20 };
        let mut p = Pipeline::new(cfg, 1, 1600);
        for i in 0..3 {
            assert_eq!(p.push(0, &frame(i, 1000)), Verdict::Queued);
        }
        let mut dues = vec![];
        while let Some(d) = p.next_due() {
            dues.push(d);
            p.pop_due(d).expect("due");
        }
        assert_eq!(dues, vec![MS, 2 * MS, 3 * MS]);
    }

    #[test]
    fn tail_drop_when_backlog_exceeds_queue() {
        let cfg = Impairment { delay_ns: 0, loss: 0.0, rate_bps: 8_000_000, queue_bytes: 2500 };
        let mut p = Pipeline::new(cfg, 1, 1600);
        let verdicts: Vec<_> = (0..5).map(|i| p.push(0, &frame(i, 1000))).collect();
        // The idle link takes the first; the second finds 1000 unserialized bytes and fits
        // (2000 <= 2500); the third would make 3000 and is dropped, as are the rest.
        assert_eq!(
            verdicts,
            vec![Verdict::Queued, Verdict::Queued, Verdict::QueueFull, Verdict::QueueFull, Verdict::QueueFull]
        );
        assert_eq!(p.stats().queue_drops, 3);
    }

    #[test]
    fn oversized_and_empty_frames_are_refused() {
        let mut p = Pipeline::new(Impairment::new(Duration::ZERO, 0.0, 0.0), 1, 100);
        assert_eq!(p.push(0, &[]), Verdict::Invalid);
        assert_eq!(p.push(0, &[0; 101]), Verdict::Invalid);
        assert_eq!(p.push(0, &[0; 100]), Verdict::Queued);
    }

    #[test]
    fn loss_fraction_close_to_setting_and_reproducible() {
        let run = |seed| {
            let mut p = Pipeline::new(Impairment::new(Duration::ZERO, 0.5, 0.0), seed, 64);
            let mut lost = 0u32;
            for i in 0..200_000u32 {
                if p.push(u64::from(i), &[1; 64]) == Verdict::Lost {
                    lost += 1;
                }
                while p.pop_due(u64::from(i)).is_some() {}
            }
            lost
        };
        let lost = run(7);
        // 0.5 % of 200 000 = 1000; binomial sd ≈ 31.
        assert!((850..=1150).contains(&lost), "lost {lost}");
        assert_eq!(lost, run(7));
        assert_ne!(lost, run(8));
    }

    #[test]
    fn unlimited_rate_overflows_instead_of_growing() {
        let mut p = Pipeline::new(Impairment::new(Duration::from_secs(10), 0.0, 0.0), 1, 65536);
        let mut overflow = false;
        for i in 0..2000 {
            if p.push(0, &frame(i, 65536)) == Verdict::Overflow {
                overflow = true;
                break;
            }
        }
        assert!(overflow);
        assert!(p.len() * 65536 <= UNLIMITED_RING_BYTES);
    }

    #[test]
    fn set_config_grows_ring_and_keeps_frames() {
        let cfg = Impairment { delay_ns: MS, loss: 0.0, rate_bps: 8_000_000, queue_bytes: 3000 };
        let mut p = Pipeline::new(cfg, 1, 1500);
        for i in 0..3 {
            assert_eq!(p.push(0, &frame(i, 1000)), Verdict::Queued);
        }
        p.set_config(Impairment { delay_ns: 100 * MS, loss: 0.0, rate_bps: 1_000_000_000, queue_bytes: 1 << 24 });
        let mut got = vec![];
        while let Some(d) = p.next_due() {
            got.push(seq_of(p.pop_due(d).expect("due")));
        }
        assert_eq!(got, vec![0, 1, 2]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Frames leave in order, never before arrival + serialization + delay, never
        /// above the rate over any window, and (when rate-limited) never overflow.
        #[test]
        fn pipeline_invariants(
            delay_ms in 0u64..50,
            rate_mbit in 1u64..200,
            queue_kib in 1u64..512,
            loss_pct in 0.0f64..5.0,
            arrivals in proptest::collection::vec((0u64..200_000, 60usize..1600), 1..400),
            seed in any::<u64>(),
        ) {
            let cfg = Impairment {
                delay_ns: delay_ms * MS,
                loss: loss_pct / 100.0,
                rate_bps: rate_mbit * 1_000_000,
                queue_bytes: queue_kib * 1024,
            };
            let mut p = Pipeline::new(cfg, seed, 1600);
            let mut now = 0u64;
            let mut accepted: Vec<(u32, u64, usize)> = vec![]; // seq, arrival, len
            let mut out: Vec<(u32, u64, usize)> = vec![]; // seq, release time, len
            let drain = |p: &mut Pipeline, t: u64, out: &mut Vec<(u32, u64, usize)>| {
                // Release at each due time up to t, as the forwarder would.
                while let Some(d) = p.next_due() {
                    if d > t { break; }
                    let f = p.pop_due(d).expect("due");
                    out.push((seq_of(f), d, f.len()));
                }
            };
            for (i, (gap, len)) in arrivals.iter().enumerate() {
                now += gap;
                drain(&mut p, now, &mut out);
                let v = p.push(now, &frame(i as u32, *len));
                prop_assert!(v != Verdict::Overflow && v != Verdict::Invalid);
                if v == Verdict::Queued {
                    accepted.push((i as u32, now, *len));
                }
            }
            drain(&mut p, u64::MAX, &mut out);
            prop_assert_eq!(out.len(), accepted.len());
            for (a, o) in accepted.iter().zip(&out) {
                prop_assert_eq!(a.0, o.0, "order");
                prop_assert_eq!(a.2, o.2);
                prop_assert!(o.1 >= a.1 + cfg.delay_ns + cfg.tx_ns(a.2), "left early");
            }
            // Rate: bytes released in any window of W ns ≤ rate × W + one max frame.
            for w in [MS, 10 * MS] {
                let mut lo = 0;
                let mut bytes = 0u128;
                for hi in 0..out.len() {
                    bytes += out[hi].2 as u128;
                    while out[hi].1 - out[lo].1 > w {
                        bytes -= out[lo].2 as u128;
                        lo += 1;
                    }
                    let allowed = cfg.rate_bps as u128 * w as u128 / 8 / 1_000_000_000 + 1600;
                    prop_assert!(bytes <= allowed, "{} bytes in {} ns", bytes, w);
                }
            }
        }
    }
}
