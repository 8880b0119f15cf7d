//! Transfers without decoding: `record` hands out a key's stored record as
//! bytes, `insert_record` takes such bytes into another buffer as they
//! are. Round trips from disk and from memory, damaged transfers,
//! replacement, removal while a record is read, and the gauges.

mod common;

use common::{value, with_faults};
use spillbuffer::{BoxError, Compression, Error, Record, Spill, SpillBuffer};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

type Buf = SpillBuffer<u64, Vec<u8>>;

fn buffer(dir: &std::path::Path, compression: Compression) -> Buf {
    SpillBuffer::builder(dir)
        .memory_target(64 << 20)
        .compression(compression)
        .build()
        .unwrap()
}

/// Compressible bytes: a counter.
fn counter(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i / 64) as u8).collect()
}

/// Values of every shape the store treats apart: small and large,
/// compressible and not.
/// A sending and a receiving buffer, each in a directory of its own
/// (kept alive with them), with the compression each is given.
fn pair(
    sender: Compression,
    receiver: Compression,
) -> ((tempfile::TempDir, tempfile::TempDir), Buf, Buf) {
    let (ta, tb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (buffer(ta.path(), sender), buffer(tb.path(), receiver));
    ((ta, tb), a, b)
}

fn values() -> Vec<(u64, Vec<u8>)> {
    vec![
        (1, value(1, 100)),
        (2, counter(1000)),
        (3, value(3, 300 << 10)),
        (4, counter(300 << 10)),
        (5, Vec::new()),
    ]
}

fn assert_corrupt(e: &Error, key: u64) {
    match e {
        Error::Corrupt { key: k, .. } => assert_eq!(k, &format!("{key:?}"), "{e}"),
        other => panic!("expected Error::Corrupt, got {other}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn spilled_records_move_without_being_read_back() {
    for compression in [Compression::Lz4, Compression::None] {
        let (_dirs, a, b) = pair(compression, Compression::Lz4);
        for (k, v) in values() {
            a.insert(k, v).unwrap();
        }
        a.evict(1 << 30);
        a.flush().await.unwrap();
        assert_eq!(a.stats().memory_bytes, 0);
        let mut sent = 0;
        for (k, _) in values() {
            let rec = a.record(&k).await.unwrap().expect("present");
            sent += rec.len() as u64;
            b.insert_record(k, rec).await.unwrap();
        }
        let (sa, sb) = (a.stats(), b.stats());
        assert_eq!(sa.records_sent_total, 5, "{sa:?}");
        assert_eq!(sa.records_sent_encoded_total, 0, "{sa:?}");
        assert_eq!(sa.records_sent_bytes_total, sent, "{sa:?}");
        assert_eq!(
            sa.unspill_count_total, 0,
            "the sender read nothing back: {sa:?}"
        );
        // As stored: the receiver's disk holds exactly the sender's records.
        assert_eq!(sb.disk_bytes, sa.disk_bytes, "{sb:?}");
        assert_eq!(sb.disk_count, 5, "{sb:?}");
        assert_eq!(sb.memory_bytes, 0, "nothing decoded on receipt: {sb:?}");
        assert_eq!(sb.records_received_total, 5, "{sb:?}");
        assert_eq!(sb.records_received_bytes_total, sent, "{sb:?}");
        assert_eq!(b.len(), 5);
        a.validate().unwrap();
        b.validate().unwrap();
        for (k, v) in values() {
            assert_eq!(*b.pin(&k).await.unwrap().unwrap(), v, "key {k}");
        }
        // Values read back count at their weight.
        let total: usize = values().iter().map(|(_, v)| v.len()).sum();
        assert_eq!(b.stats().memory_bytes, total as u64);
        b.validate().unwrap();
    }
}

#[tokio::test(flavor = "current_thread")]
async fn resident_values_are_encoded_but_not_written() {
    let (_dirs, a, b) = pair(Compression::Lz4, Compression::None);
    for (k, v) in values() {
        a.insert(k, v).unwrap();
    }
    for (k, _) in values() {
        let rec = a.record(&k).await.unwrap().expect("present");
        b.insert_record(k, rec).await.unwrap();
    }
    a.flush().await.unwrap();
    let sa = a.stats();
    assert_eq!(sa.records_sent_encoded_total, 5, "{sa:?}");
    assert_eq!(sa.spill_count_total, 0, "sending is not spilling: {sa:?}");
    assert_eq!(sa.disk_count, 0, "{sa:?}");
    // lz4 shrank the compressible ones on the way.
    let raw: usize = values().iter().map(|(_, v)| v.len()).sum();
    assert!(b.stats().disk_bytes < raw as u64, "{:?}", b.stats());
    for (k, v) in values() {
        assert_eq!(*b.get(&k).unwrap().unwrap(), v, "key {k}");
    }
    a.validate().unwrap();
    b.validate().unwrap();
}

#[test]
fn a_large_raw_value_is_sent_from_its_own_memory_and_stays_pinned() {
    let (_dirs, a, b) = pair(Compression::Lz4, Compression::Lz4);
    let v = value(9, 1 << 20); // incompressible: sent raw
    a.insert(9, v.clone()).unwrap();
    let rec = a.record_blocking(&9).unwrap().unwrap();
    let [head, body] = rec.as_slices();
    assert_eq!(head.len(), 64, "frame and record headers apart");
    assert_eq!(body.as_ptr(), a.try_pin(&9).unwrap().as_ptr(), "no copy");
    // Pinned while the record lives: eviction cannot take it.
    assert_eq!(a.evict(1 << 30), 0);
    a.flush_blocking().unwrap();
    assert_eq!(a.stats().memory_bytes, 1 << 20);
    a.validate().unwrap();
    b.insert_record_blocking(9, rec).unwrap();
    assert_eq!(a.evict(1 << 30), 1 << 20, "unpinned once the record went");
    a.flush_blocking().unwrap();
    assert_eq!(*b.get(&9).unwrap().unwrap(), v);
    a.validate().unwrap();
    b.validate().unwrap();
}

/// A value whose decodes are counted: the sending side must make none.
struct Counted(Vec<u8>);
static DECODES: AtomicUsize = AtomicUsize::new(0);

impl Spill for Counted {
    fn weight(&self) -> usize {
        self.0.len()
    }
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), BoxError> {
        out.extend_from_slice(&self.0);
        Ok(())
    }
    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        DECODES.fetch_add(1, SeqCst);
        Ok(Counted(bytes.to_vec()))
    }
}

#[tokio::test(flavor = "current_thread")]
async fn neither_side_decodes_until_a_pin() {
    let (ta, tb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a: SpillBuffer<u64, Counted> = SpillBuffer::builder(ta.path()).build().unwrap();
    let b: SpillBuffer<u64, Counted> = SpillBuffer::builder(tb.path()).build().unwrap();
    for k in 0..20u64 {
        a.insert(k, Counted(value(k, 5000))).unwrap();
    }
    a.evict(1 << 30);
    a.flush().await.unwrap();
    for k in 0..20u64 {
        let rec = a.record(&k).await.unwrap().unwrap();
        b.insert_record(k, rec).await.unwrap();
    }
    b.flush().await.unwrap();
    assert_eq!(DECODES.load(SeqCst), 0, "a transfer decoded a value");
    assert_eq!(b.pin(&3).await.unwrap().unwrap().0, value(3, 5000));
    assert_eq!(DECODES.load(SeqCst), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn damaged_transfers_are_refused_naming_the_key() {
    let (_dirs, a, b) = pair(Compression::Lz4, Compression::Lz4);
    a.insert(1, counter(10_000)).unwrap();
    a.insert(2, value(2, 10_000)).unwrap();
    a.evict(1 << 30);
    a.flush().await.unwrap();
    for k in [1u64, 2] {
        let good = a.record(&k).await.unwrap().unwrap().into_vec();
        let mut bad: Vec<(String, Vec<u8>)> = Vec::new();
        for cut in [0, 1, 31, 32, 63, 64, good.len() / 2, good.len() - 1] {
            bad.push((format!("cut at {cut}"), good[..cut].to_vec()));
        }
        let mut longer = good.clone();
        longer.push(0);
        bad.push(("one byte more".into(), longer));
        // A flipped bit in the frame header, the record header and the
        // payload, each.
        for at in [10, 40, good.len() - 10] {
            let mut v = good.clone();
            v[at] ^= 0x10;
            bad.push((format!("bit flipped at {at}"), v));
        }
        let mut v = good.clone();
        v[4] = 2;
        bad.push(("version 2".into(), v));
        let mut v = good.clone();
        v[..4].copy_from_slice(b"HTTP");
        bad.push(("not a transfer".into(), v));
        for (what, bytes) in bad {
            let e = b
                .insert_record(7, Record::from_vec(bytes.clone()))
                .await
                .expect_err(&what);
            assert_corrupt(&e, 7);
            let e = b
                .insert_record_blocking(7, Record::from_vec(bytes))
                .expect_err(&what);
            assert_corrupt(&e, 7);
        }
        let e = b
            .insert_record(7, Record::from_vec(vec![0; 3]))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("frame header"), "{e}");
        let mut v = good.clone();
        v[4] = 2;
        let e = b.insert_record(7, Record::from_vec(v)).await.unwrap_err();
        assert!(e.to_string().contains("version 2"), "{e}");
    }
    assert!(!b.contains_key(&7));
    let s = b.stats();
    assert_eq!(
        (s.disk_count, s.file_bytes, s.memory_bytes),
        (0, 0, 0),
        "{s:?}"
    );
    b.validate().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_record_of_another_value_type_fails_at_decode_not_with_a_wrong_value() {
    let (ta, tb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = buffer(ta.path(), Compression::Lz4);
    let b: SpillBuffer<u64, String> = SpillBuffer::builder(tb.path()).build().unwrap();
    a.insert(1, vec![0xff, 0xfe, 0x00]).unwrap();
    let rec = a.record(&1).await.unwrap().unwrap();
    // Checksums and lengths hold: accepted, and refused when decoded.
    b.insert_record(1, rec).await.unwrap();
    let e = b.pin(&1).await.unwrap_err();
    assert_corrupt(&e, 1);
    assert!(b.contains_key(&1), "a failed read keeps the key");
    b.validate().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn insert_record_replaces_a_key_in_either_tier() {
    let (_dirs, a, b) = pair(Compression::Lz4, Compression::Lz4);
    a.insert(1, value(11, 4000)).unwrap();
    a.insert(2, value(12, 4000)).unwrap();
    // Key 1 resident in the receiver, key 2 on its disk.
    b.insert(1, value(1, 9000)).unwrap();
    b.insert(2, value(2, 9000)).unwrap();
    b.evict(9000);
    b.flush().await.unwrap();
    let on_disk = if b.try_pin(&1).is_none() { 1 } else { 2 };
    assert_eq!(b.stats().disk_count, 1);
    for k in [1u64, 2] {
        b.insert_record(k, a.record(&k).await.unwrap().unwrap())
            .await
            .unwrap();
    }
    let s = b.stats();
    assert_eq!(s.memory_bytes, 0, "the old values are gone: {s:?}");
    assert_eq!(
        s.disk_count, 2,
        "the old record {on_disk} was released: {s:?}"
    );
    assert_eq!(b.len(), 2);
    b.validate().unwrap();
    assert_eq!(*b.pin(&1).await.unwrap().unwrap(), value(11, 4000));
    assert_eq!(*b.pin(&2).await.unwrap().unwrap(), value(12, 4000));
    // And a plain insert replaces a received record.
    b.insert(1, value(21, 100)).unwrap();
    assert_eq!(*b.pin(&1).await.unwrap().unwrap(), value(21, 100));
    b.flush().await.unwrap();
    b.validate().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_waiting_on_a_replaced_value_get_the_received_one() {
    let (ta, tb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = buffer(ta.path(), Compression::Lz4);
    let (b, faults) = with_faults(SpillBuffer::builder(tb.path()).io_threads(2));
    a.insert(1, value(100, 5000)).unwrap();
    let rec = a.record(&1).await.unwrap().unwrap();
    b.insert(1, value(1, 5000)).unwrap();
    b.evict(1 << 30);
    b.flush().await.unwrap();
    faults.hold_reads(true);
    let b2 = b.clone();
    let reader = tokio::spawn(async move { b2.pin(&1).await });
    faults.wait_until_held(1);
    b.insert_record(1, rec).await.unwrap();
    faults.hold_reads(false);
    let pinned = reader.await.unwrap().unwrap().unwrap();
    assert_eq!(*pinned, value(100, 5000));
    drop(pinned);
    b.flush().await.unwrap();
    b.validate().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_removed_while_its_record_is_read_is_absent() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, faults) = with_faults(SpillBuffer::builder(tmp.path()).io_threads(2));
    a.insert(1, value(1, 5000)).unwrap();
    a.insert(2, value(2, 5000)).unwrap();
    a.evict(1 << 30);
    a.flush().await.unwrap();
    faults.hold_reads(true);
    let (a1, a2) = (a.clone(), a.clone());
    let removed = tokio::spawn(async move { a1.record(&1).await });
    let replaced = tokio::spawn(async move { a2.record(&2).await });
    faults.wait_until_held(2);
    assert!(a.remove(&1));
    a.insert(2, value(22, 700)).unwrap();
    faults.hold_reads(false);
    assert!(removed.await.unwrap().unwrap().is_none());
    // The replaced key's record is the new value's.
    let rec = replaced.await.unwrap().unwrap().unwrap();
    let tb = tempfile::tempdir().unwrap();
    let b = buffer(tb.path(), Compression::Lz4);
    b.insert_record(2, rec).await.unwrap();
    assert_eq!(*b.pin(&2).await.unwrap().unwrap(), value(22, 700));
    a.flush().await.unwrap();
    a.validate().unwrap();
    b.validate().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_received_record_counts_in_memory_until_written() {
    let (ta, tb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = buffer(ta.path(), Compression::None);
    let (b, faults) = with_faults(SpillBuffer::builder(tb.path()).io_threads(2));
    a.insert(1, value(1, 50_000)).unwrap();
    let rec = a.record(&1).await.unwrap().unwrap();
    let len = rec.len() as u64;
    faults.hold_writes(true);
    let b2 = b.clone();
    let insert = tokio::spawn(async move { b2.insert_record(1, rec).await });
    faults.wait_until_held(1);
    let s = b.stats();
    assert_eq!((s.memory_bytes, s.detached_bytes), (len, len), "{s:?}");
    assert!(!b.contains_key(&1), "not in until written");
    faults.hold_writes(false);
    insert.await.unwrap().unwrap();
    let s = b.stats();
    assert_eq!((s.memory_bytes, s.detached_bytes), (0, 0), "{s:?}");
    assert!(b.contains_key(&1));
    b.validate().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_failed_write_inserts_nothing_and_keeps_the_old_value() {
    let (ta, tb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = buffer(ta.path(), Compression::None);
    let (b, faults) = with_faults(SpillBuffer::builder(tb.path()));
    a.insert(1, value(1, 5000)).unwrap();
    b.insert(1, value(2, 10)).unwrap();
    faults.fail_all_writes(spillbuffer::testing::WriteFault::Error);
    let e = b
        .insert_record(1, a.record(&1).await.unwrap().unwrap())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert_eq!(*b.pin(&1).await.unwrap().unwrap(), value(2, 10));
    faults.clear();
    b.flush().await.unwrap();
    b.validate().unwrap();
}

#[test]
fn records_stream_back_to_back() {
    let (_dirs, a, b) = pair(Compression::Lz4, Compression::Lz4);
    let mut wire = Vec::new();
    for (k, v) in values() {
        a.insert(k, v).unwrap();
        if k % 2 == 0 {
            a.evict(1 << 30);
            a.flush_blocking().unwrap();
        }
        a.record_blocking(&k)
            .unwrap()
            .unwrap()
            .write_to(&mut wire)
            .unwrap();
    }
    let mut reader = wire.as_slice();
    for (k, _) in values() {
        let rec = Record::read_from(&mut reader).unwrap();
        b.insert_record_blocking(k, rec).unwrap();
    }
    assert!(reader.is_empty());
    for (k, v) in values() {
        assert_eq!(*b.get(&k).unwrap().unwrap(), v);
    }
    assert!(a.record_blocking(&99).unwrap().is_none());
    b.validate().unwrap();
}

/// A buffer (lz4 allowed) to receive into, in its directory, and a record
/// sent by another: key 1's 2.5 MiB incompressible value, spilled (so
/// stored, and sent, raw) and larger than several of the pieces a stream
/// is written in.
/// Broken copies of the transfer `good`, each named: cut short in the
/// frame header, the record header, at `mid_cut` and further into the
/// payload, and with one bit flipped in the frame header, the record
/// header and the payload (first, a middle and the last piece).
fn damaged(good: &[u8], mid_cut: usize) -> Vec<(String, Vec<u8>)> {
    let mut bad = Vec::new();
    for cut in [0, 31, 32, 63, 64, mid_cut, 3 << 19, good.len() - 1] {
        bad.push((format!("cut at {cut}"), good[..cut].to_vec()));
    }
    for at in [10, 40, 64, 300 << 10, 3 << 19, good.len() - 1] {
        let mut v = good.to_vec();
        v[at] ^= 0x10;
        bad.push((format!("bit flipped at {at}"), v));
    }
    bad
}

fn a_buffer_and_a_large_record() -> (tempfile::TempDir, Buf, Vec<u8>) {
    let (ta, tb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = buffer(ta.path(), Compression::Lz4);
    a.insert(1, value(1, 5 << 19)).unwrap();
    a.evict(1 << 30);
    a.flush_blocking().unwrap();
    let good = a.record_blocking(&1).unwrap().unwrap().into_vec();
    let b = buffer(tb.path(), Compression::Lz4);
    (tb, b, good)
}

/// A record read off a stream with `read_from`: a bit flipped anywhere on
/// the wire is refused by either insert.
#[test]
fn damaged_records_read_off_a_stream_are_refused() {
    let (_dir, b, good) = a_buffer_and_a_large_record();
    let read = |bytes: &[u8]| Record::read_from(&mut &bytes[..]).unwrap();
    for at in [64, 65, 300 << 10, 3 << 19, good.len() - 1] {
        let mut bad = good.clone();
        bad[at] ^= 0x01;
        let e = b
            .insert_record_blocking(7, read(&bad))
            .expect_err("flipped");
        assert_corrupt(&e, 7);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let e = rt
            .block_on(b.insert_record(7, read(&bad)))
            .expect_err("flipped");
        assert_corrupt(&e, 7);
    }
    assert!(!b.contains_key(&7));
    b.insert_record_blocking(7, read(&good)).unwrap();
    assert_eq!(*b.get(&7).unwrap().unwrap(), value(1, 5 << 19));
    b.validate().unwrap();
}

/// Records of every shape, in memory and on disk, as one byte stream.
fn wire_of(a: &Buf) -> Vec<u8> {
    let mut wire = Vec::new();
    for (k, _) in values() {
        a.record_blocking(&k)
            .unwrap()
            .unwrap()
            .write_to(&mut wire)
            .unwrap();
    }
    wire
}

#[test]
fn records_stream_from_a_reader_straight_to_disk() {
    for compression in [Compression::Lz4, Compression::None] {
        let (_dirs, a, b) = pair(compression, Compression::None);
        for (k, v) in values() {
            a.insert(k, v).unwrap();
            if k % 2 == 0 {
                a.evict(1 << 30);
                a.flush_blocking().unwrap();
            }
        }
        let wire = wire_of(&a);
        // Read in small bits, as a socket may hand them over.
        let mut reader = std::io::BufReader::with_capacity(1000, wire.as_slice());
        for (k, _) in values() {
            b.insert_record_from(k, &mut reader).unwrap();
        }
        assert!(std::io::BufRead::fill_buf(&mut reader).unwrap().is_empty());
        let s = b.stats();
        assert_eq!(s.disk_count, 5, "{s:?}");
        assert_eq!(s.memory_bytes, 0, "nothing decoded on receipt: {s:?}");
        assert_eq!(s.records_received_total, 5, "{s:?}");
        assert_eq!(s.records_received_bytes_total, wire.len() as u64, "{s:?}");
        b.validate().unwrap();
        for (k, v) in values() {
            assert_eq!(*b.get(&k).unwrap().unwrap(), v, "key {k}");
        }
        b.validate().unwrap();
    }
}

/// A reader that fails with an error of its own after `left` bytes.
struct Failing<'a> {
    bytes: &'a [u8],
    left: usize,
}

impl std::io::Read for Failing<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Err(std::io::Error::other("connection reset"));
        }
        let n = buf.len().min(self.left).min(self.bytes.len());
        buf[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        self.left -= n;
        Ok(n)
    }
}

#[test]
fn damaged_or_broken_streams_insert_nothing_and_keep_the_old_value() {
    let (_dir, b, good) = a_buffer_and_a_large_record();
    b.insert(7, value(70, 100)).unwrap();
    let bad = damaged(&good, 300 << 10);
    for (what, bytes) in &bad {
        let e = b
            .insert_record_from(7, &mut bytes.as_slice())
            .expect_err(what);
        assert_corrupt(&e, 7);
    }
    // The reader's own failure, before and after the write began.
    for left in [10, 3 << 19] {
        let e = b
            .insert_record_from(7, &mut Failing { bytes: &good, left })
            .expect_err("reader failed");
        assert!(matches!(e, Error::Io { .. }), "{e}");
        assert!(e.to_string().contains("connection reset"), "{e}");
    }
    assert_eq!(
        *b.get(&7).unwrap().unwrap(),
        value(70, 100),
        "old value kept"
    );
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert_eq!(
        (s.disk_count, s.disk_bytes),
        (0, 0),
        "bytes released: {s:?}"
    );
    assert_eq!(s.records_received_total, 0, "{s:?}");
    b.validate().unwrap();
    // The same buffer takes the good stream afterwards.
    b.insert_record_from(7, &mut good.as_slice()).unwrap();
    assert_eq!(*b.get(&7).unwrap().unwrap(), value(1, 5 << 19));
    b.validate().unwrap();
}

#[test]
fn a_streamed_record_over_the_disk_budget_is_refused_before_it_is_read() {
    let (ta, tb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = buffer(ta.path(), Compression::None);
    let b: Buf = SpillBuffer::builder(tb.path())
        .max_spill(1000)
        .build()
        .unwrap();
    a.insert(1, value(1, 5000)).unwrap();
    let wire = a.record_blocking(&1).unwrap().unwrap().into_vec();
    let mut reader = wire.as_slice();
    let e = b.insert_record_from(1, &mut reader).unwrap_err();
    assert!(matches!(e, Error::DiskBudget { .. }), "{e}");
    assert_eq!(reader.len(), wire.len() - 64, "only the headers were read");
    assert!(!b.contains_key(&1));
    b.validate().unwrap();
}

#[test]
fn transfer_calls_start_their_work_when_called() {
    let (_dirs, a, b) = pair(Compression::Lz4, Compression::Lz4);
    a.insert(1, value(1, 5000)).unwrap();
    a.evict(1 << 30);
    a.flush_blocking().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // Never polled: the read happens anyway.
    drop(a.record(&1));
    a.flush_blocking().unwrap();
    assert_eq!(a.stats().records_sent_total, 1);
    // Several in flight, awaited in order later, none spawned.
    let pending: Vec<_> = (0..3).map(|_| a.record(&1)).collect();
    let records: Vec<Record> = pending
        .into_iter()
        .map(|f| rt.block_on(f).unwrap().unwrap())
        .collect();
    // An insert whose future is dropped unpolled still happens; an
    // invalid one is refused at the call.
    let refused = b.insert_record(8, Record::from_vec(vec![1, 2, 3]));
    for (k, rec) in (5..).zip(records) {
        drop(b.insert_record(k, rec));
    }
    b.flush_blocking().unwrap();
    assert_eq!(b.len(), 3);
    assert_eq!(*b.get(&7).unwrap().unwrap(), value(1, 5000));
    assert_corrupt(&rt.block_on(refused).unwrap_err(), 8);
    b.validate().unwrap();
}

/// Owned bytes read through a socket handed to the buffer: fails with an
/// error of its own after `fail_after` bytes, if given, and stops after
/// `stall_at` bytes (saying so on `stalled`) until `go` lets it on.
#[derive(Debug)]
struct Peer {
    bytes: Vec<u8>,
    at: usize,
    fail_after: Option<usize>,
    stall: Option<(
        usize,
        std::sync::mpsc::Sender<()>,
        std::sync::mpsc::Receiver<()>,
    )>,
}

impl Peer {
    fn new(bytes: Vec<u8>) -> Peer {
        Peer {
            bytes,
            at: 0,
            fail_after: None,
            stall: None,
        }
    }

    /// A peer that stops after `at` bytes: the first receiver hears when
    /// it got there, a send on the sender lets it go on.
    fn stalling(
        bytes: Vec<u8>,
        at: usize,
    ) -> (
        Peer,
        std::sync::mpsc::Receiver<()>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (stalled_tx, stalled_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel();
        let mut p = Peer::new(bytes);
        p.stall = Some((at, stalled_tx, go_rx));
        (p, stalled_rx, go_tx)
    }

    fn rest(&self) -> &[u8] {
        &self.bytes[self.at..]
    }
}

impl std::io::Read for Peer {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut end = self.bytes.len();
        if let Some(f) = self.fail_after {
            if self.at >= f {
                return Err(std::io::Error::other("connection reset"));
            }
            end = end.min(f);
        }
        if let Some((s, stalled, go)) = &self.stall {
            if self.at == *s {
                let _ = stalled.send(());
                let _ = go.recv();
                self.stall = None;
            } else if self.at < *s {
                end = end.min(*s);
            }
        }
        let n = buf.len().min(end - self.at);
        buf[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[tokio::test(flavor = "current_thread")]
async fn records_move_through_streams_handed_to_the_buffers() {
    for compression in [Compression::Lz4, Compression::None] {
        let (_dirs, a, b) = pair(compression, Compression::None);
        for (k, v) in values() {
            a.insert(k, v).unwrap();
            if k % 2 == 0 {
                a.evict(1 << 30);
                a.flush().await.unwrap();
            }
        }
        let resident = values()
            .iter()
            .filter(|(k, _)| a.try_pin(k).is_some())
            .count() as u64;
        let mut wire = Vec::new();
        let mut sent = 0;
        for (k, _) in values() {
            let (w, bytes) = a.send_record(&k, wire).await.unwrap();
            wire = w;
            sent += bytes.expect("present");
            assert_eq!(wire.len() as u64, sent, "key {k}: bytes as written");
        }
        // An absent key writes nothing and gives the writer back.
        let (w, bytes) = a.send_record(&99, wire).await.unwrap();
        assert_eq!(bytes, None);
        wire = w;
        assert_eq!(wire.len() as u64, sent);
        let sa = a.stats();
        assert_eq!(sa.records_sent_total, 5, "{sa:?}");
        assert_eq!(sa.records_sent_encoded_total, resident, "{sa:?}");
        assert_eq!(sa.unspill_count_total, 0, "nothing read back: {sa:?}");
        // The same bytes as the whole-record calls make, and as the
        // blocking form writes.
        assert_eq!(wire, wire_of(&a));
        let mut blocking = Vec::new();
        for (k, _) in values() {
            let before = blocking.len() as u64;
            let bytes = a.write_record_to(&k, &mut blocking).unwrap();
            assert_eq!(bytes, Some(blocking.len() as u64 - before), "key {k}");
        }
        assert_eq!(a.write_record_to(&99, &mut blocking).unwrap(), None);
        assert_eq!(blocking, wire);
        wire.extend_from_slice(b"next");
        let mut peer = Peer::new(wire);
        for (k, _) in values() {
            peer = b.receive_record(k, peer).await.unwrap();
        }
        assert_eq!(peer.rest(), b"next", "the reader stands after the records");
        let s = b.stats();
        assert_eq!(s.disk_count, 5, "{s:?}");
        assert_eq!(s.memory_bytes, 0, "nothing decoded on receipt: {s:?}");
        assert_eq!(s.records_received_total, 5, "{s:?}");
        assert_eq!(s.records_received_bytes_total, sent, "{s:?}");
        b.validate().unwrap();
        for (k, v) in values() {
            assert_eq!(*b.pin(&k).await.unwrap().unwrap(), v, "key {k}");
        }
        b.validate().unwrap();
    }
}

#[tokio::test(flavor = "current_thread")]
async fn damaged_or_broken_handed_over_streams_insert_nothing_and_release_their_space() {
    let (_dir, b, good) = a_buffer_and_a_large_record();
    b.insert(7, value(70, 100)).unwrap();
    b.evict(1 << 30);
    b.flush().await.unwrap();
    let before = b.stats();
    assert_eq!(before.disk_count, 1, "the old value is on disk: {before:?}");
    let bad = damaged(&good, 1 << 20);
    for (what, bytes) in bad {
        let e = b
            .receive_record(7, Peer::new(bytes))
            .await
            .expect_err(&what);
        assert_corrupt(&e, 7);
    }
    // The reader's own failure, before and after the write began.
    for left in [10, 3 << 19] {
        let mut peer = Peer::new(good.clone());
        peer.fail_after = Some(left);
        let e = b.receive_record(7, peer).await.expect_err("reader failed");
        assert!(matches!(e, Error::Io { .. }), "{e}");
        let text = format!("{e} {:?}", std::error::Error::source(&e));
        assert!(text.contains("connection reset"), "{text}");
        assert!(text.contains("key 7"), "{text}");
    }
    assert_eq!(
        *b.pin(&7).await.unwrap().unwrap(),
        value(70, 100),
        "old value kept"
    );
    b.flush().await.unwrap();
    let s = b.stats();
    assert_eq!(
        (s.disk_count, s.disk_bytes),
        (before.disk_count, before.disk_bytes),
        "refused bytes released: {s:?}"
    );
    assert_eq!(s.records_received_total, 0, "{s:?}");
    b.validate().unwrap();
    // The same buffer takes the good stream afterwards.
    b.receive_record(7, Peer::new(good)).await.unwrap();
    assert_eq!(*b.pin(&7).await.unwrap().unwrap(), value(1, 5 << 19));
    b.flush().await.unwrap();
    let s = b.stats();
    assert_eq!(s.disk_count, 1, "the old record released: {s:?}");
    b.validate().unwrap();
}

/// A peer that stops sending holds up its own transfer only: with a single
/// IO thread, spills and reads go on meanwhile; the key is not in until
/// the record is whole, and a key replaced meanwhile takes the received
/// record when it is in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_peer_holds_up_no_disk_io_and_inserts_only_when_whole() {
    let (_dir, _, good) = a_buffer_and_a_large_record();
    let tb = tempfile::tempdir().unwrap();
    let b: Buf = SpillBuffer::builder(tb.path())
        .memory_target(1 << 20)
        .io_threads(1)
        .build()
        .unwrap();
    b.insert(7, value(70, 100)).unwrap();
    let (peer, stalled, go) = Peer::stalling(good, 1 << 20);
    let receiving = b.receive_record(7, peer);
    stalled.recv().unwrap();
    // Spills and reads on the only IO thread while the peer is stalled.
    for k in 0..8u64 {
        b.insert(100 + k, value(k, 300 << 10)).unwrap();
    }
    b.evict(1 << 30);
    // Back-pressure waits for the writes to bring memory within the limit
    // (the target, 1 MiB): at least 5 of the 8 values of 300 KiB. A pin
    // alone would not wait: a value being written is still in memory.
    b.insert_async(200, value(0, 100)).await.unwrap();
    let spilled = b.stats().spill_count_total;
    assert!(
        spilled >= 5,
        "{spilled} values written while the peer stalls"
    );
    for k in 0..8u64 {
        assert_eq!(
            *b.pin(&(100 + k)).await.unwrap().unwrap(),
            value(k, 300 << 10)
        );
    }
    assert_eq!(
        *b.pin(&7).await.unwrap().unwrap(),
        value(70, 100),
        "not in until whole"
    );
    // Replaced meanwhile: the received record replaces the new value.
    b.insert(7, value(77, 100)).unwrap();
    go.send(()).unwrap();
    let peer = receiving.await.unwrap();
    assert!(peer.rest().is_empty());
    assert_eq!(*b.pin(&7).await.unwrap().unwrap(), value(1, 5 << 19));
    b.flush().await.unwrap();
    // Every write queued while the peer stalled went through.
    assert!(b.stats().spill_count_total >= 8);
    b.validate().unwrap();
}

/// Dropping the future does not cancel the transfer: `flush` waits for it,
/// and the key is in once the peer has sent the rest. Dropping the buffer
/// while a peer is stalled does not wait for the peer.
#[test]
fn a_dropped_stream_future_still_inserts_and_a_stalled_one_does_not_hold_up_drop() {
    let (_dir, b, good) = a_buffer_and_a_large_record();
    let (peer, stalled, go) = Peer::stalling(good.clone(), 100);
    drop(b.receive_record(7, peer));
    stalled.recv().unwrap();
    assert!(!b.contains_key(&7));
    go.send(()).unwrap();
    b.flush_blocking().unwrap();
    assert_eq!(*b.get(&7).unwrap().unwrap(), value(1, 5 << 19));
    b.validate().unwrap();

    let (peer, stalled, go) = Peer::stalling(good, 1 << 20);
    let receiving = b.receive_record(8, peer);
    stalled.recv().unwrap();
    drop(b);
    go.send(()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // Inserted into a buffer that is gone, or refused: either way an
    // answer, not a hang.
    let _ = rt.block_on(receiving);
}

/// A send takes effect when it finds the key's record on disk: a key
/// removed or replaced while its record is being read and written (the
/// reads held here, each record of several pieces in a file of its own)
/// still sends, whole, the value it had, even though the removed key's file
/// dies meanwhile; one removed before the send began sends nothing, one
/// replaced before sends the new value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_removed_or_replaced_while_its_record_is_sent_still_sends_what_it_had() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, faults) = with_faults(
        SpillBuffer::builder(tmp.path())
            .io_threads(2)
            .segment_size(256 << 10),
    );
    for k in 1..=4 {
        a.insert(k, value(k, 600 << 10)).unwrap();
    }
    a.evict(1 << 30);
    a.flush().await.unwrap();
    let files = a.stats().disk_count;
    assert_eq!(files, 4);
    faults.hold_reads(true);
    let removed = a.send_record(&1, Vec::new());
    let replaced = a.send_record(&2, Vec::new());
    faults.wait_until_held(2);
    assert!(a.remove(&1));
    a.insert(2, value(22, 700)).unwrap();
    assert!(a.remove(&3));
    a.insert(4, value(44, 700)).unwrap();
    faults.hold_reads(false);
    let tb = tempfile::tempdir().unwrap();
    let b = buffer(tb.path(), Compression::Lz4);
    for (k, sent, want) in [
        (1, removed, value(1, 600 << 10)),
        (2, replaced, value(2, 600 << 10)),
    ] {
        let (wire, bytes) = sent.await.unwrap();
        assert_eq!(bytes, Some(wire.len() as u64));
        b.receive_record(k, Peer::new(wire)).await.unwrap();
        assert!(*b.pin(&k).await.unwrap().unwrap() == want, "key {k}");
    }
    let (wire, bytes) = a.send_record(&3, Vec::new()).await.unwrap();
    assert_eq!((wire.len(), bytes), (0, None), "nothing written");
    let (wire, _) = a.send_record(&4, Vec::new()).await.unwrap();
    b.receive_record(4, Peer::new(wire)).await.unwrap();
    assert_eq!(*b.pin(&4).await.unwrap().unwrap(), value(44, 700));
    a.flush().await.unwrap();
    assert_eq!(*a.get(&2).unwrap().unwrap(), value(22, 700));
    assert!(!a.contains_key(&1));
    a.validate().unwrap();
    b.validate().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_failing_writer_is_an_error_naming_the_key() {
    struct Broken;
    impl std::io::Write for Broken {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("broken pipe"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let a = buffer(tmp.path(), Compression::Lz4);
    a.insert(3, value(3, 5000)).unwrap();
    a.evict(1 << 30);
    a.flush().await.unwrap();
    let e = a
        .send_record(&3, Broken)
        .await
        .err()
        .expect("writer failed");
    assert!(matches!(e, Error::Io { .. }), "{e}");
    let text = format!("{e} {:?}", std::error::Error::source(&e));
    assert!(
        text.contains("broken pipe") && text.contains("key 3"),
        "{text}"
    );
    // The key is untouched.
    assert_eq!(*a.pin(&3).await.unwrap().unwrap(), value(3, 5000));
    a.validate().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_record_gives_the_values_encoding_without_decoding_it() {
    for compression in [Compression::Lz4, Compression::None] {
        let dir = tempfile::tempdir().unwrap();
        let a = buffer(dir.path(), compression);
        for (k, v) in values() {
            a.insert(k, v).unwrap();
        }
        // From memory (encoded, or the value's own memory) ...
        for (k, v) in values() {
            let rec = a.record(&k).await.unwrap().expect("present");
            assert_eq!(&*rec.encoded().unwrap(), &v[..], "key {k} from memory");
        }
        // ... and from disk, as stored (compressed or not).
        a.evict(1 << 30);
        a.flush().await.unwrap();
        for (k, v) in values() {
            let rec = a.record(&k).await.unwrap().expect("present");
            assert_eq!(&*rec.encoded().unwrap(), &v[..], "key {k} from disk");
            // Through the wire too.
            let back = Record::from_vec(rec.into_vec());
            assert_eq!(&*back.encoded().unwrap(), &v[..], "key {k} received");
        }
        assert_eq!(a.stats().unspill_count_total, 0);
        // A damaged record is refused, wherever the damage is.
        let good = a.record(&4).await.unwrap().unwrap().into_vec();
        for at in [0, 40, good.len() / 2, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            let e = Record::from_vec(bad).encoded().unwrap_err();
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::InvalidData,
                "flip at {at}: {e}"
            );
        }
        let e = Record::from_vec(good[..good.len() - 1].to_vec())
            .encoded()
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    }
}
