//! [`Record`]: a key's stored record as bytes, framed for a transfer to
//! another buffer (or a file, or a peer) without decoding the value.
//!
//! The bytes are a 32-byte transfer frame header followed by the record
//! exactly as a segment holds it (its own 32-byte header, then the payload,
//! lz4-compressed or not). docs/format.md ("Transfer frame") is the
//! reference for these bytes; change both together. Every byte is covered
//! by a checksum: the frame header by its own CRC, the record header and
//! payload by theirs.
//!
//! ```text
//! offset size field
//!      0    4 magic "SPTX"
//!      4    1 frame version (1)
//!      5    3 reserved, zero
//!      8    8 record_len: bytes of the record that follow this header (u64 LE)
//!     16    8 weight: the value's weight as the sending buffer counted it (u64 LE)
//!     24    4 reserved, zero
//!     28    4 crc32 of header bytes 0..28 (u32 LE)
//! ```

use crate::store::{codec, record as stored, spare};
use std::borrow::Cow;
use std::fmt;
use std::io::{self, Read, Write};

/// Bytes in a transfer frame header.
pub(crate) const FRAME: usize = 32;
const MAGIC: [u8; 4] = *b"SPTX";
/// The frame version this build writes and reads.
const VERSION: u8 = 1;
/// A weight above this is refused: no value is that large, and the gauges
/// add weights as signed numbers.
pub(crate) const MAX_WEIGHT: u64 = 1 << 48;

/// A key's stored record as bytes, ready to be written to a socket or a
/// file and inserted into another buffer with
/// [`SpillBuffer::insert_record`](crate::SpillBuffer::insert_record),
/// without the value being decoded on either side.
///
/// Made by [`SpillBuffer::record`](crate::SpillBuffer::record) (the
/// sending side), or from bytes that came from one: [`Record::from_vec`],
/// [`Record::read_from`]. The bytes are versioned and checksummed end to
/// end (docs/format.md, "Transfer frame"): a damaged, truncated or
/// foreign transfer is refused by `insert_record` with
/// [`Error::Corrupt`](crate::Error::Corrupt), or at the latest when the
/// value is read back, never turned into a wrong value.
///
/// The bytes may live in up to two pieces (a header, and a value's own
/// memory when it was sent from memory without a copy): write them with
/// [`Record::write_to`], or piece by piece from [`Record::as_slices`].
/// A record sent from a value in memory without a copy keeps that value
/// pinned in its buffer until the record is dropped.
pub struct Record {
    /// The first bytes: the frame header, and, when the payload is a
    /// value's own memory, the record header after it. `head_len` of them
    /// are used (0 when the whole frame is in `body`).
    head: [u8; 2 * FRAME],
    head_len: u8,
    body: Body,
}

enum Body {
    Bytes(Vec<u8>),
    /// A value's encoding, borrowed from the value (kept pinned).
    Value(Box<dyn Encoding>),
}

/// Something that holds a value's encoded form in its own memory.
pub(crate) trait Encoding: Send + Sync + 'static {
    /// The encoded bytes; the same slice at every call.
    fn bytes(&self) -> &[u8];
}

impl Record {
    /// Bytes in the frame header that starts every record, for a reader
    /// that reads the header first and then the rest
    /// ([`Record::expected_len`]).
    pub const HEADER_LEN: usize = FRAME;

    /// `record` (a record header and its payload, as a segment holds
    /// them) behind a frame header for a value of `weight`.
    pub(crate) fn framed(weight: u64, record: Vec<u8>) -> Record {
        let mut head = [0u8; 2 * FRAME];
        seal_frame(&mut head[..FRAME], record.len() as u64, weight);
        Record {
            head,
            head_len: FRAME as u8,
            body: Body::Bytes(record),
        }
    }

    /// A record whose payload is `value`'s own memory, behind the record
    /// header `record_head`.
    pub(crate) fn in_place(
        weight: u64,
        record_head: &[u8; FRAME],
        value: Box<dyn Encoding>,
    ) -> Record {
        let mut head = [0u8; 2 * FRAME];
        let record_len = (FRAME + value.bytes().len()) as u64;
        seal_frame(&mut head[..FRAME], record_len, weight);
        head[FRAME..].copy_from_slice(record_head);
        Record {
            head,
            head_len: (2 * FRAME) as u8,
            body: Body::Value(value),
        }
    }

    /// A record from bytes received whole (the frame header first). Not
    /// checked here: [`SpillBuffer::insert_record`](crate::SpillBuffer::insert_record)
    /// checks it and names the key in its error.
    pub fn from_vec(bytes: Vec<u8>) -> Record {
        Record {
            head: [0u8; 2 * FRAME],
            head_len: 0,
            body: Body::Bytes(bytes),
        }
    }

