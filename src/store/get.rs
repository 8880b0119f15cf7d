//! Reading values back: the record at a location is read, checked
//! (header, lengths, both checksums), decompressed and decoded. Every way a
//! record can be wrong becomes one `Error::Corrupt` naming the key and
//! file, built here and nowhere else.

use super::codec::{self, Codec};
use super::put::IN_PLACE_MIN;
use super::record;
use super::scratch::{fit, with_scratch, Scratch};
use super::storage::SegmentFile;
use super::{segment_name, DiskLoc, Store};
use crate::error::{BoxError, Error, Result};
use crate::value::Spill;
use std::cell::Cell;
use std::fmt::Debug;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;

thread_local! {
    /// The last small record this thread read was lz4. Small records are
    /// read straight into the value's memory only while they come raw: an
    /// lz4 payload read that way must be copied out again, so a thread that
    /// meets one reads the next through scratch, until one comes raw.
    /// Values of one kind compress alike, so the guess is mostly right.
    static LAST_SMALL_WAS_LZ4: Cell<bool> = const { Cell::new(false) };
}

/// Piece size of an in-place read: each piece is checksummed right after it
/// lands, while it is still in the last-level cache. Each piece is one
/// `pread()`, whose fixed cost shows next to a copy at memory speed, so
/// the pieces are as large as a cache holds (docs/read-path.md).
const READ_PIECE: usize = 4 << 20;

/// The encoded value in the whole record `bytes`: checked, and decompressed
/// into `out` when it is lz4. Never panics, whatever the bytes (the
/// `record` fuzz target holds it to that). A read of a small record
/// through scratch is this ([`decode_whole`]); one straight into the
/// value's memory makes the same checks ([`check_split`]).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn payload<'a>(
    bytes: &'a [u8],
    out: &'a mut Vec<u8>,
) -> std::result::Result<&'a [u8], String> {
    decode_whole(bytes, out).map(|(_, p)| p)
}

/// [`payload`], and the record's codec.
fn decode_whole<'a>(
    bytes: &'a [u8],
    out: &'a mut Vec<u8>,
) -> std::result::Result<(Codec, &'a [u8]), String> {
    if bytes.len() < record::HEADER {
        return Err(format!(
            "record is {} bytes, shorter than its header",
            bytes.len()
        ));
    }
    let (head, body) = bytes.split_at(record::HEADER);
    match check_split(head, body)? {
        (Codec::Raw, _) => Ok((Codec::Raw, body)),
        (Codec::Lz4, raw_len) => {
            codec::decompress_into(body, raw_len, out)?;
            Ok((Codec::Lz4, out))
        }
    }
}

/// Check a record read as two pieces, its header `head` and the payload
/// `body` that followed it on disk: the header (magic, its checksum,
/// codec, lengths), the payload's length against the header, and the
/// payload's checksum. Returns the codec and the length the payload
/// decodes to. Every read of a small record makes these checks, whether
/// the payload landed in a scratch buffer or in the value's own memory.
pub(crate) fn check_split(head: &[u8], body: &[u8]) -> std::result::Result<(Codec, usize), String> {
    let (codec, stored, raw_len) = record::parse_header(head)?;
    if body.len() as u64 != stored {
        return Err(format!(
            "payload is {} bytes, header says {stored}",
            body.len()
        ));
    }
    if !record::payload_ok(head, body) {
        return Err("payload checksum mismatch".into());
    }
    let raw_len =
        usize::try_from(raw_len).map_err(|_| "record too large for this machine".to_string())?;
    Ok((codec, raw_len))
}

/// Whole records are read in pieces of this size, last first
/// ([`Store::read`]).
pub(crate) const WHOLE_READ_PIECE: usize = 512 << 10;

pub(super) fn corrupt<K: Debug>(key: &K, path: &Path, detail: String) -> Error {
    Error::Corrupt {
        key: format!("{key:?}"),
        path: path.to_path_buf(),
        detail,
    }
}

