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