    /// The total length of a record, from its first [`Record::HEADER_LEN`]
    /// bytes: for a reader that reads the header, then exactly the rest
    /// (an async socket, say), then makes the record with
    /// [`Record::from_vec`]. Checking the header (magic, version,
    /// checksum) first means a garbled length is refused rather than
    /// allocated for.
    ///
    /// # Errors
    ///
    /// `InvalidData`, with the reason, if `header` is not a valid frame
    /// header of this version.
    pub fn expected_len(header: &[u8]) -> io::Result<usize> {
        let (record_len, _) = parse_frame(header).map_err(invalid)?;
        usize::try_from(record_len)
            .ok()
            .and_then(|n| n.checked_add(FRAME))
            .ok_or_else(|| invalid(format!("a record of {record_len} bytes")))
    }

    /// Read one record from `reader`: its header, checked, then exactly
    /// the length it announces. The reader may go on with whatever
    /// follows (several records back to back on one socket).
    ///
    /// # Errors
    ///
    /// `InvalidData` if the header is not a valid frame header;
    /// `UnexpectedEof` if the stream ends inside the record; any error of
    /// the reader. The rest of the record is checked by `insert_record`.
    pub fn read_from<R: Read + ?Sized>(reader: &mut R) -> io::Result<Record> {
        let mut head = [0u8; FRAME];
        reader.read_exact(&mut head)?;
        let len = Record::expected_len(&head)?;
        let mut bytes = spare::take(len);
        bytes[..FRAME].copy_from_slice(&head);
        reader.read_exact(&mut bytes[FRAME..])?;
        Ok(Record::from_vec(bytes))
    }

    /// The bytes, in order, as (at most) two pieces; the second may be
    /// empty. Their concatenation is the record.
    pub fn as_slices(&self) -> [&[u8]; 2] {
        let body = match &self.body {
            Body::Bytes(v) => v.as_slice(),
            Body::Value(e) => e.bytes(),
        };
        [&self.head[..self.head_len as usize], body]
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        let [a, b] = self.as_slices();
        a.len() + b.len()
    }

    /// Whether there are no bytes at all (only for an empty
    /// [`Record::from_vec`]: a real record has at least its headers).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Write every byte to `w`, piece by piece.
    pub fn write_to<W: Write + ?Sized>(&self, w: &mut W) -> io::Result<()> {
        for piece in self.as_slices() {
            w.write_all(piece)?;
        }
        Ok(())
    }

    /// The value's encoding, as [`Spill::encode`](crate::Spill::encode)
    /// wrote it, without decoding the value: every header and the
    /// payload checked against their checksums and lengths, and the
    /// payload decompressed if it was stored compressed. For a host that
    /// passes a value on in its encoded form (a Dask worker sends a peer
    /// the frames its serializer made); `Spill::decode` of these bytes
    /// gives the value back.
    ///
    /// Borrowed from the record when the value was stored raw (no copy),
    /// a new vector of the encoding's length when it was compressed.
    ///
    /// # Errors
    ///
    /// `InvalidData`, with the reason, if the record is damaged: a header
    /// or the payload fails its checksum, a length disagrees, or the
    /// payload does not decompress to the length its header gives.
    pub fn encoded(&self) -> io::Result<Cow<'_, [u8]>> {
        let (frame, rest) = split_head(self.as_slices())
            .ok_or_else(|| invalid("record shorter than its frame header".into()))?;
        let (record_len, _weight) = parse_frame(&frame).map_err(invalid)?;
        let (head, [a, b]) = split_head(rest)
            .ok_or_else(|| invalid("record shorter than its record header".into()))?;
        let (codec, stored_len, raw_len) = stored::parse_header(&head).map_err(invalid)?;
        // The payload is one piece for every record this crate makes; a
        // record built otherwise is joined first.
        let payload: Cow<'_, [u8]> = if a.is_empty() {
            Cow::Borrowed(b)
        } else {
            Cow::Owned([a, b].concat())
        };
        let len = payload.len() as u64;
        if len != stored_len || record_len != stored::HEADER as u64 + stored_len {
            return Err(invalid(format!(
                "payload is {len} bytes, record header says {stored_len}, frame {record_len} with its header"
            )));
        }
        if !stored::payload_ok(&head, &payload) {
            return Err(invalid("payload checksum mismatch".into()));
        }
        match codec {
            codec::Codec::Raw => Ok(payload),
            codec::Codec::Lz4 => {
                let raw_len = usize::try_from(raw_len)
                    .map_err(|_| invalid(format!("an encoding of {raw_len} bytes")))?;
                let mut out = vec![0u8; raw_len];
                codec::decompress_exact(&payload, &mut out).map_err(invalid)?;
                Ok(Cow::Owned(out))
            }
        }
    }

    /// The bytes as one vector (a copy only when they were in two pieces).
    pub fn into_vec(mut self) -> Vec<u8> {
        match &mut self.body {
            Body::Bytes(v) if self.head_len == 0 => std::mem::take(v),
            _ => {
                let [a, b] = self.as_slices();
                let mut out = Vec::with_capacity(a.len() + b.len());
                out.extend_from_slice(a);
                out.extend_from_slice(b);
                out
            }
        }
    }
}

impl Drop for Record {
    /// A record's buffer is kept for the next record read or received
    /// (`store::spare`), rather than freed.
    fn drop(&mut self) {
        if let Body::Bytes(v) = &mut self.body {
            spare::give(std::mem::take(v));
        }
    }
}

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Record")
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