/// A failed read of `len` bytes at `at`, part of `key`'s record: a file
/// that ends too soon was shortened underneath the buffer (the store never
/// shrinks a segment), so the record is gone: `Error::Corrupt`. Any other
/// error is the disk's: `Error::Io`, worth retrying.
pub(super) fn read_failed<K: Debug>(
    key: &K,
    path: &Path,
    at: u64,
    len: usize,
    e: std::io::Error,
) -> Error {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        return corrupt(
            key,
            path,
            format!("the file ends before the record's bytes {at}..{} (truncated underneath the buffer?)", at + len as u64),
        );
    }
    Error::io("read record", path.to_path_buf(), e)
}

impl<K: Clone + Debug> Store<K> {
    /// Read `key`'s whole record at `loc` into `buf` (resized to fit), in
    /// pieces from its end back to its start: the piece read last is the
    /// one still in the cache, and the start is what a caller uses first
    /// (a sender writes it to its socket, compaction checks its header).
    /// Returns the path of its file, for error messages.
    pub(crate) fn read(&self, key: &K, loc: DiskLoc, buf: &mut Vec<u8>) -> Result<PathBuf> {
        let (file, path) = self.file(loc)?;
        let Ok(len) = usize::try_from(loc.len()) else {
            return Err(corrupt(
                key,
                &path,
                "record larger than the address space".into(),
            ));
        };
        fit(buf, len);
        let mut end = len;
        while end > 0 {
            let start = end.saturating_sub(WHOLE_READ_PIECE);
            let at = loc.offset + start as u64;
            file.read_exact_at(&mut buf[start..end], at)
                .map_err(|e| read_failed(key, &path, at, end - start, e))?;
            end = start;
        }
        Ok(path)
    }

    /// Read `key`'s value back from its record at `loc`.
    pub(crate) fn get<V: Spill>(&self, key: &K, loc: DiskLoc) -> Result<V> {
        if loc.len() >= IN_PLACE_MIN as u64 {
            return self.get_in_place(key, loc);
        }
        self.get_small(key, loc)
    }

    /// The open file of segment `seg`, without its path: a read that
    /// succeeds never needs the path, so it is looked up only for an error
    /// ([`Store::segment_path`]).
    fn segment_file(&self, seg: u32) -> Option<Arc<dyn SegmentFile>> {
        self.inner
            .lock()
            .segs
            .get(&seg)
            .map(|s| Arc::clone(&s.file))
    }

    /// The path of segment `seg`'s file, for an error message.
    fn segment_path(&self, seg: u32) -> PathBuf {
        match self.inner.lock().segs.get(&seg) {
            Some(s) => s.path.clone(),
            None => self.dirs[0].join(segment_name(seg)),
        }
    }

