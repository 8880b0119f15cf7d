//! Spill files changed underneath the buffer (truncated or overwritten by
//! another process of the same user, or root) give `Error::Corrupt` naming
//! the key and the file: never a signal, never `Error::Io` without the key,
//! never a wrong value.

mod common;

use common::value;
use spillbuffer::{Compression, Error, SpillBuffer};
use std::path::{Path, PathBuf};

type Buf = SpillBuffer<u64, Vec<u8>>;

fn buffer(dir: &Path) -> Buf {
    SpillBuffer::builder(dir)
        .segment_size(1 << 20)
        .compression(Compression::None)
        .memory_target(0)
        .build()
        .unwrap()
}

fn segments(b: &Buf) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = b
        .spill_dirs()
        .iter()
        .flat_map(|d| std::fs::read_dir(d).unwrap().flatten().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "spill"))
        .collect();
    v.sort();
    v
}

fn set_len(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// `get(key)` must fail as `Corrupt`, naming the key and a segment file.
fn assert_corrupt(b: &Buf, key: u64) {
    match b.get(&key) {
        Err(e) => assert_names_key_and_segment(&e, key),
        Ok(v) => panic!(
            "key {key}: read {:?} bytes from a damaged file",
            v.map(|v| v.len())
        ),
    }
}

/// `e` is `Corrupt`, naming `key` and a segment file.
fn assert_names_key_and_segment(e: &Error, key: u64) {
    match e {
        Error::Corrupt {
            key: k,
            path,
            detail,
        } => {
            assert_eq!(k, &key.to_string());
            assert!(
                path.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("seg-"),
                "{path:?}"
            );
            assert!(!detail.is_empty());
        }
        e => panic!("key {key}: expected Corrupt, got {e:?}"),
    }
}

/// Overwrite every byte of `b`'s segment files.
fn overwrite_segments(b: &Buf) {
    for seg in segments(b) {
        let len = std::fs::metadata(&seg).unwrap().len();
        std::fs::write(&seg, vec![0x5a; len as usize]).unwrap();
    }
}

/// Small (one shared segment) and large (a file of their own, read in
/// place) records.
const SIZES: [usize; 2] = [3000, 2 << 20];

/// A buffer whose keys 0..8, `size` bytes each, are all on disk.
fn spilled(dir: &Path, size: usize) -> Buf {
    let b = buffer(dir);
    for k in 0..8u64 {
        b.insert(k, value(k, size)).unwrap();
    }
    b.flush_blocking().unwrap();
    b
}

#[test]
fn a_segment_truncated_after_it_was_read_gives_corrupt_not_a_signal() {
    for size in SIZES {
        let tmp = tempfile::tempdir().unwrap();
        let b = spilled(tmp.path(), size);
        // Read every key back (what mapped the segment before reads became
        // `pread()` only), and let it go back to disk.
        for k in 0..8u64 {
            let v = b.get(&k).unwrap().unwrap();
            assert_eq!(*v, value(k, size));
            v.consume();
        }
        b.flush_blocking().unwrap();
        for seg in segments(&b) {
            set_len(&seg, 0);
        }
        for k in 0..8u64 {
            assert_corrupt(&b, k);
        }
        // Still usable: new values spill and read back.
        b.insert(100, value(100, size)).unwrap();
        b.flush_blocking().unwrap();
        assert_eq!(*b.get(&100).unwrap().unwrap(), value(100, size));
    }
}

#[test]
fn a_segment_truncated_before_any_read_gives_corrupt_with_key_and_file() {
    for size in SIZES {
        let tmp = tempfile::tempdir().unwrap();
        let b = spilled(tmp.path(), size);
        // Cut every file inside its last record: the earlier records are
        // whole and still read back, the last is cut short. Small records
        // share a file, usually one; with both IO threads writing they can
        // land in two. A large one fills a file of its own.
        let cut = segments(&b);
        for seg in &cut {
            let len = std::fs::metadata(seg).unwrap().len();
            set_len(seg, len - 100);
        }
        let mut corrupt = Vec::new();
        for k in 0..8u64 {
            match b.get(&k) {
                Ok(Some(v)) => assert_eq!(*v, value(k, size), "key {k}"),
                Ok(None) => panic!("key {k} lost"),
                Err(e) => {
                    assert_corrupt(&b, k);
                    corrupt.push((k, e.to_string()));
                }
            }
        }
        if size > 1 << 20 {
            assert_eq!(cut.len(), 8, "one file per large record");
        }
        assert_eq!(corrupt.len(), cut.len(), "size {size}: {corrupt:?}");
    }
}

#[test]
fn an_overwritten_segment_gives_corrupt() {
    for size in SIZES {
        let tmp = tempfile::tempdir().unwrap();
        let b = spilled(tmp.path(), size);
        overwrite_segments(&b);
        for k in 0..8u64 {
            assert_corrupt(&b, k);
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_truncated_segment_fails_pins_as_corrupt_too() {
    let tmp = tempfile::tempdir().unwrap();
    let b = buffer(tmp.path());
    for k in 0..4u64 {
        b.insert(k, value(k, 3000)).unwrap();
    }
    b.flush().await.unwrap();
    for seg in segments(&b) {
        set_len(&seg, 10);
    }
    for k in 0..4u64 {
        match b.pin(&k).await {
            Err(Error::Corrupt { key, .. }) => assert_eq!(key, k.to_string()),
            other => panic!("key {k}: {:?}", other.map(|p| p.map(|v| v.len()))),
        }
    }
}

/// Sending a damaged record fails as reading it does: `Corrupt`, naming
/// the key and the file. A damaged header is found before the first byte
/// is written; a large record whose file was cut short, when its last
/// piece is read.
#[test]
fn a_damaged_record_fails_its_send_as_corrupt() {
    for size in SIZES {
        let tmp = tempfile::tempdir().unwrap();
        let b = spilled(tmp.path(), size);
        overwrite_segments(&b);
        for k in 0..8u64 {
            let mut wire = Vec::new();
            let e = b.write_record_to(&k, &mut wire).unwrap_err();
            assert_names_key_and_segment(&e, k);
            assert!(wire.is_empty(), "key {k}: {} bytes written", wire.len());
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let b = spilled(tmp.path(), 2 << 20);
    for seg in segments(&b) {
        let len = std::fs::metadata(&seg).unwrap().len();
        set_len(&seg, len - 100);
    }
    for k in 0..8u64 {
        let mut wire = Vec::new();
        let e = b.write_record_to(&k, &mut wire).unwrap_err();
        assert_names_key_and_segment(&e, k);
        assert!(!wire.is_empty(), "key {k}: the record's start went out");
    }
}
