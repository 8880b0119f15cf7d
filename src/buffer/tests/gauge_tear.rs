//! A write that lands while the host evicts: the schedule behind the
//! `faults` fuzz input `b52de25b…`, which ended a few times in 20,000
//! replays with unpinned resident bytes over the target after `Flush`.
//!
//! In that input (target 4096, one shard) key 4 (2517 bytes) is resident
//! and key 8 (4190 bytes, heavier than the target) is being written when
//! the host inserts key 0 (3062 bytes). The write of key 8 ends on an IO
//! thread: its entry leaves memory, and the gauges move one after the
//! other, `resident` first. When the host's eviction after the insert read
//! the gauges between those stores, it found `resident` already without
//! key 8 but `spilling` still with it, took 5579 − 4190 = 1389 bytes for
//! what was over the target, and stopped. Nothing evicted afterwards (the
//! write's end looked at nothing, the next operations evicted nothing), so
//! the flush found key 4 and key 0 in memory, 1483 bytes over the target.
//! Which job the IO pool took first only decided how often the write
//! ended at that moment.
//!
//! Two things now keep it from happening: eviction reads what is in
//! memory and not being written from one gauge (`unheld`), which a write
//! that ends leaves as it was; and a change that moves several gauges
//! looks at the target again once it is whole (`Inner::check_target`).
//! The test holds the write's change half made, with a hook between its
//! first gauge and the rest, while the host inserts: the schedule the fuzz
//! input met by chance, every time.

use super::*;
use crate::buffer::accounting::Delta;
use crate::sync::atomic::{AtomicBool, Ordering::SeqCst};

/// Three keys: the one written while the host evicts, the older resident
/// one the eviction must write, and the one the host inserts. The written
/// key's shard is locked while its change is held half made, so the other
/// two are taken from other shards (the host must not wait for it).
fn keys(inner: &Inner<u64, Vec<u8>>) -> (u64, u64, u64) {
    let written = 8;
    let mut others = (0..).filter(|k| inner.shard_of(k) != inner.shard_of(&written));
    let mut next = || others.next().expect("keys of other shards");
    (written, next(), next())
}

#[test]
fn a_write_ending_while_the_host_evicts_leaves_nothing_over_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let b: SpillBuffer<u64, Vec<u8>> = SpillBuffer::builder(dir.path())
        .memory_target(4096)
        .io_threads(1)
        .shards(4)
        .build()
        .unwrap();
    let inner = b.inner();
    let (written, resident, inserted) = keys(inner);

    // Hold the first change that ends a write (a value leaving memory as
    // its write lands) once `resident` has moved, on the IO thread, until
    // the host has inserted.
    let (halfway_tx, halfway_rx) = crossbeam_channel::bounded::<()>(1);
    let (go_tx, go_rx) = crossbeam_channel::bounded::<()>(1);
    let held = AtomicBool::new(false);
    inner
        .accounting()
        .set_halfway(Some(Arc::new(move |d: &Delta| {
            let landing = d.resident < 0 && d.spilling < 0;
            let on_pool = std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("spillbuffer-io"));
            if landing && on_pool && !held.swap(true, SeqCst) {
                let _ = halfway_tx.send(());
                // Released by the host, or by its channel closing if the test
                // fails first.
                let _ = go_rx.recv();
            }
        })));

    b.insert(resident, vec![4; 2517]).unwrap();
    // Heavier than the target: its write is queued at once.
    b.insert(written, vec![8; 4190]).unwrap();
    halfway_rx.recv().unwrap();
    // The write's change is half made: `resident` no longer counts the
    // written value, the other gauges still do. The host inserts, which
    // puts memory over the target by 2517 + 3062 - 4096 bytes.
    b.insert(inserted, vec![0; 3062]).unwrap();
    go_tx.send(()).unwrap();
    b.flush_blocking().unwrap();
    inner.accounting().set_halfway(None);

    assert_eq!(
        inner.over_target(),
        0,
        "unpinned resident bytes over the target after the flush"
    );
    let st = b.stats();
    assert_eq!(st.memory_bytes, 3062, "only the inserted value in memory");
    assert_eq!(st.disk_count, 2, "the written value and the older one");
    b.validate().unwrap();
}
