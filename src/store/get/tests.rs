//! Reading records back. A small one: one `preadv()` into a stack header
//! and the value's own memory, for types with an in-place decode; scratch
//! for the others. A large one: pieces, each checked as it lands. Every
//! way a record can be wrong is `Corrupt` naming the key and the file, on
//! every path.

use super::super::DiskLoc;
use super::*;
use crate::store::codec::Compression;
use crate::store::tests::{noise, store_with as store};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

/// A value type with no in-place decode: read through scratch.
#[derive(Debug, PartialEq)]
struct Plain(Vec<u8>);

impl Spill for Plain {
    fn weight(&self) -> usize {
        self.0.len()
    }
    fn encode(&self, out: &mut Vec<u8>) -> std::result::Result<(), BoxError> {
        out.extend_from_slice(&self.0);
        Ok(())
    }
    fn decode(bytes: &[u8]) -> std::result::Result<Self, BoxError> {
        Ok(Plain(bytes.to_vec()))
    }
}

fn patch(path: &Path, at: u64, bytes: &[u8]) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, at).unwrap();
}

fn set_len(path: &Path, len: u64) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(len).unwrap();
}

/// `res` is `Corrupt` for key `key` in `path`, its detail containing
/// `what`.
fn assert_corrupt<V: Debug>(res: Result<V>, key: u32, path: &Path, what: &str) {
    match res {
        Err(Error::Corrupt {
            key: k,
            path: p,
            detail,
        }) => {
            assert_eq!(k, key.to_string());
            assert_eq!(p, path);
            assert!(detail.contains(what), "{detail:?} lacks {what:?}");
        }
        other => panic!("expected Corrupt({what}), got {other:?}"),
    }
}

/// Both read paths: a `Vec<u8>` (in place) and a `Plain` (scratch).
fn both(s: &Store<u32>, key: u32, loc: DiskLoc) -> (Result<Vec<u8>>, Result<Plain>) {
    (s.get::<Vec<u8>>(&key, loc), s.get::<Plain>(&key, loc))
}

#[test]
fn small_records_read_back_on_both_paths_raw_and_lz4() {
    for compression in [Compression::None, Compression::Lz4] {
        let tmp = tempfile::tempdir().unwrap();
        let s = store(tmp.path(), compression);
        let values = [
            noise(1, 4096),
            vec![0u8; 4096],
            b"x".to_vec(),
            Vec::new(),
            noise(2, IN_PLACE_MIN - record::HEADER - 1),
        ];
        for (k, v) in values.iter().enumerate() {
            let loc = s.put(&(k as u32), v).unwrap();
            let (a, b) = both(&s, k as u32, loc);
            assert_eq!(&a.unwrap(), v, "{compression:?} {k}");
            assert_eq!(&b.unwrap().0, v, "{compression:?} {k}");
        }
        // Zeros of 16 KiB are compressed (4 KiB ones are too small
        // to be): the lz4 record went through the in-place read
        // first, then was decompressed.
        if compression == Compression::Lz4 {
            let loc = s.put(&9, &vec![0u8; 16384]).unwrap();
            assert!(loc.len() < 16384, "zeros compress");
            assert_eq!(s.get::<Vec<u8>>(&9, loc).unwrap(), vec![0u8; 16384]);
            assert_eq!(s.get::<String>(&9, loc).unwrap(), "\0".repeat(16384));
        }
    }
}

#[test]
fn raw_and_lz4_records_read_back_in_any_order_on_one_thread() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path(), Compression::Lz4);
    // (Over the size from which records are compressed.)
    let raw = noise(7, 12_000);
    let zeros = vec![0u8; 12_000];
    let a = s.put(&1, &raw).unwrap();
    let b = s.put(&2, &zeros).unwrap();
    assert!(b.len() < a.len(), "zeros compress, noise does not");
    // Each switch of codec crosses from one way of reading to the other.
    for (k, loc, want) in [
        (1, a, &raw),
        (2, b, &zeros),
        (2, b, &zeros),
        (1, a, &raw),
        (1, a, &raw),
        (2, b, &zeros),
    ] {
        assert_eq!(&s.get::<Vec<u8>>(&k, loc).unwrap(), want);
    }
    // A damaged raw record is caught on the scratch way too.
    s.get::<Vec<u8>>(&2, b).unwrap();
    let path = s.segment_path(a.seg);
    patch(&path, a.offset + 40, &[raw[8] ^ 1]);
    assert_corrupt(s.get::<Vec<u8>>(&1, a), 1, &path, "payload checksum");
}

