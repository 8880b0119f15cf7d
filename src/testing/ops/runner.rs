//! The [`Runner`]: applies operations to a buffer and to a `HashMap`
//! model, checking after every step that they agree.

use super::*;
use crate::testing::{Faults, FaultyStorage, WriteFault};
use crate::{Compression, Error, Pinned, SpillBuffer};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// A record taken for [`Op::Transfer`]: whole, or the bytes a stream
/// carried.
enum Sent {
    Record(crate::Record),
    Bytes(Vec<u8>),
}

/// A pin the runner holds: its key, the guard, and the value it must show.
type HeldPin = (u8, Pinned<Value>, Arc<Value>);

/// Applies operations to a buffer and to a model, checking after each.
pub struct Runner {
    buf: SpillBuffer<u8, Value>,
    cfg: Config,
    model: HashMap<u8, Arc<Value>>,
    pins: Vec<HeldPin>,
    faults: Option<Arc<Faults>>,
    /// A read fault (failure or bit flip) has been armed since the last
    /// clear: reads may fail, but never return a wrong value.
    read_faults: bool,
    serial: u64,
    step: usize,
    /// Call `validate()` (which waits for the pool to go idle) after every
    /// step, or only on `Flush` and at the end so that IO overlaps with the
    /// following operations.
    validate_every_step: bool,
    /// Reads that failed under an armed read fault.
    pub failed_reads: u64,
}

impl Runner {
    /// A buffer configured by `cfg` in a private sub-directory of `dir`;
    /// with `faults`, over [`FaultyStorage`] and obeying the fault ops
    /// (which are ignored otherwise).
    pub fn new(dir: &Path, cfg: Config, faults: bool) -> Runner {
        let mut b = SpillBuffer::builder(dir)
            .memory_target(cfg.target)
            .compression(if cfg.lz4 {
                Compression::Lz4
            } else {
                Compression::None
            })
            .io_threads(cfg.io_threads)
            .shards(cfg.shards)
            .segment_size(SEGMENT_SIZE)
            .compact_below(cfg.compact_below);
        if cfg.limit_double {
            b = b.memory_limit(cfg.target * 2);
        }
        if cfg.small_disk {
            b = b.max_spill(24 * 1024);
        }
        let mut fault_switches = None;
        if faults {
            let storage = FaultyStorage::new();
            fault_switches = Some(storage.faults());
            b = b.storage(Arc::new(storage));
        }
        Runner {
            buf: b.build().expect("build the buffer under test"),
            cfg,
            model: HashMap::new(),
            pins: Vec::new(),
            faults: fault_switches,
            read_faults: false,
            serial: 0,
            step: 0,
            validate_every_step: true,
            failed_reads: 0,
        }
    }

    /// Validate only on `Flush` and at the end, so that spills, reads and
    /// compaction run while the next operations are applied. Values, `len`
    /// and `contains_key` are still checked after every step.
    pub fn overlapping(mut self) -> Runner {
        self.validate_every_step = false;
        self
    }

    /// The buffer under test.
    pub fn buffer(&self) -> &SpillBuffer<u8, Value> {
        &self.buf
    }

    /// Run `ops`, then [`Runner::finish`]. Panics on the first disagreement,
    /// naming the step.
    pub fn run(mut self, ops: &[Op]) {
        for op in ops {
            self.apply(op);
        }
        self.finish();
    }

    fn fail(&self, op: &Op, what: String) -> ! {
        panic!(
            "step {} ({op:?}, config {:?}): {what}\nstats: {:?}",
            self.step,
            self.cfg,
            self.buf.stats()
        )
    }

    /// Check a read's outcome against the model.
    fn check_read(
        &mut self,
        op: &Op,
        key: u8,
        got: crate::Result<Option<Pinned<Value>>>,
        keep: bool,
    ) {
        let want = self.model.get(&key).cloned();
        match (got, want) {
            (Ok(Some(p)), Some(w)) => {
                if *p != *w {
                    self.fail(op, format!("key {key}: read a wrong value"));
                }
                if keep {
                    self.hold(key, p, w);
                }
            }
            (Ok(None), None) => {}
            (Ok(Some(_)), None) => self.fail(op, format!("key {key}: read a removed key")),
            (Ok(None), Some(_)) => self.fail(op, format!("key {key}: lost")),
            (Err(e), want) => self.read_failed(op, key, e, want.is_some()),
        }
    }

    /// A read of `key` failed: allowed only while a read fault is armed,
    /// for a key the model holds, with `Io` or `Corrupt`.
    fn read_failed(&mut self, op: &Op, key: u8, e: Error, present: bool) {
        let allowed =
            self.read_faults && present && matches!(e, Error::Io { .. } | Error::Corrupt { .. });
        if !allowed {
            self.fail(op, format!("key {key}: read failed: {e}"));
        }
        self.failed_reads += 1;
    }