fn invalid(detail: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, detail)
}

/// Fill the frame header `head` for a record of `record_len` bytes.
pub(crate) fn seal_frame(head: &mut [u8], record_len: u64, weight: u64) {
    head[0..4].copy_from_slice(&MAGIC);
    head[4] = VERSION;
    head[5..8].fill(0);
    head[8..16].copy_from_slice(&record_len.to_le_bytes());
    head[16..24].copy_from_slice(&weight.to_le_bytes());
    head[24..28].fill(0);
    let crc = crc32fast::hash(&head[..28]);
    head[28..32].copy_from_slice(&crc.to_le_bytes());
}

/// Check a frame header and return `(record_len, weight)`. Never panics,
/// whatever the bytes.
pub(crate) fn parse_frame(head: &[u8]) -> Result<(u64, u64), String> {
    if head.len() < FRAME {
        return Err(format!(
            "transfer is {} bytes, shorter than its frame header",
            head.len()
        ));
    }
    if head[0..4] != MAGIC {
        return Err("not a spillbuffer transfer (bad frame magic)".into());
    }
    // The version before the checksum: another version may lay its header
    // out otherwise, and the message should say so.
    if head[4] != VERSION {
        return Err(format!(
            "transfer frame version {}, this build reads version {VERSION}",
            head[4]
        ));
    }
    let le64 = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(head[28..32].try_into().expect("4 bytes"));
    if crc32fast::hash(&head[..28]) != crc {
        return Err("frame header checksum mismatch".into());
    }
    let (record_len, weight) = (le64(8), le64(16));
    if record_len < FRAME as u64 {
        return Err(format!(
            "frame announces a record of {record_len} bytes, shorter than a record header"
        ));
    }
    if weight > MAX_WEIGHT {
        return Err(format!("frame announces a value weighing {weight} bytes"));
    }
    Ok((record_len, weight))
}

/// Split the first [`FRAME`] bytes off the concatenation of `p`: a copy of
/// them, and the pieces that follow. `None` if there are fewer.
pub(crate) fn split_head(p: [&[u8]; 2]) -> Option<([u8; FRAME], [&[u8]; 2])> {
    let mut head = [0u8; FRAME];
    let a = p[0].len().min(FRAME);
    head[..a].copy_from_slice(&p[0][..a]);
    let need = FRAME - a;
    if p[1].len() < need {
        return None;
    }
    head[a..].copy_from_slice(&p[1][..need]);
    Some((head, [&p[0][a..], &p[1][need..]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trips_and_refuses_every_flipped_bit() {
        let mut head = [0u8; FRAME];
        seal_frame(&mut head, 4096, 1234);
        assert_eq!(parse_frame(&head), Ok((4096, 1234)));
        for i in 0..FRAME * 8 {
            let mut bad = head;
            bad[i / 8] ^= 1 << (i % 8);
            assert!(parse_frame(&bad).is_err(), "flip of bit {i} went unnoticed");
        }
    }

    #[test]
    fn another_version_is_named() {
        let mut head = [0u8; FRAME];
        seal_frame(&mut head, 64, 0);
        head[4] = 2;
        let e = parse_frame(&head).unwrap_err();
        assert!(e.contains("version 2"), "{e}");
    }

    #[test]
    fn absurd_lengths_and_weights_are_refused() {
        let mut head = [0u8; FRAME];
        seal_frame(&mut head, 8, 0);
        assert!(parse_frame(&head).unwrap_err().contains("shorter"));
        seal_frame(&mut head, 64, MAX_WEIGHT + 1);
        assert!(parse_frame(&head).unwrap_err().contains("weighing"));
        seal_frame(&mut head, u64::MAX, 0);
        assert!(Record::expected_len(&head).is_err());
    }

    #[test]
    fn split_head_works_across_any_cut() {
        let bytes: Vec<u8> = (0..80u8).collect();
        for cut in 0..=bytes.len() {
            let (a, b) = bytes.split_at(cut);
            let (head, rest) = split_head([a, b]).unwrap();
            assert_eq!(&head[..], &bytes[..FRAME]);
            assert_eq!([rest[0], rest[1]].concat(), &bytes[FRAME..]);
        }
        assert!(split_head([&bytes[..10], &bytes[10..20]]).is_none());
    }

    #[test]
    fn pieces_read_back_whole() {
        struct Owned(Vec<u8>);
        impl Encoding for Owned {
            fn bytes(&self) -> &[u8] {
                &self.0
            }
        }
        let rec = Record::in_place(7, &[9u8; FRAME], Box::new(Owned(vec![5u8; 100])));
        assert_eq!(rec.len(), 2 * FRAME + 100);
        let mut wire = Vec::new();
        rec.write_to(&mut wire).unwrap();
        assert_eq!(wire, rec.into_vec());
        let back = Record::read_from(&mut wire.as_slice()).unwrap();
        assert_eq!(back.into_vec(), wire);
        // A stream that ends inside the record.
        let e = Record::read_from(&mut &wire[..wire.len() - 1]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
