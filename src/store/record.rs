//! The on-disk record: a fixed 32-byte header followed by the payload.
//! docs/format.md is the reference for these bytes; change both together.
//!
//! ```text
//! offset size field
//!      0    4 magic "SPR2" (written) or "SPR1" (still read)
//!      4    1 codec tag (0 raw, 1 lz4 block)
//!      5    3 reserved, zero
//!      8    8 stored_len: payload bytes that follow the header (u64 LE)
//!     16    8 raw_len: encoded value length before compression (u64 LE)
//!     24    4 payload checksum (u32 LE): SPR2 low 32 bits of XXH3-64,
//!             SPR1 CRC-32
//!     28    4 crc32 of header bytes 0..28 (u32 LE)
//! ```

use super::checksum::{Stream, Sum};
use super::codec::Codec;

/// Bytes in a record header.
pub(crate) const HEADER: usize = 32;
/// The magic of the records this version writes: XXH3 payload checksums.
const MAGIC: [u8; 4] = *b"SPR2";
/// The magic of the first format: CRC-32 payload checksums. Still read.
const MAGIC_V1: [u8; 4] = *b"SPR1";

/// A decoded, verified view of a record.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Record<'a> {
    pub codec: Codec,
    pub raw_len: u64,
    pub payload: &'a [u8],
}

/// Fill the header in `buf[..HEADER]` for the payload in `buf[HEADER..]`.
pub(crate) fn seal(buf: &mut [u8], codec: Codec, raw_len: u64) {
    let (head, payload) = buf.split_at_mut(HEADER);
    seal_header(head, codec, payload, raw_len);
}

/// Fill the header `head` for `payload`, which is written after it but
/// lives elsewhere in memory (a value written from its own memory).
pub(crate) fn seal_header(head: &mut [u8], codec: Codec, payload: &[u8], raw_len: u64) {
    let sum = Sum::Xxh3.of(payload);
    seal_header_sum(head, codec, payload.len() as u64, raw_len, sum);
}

/// Fill the header `head` for a payload written as `pieces`, one after
/// another, from memory elsewhere (a value handed over in pieces).
pub(crate) fn seal_header_pieces<'a>(
    head: &mut [u8],
    codec: Codec,
    pieces: impl IntoIterator<Item = &'a [u8]>,
    raw_len: u64,
) {
    let mut sum = Sum::Xxh3.stream();
    let mut len = 0u64;
    for p in pieces {
        sum.update(p);
        len += p.len() as u64;
    }
    seal_header_sum(head, codec, len, raw_len, sum.finish());
}

/// Fill the header `head` for a payload of `stored_len` bytes whose
/// checksum ([`Sum::Xxh3`]) the caller computed.
fn seal_header_sum(head: &mut [u8], codec: Codec, stored_len: u64, raw_len: u64, payload_sum: u32) {
    seal_versioned(head, MAGIC, codec, stored_len, raw_len, payload_sum);
}

/// Fill a header of the format `magic` names.
fn seal_versioned(
    head: &mut [u8],
    magic: [u8; 4],
    codec: Codec,
    stored_len: u64,
    raw_len: u64,
    payload_sum: u32,
) {
    head[0..4].copy_from_slice(&magic);
    head[4] = codec as u8;
    head[5..8].fill(0);
    head[8..16].copy_from_slice(&stored_len.to_le_bytes());
    head[16..24].copy_from_slice(&raw_len.to_le_bytes());
    head[24..28].copy_from_slice(&payload_sum.to_le_bytes());
    let hcrc = crc32fast::hash(&head[..28]);
    head[28..32].copy_from_slice(&hcrc.to_le_bytes());
}

/// The payload checksum a verified header carries.
fn payload_sum(head: &[u8]) -> u32 {
    u32_at(head, 24)
}

/// The checksum function of a verified header's format.
fn sum_of(head: &[u8]) -> Sum {
    if head[0..4] == MAGIC_V1 {
        Sum::Crc32
    } else {
        Sum::Xxh3
    }
}

/// Does `payload` match the checksum in the verified header `head`?
pub(crate) fn payload_ok(head: &[u8], payload: &[u8]) -> bool {
    sum_of(head).of(payload) == payload_sum(head)
}

/// A check of the payload of the verified header `head`, fed piece by
/// piece as the pieces are read.
pub(crate) struct PayloadCheck {
    sum: Stream,
    want: u32,
}

impl PayloadCheck {
    pub(crate) fn new(head: &[u8]) -> Self {
        PayloadCheck {
            sum: sum_of(head).stream(),
            want: payload_sum(head),
        }
    }

    pub(crate) fn update(&mut self, piece: &[u8]) {
        self.sum.update(piece);
    }

