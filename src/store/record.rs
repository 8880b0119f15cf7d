//! The on-disk record: a fixed 32-byte header followed by the payload.
//! docs/format.md is the reference for these bytes; change both together.
//!
//! ```text
//! offset size field
//!      0    4 magic "SPR1"
//!      4    1 codec tag (0 raw, 1 lz4 block)
//!      5    3 reserved, zero
//!      8    8 stored_len: payload bytes that follow the header (u64 LE)
//!     16    8 raw_len: encoded value length before compression (u64 LE)
//!     24    4 crc32 of the payload (u32 LE)
//!     28    4 crc32 of header bytes 0..28 (u32 LE)
//! ```

use super::codec::Codec;

/// Bytes in a record header.
pub(crate) const HEADER: usize = 32;
const MAGIC: [u8; 4] = *b"SPR1";

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
    let crc = crc32fast::hash(payload);
    seal_header_crc(head, codec, payload.len() as u64, raw_len, crc);
}

/// Fill the header `head` for a payload written as `pieces`, one after
/// another, from memory elsewhere (a value handed over in pieces).
pub(crate) fn seal_header_pieces<'a>(
    head: &mut [u8],
    codec: Codec,
    pieces: impl IntoIterator<Item = &'a [u8]>,
    raw_len: u64,
) {
    let mut crc = crc32fast::Hasher::new();
    let mut len = 0u64;
    for p in pieces {
        crc.update(p);
        len += p.len() as u64;
    }
    seal_header_crc(head, codec, len, raw_len, crc.finalize());
}

/// Fill the header `head` for a payload of `stored_len` bytes whose
/// checksum the caller computed (piece by piece, as it wrote them).
pub(crate) fn seal_header_crc(
    head: &mut [u8],
    codec: Codec,
    stored_len: u64,
    raw_len: u64,
    payload_crc: u32,
) {
    head[0..4].copy_from_slice(&MAGIC);
    head[4] = codec as u8;
    head[5..8].fill(0);
    head[8..16].copy_from_slice(&stored_len.to_le_bytes());
    head[16..24].copy_from_slice(&raw_len.to_le_bytes());
    head[24..28].copy_from_slice(&payload_crc.to_le_bytes());
    let hcrc = crc32fast::hash(&head[..28]);
    head[28..32].copy_from_slice(&hcrc.to_le_bytes());
}

/// The payload checksum a verified header carries, for a reader that
/// checks the payload piece by piece.
pub(crate) fn payload_crc(head: &[u8]) -> u32 {
    u32_at(head, 24)
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
    if head[0..4] != MAGIC {
        return Err("bad record magic".into());
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
    if crc32fast::hash(body) != u32_at(buf, 24) {
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
        assert_eq!(payload_crc(&head), crc32fast::hash(b"split payload"));
    }

    #[test]
    fn raw_length_mismatch_is_rejected() {
        let buf = record(b"abc", Codec::Raw, 4);
        assert!(open(&buf).unwrap_err().contains("raw_len"));
    }
}
