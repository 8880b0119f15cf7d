//! Records of the first format (magic `SPR1`, CRC-32 payload checksums),
//! as a buffer of an older release sends them, are taken in and read
//! back, on every read path (small and large, raw and lz4, in place and
//! through scratch); a damaged one is refused naming the key; a record
//! of an unknown format version is refused naming its magic.

mod common;

use common::value;
use spillbuffer::{Compression, Error, Record, SpillBuffer};

type Buf = SpillBuffer<u64, Vec<u8>>;

/// Frame header bytes before the record header (docs/format.md).
const FRAME: usize = 32;

fn buffer(dir: &std::path::Path) -> Buf {
    SpillBuffer::builder(dir)
        .memory_target(64 << 20)
        .compression(Compression::Lz4)
        .build()
        .unwrap()
}

/// Rewrite the record header inside transfer bytes `t` as the first
/// format's: magic `SPR1`, CRC-32 of the payload, header checksum anew.
fn as_first_format(mut t: Vec<u8>) -> Vec<u8> {
    let payload_crc = crc32fast::hash(&t[2 * FRAME..]);
    let head = &mut t[FRAME..2 * FRAME];
    assert_eq!(&head[..4], b"SPR2", "written in the current format");
    head[..4].copy_from_slice(b"SPR1");
    head[24..28].copy_from_slice(&payload_crc.to_le_bytes());
    let hcrc = crc32fast::hash(&head[..28]);
    head[28..32].copy_from_slice(&hcrc.to_le_bytes());
    t
}

fn counter(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i / 64) as u8).collect()
}

#[tokio::test(flavor = "current_thread")]
async fn first_format_records_read_back_and_damage_is_caught() {
    let (ta, tb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (buffer(ta.path()), buffer(tb.path()));
    // Small raw, small lz4-sized counter, large raw (in-place read), large
    // lz4 (read through scratch).
    let values = [
        (1, value(1, 100)),
        (2, counter(20_000)),
        (3, value(3, 600 << 10)),
        (4, counter(600 << 10)),
    ];
    for (k, v) in &values {
        a.insert(*k, v.clone()).unwrap();
    }
    a.evict(1 << 30);
    a.flush().await.unwrap();
    for (k, _) in &values {
        let t = a.record(k).await.unwrap().expect("present").into_vec();
        let old = as_first_format(t);
        // Damaged: one payload byte flipped.
        let mut bad = old.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0x10;
        match b.insert_record(100 + k, Record::from_vec(bad)).await {
            Err(Error::Corrupt { key, detail, .. }) => {
                assert_eq!(key, (100 + k).to_string());
                assert!(detail.contains("payload checksum"), "{detail}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        b.insert_record(*k, Record::from_vec(old)).await.unwrap();
    }
    b.evict(1 << 30);
    b.flush().await.unwrap();
    assert_eq!(b.stats().memory_bytes, 0);
    for (k, v) in &values {
        assert_eq!(&*b.get(k).unwrap().unwrap(), v, "key {k}, blocking get");
    }
    b.evict(1 << 30);
    b.flush().await.unwrap();
    for (k, v) in &values {
        assert_eq!(&*b.pin(k).await.unwrap().unwrap(), v, "key {k}, pin");
    }
    b.evict(1 << 30);
    b.flush().await.unwrap();
    for (k, _) in &values {
        // A spilled record is sent on as it is stored: still the first
        // format.
        let t = b.record(k).await.unwrap().expect("present").into_vec();
        assert_eq!(&t[FRAME..FRAME + 4], b"SPR1", "key {k}");
    }
    b.validate().unwrap();

    // An unknown version: refused, its magic named.
    let mut t = a.record(&1).await.unwrap().unwrap().into_vec();
    t[FRAME + 3] = b'9';
    match b.insert_record(9, Record::from_vec(t)).await {
        Err(Error::Corrupt { detail, .. }) => assert!(detail.contains("SPR9"), "{detail}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}
