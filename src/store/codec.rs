//! Per-record compression: lz4 (block format, into reused buffers) when it
//! pays, raw bytes when it does not. The codec is stored as a one-byte tag in
//! each record header, so records of both kinds can share a segment.

/// Whether records are compressed before they are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Store encoded values as they are.
    None,
    /// lz4 per record, skipped for records it does not shrink.
    #[default]
    Lz4,
}

/// The codec tag written into each record header. The numbers are part of
/// the on-disk format (docs/format.md) and never change meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Codec {
    Raw = 0,
    Lz4 = 1,
}

impl Codec {
    pub(crate) fn from_tag(tag: u8) -> Option<Codec> {
        match tag {
            0 => Some(Codec::Raw),
            1 => Some(Codec::Lz4),
            _ => None,
        }
    }
}

/// Records shorter than this are never compressed: what compression saves
/// on them is less than what it costs, and a record's stored size then
/// equals its encoded size, as a Dask worker's spilled frames do (its
/// `maybe_compress` leaves frames under 10 kB alone).
pub(crate) const MIN_COMPRESS: usize = 10_000;

/// A record longer than this is first tried on samples: [`SAMPLES`]
/// windows of [`WINDOW`] bytes spread over it, each compressed alone. If
/// they do not shrink, the record is stored raw without a full pass (as a
/// worker samples a frame before compressing it). Smaller records are
/// tried whole: the samples would be most of them.
const SAMPLED: usize = 4 * SAMPLES * WINDOW;
const SAMPLES: usize = 5;
const WINDOW: usize = 10_000;

/// Keep the compressed form only if it is at most 7/10 of the raw bytes,
/// the ratio a worker asks of its samples and frames: a smaller saving
/// is not worth lz4's time on write and on every read.
pub(crate) fn pays(raw: usize, compressed: usize) -> bool {
    compressed * 10 <= raw * 7
}

/// The start of window `i` of [`SAMPLES`] spread evenly over `total` bytes
/// (the first at 0, the last ending at `total`).
fn window_start(i: usize, total: usize) -> usize {
    (total - WINDOW) / (SAMPLES - 1) * i
}

/// Make `out` at least `need` bytes long for lz4 to write into. A buffer
/// too small is replaced by a zeroed allocation rather than grown: a large
/// one comes from fresh zero pages, so that only the pages the compressed
/// output reaches are ever touched (zeros of 128 MiB compress to half a
/// MiB; filling the whole bound first would cost more than compressing).
fn room(out: &mut Vec<u8>, need: usize) {
    if out.len() >= need {
        return;
    }
    if out.capacity() >= need {
        out.resize(need, 0);
        return;
    }
    *out = vec![0u8; need];
}

/// Try to compress `raw` into `out[at..]`. Returns the compressed length
/// when it pays, `None` when the record should be stored raw. `out` is grown
/// as needed but never shrunk, so a reused buffer costs no memset after the
/// first use; only `out[at..at + len]` is meaningful afterwards (the
/// samples are compressed into `out[..]`).
pub(crate) fn compress_into(raw: &[u8], out: &mut Vec<u8>, at: usize) -> Option<usize> {
    if raw.len() < MIN_COMPRESS {
        return None;
    }
    if raw.len() > SAMPLED {
        room(out, lz4_flex::block::get_maximum_output_size(WINDOW));
        let mut compressed = 0;
        for i in 0..SAMPLES {
            let at = window_start(i, raw.len());
            compressed += lz4_flex::block::compress_into(&raw[at..at + WINDOW], out).ok()?;
        }
        if !pays(SAMPLES * WINDOW, compressed) {
            return None;
        }
    }
    room(
        out,
        at + lz4_flex::block::get_maximum_output_size(raw.len()),
    );
    let n = lz4_flex::block::compress_into(raw, &mut out[at..]).ok()?;
    pays(raw.len(), n).then_some(n)
}

