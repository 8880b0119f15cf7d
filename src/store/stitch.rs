//! One lz4 block for a value handed over in pieces, made without gathering
//! the pieces into one copy: each large piece is compressed alone, and the
//! blocks are joined into one by merging the literal runs where they meet.
//!
//! An lz4 block is a series of sequences, each a run of literals followed
//! by a match (an offset back into the output and a length), the last one
//! literals only. A match never reaches before the start of the block it
//! was made in, and offsets count back from where the match is written, so
//! a block's sequences decode the same wherever its output starts. Two
//! blocks therefore make one once the first's closing literal run, any
//! small pieces between them, and the second's opening literal run are
//! written as the literals of the second's first sequence. Appending
//! literals keeps the end-of-block rules (the last bytes are literals, the
//! last match starts far enough from the end) that each block already
//! meets. The result is an ordinary lz4 block of the pieces' concatenation
//! ([`super::codec::decompress_into`] reads it back).

use lz4_flex::block;

/// Pieces at least this large are compressed alone; smaller ones are
/// written as literals.
const ALONE_MIN: usize = 16 << 10;

/// Append to `out` one lz4 block of the concatenation of `pieces`; returns
/// its length. `None` only if lz4 fails (it does not on valid input).
pub(crate) fn compress<'a>(
    pieces: impl Iterator<Item = &'a [u8]>,
    out: &mut Vec<u8>,
) -> Option<usize> {
    let start = out.len();
    // Literals waiting for the next sequence's token.
    let mut pending: Vec<u8> = Vec::new();
    for piece in pieces {
        if piece.len() < ALONE_MIN {
            pending.extend_from_slice(piece);
            continue;
        }
        // A fresh zeroed buffer: untouched pages cost nothing, so only the
        // compressed bytes become resident.
        let mut scratch = vec![0u8; block::get_maximum_output_size(piece.len())];
        let n = block::compress_into(piece, &mut scratch).ok()?;
        join(&scratch[..n], &mut pending, out)?;
    }
    emit(out, &pending, None);
    Some(out.len() - start)
}

/// Write the sequences of `b`, one lz4 block, to `out`, its first
/// sequence's literals after `pending`; its closing literal run is left in
/// `pending` for whatever follows.
fn join(b: &[u8], pending: &mut Vec<u8>, out: &mut Vec<u8>) -> Option<()> {
    let mut pos = 0;
    loop {
        let seq = pos;
        let token = *b.get(pos)?;
        pos += 1;
        let lits = read_len(b, &mut pos, token >> 4)?;
        let literals = b.get(pos..pos.checked_add(lits)?)?;
        pos += lits;
        if pos == b.len() {
            pending.extend_from_slice(literals);
            return Some(());
        }
        // The match: a two-byte offset, then the length's extra bytes.
        let tail = pos;
        pos += 2;
        read_len(b, &mut pos, token & 15)?;
        let matched = b.get(tail..pos)?;
        if pending.is_empty() {
            out.extend_from_slice(b.get(seq..pos)?);
        } else {
            pending.extend_from_slice(literals);
            emit(out, pending, Some((token & 15, matched)));
            pending.clear();
        }
    }
}

/// Read a length whose first four bits are `nibble` (15: more bytes
/// follow, each added, until one under 255), moving `pos` past its extra
/// bytes.
fn read_len(b: &[u8], pos: &mut usize, nibble: u8) -> Option<usize> {
    let mut len = nibble as usize;
    if nibble == 15 {
        loop {
            let x = *b.get(*pos)?;
            *pos += 1;
            len += x as usize;
            if x != 255 {
                break;
            }
        }
    }
    Some(len)
}

/// Write a sequence: `literals`, then the match given as its token nibble
/// and its encoded bytes (offset and extra length bytes), if any.
fn emit(out: &mut Vec<u8>, literals: &[u8], matched: Option<(u8, &[u8])>) {
    let l = literals.len();
    let nibble = matched.map_or(0, |(n, _)| n);
    out.push(((l.min(15) as u8) << 4) | nibble);
    if l >= 15 {
        let mut rest = l - 15;
        while rest >= 255 {
            out.push(255);
            rest -= 255;
        }
        out.push(rest as u8);
    }
    out.extend_from_slice(literals);
    if let Some((_, bytes)) = matched {
        out.extend_from_slice(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes of several kinds: zeros, a repeating pattern, noise.
    fn piece(kind: u64, len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|i| match kind % 3 {
                0 => 0,
                1 => (i % 251) as u8,
                _ => {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                }
            })
            .collect()
    }

    fn roundtrip(pieces: &[Vec<u8>]) {
        let whole: Vec<u8> = pieces.concat();
        let mut out = vec![7u8; 5];
        let n = compress(pieces.iter().map(|p| &p[..]), &mut out).unwrap();
        assert_eq!(out.len(), 5 + n);
        assert_eq!(&out[..5], &[7u8; 5], "what was in `out` stays");
        let back = block::decompress(&out[5..], whole.len()).unwrap();
        assert!(
            back == whole,
            "pieces {:?}",
            pieces.iter().map(Vec::len).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_stitched_block_decodes_to_the_concatenation() {
        roundtrip(&[]);
        roundtrip(&[vec![]]);
        roundtrip(&[piece(1, 100, 1)]);
        roundtrip(&[piece(0, 1 << 20, 1)]);
        roundtrip(&[piece(2, 100, 1), piece(0, 1 << 20, 2), piece(2, 3, 3)]);
        roundtrip(&[piece(0, 1 << 18, 1), piece(0, 1 << 18, 2)]);
        roundtrip(&[
            piece(2, 1 << 17, 1),
            piece(1, 1 << 17, 2),
            vec![],
            piece(0, 20, 3),
        ]);
        // Every mix of kinds and sizes around the threshold.
        let sizes = [0, 1, 14, 15, 16, 270, ALONE_MIN - 1, ALONE_MIN, 100_000];
        let mut seed = 1;
        for a in sizes {
            for b in sizes {
                for kinds in 0..9u64 {
                    seed += 1;
                    roundtrip(&[
                        piece(kinds, a, seed),
                        piece(kinds / 3, b, seed + 1),
                        piece(kinds + 1, 300, seed + 2),
                    ]);
                }
            }
        }
    }

    #[test]
    fn zeros_in_pieces_compress_as_well_as_whole_but_small_pieces() {
        let pieces = [vec![1u8; 120], vec![0u8; 4 << 20], vec![0u8; 5]];
        let mut out = Vec::new();
        let n = compress(pieces.iter().map(|p| &p[..]), &mut out).unwrap();
        let whole = block::compress(&pieces.concat());
        // The small first piece stays literal; the rest costs what it would.
        assert!(n <= whole.len() + 120 + 16, "{n} against {}", whole.len());
    }
}
