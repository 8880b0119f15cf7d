//! Records that travel between buffers without being decoded: a spilled
//! record read as stored, a value in memory encoded exactly as a spill
//! would write it (but not written), and a received record checked and
//! appended to a segment as it came — whole, or streamed from a reader
//! piece by piece. The framing around them is [`crate::frame`]'s; the
//! buffer decides which source a key's record comes from
//! (`buffer::transfer`).

use super::codec::{self, Codec, Compression};
use super::get::{corrupt, read_failed};
use super::put::IN_PLACE_MIN;
use super::record;
use super::scratch::{fit, with_scratch};
use super::spare;
use super::storage::SegmentFile;
use super::{DiskLoc, Store};
use crate::error::{Error, Result};
use crate::frame::{parse_frame, seal_frame, split_head, Record, FRAME};
use crate::value::Spill;
use std::fmt::Debug;
use std::io::{self, Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
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

/// A record's segment kept from being written over or punched
/// ([`Store::hold`]) while the record is sent.
pub(crate) struct Hold<'a, K> {
    store: &'a Store<K>,
    loc: DiskLoc,
    /// Open even if the segment dies meanwhile and its file is deleted.
    file: Arc<dyn SegmentFile>,
    path: PathBuf,
}

impl<K: Clone + Debug> Hold<'_, K> {
    /// Write a frame header (the record's length and `weight`) and then
    /// the held record, as stored, to `w`, a [`SEND_PIECE`] at a time: each
    /// piece read into this thread's scratch buffer and written on while
    /// it is still in the cache, as a plain file-to-socket copy does. The
    /// record header is read and checked before the first byte is written.
    /// The caller must have found the record live after taking the hold.
    /// Returns the bytes written.
    pub(crate) fn send<W: Write + ?Sized>(&self, key: &K, weight: u64, w: &mut W) -> Result<u64> {
        let (loc, path) = (self.loc, &self.path);
        let len = loc.len();
        with_scratch(|s| {
            let piece = &mut s.a;
            fit(
                piece,
                SEND_PIECE.min(usize::try_from(len).unwrap_or(SEND_PIECE)),
            );
            let mut at = 0u64;
            while at < len {
                let n = piece.len().min((len - at) as usize);
                self.file
                    .read_exact_at(&mut piece[..n], loc.offset + at)
                    .map_err(|e| read_failed(key, path, loc.offset + at, n, e))?;
                if at == 0 {
                    check_stored_header(key, path, &piece[..n], loc)?;
                    let mut frame = [0u8; FRAME];
                    seal_frame(&mut frame, len, weight);
                    w.write_all(&frame).map_err(|e| send_failed(key, e))?;
                }
                w.write_all(&piece[..n]).map_err(|e| send_failed(key, e))?;
                at += n as u64;
            }
            Ok(FRAME as u64 + len)
        })
    }
}

impl<K> Drop for Hold<'_, K> {
    /// The last hold of a segment that compaction passed over queues it
    /// again (the buffer drains the queue after the transfer).
    fn drop(&mut self) {
        let seg = self.loc.seg;
        let mut g = self.store.inner.lock();
        let Some(s) = g.segs.get_mut(&seg) else {
            return;
        };
        s.held -= 1;
        if s.held == 0 && s.after_hold {
            s.after_hold = false;
            g.to_compact.push(seg);
        }
    }
}

/// Check the header at the start of `bytes`, the first bytes of `key`'s
/// stored record at `loc` (in the file at `path`): a record header whose
/// payload length agrees with the index.
fn check_stored_header<K: Debug>(key: &K, path: &Path, bytes: &[u8], loc: DiskLoc) -> Result<()> {
    let (_, stored, _) = record::parse_header(bytes).map_err(|d| corrupt(key, path, d))?;
    if stored.checked_add(record::HEADER as u64) != Some(loc.len()) {
        return Err(corrupt(
            key,
            path,
            format!(
                "header says {stored} payload bytes, the index {}",
                loc.len() - record::HEADER as u64
            ),
        ));
    }
    Ok(())
}

/// A stream's own failure, its message naming the key it was moving.
fn naming<K: Debug>(key: &K, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("transfer of key {key:?}: {e}"))
}

/// The writer a record of `key` was being sent to failed.
pub(crate) fn send_failed<K: Debug>(key: &K, e: io::Error) -> Error {
    Error::io("send record", transfer_path(), naming(key, e))
}

/// What [`Store::write_streamed`] made of a record read from a stream.
pub(crate) enum Streamed {
    /// Written whole, every checksum good: `len` bytes came (frame header
    /// included).
    Whole {
        loc: DiskLoc,
        weight: usize,
        len: u64,
    },
    /// Refused once part of it was on disk at `loc` (a damaged payload, a
    /// stream that ended or failed inside it): no entry points at those
    /// bytes; the caller releases them.
    Refused { loc: DiskLoc, error: Error },
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
        let mut check = record::PayloadCheck::new(&self.head);
        for p in self.payload {
            check.update(p);
        }
        if !check.ok() {
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
        let mut buf = spare::take(usize::try_from(loc.len()).unwrap_or(0));
        let path = self.read(key, loc, &mut buf)?;
        check_stored_header(key, &path, &buf, loc)?;
        Ok(buf)
    }

    /// Keep the bytes of the segment holding `loc` as they are until the
    /// hold is dropped: nothing is written over them or punched out, even
    /// where records die meanwhile. `None` if the segment is gone. A
    /// record its caller then finds still live stays readable, whole and
    /// unchanged, for as long as the hold lasts: what a transfer needs to
    /// send it piece by piece ([`Hold::send`]).
    pub(crate) fn hold(&self, loc: DiskLoc) -> Option<Hold<'_, K>> {
        let mut g = self.inner.lock();
        let s = g.segs.get_mut(&loc.seg)?;
        s.held += 1;
        Some(Hold {
            store: self,
            loc,
            file: Arc::clone(&s.file),
            path: s.path.clone(),
        })
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

