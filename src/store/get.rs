//! Reading values back: the record at a location is read, checked
//! (header, lengths, both checksums), decompressed and decoded. Every way a
//! record can be wrong becomes one `Error::Corrupt` naming the key and
//! file, built here and nowhere else.

use super::codec::{self, Codec};
use super::put::IN_PLACE_MIN;
use super::record;
use super::scratch::{fit, with_scratch};
use super::{DiskLoc, Store};
use crate::error::{BoxError, Error, Result};
use crate::value::Spill;
use std::fmt::Debug;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// Piece size of an in-place read: each piece is checksummed right after it
/// lands, while it is still in the core's cache.
const READ_PIECE: usize = 256 << 10;

/// The encoded value in the whole record `bytes`: checked, and decompressed
/// into `out` when it is lz4. What a read of a small record does; never
/// panics, whatever the bytes (the `record` fuzz target holds it to that).
pub(crate) fn payload<'a>(
    bytes: &'a [u8],
    out: &'a mut Vec<u8>,
) -> std::result::Result<&'a [u8], String> {
    let rec = record::open(bytes)?;
    match rec.codec {
        Codec::Raw => Ok(rec.payload),
        Codec::Lz4 => {
            let raw_len = usize::try_from(rec.raw_len)
                .map_err(|_| "record too large for this machine".to_string())?;
            codec::decompress_into(rec.payload, raw_len, out)?;
            Ok(out)
        }
    }
}

fn corrupt<K: Debug>(key: &K, path: &Path, detail: String) -> Error {
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
fn read_failed<K: Debug>(key: &K, path: &Path, at: u64, len: usize, e: std::io::Error) -> Error {
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
    /// Read `key`'s whole record at `loc` into `buf` (resized to fit).
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
        file.read_exact_at(buf, loc.offset)
            .map_err(|e| read_failed(key, &path, loc.offset, len, e))?;
        Ok(path)
    }

    /// Read `key`'s value back from its record at `loc`.
    pub(crate) fn get<V: Spill>(&self, key: &K, loc: DiskLoc) -> Result<V> {
        if loc.len() >= IN_PLACE_MIN as u64 {
            return self.get_in_place(key, loc);
        }
        with_scratch(|sc| {
            let path = self.read(key, loc, &mut sc.a)?;
            let bytes = payload(&sc.a, &mut sc.b).map_err(|d| corrupt(key, &path, d))?;
            decode(bytes).map_err(|d| corrupt(key, &path, d))
        })
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
        let want_crc = record::payload_crc(&head);
        // The first failure inside `fill`, reported as is.
        let mut failed: Option<Error> = None;
        let in_place = match codec {
            Codec::Raw => {
                let mut fill = |dst: &mut [u8]| -> std::result::Result<(), BoxError> {
                    let mut crc = crc32fast::Hasher::new();
                    let mut at = body;
                    for piece in dst.chunks_mut(READ_PIECE) {
                        if let Err(e) = file.read_exact_at(piece, at) {
                            failed = Some(io(at, piece.len(), e));
                            return Err("read failed".into());
                        }
                        crc.update(piece);
                        at += piece.len() as u64;
                    }
                    if crc.finalize() != want_crc {
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
            if crc32fast::hash(&sc.a) != want_crc {
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
