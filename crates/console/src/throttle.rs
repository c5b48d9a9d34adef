//! Sign-in throttling: a token bucket per source address and one per submitted key, so a
//! guesser gets a few tries and then one every `refill`, whichever it varies.
//!
//! What an attacker controls decides the shape. It picks the keys it submits, so the per-key
//! bucket is charged only by failures of that key: a person's right key never fails, so nobody
//! who does not hold it can exhaust its bucket. It picks its source only within what it owns,
//! so sources are grouped as an ISP hands them out (an IPv4 address, an IPv6 /64) and one
//! source's failures never slow another. There is no global bucket: one attacker must not lock
//! out everybody. A throttled attempt is refused before the key is looked at (so a right key
//! does not slip through a full bucket and confirm itself); a successful sign-in gives its
//! tokens back. Memory is bounded: each table holds at most `max_entries` buckets, and when
//! full forgets refilled ones first, then the longest idle.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::peer::Peer;

/// How many sign-in failures are allowed and how fast they come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignInLimits {
    /// Failures allowed at once, per source and per key.
    pub burst: u32,
    /// One more failure is allowed per this interval.
    pub refill: Duration,
    /// Buckets kept per table (sources, keys).
    pub max_entries: usize,
}

impl Default for SignInLimits {
    /// 5 tries, then one every 12 s (5 a minute).
    fn default() -> Self {
        SignInLimits {
            burst: 5,
            refill: Duration::from_secs(12),
            max_entries: 10_000,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn level(&self, l: &SignInLimits, now: Instant) -> f64 {
        let gained = now.saturating_duration_since(self.at).as_secs_f64() / l.refill.as_secs_f64();
        (self.tokens + gained).min(l.burst as f64)
    }
}

struct Table<K> {
    map: HashMap<K, Bucket>,
}

impl<K: Hash + Eq + Copy> Table<K> {
    fn level(&self, k: &K, l: &SignInLimits, now: Instant) -> f64 {
        self.map.get(k).map_or(l.burst as f64, |b| b.level(l, now))
    }

    fn set(&mut self, k: K, tokens: f64, l: &SignInLimits, now: Instant) {
        if !self.map.contains_key(&k) && self.map.len() >= l.max_entries {
            self.map.retain(|_, b| b.level(l, now) < l.burst as f64);
            if self.map.len() >= l.max_entries
                && let Some(idle) = self.map.iter().min_by_key(|(_, b)| b.at).map(|(k, _)| *k)
            {
                self.map.remove(&idle);
            }
        }
        self.map.insert(k, Bucket { tokens, at: now });
    }
}

/// Where an attempt comes from, as far as throttling is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    V4([u8; 4]),
    /// The /64 prefix.
    V6([u8; 8]),
    /// The server did not record the peer (served without connect info): all such share one.
    Unrecorded,
}

impl Source {
    fn of(peer: Peer) -> Self {
        match peer.0.map(|ip| ip.to_canonical()) {
            Some(IpAddr::V4(a)) => Source::V4(a.octets()),
            Some(IpAddr::V6(a)) => {
                let o = a.octets();
                let mut p = [0u8; 8];
                p.copy_from_slice(&o[..8]);
                Source::V6(p)
            }
            None => Source::Unrecorded,
        }
    }
}

/// The sign-in throttle of one process.
pub struct Throttle {
    limits: SignInLimits,
    hasher: RandomState,
    tables: Mutex<(Table<Source>, Table<u64>)>,
}

impl Throttle {
    pub fn new(limits: SignInLimits) -> Self {
        Throttle {
            limits,
            hasher: RandomState::new(),
            tables: Mutex::new((
                Table {
                    map: HashMap::new(),
                },
                Table {
                    map: HashMap::new(),
                },
            )),
        }
    }

    fn key_id(&self, key: &str) -> u64 {
        self.hasher.hash_one(key.trim())
    }