    /// Did the pieces match the header's checksum?
    pub(crate) fn ok(self) -> bool {
        self.sum.finish() == self.want
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// Check a header alone and return `(codec, stored_len, raw_len)`.
pub(crate) fn parse_header(head: &[u8]) -> Result<(Codec, u64, u64), String> {
    if head.len() < HEADER {
        return Err(format!(
            "record is {} bytes, shorter than its header",
            head.len()
        ));
    }
    if head[0..4] != MAGIC && head[0..4] != MAGIC_V1 {
        return Err(format!(
            "bad record magic {:?} (this version reads SPR1 and SPR2)",
            String::from_utf8_lossy(&head[0..4])
        ));
    }
    if crc32fast::hash(&head[..28]) != u32_at(head, 28) {
        return Err("header checksum mismatch".into());
    }
    let codec = Codec::from_tag(head[4]).ok_or_else(|| format!("unknown codec tag {}", head[4]))?;
    let stored = u64_at(head, 8);
    let raw = u64_at(head, 16);
    if codec == Codec::Raw && raw != stored {
        return Err(format!(
            "raw record with stored_len {stored} != raw_len {raw}"
        ));
    }
    // lz4 cannot expand data by more than ~255x; a larger claim would make
    // the reader allocate for a lie.
    if codec == Codec::Lz4 && raw > stored.saturating_mul(255).saturating_add(64) {
        return Err(format!("lz4 record claims {raw} bytes from {stored}"));
    }
    Ok((codec, stored, raw))
}

/// Verify a whole record (header and payload checksums, lengths) and return
/// a view of it. Never panics, whatever the bytes.
pub(crate) fn open(buf: &[u8]) -> Result<Record<'_>, String> {
    let (codec, stored, raw_len) = parse_header(buf)?;
    let body = &buf[HEADER..];
    if body.len() as u64 != stored {
        return Err(format!(
            "payload is {} bytes, header says {stored}",
            body.len()
        ));
    }
    if !payload_ok(buf, body) {
        return Err("payload checksum mismatch".into());
    }
    Ok(Record {
        codec,
        raw_len,
        payload: body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(payload: &[u8], codec: Codec, raw_len: u64) -> Vec<u8> {
        let mut buf = vec![0u8; HEADER];
        buf.extend_from_slice(payload);
        seal(&mut buf, codec, raw_len);
        buf
    }

    #[test]
    fn round_trip() {
        let buf = record(b"hello", Codec::Raw, 5);
        let r = open(&buf).unwrap();
        assert_eq!(r.payload, b"hello");
        assert_eq!(r.codec, Codec::Raw);
        assert_eq!(r.raw_len, 5);
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let buf = record(b"some payload bytes", Codec::Raw, 18);
        for i in 0..buf.len() * 8 {
            let mut bad = buf.clone();
            bad[i / 8] ^= 1 << (i % 8);
            assert!(open(&bad).is_err(), "flip of bit {i} went unnoticed");
        }
    }

    #[test]
    fn truncated_and_extended_records_are_rejected() {
        let buf = record(b"0123456789", Codec::Raw, 10);
        for n in 0..buf.len() {
            assert!(open(&buf[..n]).is_err());
        }
        let mut longer = buf.clone();
        longer.push(0);
        assert!(open(&longer).is_err());
    }

    #[test]
    fn header_sealed_apart_matches_a_whole_record() {
        let whole = record(b"split payload", Codec::Raw, 13);
        let mut head = [0u8; HEADER];
        seal_header(&mut head, Codec::Raw, b"split payload", 13);
        assert_eq!(&whole[..HEADER], &head);
        assert_eq!(payload_sum(&head), Sum::Xxh3.of(b"split payload"));
    }

    /// A record of the first format (CRC-32 payload checksum) still opens,
    /// and a flipped bit in it is still caught; a record of an unknown
    /// version is refused by its magic, named in the error.
    #[test]
    fn first_format_records_still_open() {
        let payload = b"a record from an older release";
        let mut buf = vec![0u8; HEADER];
        buf.extend_from_slice(payload);
        let n = payload.len() as u64;
        seal_versioned(
            &mut buf[..HEADER],
            MAGIC_V1,
            Codec::Raw,
            n,
            n,
            crc32fast::hash(payload),
        );
        assert_eq!(open(&buf).unwrap().payload, payload);
        let mut check = PayloadCheck::new(&buf[..HEADER]);
        check.update(payload);
        assert!(check.ok());
        let mut bad = buf.clone();
        bad[HEADER + 3] ^= 4;
        assert!(open(&bad).unwrap_err().contains("payload checksum"));
        // The same bytes under the current magic fail: the magic says
        // which function checks the payload.
        let mut v2 = buf.clone();
        seal_versioned(
            &mut v2[..HEADER],
            MAGIC,
            Codec::Raw,
            n,
            n,
            crc32fast::hash(payload),
        );
        assert!(open(&v2).unwrap_err().contains("payload checksum"));
        let mut v3 = buf.clone();
        v3[3] = b'3';
        let e = open(&v3).unwrap_err();
        assert!(e.contains("SPR3") && e.contains("magic"), "{e}");
    }

    #[test]
    fn raw_length_mismatch_is_rejected() {
        let buf = record(b"abc", Codec::Raw, 4);
        assert!(open(&buf).unwrap_err().contains("raw_len"));
    }
}
