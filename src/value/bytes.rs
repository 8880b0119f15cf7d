//! `bytes::Bytes` (feature `bytes`): written as its bytes, straight from
//! its memory; read back into a vector that becomes the `Bytes` itself,
//! so the bytes read are the bytes handed out, with no second copy.

use super::spill::Spill;
use crate::error::BoxError;
use ::bytes::Bytes;

/// The weight is the bytes in view: a `Bytes` cut from a larger buffer
/// may keep that whole buffer alive, which the buffer cannot see.
impl Spill for Bytes {
    fn weight(&self) -> usize {
        self.len()
    }

    fn encode(&self, out: &mut Vec<u8>) -> Result<(), BoxError> {
        out.extend_from_slice(self);
        Ok(())
    }

    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        Ok(Bytes::copy_from_slice(bytes))
    }

    fn as_encoded(&self) -> Option<&[u8]> {
        Some(self)
    }

    fn decode_in_place(
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<(), BoxError>,
    ) -> Option<Result<Self, BoxError>> {
        // Zeroed pages from the allocator, filled by the read; `Bytes`
        // takes the vector over without copying it.
        let mut v = vec![0u8; len];
        Some(fill(&mut v).map(|()| Bytes::from(v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::check;

    #[test]
    fn bytes_round_trip() {
        check::round_trip(Bytes::from_static(b"spilled"));
        check::round_trip(Bytes::new());
        check::in_place_round_trip(Bytes::from(vec![7u8; 1000]));
    }

    #[test]
    fn bytes_weigh_the_bytes_in_view() {
        let whole = Bytes::from(vec![1u8; 100]);
        assert_eq!(whole.weight(), 100);
        assert_eq!(whole.slice(10..30).weight(), 20);
    }

    #[test]
    fn bytes_decode_in_place_into_the_read_memory() {
        let b = check::decoded_in_place(&Bytes::from(vec![3u8; 1 << 16]));
        assert!(check::holds_read(b.as_ptr(), b.len()));
        assert!(b.iter().all(|&x| x == 3));
    }

    /// Bytes have no structure to check; the store's checksum is what
    /// catches a damaged record (tests/value_types.rs). What can be checked
    /// here: a slice of a larger `Bytes` encodes only its view.
    #[test]
    fn bytes_encode_only_their_view() {
        let whole = Bytes::from((0..=255u8).collect::<Vec<_>>());
        let mut out = Vec::new();
        whole.slice(3..6).encode(&mut out).unwrap();
        assert_eq!(out, [3, 4, 5]);
    }
}