    /// Read a small record back with one system call. For a type that can
    /// be rebuilt in its own memory ([`Spill::decode_in_place`]), the
    /// header lands in a stack array and the payload straight in the
    /// value, both from one `preadv()`; both are checked ([`check_split`])
    /// before the value is returned. A record that turns out to be lz4 is
    /// then decompressed from a copy of its payload, and the thread reads
    /// small records through scratch until one comes raw again
    /// ([`LAST_SMALL_WAS_LZ4`]). Other types read the whole record into
    /// scratch and decode from there.
    fn get_small<V: Spill>(&self, key: &K, loc: DiskLoc) -> Result<V> {
        let Some(file) = self.segment_file(loc.seg) else {
            return Err(Error::io(
                "read record",
                self.segment_path(loc.seg),
                std::io::Error::new(std::io::ErrorKind::NotFound, "segment released"),
            ));
        };
        let corrupt = |detail: String| corrupt(key, &self.segment_path(loc.seg), detail);
        // Smaller than IN_PLACE_MIN, so it fits in a usize.
        let len = loc.len() as usize;
        let Some(stored) = len.checked_sub(record::HEADER) else {
            return Err(corrupt(format!(
                "the index gives the record {len} bytes, shorter than its header"
            )));
        };
        with_scratch(|sc| {
            if LAST_SMALL_WAS_LZ4.get() {
                return self.get_small_via_scratch(key, loc, &*file, sc);
            }
            let mut head = [0u8; record::HEADER];
            // The first failure inside `fill`, reported as is; or, for an
            // lz4 record (its payload then copied into `sc.a`), its length
            // once decompressed.
            let mut failed: Option<Error> = None;
            let mut lz4: Option<usize> = None;
            let mut fill = |dst: &mut [u8]| -> std::result::Result<(), BoxError> {
                if let Err(e) = file.read_split_at(&mut head, dst, loc.offset) {
                    failed = Some(read_failed(
                        key,
                        &self.segment_path(loc.seg),
                        loc.offset,
                        len,
                        e,
                    ));
                    return Err("read failed".into());
                }
                match check_split(&head, dst) {
                    Ok((Codec::Raw, _)) => Ok(()),
                    Ok((Codec::Lz4, raw_len)) => {
                        fit(&mut sc.a, dst.len());
                        sc.a.copy_from_slice(dst);
                        lz4 = Some(raw_len);
                        LAST_SMALL_WAS_LZ4.set(true);
                        Err("lz4 record".into())
                    }
                    Err(d) => {
                        failed = Some(corrupt(d));
                        Err("bad record".into())
                    }
                }
            };
            match decode_in_place::<V>(stored, &mut fill) {
                Some(Ok(v)) => return Ok(v),
                Some(Err(e)) => {
                    if let Some(f) = failed.take() {
                        return Err(f);
                    }
                    let Some(raw_len) = lz4 else {
                        return Err(corrupt(e));
                    };
                    codec::decompress_into(&sc.a, raw_len, &mut sc.b).map_err(corrupt)?;
                    return decode(&sc.b).map_err(corrupt);
                }
                None => {}
            }
            self.get_small_via_scratch(key, loc, &*file, sc)
        })
    }

    /// Read a small record whole into scratch with one `pread()`, check
    /// it and decode it from there: for types without an in-place decode,
    /// and for lz4 records (whose payload is not the value's bytes).
    fn get_small_via_scratch<V: Spill>(
        &self,
        key: &K,
        loc: DiskLoc,
        file: &dyn SegmentFile,
        sc: &mut Scratch,
    ) -> Result<V> {
        let corrupt = |detail: String| corrupt(key, &self.segment_path(loc.seg), detail);
        let len = loc.len() as usize;
        fit(&mut sc.a, len);
        file.read_exact_at(&mut sc.a, loc.offset)
            .map_err(|e| read_failed(key, &self.segment_path(loc.seg), loc.offset, len, e))?;
        let (codec, bytes) = decode_whole(&sc.a, &mut sc.b).map_err(corrupt)?;
        LAST_SMALL_WAS_LZ4.set(codec == Codec::Lz4);
        decode(bytes).map_err(corrupt)
    }

    /// Read the record at `loc` and check it, for a copy (compaction): a
    /// read that went wrong must not become the only copy on disk.
    pub(crate) fn read_checked(&self, key: &K, loc: DiskLoc, buf: &mut Vec<u8>) -> Result<()> {
        let path = self.read(key, loc, buf)?;
        record::open(buf).map_err(|d| corrupt(key, &path, d))?;
        Ok(())
    }

