//! The eviction-policy workload, shared by `examples/bench.rs --workload
//! policy` and `benches/policy.rs`: keys inserted once, then read with
//! blocking `get` in a given order (zipf(1), or zipf mixed with scans),
//! with memory for a fraction of the values. The buffer's disk reads are
//! set against the misses of an exact LRU of the same byte capacity run
//! on the same sequence ([`Lru`]).
//!
//! [`simulate`] replays a sequence through the buffer's eviction rule
//! with a given dirty-age factor, without IO: the figure behind the factor
//! the crate uses (reads and writes by factor).

use super::{random_f64, rng, zipf, Buf};
use rand::Rng;
use serde_json::json;
use spillbuffer::SpillBuffer;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Instant;

/// One access of a sequence.
#[derive(Clone, Copy, Debug)]
pub enum Access {
    /// Blocking `get` of an existing key.
    Read(usize),
    /// Insert of a new key (a dirty value).
    Insert(usize),
}

/// Keys 0..keys inserted once, in order.
pub fn inserts(keys: usize) -> Vec<Access> {
    (0..keys).map(Access::Insert).collect()
}

/// `reads` zipf(1) reads over `keys` keys.
pub fn zipf_reads(keys: usize, reads: usize, seed: u64) -> Vec<Access> {
    zipf(&mut rng(seed), keys, reads)
        .into_iter()
        .map(Access::Read)
        .collect()
}

/// Zipf reads with a scan every 1,000 of them: 10% of the keys read in key
/// order, each scan going on where the last stopped.
pub fn scan_mix(keys: usize, reads: usize, seed: u64) -> Vec<Access> {
    let z = zipf(&mut rng(seed), keys, reads);
    let scan = (keys / 10).max(1);
    let mut at = 0;
    let mut out = Vec::with_capacity(reads * 2);
    for (i, k) in z.into_iter().enumerate() {
        out.push(Access::Read(k));
        if i % 1000 == 999 {
            for _ in 0..scan {
                out.push(Access::Read(at % keys));
                at += 1;
            }
        }
    }
    out
}

/// Zipf reads of existing keys, with an insert of a new key in a quarter
/// of the steps: the case where a dirty value's write is a real cost.
pub fn insert_mix(keys: usize, steps: usize, seed: u64) -> Vec<Access> {
    let mut r = rng(seed);
    let z = zipf(&mut r, keys, steps);
    let mut next = keys;
    z.into_iter()
        .map(|k| {
            if r.gen_range(0..4) == 0 {
                next += 1;
                Access::Insert(next - 1)
            } else {
                Access::Read(k)
            }
        })
        .collect()
}

/// An exact LRU cache of `slots` equal-weight values: counts misses.
pub struct Lru {
    slots: usize,
    by_tick: BTreeMap<u64, usize>,
    tick_of: HashMap<usize, u64>,
    now: u64,
    pub misses: u64,
}

impl Lru {
    pub fn new(slots: usize) -> Self {
        Lru {
            slots,
            by_tick: BTreeMap::new(),
            tick_of: HashMap::new(),
            now: 0,
            misses: 0,
        }
    }

    /// Use `k`: a miss if absent (a read, or the first put of a value).
    pub fn access(&mut self, a: Access) {
        let k = match a {
            Access::Read(k) => k,
            Access::Insert(k) => k,
        };
        self.now += 1;
        match self.tick_of.insert(k, self.now) {
            Some(old) => {
                self.by_tick.remove(&old);
            }
            None => {
                if matches!(a, Access::Read(_)) {
                    self.misses += 1;
                }
            }
        }
        self.by_tick.insert(self.now, k);
        while self.by_tick.len() > self.slots {
            let (_, victim) = self.by_tick.pop_first().expect("over capacity");
            self.tick_of.remove(&victim);
        }
    }
}

/// Reads and writes of the buffer's eviction rule on `seq` with `slots`
/// values of memory, preferring a clean victim unless the dirty one is
/// more than `factor` times as old (`None`: clean first, always).
pub fn simulate(seq: &[Access], slots: usize, factor: Option<f64>) -> (u64, u64) {
    // key -> (tick, dirty); per class, tick -> key.
    let mut mem: HashMap<usize, (u64, bool)> = HashMap::new();
    let mut lists = [BTreeMap::new(), BTreeMap::new()];
    let (mut now, mut reads, mut writes) = (0u64, 0u64, 0u64);
    let mut on_disk = std::collections::HashSet::new();
    for &a in seq {
        now += 1;
        let (k, dirty) = match a {
            Access::Insert(k) => (k, true),
            Access::Read(k) => match mem.get(&k) {
                Some(&(_, d)) => (k, d),
                None => {
                    if on_disk.contains(&k) {
                        reads += 1;
                    }
                    (k, false)
                }
            },
        };
        if let Some((t, d)) = mem.insert(k, (now, dirty)) {
            lists[d as usize].remove(&t);
        }
        lists[dirty as usize].insert(now, k);
        while mem.len() > slots {
            let c = lists[0].first_key_value().map(|(&t, _)| t);
            let d = lists[1].first_key_value().map(|(&t, _)| t);
            let take_dirty = match (c, d, factor) {
                (None, _, _) => true,
                (_, None, _) => false,
                (Some(_), Some(_), None) => false,
                (Some(c), Some(d), Some(f)) => (now - d) as f64 > f * (now - c) as f64,
            };
            let (_, victim) = lists[take_dirty as usize].pop_first().expect("a victim");
            mem.remove(&victim);
            if take_dirty {
                writes += 1;
            }
            on_disk.insert(victim);
        }
    }
    (reads, writes)
}

