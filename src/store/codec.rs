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

/// Inputs larger than this are first tried on a prefix of this size, so that
/// incompressible data costs one small probe rather than a full pass.
const PROBE: usize = 64 * 1024;

/// Keep the compressed form only if it saves at least 1/16 of the bytes:
/// below that, the decompression cost on every read is not worth it.
fn pays(raw: usize, compressed: usize) -> bool {
    compressed < raw - raw / 16
}

/// Try to compress `raw` into `out[at..]`. Returns the compressed length
/// when it pays, `None` when the record should be stored raw. `out` is grown
/// as needed but never shrunk, so a reused buffer costs no memset after the
/// first use; only `out[at..at + len]` is meaningful afterwards.
pub(crate) fn compress_into(raw: &[u8], out: &mut Vec<u8>, at: usize) -> Option<usize> {
    if raw.len() < 64 {
        return None;
    }
    let need = at + lz4_flex::block::get_maximum_output_size(raw.len());
    if out.len() < need {
        out.resize(need, 0);
    }
    if raw.len() > 4 * PROBE {
        let n = lz4_flex::block::compress_into(&raw[..PROBE], &mut out[at..]).ok()?;
        if !pays(PROBE, n) {
            return None;
        }
    }
    let n = lz4_flex::block::compress_into(raw, &mut out[at..]).ok()?;
    pays(raw.len(), n).then_some(n)
}

/// Whether lz4 may pay on an input of `total` bytes given as `pieces`, told
/// without gathering them: a large input is tried on its first [`PROBE`]
/// bytes (copied into `prefix`, compressed into `out`), the probe
/// [`compress_into`] makes; a smaller one is left to [`compress_into`].
pub(crate) fn might_pay<'a>(
    pieces: impl IntoIterator<Item = &'a [u8]>,
    total: usize,
    prefix: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> bool {
    if total < 64 {
        return false;
    }
    if total <= 4 * PROBE {
        return true;
    }
    prefix.clear();
    for p in pieces {
        let take = (PROBE - prefix.len()).min(p.len());
        prefix.extend_from_slice(&p[..take]);
        if prefix.len() == PROBE {
            break;
        }
    }
    let need = lz4_flex::block::get_maximum_output_size(prefix.len());
    if out.len() < need {
        out.resize(need, 0);
    }
    lz4_flex::block::compress_into(prefix, out).is_ok_and(|n| pays(prefix.len(), n))
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
        // xorshift noise: lz4 finds no matches in it.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let raw: Vec<u8> = (0..1_000_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        assert_eq!(compress_into(&raw, &mut Vec::new(), 0), None);
        assert_eq!(compress_into(&raw[..1000], &mut Vec::new(), 0), None);
    }

    #[test]
    fn tiny_values_are_not_compressed() {
        assert_eq!(compress_into(&[0u8; 10], &mut Vec::new(), 0), None);
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
