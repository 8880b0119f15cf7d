//! Writing values: encode, compress when it pays, seal as a record
//! ([`record`]) and append it to a segment. One value at a time
//! ([`Store::put`]), or small ones packed into shared writes
//! ([`Store::put_batch`]). Runs on the IO pool.

use super::codec::{self, Codec, Compression};
use super::record;
use super::scratch::{with_scratch, Scratch};
use super::{DiskLoc, Store};
use crate::error::{Error, Result};
use crate::value::{EncodedPieces, Spill};
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
        // A panic here falls back to `encode`, which reports it.
        let pieces = catch_unwind(AssertUnwindSafe(|| value.encoded_pieces()))
            .ok()
            .flatten()
            .filter(|p| p.len() >= IN_PLACE_MIN);
        if let Some(pieces) = pieces {
            return self.put_pieces(key, &pieces);
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
        // Two pieces, header then payload, with one syscall each, rather
        // than checksumming and writing 256 KiB pieces in turn: that would
        // read the value once instead of twice, but make 17 syscalls, each
        // taking the file's write lock and the dirty-page throttling
        // check, which costs more than the second read.
        let mut head = [0u8; record::HEADER];
        record::seal_header(&mut head, Codec::Raw, bytes, raw_len);
        self.write_pieces(key, &[&head, bytes])
    }

    /// Write a large value handed over in pieces ([`EncodedPieces`]): as
    /// [`Self::put_in_place`], from the value's own memory behind a header
    /// on the stack, the pieces written one after another. Gathered into
    /// scratch only when lz4 may pay (samples of it say so).
    fn put_pieces(&self, key: &K, pieces: &EncodedPieces<'_>) -> Result<DiskLoc> {
        let raw_len = pieces.len() as u64;
        if self.compression() == Compression::Lz4 {
            let done = with_scratch(|sc| {
                if !codec::might_pay(|| pieces.iter(), pieces.len(), &mut sc.a, &mut sc.b) {
                    return None;
                }
                sc.a.clear();
                pieces.iter().for_each(|p| sc.a.extend_from_slice(p));
                let n = codec::compress_into(&sc.a, &mut sc.b, record::HEADER)?;
                let rec = &mut sc.b[..record::HEADER + n];
                record::seal(rec, Codec::Lz4, raw_len);
                Some(self.write(key, rec))
            });
            if let Some(res) = done {
                return res;
            }
        }
        let mut head = [0u8; record::HEADER];
        record::seal_header_pieces(&mut head, Codec::Raw, pieces.iter(), raw_len);
        let (glue, runs) = coalesce(std::iter::once(&head[..]).chain(pieces.iter()));
        let all: Vec<&[u8]> = runs
            .iter()
            .map(|run| match run {
                Run::Glued(r) => &glue[r.clone()],
                Run::Own(p) => *p,
            })
            .collect();
        self.write_pieces(key, &all)
    }
}

/// Pieces smaller than this are copied together rather than written with
/// a call of their own (each call takes the file's write lock).
const GLUE_BELOW: usize = 16 << 10;

/// Where a piece of a coalesced write comes from.
enum Run<'a> {
    /// A range of the glued small pieces.
    Glued(std::ops::Range<usize>),
    /// A large piece, written from where it is.
    Own(&'a [u8]),
}

