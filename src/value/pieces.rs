//! [`EncodedPieces`]: an encoding handed over as several slices, most of
//! them borrowed from the value (see [`super::Spill::encoded_pieces`]).

/// A value's encoding as a sequence of byte slices which, laid end to end,
/// are exactly what [`super::Spill::encode`] appends. Each piece is either
/// borrowed from the value (`push_slice`) or held here (`push`): a small
/// header built on the fly, or a reference-counted buffer that shares the
/// value's memory. The store writes the pieces to disk one after another
/// without gathering them first.
#[derive(Default)]
pub struct EncodedPieces<'a> {
    pieces: Vec<Piece<'a>>,
    len: usize,
}

enum Piece<'a> {
    Borrowed(&'a [u8]),
    Held(Box<dyn AsRef<[u8]> + Send + Sync + 'a>),
}

impl Piece<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Piece::Borrowed(b) => b,
            Piece::Held(h) => (**h).as_ref(),
        }
    }
}

impl<'a> EncodedPieces<'a> {
    /// No pieces yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append a slice borrowed from the value (or static).
    pub fn push_slice(&mut self, bytes: &'a [u8]) {
        self.len += bytes.len();
        self.pieces.push(Piece::Borrowed(bytes));
    }

    /// Append a piece this list keeps alive: an owned `Vec<u8>`, or a
    /// handle such as `bytes::Bytes` or an Arrow `Buffer` that shares the
    /// value's memory without copying it.
    pub fn push(&mut self, piece: impl AsRef<[u8]> + Send + Sync + 'a) {
        self.len += piece.as_ref().len();
        self.pieces.push(Piece::Held(Box::new(piece)));
    }

    /// Total bytes: the length of the encoding.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the encoding is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pieces, in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.pieces.iter().map(Piece::bytes)
    }

    /// The pieces as slices, in order (for a vectored write).
    pub fn slices(&self) -> Vec<&[u8]> {
        self.iter().collect()
    }

    /// The encoding gathered into one buffer (a copy).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        self.iter().for_each(|p| out.extend_from_slice(p));
        out
    }
}

impl std::fmt::Debug for EncodedPieces<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncodedPieces")
            .field("pieces", &self.pieces.len())
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_concatenate_in_order_and_count_their_length() {
        let value = vec![7u8; 10];
        let mut p = EncodedPieces::new();
        assert!(p.is_empty());
        p.push(vec![1u8, 2]);
        p.push_slice(&value);
        p.push_slice(&[]);
        p.push(*b"end");
        assert_eq!(p.len(), 15);
        assert_eq!(p.slices().len(), 4);
        let mut want = vec![1u8, 2];
        want.extend_from_slice(&value);
        want.extend_from_slice(b"end");
        assert_eq!(p.to_vec(), want);
    }
}