/// What one run of the buffer on a sequence did.
pub struct PolicyRun {
    pub reads: u64,
    pub disk_reads: u64,
    pub lru_misses: u64,
    pub writes: u64,
    pub secs: f64,
}

/// Insert `keys` values of `value_bytes` once (in key order), then run
/// `seq` (reads with blocking `get`, inserts of new keys) on a buffer with
/// memory for `fraction` of the keys; the LRU model runs on the same
/// accesses with the same byte capacity.
pub fn run(
    dir: &Path,
    keys: usize,
    value_bytes: usize,
    fraction: f64,
    seq: &[Access],
) -> PolicyRun {
    let slots = ((keys as f64 * fraction) as usize).max(1);
    let b: Buf = SpillBuffer::builder(dir)
        .memory_target(slots * value_bytes)
        .build()
        .expect("build buffer");
    let mut lru = Lru::new(slots);
    let mut r = rng(41);
    let value = random_f64(&mut r, value_bytes);
    for a in inserts(keys) {
        let Access::Insert(k) = a else { unreachable!() };
        b.insert(k as u64, value.clone()).expect("insert");
        lru.access(a);
    }
    b.flush_blocking().expect("flush");
    let before = b.stats();
    let start = Instant::now();
    let mut reads = 0;
    for &a in seq {
        match a {
            Access::Read(k) => {
                reads += 1;
                drop(b.get(&(k as u64)).expect("get"));
            }
            Access::Insert(k) => b.insert(k as u64, value.clone()).expect("insert"),
        }
        lru.access(a);
    }
    let secs = start.elapsed().as_secs_f64();
    b.flush_blocking().expect("flush");
    let after = b.stats();
    PolicyRun {
        reads,
        disk_reads: after.unspill_count_total - before.unspill_count_total,
        lru_misses: lru.misses,
        writes: after.spill_count_total - before.spill_count_total,
        secs,
    }
}

/// The sequences of the policy workload, by name.
fn sequences(keys: usize, reads: usize) -> [(&'static str, Vec<Access>); 2] {
    [
        ("zipf", zipf_reads(keys, reads, 5)),
        ("scan-mix", scan_mix(keys, reads, 5)),
    ]
}

/// Print one JSON line per sequence and memory fraction: the buffer's
/// disk reads against the exact LRU's (`--workload policy`).
pub fn report(dir: &Path, keys: usize, reads: usize, value_bytes: usize) {
    for (name, seq) in sequences(keys, reads) {
        for fraction in [0.10, 0.25, 0.50] {
            let r = run(dir, keys, value_bytes, fraction, &seq);
            let line = json!({
                "workload": "policy",
                "sequence": name,
                "memory_fraction": fraction,
                "keys": keys,
                "value_bytes": value_bytes,
                "reads": r.reads,
                "disk_reads": r.disk_reads,
                "lru_misses": r.lru_misses,
                "reads_vs_lru": r.disk_reads as f64 / r.lru_misses.max(1) as f64,
                "hit_rate": 1.0 - r.disk_reads as f64 / r.reads as f64,
                "lru_hit_rate": 1.0 - r.lru_misses as f64 / r.reads as f64,
                "writes": r.writes,
                "gets_per_s": r.reads as f64 / r.secs,
            });
            println!("{line}");
        }
    }
}

/// Print one JSON line per sequence, memory fraction and dirty-age factor:
/// the rule replayed without IO (`--workload policy-sweep`).
pub fn sweep_report(keys: usize, reads: usize) {
    let mut seqs = sequences(keys, reads).to_vec();
    seqs.push(("insert-mix", insert_mix(keys, reads, 5)));
    for (name, seq) in seqs {
        let mut all = inserts(keys);
        all.extend(seq);
        for fraction in [0.10, 0.25, 0.50] {
            let slots = (keys as f64 * fraction) as usize;
            let (lru_reads, lru_writes) = simulate(&all, slots, Some(1.0));
            for factor in [Some(1.0), Some(1.25), Some(1.5), Some(2.0), Some(4.0), None] {
                let (reads, writes) = simulate(&all, slots, factor);
                let line = json!({
                    "workload": "policy-sweep",
                    "sequence": name,
                    "memory_fraction": fraction,
                    "dirty_age_factor": factor.map_or("clean-first".to_string(), |f| f.to_string()),
                    "reads": reads,
                    "writes": writes,
                    "reads_vs_lru": reads as f64 / lru_reads.max(1) as f64,
                    "writes_vs_lru": writes as f64 / lru_writes.max(1) as f64,
                });
                println!("{line}");
            }
        }
    }
}