    /// Check a take's outcome against the model, and remove the key from
    /// the model if it was taken. A failed read-back leaves the key.
    fn check_take(&mut self, op: &Op, key: u8, got: crate::Result<Option<Arc<Value>>>) {
        let want = self.model.get(&key).cloned();
        match (got, want) {
            (Ok(Some(v)), Some(w)) => {
                if *v != *w {
                    self.fail(op, format!("key {key}: took a wrong value"));
                }
                self.model.remove(&key);
            }
            (Ok(None), None) => {}
            (Ok(Some(_)), None) => self.fail(op, format!("key {key}: took a removed key")),
            (Ok(None), Some(_)) => self.fail(op, format!("key {key}: lost")),
            (Err(e), want) => self.read_failed(op, key, e, want.is_some()),
        }
    }

    /// [`Op::Transfer`]: `from`'s record inserted as `to`'s, as a
    /// [`crate::Record`] or through a byte stream (`streamed`). Reading
    /// the record may fail only as a read may (a read fault armed) or, for
    /// a value that cannot be encoded, with `Encode`; inserting it only
    /// with a write failure where writes can fail, or with `Corrupt` under
    /// an armed read fault (a bit flipped in the bytes read). On any
    /// failure `to` keeps what it had.
    fn transfer(&mut self, op: &Op, from: u8, to: u8, blocking: bool, streamed: bool) {
        let got = match (streamed, blocking) {
            (false, true) => self.buf.record_blocking(&from).map(|r| r.map(Sent::Record)),
            (false, false) => block_on(self.buf.record(&from), HANG).map(|r| r.map(Sent::Record)),
            (true, true) => {
                let mut wire = Vec::new();
                let sent = self.buf.write_record_to(&from, &mut wire);
                sent.map(|n| n.map(|_| Sent::Bytes(wire)))
            }
            (true, false) => block_on(self.buf.send_record(&from, Vec::new()), HANG)
                .map(|(wire, n)| n.map(|_| Sent::Bytes(wire))),
        };
        let want = self.model.get(&from).cloned();
        let sent = match (got, want.clone()) {
            (Ok(Some(sent)), Some(_)) => sent,
            (Ok(None), None) => return,
            (Ok(Some(_)), None) => self.fail(op, format!("key {from}: record of a removed key")),
            (Ok(None), Some(_)) => self.fail(op, format!("key {from}: lost")),
            (Err(Error::Encode { .. }), Some(w)) if w.fails_encode => return,
            (Err(e), want) => return self.read_failed(op, from, e, want.is_some()),
        };
        let res = match (sent, blocking) {
            (Sent::Record(rec), true) => self.buf.insert_record_blocking(to, rec),
            (Sent::Record(rec), false) => block_on(self.buf.insert_record(to, rec), HANG),
            (Sent::Bytes(wire), true) => self.buf.insert_record_from(to, &mut wire.as_slice()),
            (Sent::Bytes(wire), false) => {
                let reader = std::io::Cursor::new(wire);
                block_on(self.buf.receive_record(to, reader), HANG).map(drop)
            }
        };
        match res {
            Ok(()) => {
                let w = want.expect("matched above");
                self.model.insert(to, w);
            }
            Err(Error::Corrupt { .. }) if self.read_faults => self.failed_reads += 1,
            Err(Error::Io { .. } | Error::DiskFull { .. } | Error::DiskBudget { .. })
                if self.faults.is_some() || self.cfg.small_disk => {}
            Err(e) => self.fail(op, format!("insert_record({to}) failed: {e}")),
        }
    }

    fn hold(&mut self, key: u8, p: Pinned<Value>, want: Arc<Value>) {
        if self.pins.len() == MAX_PINS {
            self.pins.remove(0);
        }
        self.pins.push((key, p, want));
    }

    /// The next value for `key`, entered in the model.
    fn insert_value(&mut self, key: u8, len: u16, compressible: bool, fails_encode: bool) -> Value {
        self.serial += 1;
        let v = Value {
            bytes: value_for(key, self.serial, len, compressible),
            fails_encode,
        };
        self.model.insert(key, Arc::new(v.clone()));
        v
    }

    /// `insert_async(key, v)`, with `v` already in the model. A refusal
    /// must come with `MemoryLimit` and hand back exactly `v`; the model
    /// then goes back to `before` (the buffer keeps what it had).
    fn insert_async(&mut self, op: &Op, key: u8, v: Value, before: Option<Arc<Value>>) {
        if let Err(e) = block_on(self.buf.insert_async(key, v), HANG) {
            let sent = match before {
                Some(old) => self.model.insert(key, old),
                None => self.model.remove(&key),
            };
            if !matches!(e.error, Error::MemoryLimit { .. }) {
                self.fail(op, format!("insert_async failed: {e}"));
            }
            if e.key != key {
                self.fail(op, format!("insert_async handed back key {}", e.key));
            }
            match sent {
                Some(s) if *s == e.value && s.fails_encode == e.value.fails_encode => {}
                _ => self.fail(op, "insert_async handed back another value".into()),
            }
        }
    }

