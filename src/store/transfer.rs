//! Records that travel between buffers without being decoded: a spilled
//! record read as stored, a value in memory encoded exactly as a spill
//! would write it (but not written), and a received record checked and
//! appended to a segment as it came. The framing around them is
//! [`crate::record`]'s; the buffer decides which source a key's record
//! comes from (`buffer::transfer`).

use super::codec::{self, Codec, Compression};
use super::put::IN_PLACE_MIN;
use super::record;
use super::spare;
use super::{DiskLoc, Store};
use crate::error::{Error, Result};
use crate::record::{parse_frame, split_head, Record};
use crate::value::Spill;
use std::fmt::Debug;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;

/// What [`Store::encode_for_transfer`] made of a value in memory.
pub(crate) enum Encoded {
    /// The whole record (header and payload) in a new buffer.
    Record(Vec<u8>),
    /// The header of a raw record whose payload is the value's own memory
    /// ([`Spill::as_encoded`]): nothing was copied.
    InPlace([u8; record::HEADER]),
}

/// A received record, its headers checked (not yet its payload).
pub(crate) struct Received<'a> {
    /// The value's weight, as the sender counted it.
    pub weight: usize,
    head: [u8; record::HEADER],
    payload: [&'a [u8]; 2],
}

/// The path a received record's errors name: it has no file yet.
pub(crate) fn transfer_path() -> PathBuf {
    PathBuf::from("(received transfer)")
}

/// Check what can be checked of `rec` without reading its payload: the
/// frame header, the record header, and that the lengths all agree.
/// Never panics, whatever the bytes.
pub(crate) fn open_received(rec: &Record) -> std::result::Result<Received<'_>, String> {
    let (frame, rest) = split_head(rec.as_slices()).ok_or_else(|| {
        format!(
            "transfer is {} bytes, shorter than its frame header",
            rec.len()
        )
    })?;
    let (record_len, weight) = parse_frame(&frame)?;
    let have = (rest[0].len() + rest[1].len()) as u64;
    if have != record_len {
        return Err(format!(
            "frame announces a record of {record_len} bytes, {have} came (truncated or extended)"
        ));
    }
    let (head, payload) = split_head(rest).ok_or("record shorter than its header")?;
    let (_, stored, _) = record::parse_header(&head)?;
    if stored.checked_add(record::HEADER as u64) != Some(record_len) {
        return Err(format!(
            "record header says {stored} payload bytes, the frame {}",
            record_len - record::HEADER as u64
        ));
    }
    Ok(Received {
        // parse_frame bounds it well below usize::MAX on 64-bit targets.
        weight: usize::try_from(weight).map_err(|_| "weight too large for this machine")?,
        head,
        payload,
    })
}

impl Received<'_> {
    /// Check the payload against the record header's checksum.
    pub(crate) fn check_payload(&self) -> std::result::Result<(), String> {
        let mut crc = crc32fast::Hasher::new();
        for p in self.payload {
            crc.update(p);
        }
        if crc.finalize() != record::payload_crc(&self.head) {
            return Err("payload checksum mismatch".into());
        }
        Ok(())
    }
}

impl<K: Clone + Debug> Store<K> {
    /// `key`'s record at `loc`, read as stored, for a transfer. Its header
    /// is checked here (a damaged disk is reported by the sender, naming
    /// the file); its payload checksum by whoever inserts it.
    pub(crate) fn read_record(&self, key: &K, loc: DiskLoc) -> Result<Vec<u8>> {
        // `read` fits it to the record's length: nothing to do when the
        // spare buffer already has it.
        let mut buf = spare::take(usize::try_from(loc.len()).unwrap_or(0));
        let path = self.read(key, loc, &mut buf)?;
        let corrupt = |detail: String| Error::Corrupt {
            key: format!("{key:?}"),
            path: path.clone(),
            detail,
        };
        let (_, stored, _) = record::parse_header(&buf).map_err(corrupt)?;
        if stored.checked_add(record::HEADER as u64) != Some(loc.len()) {
            return Err(corrupt(format!(
                "header says {stored} payload bytes, the index {}",
                loc.len() - record::HEADER as u64
            )));
        }
        Ok(buf)
    }

    /// Encode `value` into the record a spill would write for it (lz4 when
    /// it pays, under the same settings), without writing it. A large
    /// value whose memory is its encoding and that does not compress is
    /// not copied: only its header is made.
    pub(crate) fn encode_for_transfer<V: Spill>(&self, key: &K, value: &V) -> Result<Encoded> {
        let lz4 = self.compression() == Compression::Lz4;
        if let Some(bytes) = value.as_encoded().filter(|b| b.len() >= IN_PLACE_MIN) {
            if lz4 {
                if let Some(rec) = compressed(bytes) {
                    return Ok(Encoded::Record(rec));
                }
            }
            let mut head = [0u8; record::HEADER];
            record::seal_header(&mut head, Codec::Raw, bytes, bytes.len() as u64);
            return Ok(Encoded::InPlace(head));
        }
        let mut buf = vec![0u8; record::HEADER];
        let failed = |source: crate::error::BoxError| Error::Encode {
            key: format!("{key:?}"),
            source: Arc::from(source),
        };
        match catch_unwind(AssertUnwindSafe(|| value.encode(&mut buf))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(failed(e)),
            Err(_) => return Err(failed("encode panicked".into())),
        }
        if lz4 {
            if let Some(rec) = compressed(&buf[record::HEADER..]) {
                return Ok(Encoded::Record(rec));
            }
        }
        let raw_len = (buf.len() - record::HEADER) as u64;
        record::seal(&mut buf, Codec::Raw, raw_len);
        Ok(Encoded::Record(buf))
    }

    /// Append a received record, as it came, as `key`'s. Runs on the IO
    /// pool (or the caller's thread for the blocking insert). The caller
    /// has checked its payload.
    pub(crate) fn write_received(&self, key: &K, rec: &Received<'_>) -> Result<DiskLoc> {
        let mut pieces: Vec<&[u8]> = vec![&rec.head];
        pieces.extend(rec.payload.iter().copied().filter(|p| !p.is_empty()));
        self.write_pieces(key, &pieces)
    }
}

/// `raw` as a sealed lz4 record in a buffer of its own, if compressing
/// pays (the rule spills follow, `codec::compress_into`).
fn compressed(raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let n = codec::compress_into(raw, &mut out, record::HEADER)?;
    out.truncate(record::HEADER + n);
    // The compressor sized it for the worst case; a record that may be
    // kept a while should not hold twice its bytes.
    if out.capacity() > 2 * out.len() {
        out.shrink_to_fit();
    }
    record::seal(&mut out, Codec::Lz4, raw.len() as u64);
    Some(out)
}