    /// Read a large record back with as few copies as the value type
    /// allows: the header first, then a raw payload straight into the
    /// value's own memory ([`Spill::decode_in_place`]), checksummed piece
    /// by piece while each piece is still in cache; an lz4 payload is read
    /// into scratch and decompressed straight into the value. Types without
    /// an in-place path decode from scratch, as small records do.
    fn get_in_place<V: Spill>(&self, key: &K, loc: DiskLoc) -> Result<V> {
        let (file, path) = self.file(loc)?;
        let corrupt = |detail: String| corrupt(key, &path, detail);
        let io = |at: u64, len: usize, e| read_failed(key, &path, at, len, e);
        let mut head = [0u8; record::HEADER];
        file.read_exact_at(&mut head, loc.offset)
            .map_err(|e| io(loc.offset, record::HEADER, e))?;
        let (codec, stored, raw_len) = record::parse_header(&head).map_err(corrupt)?;
        if stored.checked_add(record::HEADER as u64) != Some(loc.len()) {
            return Err(corrupt(format!(
                "header says {stored} payload bytes, the index {}",
                loc.len() - record::HEADER as u64
            )));
        }
        let raw_len = usize::try_from(raw_len)
            .map_err(|_| corrupt("record too large for this machine".into()))?;
        let body = loc.offset + record::HEADER as u64;
        // The first failure inside `fill`, reported as is.
        let mut failed: Option<Error> = None;
        let in_place = match codec {
            Codec::Raw => {
                let mut fill = |dst: &mut [u8]| -> std::result::Result<(), BoxError> {
                    let mut check = record::PayloadCheck::new(&head);
                    let mut at = body;
                    for piece in dst.chunks_mut(READ_PIECE) {
                        if let Err(e) = file.read_exact_at(piece, at) {
                            failed = Some(io(at, piece.len(), e));
                            return Err("read failed".into());
                        }
                        check.update(piece);
                        at += piece.len() as u64;
                    }
                    if !check.ok() {
                        failed = Some(corrupt("payload checksum mismatch".into()));
                        return Err("checksum mismatch".into());
                    }
                    Ok(())
                };
                decode_in_place::<V>(raw_len, &mut fill)
            }
            Codec::Lz4 => None,
        };
        match in_place {
            Some(Ok(v)) => return Ok(v),
            Some(Err(e)) => return Err(failed.take().unwrap_or_else(|| corrupt(e))),
            None => {}
        }
        with_scratch(|sc| {
            fit(&mut sc.a, stored as usize);
            file.read_exact_at(&mut sc.a, body)
                .map_err(|e| io(body, sc.a.len(), e))?;
            if !record::payload_ok(&head, &sc.a) {
                return Err(corrupt("payload checksum mismatch".into()));
            }
            match codec {
                Codec::Raw => decode(&sc.a).map_err(corrupt),
                Codec::Lz4 => {
                    let stored = &sc.a;
                    let mut fill = |dst: &mut [u8]| -> std::result::Result<(), BoxError> {
                        codec::decompress_exact(stored, dst).map_err(|e| {
                            failed = Some(corrupt(e));
                            BoxError::from("decompression failed")
                        })
                    };
                    match decode_in_place::<V>(raw_len, &mut fill) {
                        Some(Ok(v)) => Ok(v),
                        Some(Err(e)) => Err(failed.take().unwrap_or_else(|| corrupt(e))),
                        None => {
                            codec::decompress_into(stored, raw_len, &mut sc.b).map_err(corrupt)?;
                            decode(&sc.b).map_err(corrupt)
                        }
                    }
                }
            }
        })
    }
}

/// `V::decode`, with a panic turned into an error.
fn decode<V: Spill>(bytes: &[u8]) -> std::result::Result<V, String> {
    match catch_unwind(AssertUnwindSafe(|| V::decode(bytes))) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("decode failed: {e}")),
        Err(_) => Err("decode panicked".into()),
    }
}

/// `V::decode_in_place`, with a panic turned into an error. The error of a
/// failed decode is its message; one from `fill` the caller has kept.
fn decode_in_place<V: Spill>(
    len: usize,
    fill: &mut dyn FnMut(&mut [u8]) -> std::result::Result<(), BoxError>,
) -> Option<std::result::Result<V, String>> {
    match catch_unwind(AssertUnwindSafe(|| V::decode_in_place(len, fill))) {
        Ok(Some(Ok(v))) => Some(Ok(v)),
        Ok(Some(Err(e))) => Some(Err(format!("decode failed: {e}"))),
        Ok(None) => None,
        Err(_) => Some(Err("decode panicked".into())),
    }
}

#[cfg(test)]
mod tests;