    /// Apply one operation to both sides and check them.
    pub fn apply(&mut self, op: &Op) {
        self.step += 1;
        match *op {
            Op::Insert {
                key,
                len,
                compressible,
            } => {
                let v = self.insert_value(key, len, compressible, false);
                if let Err(e) = self.buf.insert(key, v) {
                    self.fail(op, format!("insert failed: {e}"));
                }
            }
            Op::InsertAsync {
                key,
                len,
                compressible,
            } => {
                let before = self.model.get(&key).cloned();
                let v = self.insert_value(key, len, compressible, false);
                self.insert_async(op, key, v, before);
            }
            Op::InsertBad { key, len, wait } => {
                let before = self.model.get(&key).cloned();
                let v = self.insert_value(key, len, false, true);
                if wait {
                    self.insert_async(op, key, v, before);
                } else if let Err(e) = self.buf.insert(key, v) {
                    self.fail(op, format!("insert failed: {e}"));
                }
            }
            Op::Take { key } => {
                let got = block_on(self.buf.take(&key), HANG);
                self.check_take(op, key, got);
            }
            Op::TakeBlocking { key } => {
                let got = self.buf.take_blocking(&key);
                self.check_take(op, key, got);
            }
            Op::Keys => {
                let mut got = self.buf.keys();
                got.sort_unstable();
                let mut want: Vec<u8> = self.model.keys().copied().collect();
                want.sort_unstable();
                if got != want {
                    self.fail(op, format!("keys() {got:?} != model {want:?}"));
                }
            }
            Op::RetrySpills => {
                // Only values that fail their encode are ever set aside.
                let bad = self.model.values().filter(|v| v.fails_encode).count();
                let set_aside = self.buf.retry_spills();
                if set_aside > bad {
                    self.fail(
                        op,
                        format!("retry_spills: {set_aside} set aside, only {bad} bad values"),
                    );
                }
            }
            Op::Transfer {
                from,
                to,
                blocking,
                streamed,
            } => self.transfer(op, from, to, blocking, streamed),
            Op::SetCapacity {
                blocks,
                refuse_punch,
            } => {
                if let Some(f) = &self.faults {
                    let blocks = u64::from(blocks.min(MAX_BLOCKS));
                    f.set_capacity(blocks * crate::store::storage::PUNCH_BLOCK);
                    f.refuse_punch(refuse_punch);
                }
            }
            Op::Get { key } => {
                // A blocking get is a short read: its pin is dropped at once.
                let got = self.buf.get(&key);
                self.check_read(op, key, got, false);
            }
            Op::Pin { key } => {
                let got = block_on(self.buf.pin(&key), HANG);
                self.check_read(op, key, got, true);
            }
            Op::TryPin { key } => {
                // A miss is fine: the value may be on disk.
                if let Some(p) = self.buf.try_pin(&key) {
                    self.check_read(op, key, Ok(Some(p)), true);
                }
            }
            Op::DropPin { slot } => {
                if !self.pins.is_empty() {
                    let i = slot as usize % self.pins.len();
                    self.pins.remove(i);
                }
            }
            Op::ConsumePin { slot } => {
                if !self.pins.is_empty() {
                    let i = slot as usize % self.pins.len();
                    let (_, p, _) = self.pins.remove(i);
                    p.consume();
                }
            }
            Op::ClonePin { slot } => {
                if !self.pins.is_empty() {
                    let i = slot as usize % self.pins.len();
                    let (k, p, w) = &self.pins[i];
                    let (k, p, w) = (*k, p.clone(), Arc::clone(w));
                    self.hold(k, p, w);
                }
            }
            Op::Prefetch { ref keys } => self.buf.prefetch(keys.iter().copied()),
            Op::Remove { key } => {
                let was = self.model.remove(&key).is_some();
                if self.buf.remove(&key) != was {
                    self.fail(op, format!("remove({key}) disagrees: model had it: {was}"));
                }
            }
            Op::Evict { bytes } => {
                self.buf.evict(bytes as usize);
            }
            Op::SetTarget { choice } => {
                self.buf.set_memory_target(TARGETS[choice as usize % 8]);
            }
            Op::Flush => {
                if let Err(e) = block_on(self.buf.flush(), HANG) {
                    self.fail(op, format!("flush failed: {e}"));
                }
            }
            Op::FailWrite { nth, kind } => {
                if let Some(f) = &self.faults {
                    let kind = match kind % 3 {
                        0 => WriteFault::Error,
                        1 => WriteFault::NoSpace,
                        _ => WriteFault::Short,
                    };
                    f.fail_nth_write(nth.max(1) as u64, kind);
                }
            }
            Op::FailRead { nth } => {
                if let Some(f) = &self.faults {
                    f.fail_nth_read(nth.max(1) as u64);
                    self.read_faults = true;
                }
            }
            Op::FailCreate { nth } => {
                if let Some(f) = &self.faults {
                    f.fail_nth_create(nth.max(1) as u64);
                }
            }
            Op::FlipBits => {
                if let Some(f) = &self.faults {
                    f.flip_bits_on_read(true);
                    self.read_faults = true;
                }
            }
            Op::ClearFaults => {
                if self.faults.is_some() {
                    self.clear_faults();
                    self.check_all_values(op);
                }
            }
        }
        self.check(op);
    }

