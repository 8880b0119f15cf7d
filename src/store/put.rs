//! Writing values: encode, compress when it pays, seal as a record
//! ([`record`]) and append it to a segment. One value at a time
//! ([`Store::put`]), or small ones packed into shared writes
//! ([`Store::put_batch`]). Runs on the IO pool.

use super::codec::{self, Codec, Compression};
use super::record;
use super::scratch::{with_scratch, Scratch};
use super::stitch;
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

    /// Write small values, packed: one call per [`BATCH_BYTES`] of records
    /// (within one segment). A value whose memory is its encoding
    /// ([`Spill::as_encoded`]) and that stays raw is written from where it
    /// is, behind its header, with no copy; the others are encoded and
    /// sealed into one buffer. `done(i, result)` is called for `items[i]`
    /// as soon as its fate is known. A value that fails to encode fails
    /// alone; if a packed write fails, its records are tried one by one,
    /// exactly as unbatched writes would be, so that one record's fate does
    /// not hang on its neighbours' (a budget that fits some, a fault that
    /// cleared).
    pub(crate) fn put_batch<'v, V: Spill>(
        &self,
        items: &[(&K, &'v V)],
        mut done: impl FnMut(usize, Result<DiskLoc>),
    ) {
        let batch_limit = BATCH_BYTES.min(self.segment_size() as usize);
        with_scratch(|sc| {
            sc.batch.clear();
            // The records gathered for the next write, and their bytes.
            let mut packed: Vec<Packed<'v>> = Vec::new();
            let mut bytes = 0;
            for (i, &(key, value)) in items.iter().enumerate() {
                let res = self
                    .check_budget(record::HEADER as u64)
                    .and_then(|()| self.small_record(key, value, sc));
                let rec = match res {
                    Ok(rec) => rec,
                    Err(e) => {
                        done(i, Err(e));
                        continue;
                    }
                };
                // A larger write would get a file of its own, and the space
                // bound of compaction assumes segment-sized files.
                if !packed.is_empty() && bytes + rec.len() > batch_limit {
                    self.write_packed(items, &packed, &sc.batch, &mut done);
                    packed.clear();
                    sc.batch.clear();
                    bytes = 0;
                }
                bytes += rec.len();
                let start = sc.batch.len();
                let own = match rec {
                    Small::Sealed { len, in_b } => {
                        let rec = if in_b { &sc.b } else { &sc.a };
                        sc.batch.extend_from_slice(&rec[..len]);
                        &[][..]
                    }
                    Small::Own { head, payload } => {
                        sc.batch.extend_from_slice(&head);
                        payload
                    }
                };
                packed.push(Packed {
                    item: i,
                    in_batch: start..sc.batch.len(),
                    own,
                });
            }
            if !packed.is_empty() {
                self.write_packed(items, &packed, &sc.batch, &mut done);
            }
            sc.batch.clear();
        });
    }

    /// One small value as a record: a header for its own memory when that
    /// is its encoding and lz4 does not pay, else sealed whole in scratch.
    fn small_record<'v, V: Spill>(
        &self,
        key: &K,
        value: &'v V,
        sc: &mut Scratch,
    ) -> Result<Small<'v>> {
        // A panic here falls back to `encode`, which reports it.
        let Some(bytes) = catch_unwind(AssertUnwindSafe(|| value.as_encoded()))
            .ok()
            .flatten()
        else {
            let (len, in_b) = self.encode_record(key, value, sc)?;
            return Ok(Small::Sealed { len, in_b });
        };
        let raw_len = bytes.len() as u64;
        if self.compression() == Compression::Lz4 {
            if let Some(n) = codec::compress_into(bytes, &mut sc.b, record::HEADER) {
                record::seal(&mut sc.b[..record::HEADER + n], Codec::Lz4, raw_len);
                return Ok(Small::Sealed {
                    len: record::HEADER + n,
                    in_b: true,
                });
            }
        }
        let mut head = [0u8; record::HEADER];
        record::seal_header(&mut head, Codec::Raw, bytes, raw_len);
        Ok(Small::Own {
            head,
            payload: bytes,
        })
    }

    /// Write the records `packed` (laid out in `buf` and in their values'
    /// memory) with one call, adjacent ranges of `buf` as one piece.
    fn write_packed<V>(
        &self,
        items: &[(&K, &V)],
        packed: &[Packed<'_>],
        buf: &[u8],
        done: &mut impl FnMut(usize, Result<DiskLoc>),
    ) {
        let mut pieces: Vec<&[u8]> = Vec::with_capacity(2 * packed.len());
        let mut open: Option<std::ops::Range<usize>> = None;
        for p in packed {
            open = Some(match open.take() {
                Some(o) if o.end == p.in_batch.start => o.start..p.in_batch.end,
                o => {
                    pieces.extend(o.map(|o| &buf[o]));
                    p.in_batch.clone()
                }
            });
            if !p.own.is_empty() {
                pieces.extend(open.take().map(|o| &buf[o]));
                pieces.push(p.own);
            }
        }
        pieces.extend(open.map(|o| &buf[o]));
        let records: Vec<(&K, u64)> = packed.iter().map(|p| (items[p.item].0, p.len())).collect();
        match self.write_records(&pieces, &records) {
            Ok(locs) => {
                for (p, loc) in packed.iter().zip(locs) {
                    done(p.item, Ok(loc));
                }
            }
            // A full disk fails them all alike: one by one they would
            // only fill the last partial block, each failure counted.
            Err(e) if packed.len() > 1 && !matches!(e, Error::DiskFull { .. }) => {
                for p in packed {
                    let rec = [&buf[p.in_batch.clone()], p.own];
                    done(p.item, self.write_pieces(items[p.item].0, &rec));
                }
            }
            Err(e) => {
                for p in packed {
                    done(p.item, Err(e.clone()));
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
        // Two pieces, header then payload, in one `pwritev()`, rather
        // than checksumming and writing 256 KiB pieces in turn: that would
        // read the value once instead of twice, but make 17 syscalls, each
        // taking the file's write lock and the dirty-page throttling
        // check, which costs more than the second read.
        let mut head = [0u8; record::HEADER];
        record::seal_header(&mut head, Codec::Raw, bytes, raw_len);
        self.write_pieces(key, &[&head, bytes])
    }

    /// `pieces` compressed into a sealed record, or `None` if lz4 does
    /// not pay. Each large piece is compressed where it is and the blocks
    /// joined ([`super::stitch`]): no copy as large as the value is made.
    fn compress_pieces(&self, pieces: &EncodedPieces<'_>) -> Option<Vec<u8>> {
        let mut rec = vec![0u8; record::HEADER];
        let n = stitch::compress(pieces.iter(), &mut rec)?;
        if !codec::pays(pieces.len(), n) {
            return None;
        }
        record::seal(&mut rec, Codec::Lz4, pieces.len() as u64);
        Some(rec)
    }

    /// Write a large value handed over in pieces ([`EncodedPieces`]): as
    /// [`Self::put_in_place`], from the value's own memory behind a header
    /// on the stack, the pieces written one after another; compressed
    /// piece by piece instead when samples say lz4 may pay.
    fn put_pieces(&self, key: &K, pieces: &EncodedPieces<'_>) -> Result<DiskLoc> {
        let raw_len = pieces.len() as u64;
        if self.compression() == Compression::Lz4 {
            let pays = with_scratch(|sc| {
                codec::might_pay(|| pieces.iter(), pieces.len(), &mut sc.a, &mut sc.b)
            });
            if let Some(rec) = pays.then(|| self.compress_pieces(pieces)).flatten() {
                return self.write(key, &rec);
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

/// A small value's record, before it joins a packed write.
enum Small<'v> {
    /// Sealed whole in scratch: `len` bytes of `sc.b` if `in_b`, else of
    /// `sc.a`.
    Sealed { len: usize, in_b: bool },
    /// A header for a raw payload written from the value's own memory.
    Own {
        head: [u8; record::HEADER],
        payload: &'v [u8],
    },
}

impl Small<'_> {
    fn len(&self) -> usize {
        match self {
            Small::Sealed { len, .. } => *len,
            Small::Own { head, payload } => head.len() + payload.len(),
        }
    }
}

/// One record of a packed write: its bytes in the batch buffer (the
/// header, or the whole record when it was sealed in scratch), then those
/// left in the value's own memory (the payload, or nothing).
struct Packed<'v> {
    item: usize,
    in_batch: std::ops::Range<usize>,
    own: &'v [u8],
}

impl Packed<'_> {
    fn len(&self) -> u64 {
        (self.in_batch.len() + self.own.len()) as u64
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

    /// A packed batch mixes records written from the values' own memory
    /// (raw), sealed in scratch (lz4) and empty ones, over several writes
    /// and segments; each reads back as it went in, with its codec.
    #[test]
    fn a_packed_batch_of_raw_lz4_and_empty_records_reads_back() {
        for compression in [Compression::None, Compression::Lz4] {
            let tmp = tempfile::tempdir().unwrap();
            let s = store(tmp.path(), compression);
            let values: Vec<Vec<u8>> = (0..700u64)
                .map(|i| match i % 3 {
                    0 => noise(i, 4096),
                    1 => vec![(i % 7) as u8; 16_384],
                    _ => noise(i, (i % 5) as usize),
                })
                .collect();
            let keys: Vec<u32> = (0..values.len() as u32).collect();
            let items: Vec<(&u32, &Vec<u8>)> = keys.iter().zip(&values).collect();
            let mut locs = vec![None; items.len()];
            s.put_batch(&items, |i, res| locs[i] = Some(res.unwrap()));
            for (i, v) in values.iter().enumerate() {
                let loc = locs[i].expect("every item reported");
                let lz4 = compression == Compression::Lz4 && i % 3 == 1;
                let want = if lz4 { Codec::Lz4 } else { Codec::Raw };
                assert_eq!(codec_of(&s, loc), want as u8, "{compression:?} {i}");
                assert_eq!(&s.get::<Vec<u8>>(&(i as u32), loc).unwrap(), v);
            }
            s.validate().unwrap();
        }
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
