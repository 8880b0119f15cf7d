//! Arrow record batches (`arrow_array::RecordBatch`, feature `arrow`), in
//! Arrow's IPC stream format: the schema, the batch, the end-of-stream
//! marker, every buffer 64-byte aligned from the stream's start. The
//! format DataFusion and other Arrow engines spill in, readable by any
//! Arrow implementation. An 8-byte trailer follows the stream: a checksum
//! of the messages' metadata, so that damaged metadata (buffer offsets and
//! lengths, types) is refused before arrow's reader, which trusts it,
//! sees it; damaged data is caught by arrow's validation of the arrays or
//! is plain data, which the store's checksum covers.
//!
//! A large batch is read back into one 16-byte-aligned allocation, and its
//! arrays point into it: the read is the only copy of their data. On the
//! way out it is handed over in pieces ([`Spill::encoded_pieces`]): the
//! messages' metadata, then the arrays' own buffers, written to disk from
//! where they are, with no copy (unless lz4 compresses the record).

use super::pieces::EncodedPieces;
use super::spill::Spill;
use crate::error::BoxError;
use arrow_array::{Array, RecordBatch};
use arrow_buffer::Buffer;
use arrow_data::ArrayData;
use arrow_ipc::reader::StreamDecoder;
use arrow_ipc::writer::{IpcWriteOptions, StreamEncoder, StreamWriter};
use arrow_ipc::MetadataVersion;
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The weight is the memory the batch's arrays hold: each allocation they
/// point into counted once, at its capacity. A batch read back counts its
/// one allocation; a slice of a larger batch counts the larger one, which
/// it keeps alive.
impl Spill for RecordBatch {
    fn weight(&self) -> usize {
        let mut seen = HashSet::new();
        self.columns()
            .iter()
            .map(|c| allocations(&c.to_data(), &mut seen))
            .sum()
    }

    fn encode(&self, out: &mut Vec<u8>) -> Result<(), BoxError> {
        // Written straight from the arrays' buffers into `out` (arrow-ipc
        // makes no body copy of its own for a stream writer).
        let options = IpcWriteOptions::try_new(ALIGNMENT, false, MetadataVersion::V5)?;
        let start = out.len();
        let mut w = StreamWriter::try_new_with_options(&mut *out, &self.schema(), options)?;
        w.write(self)?;
        w.finish()?;
        drop(w);
        seal(out, start)
    }

    fn encoded_pieces(&self) -> Option<EncodedPieces<'_>> {
        // arrow-ipc's encoder hands the body buffers over as the arrays'
        // own `Buffer`s (shared, not copied); the framing and padding
        // around them are small buffers of their own.
        let options = IpcWriteOptions::try_new(ALIGNMENT, false, MetadataVersion::V5).ok()?;
        let mut encoder = StreamEncoder::try_new_with_options(&self.schema(), options).ok()?;
        let mut buffers = encoder.encode(self).ok()?;
        buffers.extend(encoder.finish().ok()?);
        let crc = metadata_crc(&buffers)?;
        let mut pieces = EncodedPieces::new();
        for b in buffers {
            pieces.push(b);
        }
        let mut trailer = [0u8; TRAILER];
        trailer[..4].copy_from_slice(&crc.to_le_bytes());
        trailer[4..].copy_from_slice(&TRAILER_TAG);
        pieces.push(trailer);
        Some(pieces)
    }

    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        // Copied into aligned memory, where the arrays are then used.
        read_stream(Buffer::from(bytes))
    }

    fn decode_in_place(
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<(), BoxError>,
    ) -> Option<Result<Self, BoxError>> {
        // Zeroed memory straight from the allocator (fresh zero pages for
        // a large batch, no memset pass), which the read fills. As
        // `i128`s: 16-byte aligned, which is all any Arrow type needs
        // (arrow's own 64-byte-aligned allocation would be zeroed by a
        // memset, an extra pass over the batch).
        let mut words: Vec<i128> = bytemuck::zeroed_vec(len.div_ceil(16));
        if let Err(e) = fill(&mut bytemuck::cast_slice_mut(&mut words)[..len]) {
            return Some(Err(e));
        }
        Some(read_stream(
            Buffer::from_vec(words).slice_with_length(0, len),
        ))
    }
}