#[test]
fn a_corrupt_header_or_payload_is_corrupt_on_both_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path(), Compression::None);
    let v = noise(3, 4096);
    // (byte to flip within the record, what the error says)
    for (i, (at, what)) in [
        (0, "magic"),
        (9, "header checksum"),
        (27, "header checksum"),
        (30, "header checksum"),
        (32, "payload checksum"),
        (32 + 4095, "payload checksum"),
    ]
    .into_iter()
    .enumerate()
    {
        let key = i as u32;
        let loc = s.put(&key, &v).unwrap();
        let path = s.segment_path(loc.seg);
        let mut b = [0u8; 1];
        let f = std::fs::File::open(&path).unwrap();
        f.read_exact_at(&mut b, loc.offset + at).unwrap();
        patch(&path, loc.offset + at, &[b[0] ^ 0x40]);
        let (a, b) = both(&s, key, loc);
        assert_corrupt(a, key, &path, what);
        assert_corrupt(b, key, &path, what);
    }
}

#[test]
fn an_index_length_that_disagrees_with_the_header_is_corrupt() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path(), Compression::None);
    let v = noise(4, 4096);
    let loc = s.put(&1, &v).unwrap();
    s.put(&2, &v).unwrap();
    let path = s.segment_path(loc.seg);
    for len in [loc.len() - 1, loc.len() + 1] {
        let bad = DiskLoc::new(loc.seg, loc.offset, len);
        let (a, b) = both(&s, 1, bad);
        assert_corrupt(a, 1, &path, "header says");
        assert_corrupt(b, 1, &path, "header says");
    }
    let tiny = DiskLoc::new(loc.seg, loc.offset, 5);
    assert_corrupt(
        s.get::<Vec<u8>>(&1, tiny),
        1,
        &path,
        "shorter than its header",
    );
    assert_corrupt(
        s.get::<Plain>(&1, tiny),
        1,
        &path,
        "shorter than its header",
    );
}

#[test]
fn a_segment_cut_short_anywhere_in_a_record_is_corrupt_on_both_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path(), Compression::None);
    let v = noise(5, 4096);
    let loc = s.put(&7, &v).unwrap();
    let path = s.segment_path(loc.seg);
    // Inside the header, at its end (the payload reads nothing), inside
    // the payload, one byte short.
    for cut in [0, 10, record::HEADER as u64, 100, loc.len() - 1] {
        set_len(&path, loc.offset + cut);
        let (a, b) = both(&s, 7, loc);
        assert_corrupt(a, 7, &path, "truncated");
        assert_corrupt(b, 7, &path, "truncated");
    }
}

#[test]
fn a_decode_failure_after_an_in_place_read_is_corrupt() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path(), Compression::None);
    let loc = s.put(&3, &vec![0xffu8; 100]).unwrap();
    let path = s.segment_path(loc.seg);
    assert_corrupt(s.get::<String>(&3, loc), 3, &path, "decode failed");
}

#[test]
fn a_released_segment_is_an_io_error_naming_its_file() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path(), Compression::None);
    let loc = s.put(&1, &noise(6, 100)).unwrap();
    let gone = DiskLoc::new(loc.seg + 1, 0, loc.len());
    match s.get::<Vec<u8>>(&1, gone) {
        Err(e @ Error::Io { .. }) => assert!(e.to_string().contains("seg-"), "{e}"),
        other => panic!("expected Io, got {other:?}"),
    }
}

/// A large record is read in several pieces, each checked as it lands:
/// it reads back whole, and damage or a cut in its last piece, read after
/// the first has passed, is still `Corrupt`.
#[test]
fn a_record_of_several_pieces_reads_back_and_fails_in_its_last_piece() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path(), Compression::None);
    let v = noise(7, READ_PIECE + 100_000);
    let loc = s.put(&1, &v).unwrap();
    assert_eq!(s.get::<Vec<u8>>(&1, loc).unwrap(), v);
    let path = s.segment_path(loc.seg);
    let last = loc.offset + loc.len() - 10;
    let mut b = [0u8; 1];
    std::fs::File::open(&path)
        .unwrap()
        .read_exact_at(&mut b, last)
        .unwrap();
    patch(&path, last, &[b[0] ^ 0x01]);
    assert_corrupt(s.get::<Vec<u8>>(&1, loc), 1, &path, "payload checksum");
    patch(&path, last, &b);
    assert_eq!(s.get::<Vec<u8>>(&1, loc).unwrap(), v);
    set_len(&path, last);
    assert_corrupt(s.get::<Vec<u8>>(&1, loc), 1, &path, "truncated");
}
