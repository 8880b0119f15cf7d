//! Writing values: encode, compress when it pays, seal as a record
//! ([`record`]) and append it to a segment. One value at a time
//! ([`Store::put`]), or small ones packed into shared writes
//! ([`Store::put_batch`]). Runs on the IO pool.

use super::codec::{self, Codec, Compression};
use super::record;
use super::scratch::{with_scratch, Scratch};
use super::{DiskLoc, Store};
use crate::error::{Error, Result};
use crate::value::Spill;
use std::fmt::Debug;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// Values whose encoding is at least this large are written from and read
/// into their own memory when their type allows it; below it, one syscall
/// through a reused buffer is cheaper than two without one.
pub(crate) const IN_PLACE_MIN: usize = 64 << 10;

/// Small records are packed into writes of about this many bytes.
const BATCH_BYTES: usize = 1 << 20;

impl<K: Clone + Debug> Store<K> {
    /// Write `value` as `key`'s record.
    pub(crate) fn put<V: Spill>(&self, key: &K, value: &V) -> Result<DiskLoc> {
        // Budget already spent: do not even encode.
        self.check_budget(record::HEADER as u64)?;
        if let Some(bytes) = value.as_encoded().filter(|b| b.len() >= IN_PLACE_MIN) {
            return self.put_in_place(key, bytes);
        }
        with_scratch(|sc| {
            let (len, in_b) = self.encode_record(key, value, sc)?;
            let rec = if in_b { &sc.b } else { &sc.a };
            self.write(key, &rec[..len])
        })
    }

    /// Write small values: each is encoded and sealed into one buffer, and
    /// the buffer written with one call per [`BATCH_BYTES`] (within one
    /// segment). `done(i, result)` is called for `items[i]` as soon as its
    /// fate is known. A value that fails to encode fails alone; if a
    /// packed write fails, its records are tried one by one, exactly as
    /// unbatched writes would be, so that one record's fate does not hang
    /// on its neighbours' (a budget that fits some, a fault that cleared).
    pub(crate) fn put_batch<V: Spill>(
        &self,
        items: &[(&K, &V)],
        mut done: impl FnMut(usize, Result<DiskLoc>),
    ) {
        let batch_limit = BATCH_BYTES.min(self.segment_size() as usize);
        with_scratch(|sc| {
            sc.batch.clear();
            // (item, record length) of the records in `sc.batch`.
            let mut packed: Vec<(usize, u64)> = Vec::new();
            for (i, &(key, value)) in items.iter().enumerate() {
                let res = self
                    .check_budget(record::HEADER as u64)
                    .and_then(|()| self.encode_record(key, value, sc));
                match res {
                    Ok((len, in_b)) => {
                        // A larger write would get a file of its own, and
                        // the space bound of compaction assumes
                        // segment-sized files.
                        if !packed.is_empty() && sc.batch.len() + len > batch_limit {
                            self.write_packed(
                                items,
                                &std::mem::take(&mut packed),
                                &sc.batch,
                                &mut done,
                            );
                            sc.batch.clear();
                        }
                        let rec = if in_b { &sc.b } else { &sc.a };
                        sc.batch.extend_from_slice(&rec[..len]);
                        packed.push((i, len as u64));
                    }
                    Err(e) => done(i, Err(e)),
                }
            }
            if !packed.is_empty() {
                self.write_packed(items, &packed, &sc.batch, &mut done);
            }
            sc.batch.clear();
        });
    }

    fn write_packed<V>(
        &self,
        items: &[(&K, &V)],
        packed: &[(usize, u64)],
        buf: &[u8],
        done: &mut impl FnMut(usize, Result<DiskLoc>),
    ) {
        let records: Vec<(&K, u64)> = packed.iter().map(|&(i, len)| (items[i].0, len)).collect();
        match self.write_records(&[buf], &records) {
            Ok(locs) => {
                for (&(i, _), loc) in packed.iter().zip(locs) {
                    done(i, Ok(loc));
                }
            }
            // A full disk fails them all alike: one by one they would
            // only fill the last partial block, each failure counted.
            Err(e) if packed.len() > 1 && !matches!(e, Error::DiskFull { .. }) => {
                let mut at = 0usize;
                for &(i, len) in packed {
                    let rec = &buf[at..at + len as usize];
                    at += len as usize;
                    done(i, self.write(items[i].0, rec));
                }
            }
            Err(e) => {
                for &(i, _) in packed {
                    done(i, Err(e.clone()));
                }
            }
        }
    }

    /// Encode `value` and seal it as one record in scratch: in `sc.b` when
    /// compressed (the `bool`), else in `sc.a`. Returns its length.
    fn encode_record<V: Spill>(
        &self,
        key: &K,
        value: &V,
        sc: &mut Scratch,
    ) -> Result<(usize, bool)> {
        let buf = &mut sc.a;
        buf.clear();
        buf.resize(record::HEADER, 0);
        let failed = |source: crate::error::BoxError| Error::Encode {
            key: format!("{key:?}"),
            source: Arc::from(source),
        };
        match catch_unwind(AssertUnwindSafe(|| value.encode(buf))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(failed(e)),
            Err(_) => return Err(failed("encode panicked".into())),
        }
        let raw_len = (buf.len() - record::HEADER) as u64;
        let compressed = match self.compression() {
            Compression::Lz4 => {
                codec::compress_into(&buf[record::HEADER..], &mut sc.b, record::HEADER)
            }
            Compression::None => None,
        };
        match compressed {
            Some(n) => {
                record::seal(&mut sc.b[..record::HEADER + n], Codec::Lz4, raw_len);
                Ok((record::HEADER + n, true))
            }
            None => {
                record::seal(buf, Codec::Raw, raw_len);
                Ok((buf.len(), false))
            }
        }
    }

    /// Write a large value whose memory is its encoding: compressed into
    /// scratch if that pays, else straight from the value's memory behind a
    /// header on the stack, with no copy.
    fn put_in_place(&self, key: &K, bytes: &[u8]) -> Result<DiskLoc> {
        let raw_len = bytes.len() as u64;
        if self.compression() == Compression::Lz4 {
            let done = with_scratch(|sc| {
                let n = codec::compress_into(bytes, &mut sc.b, record::HEADER)?;
                let rec = &mut sc.b[..record::HEADER + n];
                record::seal(rec, Codec::Lz4, raw_len);
                Some(self.write(key, rec))
            });
            if let Some(res) = done {
                return res;
            }
        }
        // Two pieces, header then payload, with one syscall each: measured
        // faster here than checksumming and writing 256 KiB pieces in turn
        // (17 syscalls, each with the file's write lock and dirty-page
        // throttling check), although that reads the value once instead of
        // twice.
        let mut head = [0u8; record::HEADER];
        record::seal_header(&mut head, Codec::Raw, bytes, raw_len);
        self.write_pieces(key, &[&head, bytes])
    }
}