/// Runs of consecutive small pieces copied into one buffer (returned), and
/// the large pieces between them left where they are.
fn coalesce<'a>(pieces: impl Iterator<Item = &'a [u8]>) -> (Vec<u8>, Vec<Run<'a>>) {
    let mut glue = Vec::new();
    let mut runs = Vec::new();
    let mut open: Option<usize> = None;
    for p in pieces {
        if p.len() < GLUE_BELOW {
            open.get_or_insert(glue.len());
            glue.extend_from_slice(p);
            continue;
        }
        if let Some(start) = open.take() {
            runs.push(Run::Glued(start..glue.len()));
        }
        runs.push(Run::Own(p));
    }
    if let Some(start) = open {
        runs.push(Run::Glued(start..glue.len()));
    }
    (glue, runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{noise, store_with as store};
    use crate::BoxError;
    use std::os::unix::fs::FileExt;

    /// Frames handed over in pieces: each a 4-byte length (built on the
    /// fly) then the frame's own bytes (borrowed).
    #[derive(Debug, PartialEq)]
    struct Frames(Vec<Vec<u8>>);

    impl Spill for Frames {
        fn weight(&self) -> usize {
            self.0.iter().map(Vec::len).sum()
        }
        fn encode(&self, out: &mut Vec<u8>) -> std::result::Result<(), BoxError> {
            for f in &self.0 {
                out.extend_from_slice(&(f.len() as u32).to_le_bytes());
                out.extend_from_slice(f);
            }
            Ok(())
        }
        fn decode(mut bytes: &[u8]) -> std::result::Result<Self, BoxError> {
            let mut frames = Vec::new();
            while !bytes.is_empty() {
                let (len, rest) = bytes.split_at_checked(4).ok_or("cut length")?;
                let len = u32::from_le_bytes(len.try_into()?) as usize;
                let (f, rest) = rest.split_at_checked(len).ok_or("cut frame")?;
                frames.push(f.to_vec());
                bytes = rest;
            }
            Ok(Frames(frames))
        }
        fn encoded_pieces(&self) -> Option<EncodedPieces<'_>> {
            let mut p = EncodedPieces::new();
            for f in &self.0 {
                p.push((f.len() as u32).to_le_bytes());
                p.push_slice(f);
            }
            Some(p)
        }
    }

    /// Frames of mixed sizes: small ones glued together, large ones
    /// written from where they are.
    fn frames(compressible: bool) -> Frames {
        let frame = |n: usize, s: u64| {
            if compressible {
                (0..n).map(|i| (i % 13) as u8).collect()
            } else {
                noise(s, n)
            }
        };
        Frames(vec![
            frame(10, 1),
            frame(300_000, 2),
            frame(5, 3),
            frame(0, 4),
            frame(20_000, 5),
            frame(700_000, 6),
            frame(3, 7),
        ])
    }

    fn codec_of(s: &Store<u32>, loc: DiskLoc) -> u8 {
        let mut head = [0u8; record::HEADER];
        let file = std::fs::File::open(s.path_of(loc)).unwrap();
        file.read_exact_at(&mut head, loc.offset).unwrap();
        head[4]
    }

    #[test]
    fn values_in_pieces_round_trip_raw_and_compressed() {
        for (compression, compressible, codec) in [
            (Compression::None, true, Codec::Raw),
            (Compression::Lz4, false, Codec::Raw),
            (Compression::Lz4, true, Codec::Lz4),
        ] {
            let tmp = tempfile::tempdir().unwrap();
            let s = store(tmp.path(), compression);
            let v = frames(compressible);
            let loc = s.put(&1, &v).unwrap();
            assert_eq!(codec_of(&s, loc), codec as u8, "{compression:?}");
            assert_eq!(s.get::<Frames>(&1, loc).unwrap(), v, "{compression:?}");
            // The same record as `encode` would have made.
            let mut enc = Vec::new();
            v.encode(&mut enc).unwrap();
            if codec == Codec::Raw {
                assert_eq!(loc.len(), (record::HEADER + enc.len()) as u64);
            }
            s.validate().unwrap();
        }
    }

    #[test]
    fn a_damaged_piece_is_corrupt() {
        let tmp = tempfile::tempdir().unwrap();
        let s = store(tmp.path(), Compression::None);
        let v = frames(false);
        let loc = s.put(&7, &v).unwrap();
        // A byte inside the second large frame.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(s.path_of(loc))
            .unwrap();
        let at = loc.offset + record::HEADER as u64 + 330_000 + 500_000;
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, at).unwrap();
        file.write_all_at(&[byte[0] ^ 0xFF], at).unwrap();
        let err = s.get::<Frames>(&7, loc).unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains('7'), "{err}");
    }

    #[test]
    fn small_pieces_are_glued_and_large_ones_kept_in_place() {
        let big = vec![1u8; GLUE_BELOW];
        let pieces: Vec<&[u8]> = vec![b"ab", b"c", &big, b"d", &big];
        let (glue, runs) = coalesce(pieces.into_iter());
        assert_eq!(glue, b"abcd");
        let shape: Vec<String> = runs
            .iter()
            .map(|r| match r {
                Run::Glued(r) => format!("{r:?}"),
                Run::Own(p) => format!("own {}", p.len()),
            })
            .collect();
        assert_eq!(shape, ["0..3", "own 16384", "3..4", "own 16384"]);
    }
}