    /// Takes one try from the source's and the key's buckets, or says how long to wait.
    pub fn take(&self, peer: Peer, key: &str, now: Instant) -> Result<(), Duration> {
        let l = &self.limits;
        let (src, kid) = (Source::of(peer), self.key_id(key));
        let mut t = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        let (a, b) = (t.0.level(&src, l, now), t.1.level(&kid, l, now));
        if a < 1.0 || b < 1.0 {
            let short = 1.0 - a.min(b);
            return Err(l.refill.mul_f64(short).max(Duration::from_secs(1)));
        }
        t.0.set(src, a - 1.0, l, now);
        t.1.set(kid, b - 1.0, l, now);
        Ok(())
    }

    /// Gives back the try a successful sign-in took.
    pub fn refund(&self, peer: Peer, key: &str, now: Instant) {
        let l = &self.limits;
        let (src, kid) = (Source::of(peer), self.key_id(key));
        let mut t = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        let (a, b) = (t.0.level(&src, l, now), t.1.level(&kid, l, now));
        t.0.set(src, (a + 1.0).min(l.burst as f64), l, now);
        t.1.set(kid, (b + 1.0).min(l.burst as f64), l, now);
    }

    /// Buckets held (sources, keys).
    pub fn buckets(&self) -> (usize, usize) {
        let t = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        (t.0.map.len(), t.1.map.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(s: &str) -> Peer {
        Peer(Some(s.parse().unwrap()))
    }

    fn limits() -> SignInLimits {
        SignInLimits {
            burst: 3,
            refill: Duration::from_secs(10),
            max_entries: 4,
        }
    }

    #[test]
    fn a_source_gets_its_burst_then_waits_and_refills() {
        let t = Throttle::new(limits());
        let now = Instant::now();
        for i in 0..3 {
            assert!(t.take(peer("203.0.113.7"), &format!("k{i}"), now).is_ok());
        }
        let wait = t.take(peer("203.0.113.7"), "k9", now).unwrap_err();
        assert_eq!(wait, Duration::from_secs(10));
        // Another address is not slowed.
        assert!(t.take(peer("203.0.113.8"), "k10", now).is_ok());
        // One refill later, one more try.
        let later = now + Duration::from_secs(10);
        assert!(t.take(peer("203.0.113.7"), "k11", later).is_ok());
        assert!(t.take(peer("203.0.113.7"), "k12", later).is_err());
    }

    #[test]
    fn one_ipv6_slash_64_is_one_source() {
        let t = Throttle::new(limits());
        let now = Instant::now();
        for i in 0..3 {
            let a = format!("2001:db8:1:2::{i:x}");
            assert!(t.take(peer(&a), &format!("k{i}"), now).is_ok());
        }
        assert!(t.take(peer("2001:db8:1:2::ffff"), "k3", now).is_err());
        assert!(t.take(peer("2001:db8:1:3::1"), "k4", now).is_ok());
    }

    #[test]
    fn one_key_from_many_sources_is_throttled_and_success_refunds() {
        let t = Throttle::new(limits());
        let now = Instant::now();
        for i in 0..3 {
            assert!(
                t.take(peer(&format!("198.51.100.{i}")), "same", now)
                    .is_ok()
            );
        }
        assert!(t.take(peer("198.51.100.9"), "same", now).is_err());
        assert!(t.take(peer("198.51.100.9"), "other", now).is_ok());
        t.refund(peer("198.51.100.9"), "other", now);
        assert!(t.take(peer("198.51.100.9"), "other", now).is_ok());
    }

    #[test]
    fn the_tables_stay_bounded() {
        let t = Throttle::new(limits());
        let now = Instant::now();
        for i in 0..100u32 {
            let _ = t.take(
                peer(&format!("10.0.{}.{}", i / 256, i % 256)),
                &i.to_string(),
                now,
            );
        }
        let (s, k) = t.buckets();
        assert!(s <= 4 && k <= 4, "{s} sources, {k} keys");
    }
}