    fn clear_faults(&mut self) {
        if let Some(f) = &self.faults {
            // Let IO that may still meet an armed fault finish first.
            block_on(self.buf.flush(), HANG).expect("flush");
            f.clear();
            self.read_faults = false;
        }
    }

    /// Every key of the model reads back equal (pins are dropped at once).
    fn check_all_values(&mut self, op: &Op) {
        let mut keys: Vec<u8> = self.model.keys().copied().collect();
        keys.sort_unstable();
        for key in keys {
            let got = self.buf.get(&key);
            let want = &self.model[&key];
            match got {
                Ok(Some(p)) if *p == **want => {}
                Ok(Some(_)) => self.fail(op, format!("key {key}: wrong value after faults")),
                Ok(None) => self.fail(op, format!("key {key}: lost")),
                Err(e) => self.fail(op, format!("key {key}: unreadable after faults: {e}")),
            }
        }
    }

    /// The checks run after every step.
    fn check(&self, op: &Op) {
        if self.buf.len() != self.model.len() {
            self.fail(
                op,
                format!("len {} != model {}", self.buf.len(), self.model.len()),
            );
        }
        for key in 0..KEYS {
            if self.buf.contains_key(&key) != self.model.contains_key(&key) {
                self.fail(op, format!("contains_key({key}) disagrees with the model"));
            }
        }
        for (key, p, want) in &self.pins {
            if **p != **want {
                self.fail(op, format!("a held pin of key {key} changed"));
            }
        }
        if self.validate_every_step || *op == Op::Flush {
            self.validate(op);
        }
    }

    fn validate(&self, op: &Op) {
        if let Err(e) = self.buf.validate() {
            self.fail(op, format!("validate: {e}"));
        }
    }

    /// Clear faults, read every key back, then remove everything and check
    /// that memory and disk are empty (invariant 4) and that dropping the
    /// buffer leaves no file behind (invariant 5).
    pub fn finish(mut self) {
        let op = Op::ClearFaults;
        self.clear_faults();
        self.check_all_values(&op);
        self.pins.clear();
        let keys: Vec<u8> = self.model.keys().copied().collect();
        for key in keys {
            self.model.remove(&key);
            if !self.buf.remove(&key) {
                self.fail(&op, format!("final remove({key}) found nothing"));
            }
        }
        block_on(self.buf.flush(), HANG).expect("flush");
        self.check(&op);
        self.validate(&op);
        let st = self.buf.stats();
        if st.memory_bytes != 0 || st.memory_count != 0 || st.spilling_bytes != 0 {
            self.fail(&op, "memory not empty after removing every key".into());
        }
        if st.disk_bytes != 0 || st.disk_count != 0 {
            self.fail(&op, "disk records left after removing every key".into());
        }
        if st.file_bytes > SEGMENT_SIZE {
            self.fail(
                &op,
                format!("{} file bytes left, more than one segment", st.file_bytes),
            );
        }
        let dirs = self.buf.spill_dirs();
        drop(self);
        for d in dirs {
            assert!(!d.exists(), "{} left behind after drop", d.display());
        }
    }
}

/// Run one fuzzer input: byte 0 picks the [`Config`], bit 0 of byte 1 makes
/// the run [`Runner::overlapping`], the rest decode into operations. The
/// fuzz targets and the corpus replay in `tests/model.rs` both use this, so
/// a committed input means the same thing in both.
pub fn run_input(dir: &Path, data: &[u8], faults: bool) {
    let [cfg, mode, rest @ ..] = data else {
        return;
    };
    let runner = Runner::new(dir, Config::from_byte(*cfg), faults);
    let runner = if mode & 1 != 0 {
        runner.overlapping()
    } else {
        runner
    };
    runner.run(&ops_from_bytes(rest));
}