/// Bytes of the allocations `data` and its children point into that are
/// not in `seen` yet.
fn allocations(data: &ArrayData, seen: &mut HashSet<usize>) -> usize {
    let mut count = |b: &Buffer| {
        if seen.insert(b.data_ptr().as_ptr() as usize) {
            b.capacity()
        } else {
            0
        }
    };
    let own: usize = data.buffers().iter().map(&mut count).sum();
    let nulls = data.nulls().map_or(0, |n| count(n.buffer()));
    let children: usize = data.child_data().iter().map(|c| allocations(c, seen)).sum();
    own + nulls + children
}

/// The one batch of the stream in `buf` (IPC stream and trailer), its
/// arrays pointing into `buf` (arrow copies a buffer only if it is
/// misaligned, which a stream written by `encode` never is).
fn read_stream(buf: Buffer) -> Result<RecordBatch, BoxError> {
    let len = check_stream(&buf)?;
    let mut stream = buf.slice_with_length(0, len);
    // `check_stream` rules out every damage known to make arrow panic;
    // this is for any it does not know.
    let read = catch_unwind(AssertUnwindSafe(|| -> Result<RecordBatch, BoxError> {
        let mut decoder = StreamDecoder::new();
        let batch = decoder
            .decode(&mut stream)?
            .ok_or("the stream holds no record batch")?;
        if decoder.decode(&mut stream)?.is_some() {
            return Err("the stream holds more than one record batch".into());
        }
        decoder.finish()?;
        Ok(batch)
    }));
    read.unwrap_or_else(|_| Err("arrow's IPC reader panicked on the stream".into()))
}

const CONTINUATION: [u8; 4] = [0xFF; 4];

/// Alignment of every message and buffer from the stream's start: arrow's
/// own default, enough for any array type, so that none is copied.
const ALIGNMENT: usize = 64;

/// The last 4 bytes of an encoding, after the checksum: names this
/// format, so that other bytes are refused rather than misread.
const TRAILER_TAG: [u8; 4] = *b"SBA1";

/// Bytes after the IPC stream: the checksum of its messages' metadata
/// (CRC-32, little-endian), then [`TRAILER_TAG`]. Readers of plain IPC
/// streams stop at the end-of-stream marker before it.
const TRAILER: usize = 8;

/// Append the trailer of the IPC stream `out[start..]`.
fn seal(out: &mut Vec<u8>, start: usize) -> Result<(), BoxError> {
    let walk = walk_stream(&out[start..])?;
    out.extend_from_slice(&walk.metadata_crc.to_le_bytes());
    out.extend_from_slice(&TRAILER_TAG);
    Ok(())
}

/// The trailer's checksum ([`Walk::metadata_crc`]) of the IPC stream laid
/// out in `pieces`, read across piece boundaries and skipping the message
/// bodies. `None` if the pieces are not one whole stream.
fn metadata_crc(pieces: &[Buffer]) -> Option<u32> {
    let mut at = Cursor {
        pieces,
        piece: 0,
        at: 0,
    };
    let mut crc = crc32fast::Hasher::new();
    let mut framing = Vec::new();
    loop {
        framing.clear();
        at.read(4, &mut framing)?;
        if framing[..] == CONTINUATION {
            at.read(4, &mut framing)?;
        }
        let word = &framing[framing.len() - 4..];
        let len = u32::from_le_bytes(word.try_into().ok()?) as usize;
        let meta_start = framing.len();
        at.read(len, &mut framing)?;
        crc.update(&framing);
        if len == 0 {
            break;
        }
        let message = arrow_ipc::root_as_message(&framing[meta_start..]).ok()?;
        at.skip(usize::try_from(message.bodyLength()).ok()?)?;
    }
    at.at_end().then(|| crc.finalize())
}