    /// Read one record (frame header first) from `reader` and append it,
    /// as it comes, as `key`'s: the headers are read and checked first,
    /// then the payload is read piece by piece into this thread's scratch
    /// buffer, checksummed and written while the piece is still in the
    /// core's cache — the bytes pass through memory once, as in a plain
    /// socket-to-file copy. Runs on the caller's thread.
    ///
    /// Errors before anything is written (a bad header, a stream that
    /// ends or fails inside the headers, the disk budget) come back as
    /// `Err`; later ones as [`Streamed::Refused`].
    pub(crate) fn write_streamed<R: Read + ?Sized>(
        &self,
        key: &K,
        reader: &mut R,
    ) -> Result<Streamed> {
        let corrupt = |detail: String| Error::Corrupt {
            key: format!("{key:?}"),
            path: transfer_path(),
            detail,
        };
        let failed = |e: io::Error| match e.kind() {
            io::ErrorKind::UnexpectedEof => {
                corrupt("the stream ended inside the record (truncated)".into())
            }
            _ => Error::io("read transfer", transfer_path(), naming(key, e)),
        };
        let mut frame = [0u8; FRAME];
        reader.read_exact(&mut frame).map_err(failed)?;
        let (record_len, weight) = parse_frame(&frame).map_err(corrupt)?;
        let mut head = [0u8; record::HEADER];
        reader.read_exact(&mut head).map_err(failed)?;
        let (_, stored, _) = record::parse_header(&head).map_err(corrupt)?;
        if stored.checked_add(record::HEADER as u64) != Some(record_len) {
            return Err(corrupt(format!(
                "record header says {stored} payload bytes, the frame {}",
                record_len - record::HEADER as u64
            )));
        }
        let weight = usize::try_from(weight)
            .map_err(|_| corrupt("weight too large for this machine".into()))?;
        // A failure of the stream, not of the disk: the write reports
        // success and the bytes are released afterwards, so the store does
        // not count a peer's fault against its directory.
        let mut refused = None;
        let locs = self.write_records_with(&[(key, record_len)], |file, offset| {
            file.write_all_at(&head, offset)?;
            with_scratch(|s| {
                let piece = &mut s.a;
                fit(
                    piece,
                    STREAM_PIECE.min(usize::try_from(stored).unwrap_or(STREAM_PIECE)),
                );
                let mut check = record::PayloadCheck::new(&head);
                let mut at = record::HEADER as u64;
                while at < record_len {
                    let n = piece.len().min((record_len - at) as usize);
                    if let Err(e) = reader.read_exact(&mut piece[..n]) {
                        refused = Some(failed(e));
                        return Ok(());
                    }
                    check.update(&piece[..n]);
                    file.write_all_at(&piece[..n], offset + at)?;
                    at += n as u64;
                }
                if !check.ok() {
                    refused = Some(corrupt("payload checksum mismatch".into()));
                }
                Ok(())
            })
        })?;
        let loc = locs[0];
        Ok(match refused {
            Some(error) => Streamed::Refused { loc, error },
            None => Streamed::Whole {
                loc,
                weight,
                len: FRAME as u64 + record_len,
            },
        })
    }

    /// Append a received record, as it came, as `key`'s. Runs on the IO
    /// pool (or the caller's thread for the blocking insert). The caller
    /// has checked its payload.
    pub(crate) fn write_received(&self, key: &K, rec: &Received<'_>) -> Result<DiskLoc> {
        // (offset in the record, bytes), cut to pieces and written last
        // first: the end of a record just received is what the cache
        // still holds.
        let mut pieces: Vec<(u64, &[u8])> = Vec::new();
        let mut at = 0u64;
        for p in std::iter::once(&rec.head[..]).chain(rec.payload.iter().copied()) {
            for c in p.chunks(BACKWARD_PIECE) {
                pieces.push((at, c));
                at += c.len() as u64;
            }
        }
        let locs = self.write_records_with(&[(key, at)], |file, offset| {
            for &(o, c) in pieces.iter().rev() {
                file.write_all_at(c, offset + o)?;
            }
            Ok(())
        })?;
        Ok(locs[0])
    }
}

/// A whole record received is written in pieces of this size, last
/// first (the end of the record is what the checksum pass left in the
/// cache, so the copy into the segment's pages starts from cache); records
/// are read the same way ([`super::get::WHOLE_READ_PIECE`]).
const BACKWARD_PIECE: usize = super::get::WHOLE_READ_PIECE;

/// A record streamed from a reader is read, checksummed and written in
/// pieces of this size: small enough that a piece just copied is still in
/// the core's caches when it is copied on, large enough that the system
/// calls do not add up (smaller pieces cost the receiving thread more
/// time over loopback; `examples/transfer.rs --measure` is the check
/// after changing it).
const STREAM_PIECE: usize = 1 << 20;

/// A record sent to a writer ([`Hold::send`]) is read and written on in
/// pieces of this size. Smaller than the receiver's: the sender's piece
/// is copied twice by the same core (file to scratch, scratch to socket)
/// and should stay in the core's L2 between the two; of the sizes from
/// 64 KiB to 1 MiB, this one came closest to a raw copy over loopback
/// (`examples/transfer.rs --measure` is the check after changing it).
const SEND_PIECE: usize = 256 << 10;

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
