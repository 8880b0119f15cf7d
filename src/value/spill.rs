//! The [`Spill`] trait itself.

use super::pieces::EncodedPieces;
use crate::error::BoxError;

/// A value that can live in a [`crate::SpillBuffer`].
///
/// `encode` and `decode` run on the buffer's IO pool (or on the caller's
/// thread for the blocking [`crate::SpillBuffer::get`]), never under a lock.
pub trait Spill: Sized + Send + Sync + 'static {
    /// Bytes this value occupies in memory: what the memory target counts.
    fn weight(&self) -> usize;
    /// Append the encoded form of the value to `out`.
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), BoxError>;
    /// Rebuild a value from what `encode` wrote.
    fn decode(bytes: &[u8]) -> Result<Self, BoxError>;

    /// The encoded form as one borrowed slice, for a value whose memory
    /// already is its encoding (what `encode` would append). The value is
    /// then written to disk straight from its own memory rather than
    /// copied into a buffer first (a small one as one piece of a packed
    /// write). Must agree with `encode`.
    /// Defaults to: `None` (the value is encoded into a buffer).
    fn as_encoded(&self) -> Option<&[u8]> {
        None
    }

    /// The encoded form as several pieces, most borrowed from the value,
    /// for a value whose encoding is its own buffers framed by a little
    /// metadata (a record batch's arrays, a list of frames). Laid end to
    /// end the pieces must be exactly what `encode` appends. A large value
    /// is then written to disk from its own memory, piece after piece,
    /// rather than gathered into a buffer first. Returning `None` (also
    /// when the pieces cannot be produced) falls back to `encode`, which
    /// reports any error.
    /// Defaults to: `None`.
    fn encoded_pieces(&self) -> Option<EncodedPieces<'_>> {
        None
    }

    /// Rebuild a value straight into its own memory: allocate it for `len`
    /// encoded bytes, let `fill` write those bytes into it (from disk, or
    /// from the decompressor), and return it. A large value is then read
    /// back with no intermediate buffer. An error from `fill` must be
    /// returned as is. Returns `None`, without calling `fill`, for types
    /// that have no such path; they are decoded from a buffer by `decode`.
    /// Defaults to: `None`.
    fn decode_in_place(
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<(), BoxError>,
    ) -> Option<Result<Self, BoxError>> {
        let _ = (len, fill);
        None
    }
}