/// Whether lz4 may pay on an input of `total` bytes given as `pieces()`, told
/// without gathering them: a large input is tried on the samples
/// [`compress_into`] takes (each copied into `window`, compressed into
/// `out`); a smaller one is left to [`compress_into`].
pub(crate) fn might_pay<'a, I: Iterator<Item = &'a [u8]>>(
    pieces: impl Fn() -> I,
    total: usize,
    window: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> bool {
    if total < MIN_COMPRESS {
        return false;
    }
    if total <= SAMPLED {
        return true;
    }
    room(out, lz4_flex::block::get_maximum_output_size(WINDOW));
    let mut compressed = 0;
    for i in 0..SAMPLES {
        let start = window_start(i, total);
        window.clear();
        let mut offset = 0;
        for p in pieces() {
            let (from, to) = (start.max(offset), (start + WINDOW).min(offset + p.len()));
            if from < to {
                window.extend_from_slice(&p[from - offset..to - offset]);
            }
            offset += p.len();
            if offset >= start + WINDOW {
                break;
            }
        }
        match lz4_flex::block::compress_into(window, out) {
            Ok(n) => compressed += n,
            Err(_) => return false,
        }
    }
    pays(SAMPLES * WINDOW, compressed)
}

/// Decompress `stored` (an lz4 block of `raw_len` bytes) into `out`, which is
/// resized to exactly `raw_len`.
pub(crate) fn decompress_into(
    stored: &[u8],
    raw_len: usize,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    if out.len() < raw_len {
        out.resize(raw_len, 0);
    }
    let n = lz4_flex::block::decompress_into(stored, &mut out[..raw_len])
        .map_err(|e| format!("lz4 decompression failed: {e}"))?;
    if n != raw_len {
        return Err(format!(
            "lz4 block decompressed to {n} bytes, header says {raw_len}"
        ));
    }
    out.truncate(raw_len);
    Ok(())
}

/// Decompress `stored` (an lz4 block) into exactly all of `out`.
pub(crate) fn decompress_exact(stored: &[u8], out: &mut [u8]) -> Result<(), String> {
    let n = lz4_flex::block::decompress_into(stored, out)
        .map_err(|e| format!("lz4 decompression failed: {e}"))?;
    if n != out.len() {
        return Err(format!(
            "lz4 block decompressed to {n} bytes, header says {}",
            out.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressible_data_round_trips() {
        let raw: Vec<u8> = (0..100_000u32)
            .flat_map(|i| (i % 7).to_le_bytes())
            .collect();
        let mut out = vec![0u8; 3];
        let n = compress_into(&raw, &mut out, 3).expect("repetitive data compresses");
        assert!(n < raw.len() / 4);
        let mut back = Vec::new();
        decompress_into(&out[3..3 + n], raw.len(), &mut back).unwrap();
        assert_eq!(back, raw);
    }

    #[test]
    fn incompressible_data_is_stored_raw() {
        let raw = noise(1_000_000, 0x9E37_79B9_7F4A_7C15);
        assert_eq!(compress_into(&raw, &mut Vec::new(), 0), None);
        assert_eq!(compress_into(&raw[..1000], &mut Vec::new(), 0), None);
    }

    /// xorshift noise: lz4 finds no matches in it.
    fn noise(len: usize, mut x: u64) -> Vec<u8> {
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn records_under_the_minimum_are_never_compressed() {
        let zeros = vec![0u8; MIN_COMPRESS];
        assert_eq!(compress_into(&zeros[..10], &mut Vec::new(), 0), None);
        assert_eq!(compress_into(&zeros[..500], &mut Vec::new(), 0), None);
        assert_eq!(
            compress_into(&zeros[..MIN_COMPRESS - 1], &mut Vec::new(), 0),
            None
        );
        assert!(compress_into(&zeros, &mut Vec::new(), 0).is_some());
        let pieces = || [&zeros[..500]].into_iter();
        assert!(!might_pay(pieces, 500, &mut Vec::new(), &mut Vec::new()));
    }

    #[test]
    fn samples_decide_before_a_large_record_is_tried() {
        // Zeros but for noise under every sampled window: the whole would
        // compress to almost nothing, the samples say it does not.
        let len = 10 * SAMPLED;
        let mut raw = vec![0u8; len];
        for i in 0..SAMPLES {
            let at = window_start(i, len);
            raw[at..at + WINDOW].copy_from_slice(&noise(WINDOW, i as u64 + 1));
        }
        assert_eq!(compress_into(&raw, &mut Vec::new(), 0), None);
        // And the other way round: noise everywhere but the windows passes
        // the samples, then fails the whole.
        let mut raw = noise(len, 7);
        for i in 0..SAMPLES {
            let at = window_start(i, len);
            raw[at..at + WINDOW].fill(0);
        }
        assert_eq!(compress_into(&raw, &mut Vec::new(), 0), None);
        // A record just under the sampled size is tried whole.
        let mut raw = vec![0u8; SAMPLED];
        raw[..WINDOW].copy_from_slice(&noise(WINDOW, 3));
        assert!(compress_into(&raw, &mut Vec::new(), 0).is_some());
    }

    #[test]
    fn a_saving_under_three_tenths_is_not_kept() {
        // Halves of noise and zeros compress to about 1/2; three quarters
        // of noise to about 3/4.
        let half: Vec<u8> = noise(50_000, 5).into_iter().chain([0; 50_000]).collect();
        assert!(compress_into(&half, &mut Vec::new(), 0).is_some());
        let most: Vec<u8> = noise(75_000, 5).into_iter().chain([0; 25_000]).collect();
        assert_eq!(compress_into(&most, &mut Vec::new(), 0), None);
    }

    #[test]
    fn pieces_are_sampled_as_the_whole_would_be() {
        // Compressible windows at the sampled spots of a noisy whole, split
        // into pieces whose boundaries cut through windows.
        let len = 3 * SAMPLED + 12_345;
        let mut compressible = noise(len, 9);
        for i in 0..SAMPLES {
            let at = window_start(i, len);
            compressible[at..at + WINDOW].fill(1);
        }
        let noisy = noise(len, 11);
        for raw in [&compressible, &noisy] {
            for cut in [1, 4_999, 10_000, 77_777] {
                let pieces: Vec<&[u8]> = raw.chunks(cut).collect();
                let whole_samples_pay = {
                    let mut out = Vec::new();
                    let mut got = 0;
                    for i in 0..SAMPLES {
                        let at = window_start(i, len);
                        room(&mut out, lz4_flex::block::get_maximum_output_size(WINDOW));
                        got += lz4_flex::block::compress_into(&raw[at..at + WINDOW], &mut out)
                            .unwrap();
                    }
                    pays(SAMPLES * WINDOW, got)
                };
                let by_pieces = might_pay(
                    || pieces.iter().copied(),
                    len,
                    &mut Vec::new(),
                    &mut Vec::new(),
                );
                assert_eq!(by_pieces, whole_samples_pay, "cut {cut}");
            }
        }
        assert!(might_pay(
            || [&compressible[..]].into_iter(),
            len,
            &mut Vec::new(),
            &mut Vec::new()
        ));
    }

    #[test]
    fn a_reused_buffer_and_an_offset_give_the_same_record() {
        let raw: Vec<u8> = (0..300_000u32)
            .flat_map(|i| (i / 3).to_le_bytes())
            .collect();
        let mut out = vec![7u8; 5];
        let n = compress_into(&raw, &mut out, 5).expect("a counter compresses");
        let mut back = Vec::new();
        decompress_into(&out[5..5 + n], raw.len(), &mut back).unwrap();
        assert_eq!(back, raw);
        // Again into the same, now large, buffer.
        let m = compress_into(&raw, &mut out, 5).unwrap();
        assert_eq!(m, n);
        decompress_into(&out[5..5 + m], raw.len(), &mut back).unwrap();
        assert_eq!(back, raw);
    }

    #[test]
    fn bad_lz4_block_is_an_error_not_a_panic() {
        let mut out = Vec::new();
        assert!(decompress_into(&[0xff; 20], 1000, &mut out).is_err());
        assert!(decompress_into(&[], 10, &mut out).is_err());
    }

    #[test]
    fn tags_are_stable() {
        assert_eq!(Codec::from_tag(0), Some(Codec::Raw));
        assert_eq!(Codec::from_tag(1), Some(Codec::Lz4));
        assert_eq!(Codec::from_tag(2), None);
    }
}
