//! Conveniences of the public API: lookups by a borrowed form of the key,
//! and taking a value out.

mod common;

use common::value;
use spillbuffer::SpillBuffer;

type Strings = SpillBuffer<String, Vec<u8>>;

fn strings(dir: &std::path::Path, target: usize) -> Strings {
    SpillBuffer::builder(dir)
        .memory_target(target)
        .segment_size(64 * 1024)
        .build()
        .expect("build")
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

#[test]
fn string_keys_are_looked_up_by_str() {
    let tmp = tempfile::tempdir().unwrap();
    // Room for 4 of the 20 values: most are on disk after the flush.
    let b = strings(tmp.path(), 4_000);
    for i in 0..20u64 {
        b.insert(format!("key-{i}"), value(i, 1000)).unwrap();
    }
    b.flush_blocking().unwrap();
    assert!(b.stats().disk_count >= 16, "{:?}", b.stats());

    assert!(b.contains_key("key-3"));
    assert!(!b.contains_key("key-20"));
    // A value on disk, read back on the pool (pin) and on this thread
    // (get), each found by &str.
    let on_disk = (0..20u64)
        .map(|i| format!("key-{i}"))
        .find(|k| b.try_pin(k.as_str()).is_none())
        .expect("some value is on disk");
    let pinned = rt().block_on(b.pin(on_disk.as_str())).unwrap().unwrap();
    let i: u64 = on_disk["key-".len()..].parse().unwrap();
    assert_eq!(*pinned, value(i, 1000));
    drop(pinned);
    for i in 0..20u64 {
        let k = format!("key-{i}");
        assert_eq!(*b.get(k.as_str()).unwrap().unwrap(), value(i, 1000), "{k}");
    }
    // try_pin by &str of a value now in memory.
    let last = format!("key-{}", 19);
    assert!(b.get(last.as_str()).unwrap().is_some());
    assert_eq!(*b.try_pin(last.as_str()).unwrap(), value(19, 1000));

    assert!(b.remove("key-7"));
    assert!(!b.remove("key-7"));
    assert!(!b.contains_key("key-7"));
    assert!(b.get("key-7").unwrap().is_none());
    assert!(rt().block_on(b.pin("key-7")).unwrap().is_none());
    assert_eq!(b.len(), 19);
    b.validate().unwrap();
}

#[test]
fn vec_keys_are_looked_up_by_slice() {
    let tmp = tempfile::tempdir().unwrap();
    let b: SpillBuffer<Vec<u8>, Vec<u8>> = SpillBuffer::builder(tmp.path()).build().expect("build");
    b.insert(b"abc".to_vec(), value(1, 10)).unwrap();
    let k: &[u8] = b"abc";
    assert!(b.contains_key(k));
    assert_eq!(*b.try_pin(k).unwrap(), value(1, 10));
    assert!(b.remove(k));
    assert!(b.is_empty());
}

#[test]
fn take_removes_a_resident_value_and_hands_it_over_unshared() {
    let tmp = tempfile::tempdir().unwrap();
    let b = strings(tmp.path(), 1 << 20);
    b.insert("a".to_string(), value(1, 1000)).unwrap();
    b.insert("b".to_string(), value(2, 1000)).unwrap();
    let got = rt().block_on(b.take("a")).unwrap().expect("present");
    let owned: Vec<u8> = std::sync::Arc::try_unwrap(got).expect("nobody else holds it");
    assert_eq!(owned, value(1, 1000));
    assert!(!b.contains_key("a"));
    assert_eq!(b.len(), 1);
    assert_eq!(b.stats().memory_bytes, 1000);
    assert!(rt().block_on(b.take("a")).unwrap().is_none());
    assert!(b.take_blocking("a").unwrap().is_none());
    b.validate().unwrap();
}

#[tokio::test]
async fn take_reads_a_spilled_value_back_on_the_io_pool() {
    let tmp = tempfile::tempdir().unwrap();
    let (b, faults) = common::with_faults(
        SpillBuffer::builder(tmp.path())
            .memory_target(4_000)
            .segment_size(64 * 1024),
    );
    for k in 0..10u64 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    b.flush().await.unwrap();
    assert!(b.try_pin(&0).is_none(), "key 0 is on disk");
    let disk_before = b.stats().disk_count;
    // With reads held, the take cannot finish: its read is on the pool,
    // not on this thread (which would block here instead).
    faults.hold_reads(true);
    let mut take = std::pin::pin!(b.take(&0));
    common::start_each(&mut [take.as_mut()]).await;
    faults.wait_until_held(1);
    faults.hold_reads(false);
    let got = take.await.unwrap().expect("present");
    assert_eq!(*got, value(0, 1000));
    assert!(!b.contains_key(&0));
    b.flush().await.unwrap();
    assert_eq!(b.stats().disk_count, disk_before - 1, "its record is freed");
    assert_eq!(b.len(), 9);
    b.validate().unwrap();
}

#[test]
fn take_blocking_reads_a_spilled_value_on_the_callers_thread() {
    let tmp = tempfile::tempdir().unwrap();
    let b = strings(tmp.path(), 4_000);
    for i in 0..10u64 {
        b.insert(format!("k{i}"), value(i, 1000)).unwrap();
    }
    b.flush_blocking().unwrap();
    assert!(b.try_pin("k0").is_none(), "k0 is on disk");
    let got = b.take_blocking("k0").unwrap().expect("present");
    assert_eq!(*got, value(0, 1000));
    assert!(!b.contains_key("k0"));
    b.flush_blocking().unwrap();
    b.validate().unwrap();
}

#[test]
fn take_of_a_pinned_value_shares_it_with_the_pin() {
    let tmp = tempfile::tempdir().unwrap();
    let b = strings(tmp.path(), 1 << 20);
    b.insert("k".to_string(), value(1, 1000)).unwrap();
    let pin = b.try_pin("k").unwrap();
    let got = b.take_blocking("k").unwrap().expect("present");
    assert!(!b.contains_key("k"));
    // The pin keeps reading the old value, and the buffer counts it
    // until the pin goes; the taken handle is shared with it.
    assert_eq!(*pin, value(1, 1000));
    assert_eq!(b.stats().detached_bytes, 1000);
    let got = std::sync::Arc::try_unwrap(got).expect_err("the pin shares it");
    drop(pin);
    assert_eq!(b.stats().memory_bytes, 0);
    let owned = std::sync::Arc::try_unwrap(got).expect("the pin is gone");
    assert_eq!(owned, value(1, 1000));
    b.validate().unwrap();
}

#[test]
fn a_take_whose_read_fails_keeps_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let (b, faults) = common::with_faults(
        SpillBuffer::builder(tmp.path())
            .memory_target(4_000)
            .segment_size(64 * 1024),
    );
    for k in 0..10u64 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    b.flush_blocking().unwrap();
    assert!(b.try_pin(&0).is_none(), "key 0 is on disk");
    faults.fail_nth_read(1);
    assert!(rt().block_on(b.take(&0)).is_err());
    assert!(b.contains_key(&0));
    let got = rt().block_on(b.take(&0)).unwrap().expect("still there");
    assert_eq!(*got, value(0, 1000));
    b.flush_blocking().unwrap();
    b.validate().unwrap();
}