/// A read position in a stream laid out in pieces.
struct Cursor<'a> {
    pieces: &'a [Buffer],
    piece: usize,
    /// Offset in `pieces[piece]`.
    at: usize,
}

impl Cursor<'_> {
    /// Append the next `n` bytes to `out`; `None` past the end.
    fn read(&mut self, n: usize, out: &mut Vec<u8>) -> Option<()> {
        self.advance(n, |bytes| out.extend_from_slice(bytes))
    }

    /// Step over the next `n` bytes; `None` past the end.
    fn skip(&mut self, n: usize) -> Option<()> {
        self.advance(n, |_| {})
    }

    fn advance(&mut self, mut n: usize, mut each: impl FnMut(&[u8])) -> Option<()> {
        while n > 0 {
            let piece = self.pieces.get(self.piece)?.as_slice();
            let take = (piece.len() - self.at).min(n);
            each(&piece[self.at..self.at + take]);
            self.at += take;
            n -= take;
            if self.at == piece.len() {
                self.piece += 1;
                self.at = 0;
            }
        }
        Some(())
    }

    fn at_end(&self) -> bool {
        self.pieces[self.piece.min(self.pieces.len())..]
            .iter()
            .map(|p| p.len())
            .sum::<usize>()
            == self.at
    }
}

/// Check an encoding before arrow reads it: its trailer, then its IPC
/// stream ([`walk_stream`]), whose metadata must match the checksum.
/// Returns the stream's length.
fn check_stream(bytes: &[u8]) -> Result<usize, String> {
    let Some(len) = bytes.len().checked_sub(TRAILER) else {
        return Err(format!(
            "{} bytes is too short for a record batch",
            bytes.len()
        ));
    };
    let (stream, trailer) = bytes.split_at(len);
    if trailer[4..] != TRAILER_TAG {
        return Err("not a record batch written by spillbuffer (trailer tag)".into());
    }
    let want = u32::from_le_bytes(trailer[..4].try_into().expect("4 bytes"));
    let walk = walk_stream(stream)?;
    if walk.metadata_crc != want {
        return Err("the IPC messages' metadata fails its checksum".into());
    }
    if walk.end != len {
        return Err(format!(
            "{} bytes after the end-of-stream marker",
            len - walk.end
        ));
    }
    if walk.batches != 1 {
        return Err(format!(
            "the stream holds {} record batches, not one",
            walk.batches
        ));
    }
    Ok(len)
}

/// What [`walk_stream`] found.
struct Walk {
    /// CRC-32 of every message's length prefix and metadata (not bodies).
    metadata_crc: u32,
    /// Where the end-of-stream marker ends.
    end: usize,
    /// Record batch messages seen.
    batches: usize,
}

