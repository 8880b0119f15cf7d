//! The invariant checker behind `SpillBuffer::validate` (docs/design.md,
//! "What `validate()` checks"): compiled for this crate's tests and with
//! the `testing` feature, for the model tests and fuzz targets.

use super::Inner;
use crate::buffer::accounting::{Delta, Readings};
use crate::buffer::entry::{ListKind, State};
use crate::buffer::Key;
use crate::sync::atomic::Ordering::Relaxed;
use crate::value::Spill;

impl<K: Key, V: Spill> Inner<K, V> {
    /// Check every invariant that holds when no IO is in flight: waits for
    /// the pool to go idle first. The caller must not run other operations
    /// meanwhile.
    pub(crate) fn validate(&self) -> Result<(), String> {
        self.pool.wait_idle_blocking();
        let (mut resident, mut count, mut spilling, mut pinned, mut len) = (0, 0, 0, 0, 0);
        let (mut pinned_spilling, mut set_aside, mut live_weight) = (0, 0, 0);
        let (mut detached, mut detached_count) = (0, 0);
        let mut disk_records = 0u64;
        // (key, record, state) of every entry with a disk copy, checked
        // against the store after the shard lock is released: one lock at
        // a time, here too.
        let mut owned = Vec::new();
        let mut disk_sum = 0u64;
        for (s, locked) in self.shards.iter().enumerate() {
            let shard = locked.core.read();
            shard.validate().map_err(|e| format!("shard {s}: {e}"))?;
            for kind in [ListKind::Clean, ListKind::Dirty] {
                let published = locked.tails[kind as usize].load(Relaxed);
                if published != shard.tail_tick(kind) {
                    return Err(format!("shard {s}: stale published tail for {kind:?}"));
                }
            }
            len += shard.len();
            // With the pool idle no write or free holds a detached value:
            // only pins of removed or replaced keys keep one alive.
            for (version, d) in shard.detached() {
                if d.writing() || d.pins() == 0 {
                    return Err(format!(
                        "shard {s}: detached value of version {version} held by {} pins, \
                         writing {} with the pool idle",
                        d.pins(),
                        d.writing()
                    ));
                }
                detached += d.weight();
                detached_count += 1;
            }
            let shard_pinned: usize = shard
                .nodes()
                .filter(|(_, n)| n.pins() > 0)
                .map(|(_, n)| n.weight)
                .sum();
            if shard_pinned != locked.pinned.load(Relaxed) {
                return Err(format!(
                    "shard {s}: pinned gauge {}, its pinned entries weigh {shard_pinned}",
                    locked.pinned.load(Relaxed)
                ));
            }
            for (i, n) in shard.nodes() {
                if self.shard_of(&n.key) != s {
                    return Err(format!("key {:?} is in the wrong shard", n.key));
                }
                let in_memory = n.state().value().is_some();
                live_weight += n.weight;
                if n.pins() > 0 && !in_memory {
                    return Err(format!("slot {i}: pinned but {}", n.state().name()));
                }
                if n.set_aside() {
                    if !matches!(n.state(), State::Resident { disk: None, .. }) {
                        return Err(format!("slot {i}: set aside but {}", n.state().name()));
                    }
                    set_aside += n.weight;
                }
                if in_memory {
                    resident += n.weight;
                    count += 1;
                    if n.pins() > 0 {
                        pinned += n.weight;
                    }
                }
                match n.state() {
                    State::Spilling { .. } => {
                        spilling += n.weight;
                        if n.pins() > 0 {
                            pinned_spilling += n.weight;
                        }
                    }
                    State::Unspilling { prefetch, .. } => {
                        return Err(format!(
                            "key {:?} still unspilling (prefetch {prefetch}) with the pool idle",
                            n.key
                        ))
                    }
                    _ => {}
                }
                if let Some(loc) = n.state().disk() {
                    disk_records += 1;
                    disk_sum += loc.len();
                    owned.push((n.key.clone(), loc, n.state().name()));
                }
            }
        }
        // With the pool idle no read is in flight (checked above), so no
        // prefetch holds a reservation, and no job holds a detached value.
        let total = Delta {
            resident: resident as isize,
            count: count as isize,
            spilling: spilling as isize,
            pinned_spilling: pinned_spilling as isize,
            len: len as isize,
            live_weight: live_weight as isize,
            detached: detached as isize,
            detached_count: detached_count as isize,
            set_aside: set_aside as isize,
            ..Delta::ZERO
        };
        let gauges = self.accounting.read();
        if let Some((name, gauge, counted)) = gauges.differences(&Readings::of(total)).first() {
            return Err(format!(
                "gauge {name} is {gauge}, entries add up to {counted}"
            ));
        }
        if pinned != self.pinned() {
            return Err(format!(
                "gauge pinned is {}, entries add up to {pinned}",
                self.pinned()
            ));
        }
        if spilling != 0 {
            return Err(format!(
                "{spilling} bytes still spilling with the pool idle"
            ));
        }
        self.store.validate()?;
        // Each record must be live, its entry's key's, and no other entry's:
        // a key has one place on disk.
        let mut locs = std::collections::HashSet::new();
        for (key, loc, state) in owned {
            if self.store.record_key(loc).as_ref() != Some(&key) {
                return Err(format!(
                    "key {key:?} ({state}) points at {loc:?}, not a live record of its own"
                ));
            }
            if !locs.insert((loc.seg, loc.offset)) {
                return Err(format!("key {key:?} shares record {loc:?}"));
            }
        }
        if disk_records != self.store.disk_count() || disk_sum != self.store.disk_bytes() {
            return Err(format!(
                "entries own {disk_records} records / {disk_sum} bytes, store has {} / {}",
                self.store.disk_count(),
                self.store.disk_bytes()
            ));
        }
        let failed = self.metrics.spill_errors.load(Relaxed) > 0;
        if !failed && self.over_target() > 0 {
            return Err(format!(
                "unpinned resident bytes {} pass the target {}",
                resident - pinned,
                self.target()
            ));
        }
        Ok(())
    }
}