/// Walk an IPC stream's messages up to its end-of-stream marker. Each
/// message's metadata must be a valid flatbuffer, its body within the
/// stream and aligned, and each of its buffers within the body and
/// aligned as `encode` aligns them: arrow's reader panics on a buffer
/// outside its body or misaligned, which the checksum alone would not
/// rule out for a stream damaged before it was sealed.
fn walk_stream(bytes: &[u8]) -> Result<Walk, String> {
    let mut at = 0usize;
    let mut crc = crc32fast::Hasher::new();
    let mut batches = 0;
    let take = |at: &mut usize, n: usize, what: &str| -> Result<std::ops::Range<usize>, String> {
        let end = at
            .checked_add(n)
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| format!("the stream ends inside {what} at byte {at}"))?;
        let r = *at..end;
        *at = end;
        Ok(r)
    };
    loop {
        let prefix_start = at;
        let mut word = &bytes[take(&mut at, 4, "a message length")?];
        if word == CONTINUATION {
            word = &bytes[take(&mut at, 4, "a message length")?];
        }
        let len = u32::from_le_bytes(word.try_into().expect("4 bytes"));
        let meta = take(&mut at, len as usize, "a message")?;
        crc.update(&bytes[prefix_start..at]);
        if len == 0 {
            break;
        }
        let message = arrow_ipc::root_as_message(&bytes[meta])
            .map_err(|e| format!("message before byte {at}: {e}"))?;
        let body_len = usize::try_from(message.bodyLength())
            .map_err(|_| format!("negative body length before byte {at}"))?;
        if at % ALIGNMENT != 0 {
            return Err(format!(
                "a message body starts at byte {at}, not {ALIGNMENT}-byte aligned"
            ));
        }
        take(&mut at, body_len, "a message body")?;
        let buffers = match (
            message.header_as_record_batch(),
            message.header_as_dictionary_batch(),
        ) {
            (Some(b), _) => {
                batches += 1;
                b.buffers()
            }
            (None, Some(d)) => d.data().and_then(|b| b.buffers()),
            (None, None) => None,
        };
        for b in buffers.iter().flatten() {
            let fits = u64::try_from(b.offset())
                .ok()
                .zip(u64::try_from(b.length()).ok())
                .and_then(|(o, l)| Some((o, o.checked_add(l)?)))
                .is_some_and(|(o, end)| o % ALIGNMENT as u64 == 0 && end <= body_len as u64);
            if !fits {
                return Err(format!(
                    "a buffer ({} bytes at {}) is misaligned or outside its {body_len}-byte message body",
                    b.length(),
                    b.offset()
                ));
            }
        }
    }
    Ok(Walk {
        metadata_crc: crc.finalize(),
        end: at,
        batches,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::check;
    use arrow_array::builder::StringDictionaryBuilder;
    use arrow_array::types::Int32Type;
    use arrow_array::{ArrayRef, Float64Array, Int64Array, StringArray};
    use std::sync::Arc;

    fn batch(rows: usize) -> RecordBatch {
        let ids: ArrayRef = Arc::new(Int64Array::from_iter(
            (0..rows as i64).map(|i| (i % 7 != 0).then_some(i)),
        ));
        let xs: ArrayRef = Arc::new(Float64Array::from_iter_values(
            (0..rows).map(|i| i as f64 * 0.25),
        ));
        let names: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..rows).map(|i| format!("row-{i}")),
        ));
        let mut dict = StringDictionaryBuilder::<Int32Type>::new();
        for i in 0..rows {
            dict.append_value(["red", "green", "blue"][i % 3]);
        }
        let colour: ArrayRef = Arc::new(dict.finish());
        RecordBatch::try_from_iter([("id", ids), ("x", xs), ("name", names), ("colour", colour)])
            .unwrap()
    }

    fn encoded(b: &RecordBatch) -> Vec<u8> {
        let mut out = Vec::new();
        b.encode(&mut out).unwrap();
        out
    }

    #[test]
    fn record_batches_round_trip() {
        check::round_trip(batch(1000));
        check::round_trip(batch(0));
        check::round_trip(batch(1000).slice(100, 50));
        check::in_place_round_trip(batch(1000));
    }

    /// Batches of many shapes: nulls, strings, dictionaries, slices
    /// (offsets re-based, bitmaps at an odd bit offset), empty, nested.
    fn shapes() -> Vec<RecordBatch> {
        use arrow_array::builder::{ListBuilder, StringBuilder};
        let mut list = ListBuilder::new(StringBuilder::new());
        for i in 0..300 {
            for j in 0..i % 4 {
                list.values().append_value(format!("{i}.{j}"));
            }
            list.append(i % 5 != 0);
        }
        let list: ArrayRef = Arc::new(list.finish());
        let nested = RecordBatch::try_from_iter([("list", list)]).unwrap();
        let big = batch(20_000);
        vec![
            batch(0),
            batch(1),
            batch(1000),
            big.clone(),
            big.slice(3, 7_001),
            big.slice(19_990, 10),
            batch(1000).slice(0, 0),
            nested.clone(),
            nested.slice(7, 100),
        ]
    }

    #[test]
    fn the_pieces_are_the_encoding() {
        for b in shapes() {
            let pieces = b.encoded_pieces().expect("a record batch has pieces");
            let whole = pieces.to_vec();
            assert_eq!(pieces.len(), whole.len());
            assert!(whole == encoded(&b), "{} rows", b.num_rows());
            assert_eq!(RecordBatch::decode(&whole).unwrap(), b);
        }
    }

    #[test]
    fn large_buffers_are_handed_over_not_copied() {
        let b = batch(20_000);
        let xs = b.column(1).to_data().buffers()[0].clone();
        let pieces = b.encoded_pieces().unwrap();
        assert!(pieces
            .iter()
            .any(|p| p.as_ptr() == xs.as_ptr() && p.len() == xs.len()));
    }

    #[test]
    fn the_encoding_is_an_ipc_stream_any_arrow_reader_reads() {
        let b = batch(100);
        let enc = encoded(&b);
        let reader =
            arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(enc), None).unwrap();
        let batches: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
        assert_eq!(batches, [b]);
    }

    #[test]
    fn decode_in_place_uses_the_read_memory_for_every_array() {
        let v = check::decoded_in_place(&batch(10_000));
        assert_eq!(v, batch(10_000));
        let mut buffers = 0;
        fn each(data: &ArrayData, f: &mut dyn FnMut(&Buffer)) {
            data.buffers().iter().for_each(&mut *f);
            if let Some(n) = data.nulls() {
                f(n.buffer());
            }
            data.child_data().iter().for_each(|c| each(c, f));
        }
        for col in v.columns() {
            each(&col.to_data(), &mut |b| {
                buffers += 1;
                assert!(
                    check::holds_read(b.as_ptr(), b.len()),
                    "a {}-byte buffer of {:?} was copied out of the read",
                    b.len(),
                    col.data_type()
                );
            });
        }
        // ids (values, nulls), x, name (offsets, bytes), colour (keys,
        // dictionary offsets and bytes).
        assert_eq!(buffers, 8);
    }

    #[test]
    fn weight_counts_each_allocation_once() {
        let b = batch(10_000);
        let data_bytes = 10_000 * (8 + 8 + 4) + 10_000 / 8;
        assert!(b.weight() >= data_bytes, "{} < {data_bytes}", b.weight());
        assert!(b.weight() <= b.get_array_memory_size());
        // Read back, the arrays share one allocation: counted once, not
        // once per array as `get_array_memory_size` does.
        let enc = encoded(&b);
        let back = check::decoded_in_place(&b);
        assert!(back.weight() >= enc.len() && back.weight() <= enc.len() + 128);
        assert!(back.get_array_memory_size() > 4 * back.weight());
        // A slice keeps its whole batch alive, and weighs it.
        assert_eq!(b.slice(0, 10).weight(), b.weight());
    }

    #[test]
    fn record_batches_refuse_corrupt_input() {
        let b = batch(40);
        let enc = encoded(&b);
        // Whatever a damaged byte decodes to, it is a valid batch (arrow
        // validates arrays as it reads them), never a panic; the store's
        // checksum is what catches damage in plain data.
        check::corrupt_input::<RecordBatch>(&enc, |got| {
            got.columns()
                .iter()
                .all(|c| c.to_data().validate_full().is_ok())
        });
        let err = RecordBatch::decode(&enc[..enc.len() - 8]).unwrap_err();
        assert!(err.to_string().contains("trailer tag"), "{err}");
        // The stream cut short, the trailer kept.
        let mut cut = enc[..enc.len() - 16].to_vec();
        cut.extend_from_slice(&enc[enc.len() - 8..]);
        let err = RecordBatch::decode(&cut).unwrap_err();
        assert!(err.to_string().contains("ends inside"), "{err}");
        let mut two = enc.clone();
        two.extend_from_slice(&enc);
        assert!(RecordBatch::decode(&two).is_err());
        assert!(RecordBatch::decode(&[0xFF; 64]).is_err());
    }
}
