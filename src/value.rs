//! The [`Spill`] trait: how a value is weighed, written out and read back,
//! and the implementations this crate provides.

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
    /// already is its encoding (what `encode` would append). A large value
    /// is then written to disk straight from its own memory rather than
    /// copied into a buffer first. Must agree with `encode`.
    /// Defaults to: `None` (the value is encoded into a buffer).
    fn as_encoded(&self) -> Option<&[u8]> {
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

/// Plain-old-data vectors are written as their bytes, with no per-element work.
impl<T: bytemuck::Pod + Send + Sync> Spill for Vec<T> {
    fn weight(&self) -> usize {
        std::mem::size_of_val(self.as_slice())
    }

    fn encode(&self, out: &mut Vec<u8>) -> Result<(), BoxError> {
        out.extend_from_slice(bytemuck::cast_slice(self.as_slice()));
        Ok(())
    }

    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        let size = std::mem::size_of::<T>();
        if size == 0 {
            return Err("cannot decode a vector of zero-sized elements".into());
        }
        if bytes.len() % size != 0 {
            return Err(format!(
                "{} bytes is not a whole number of {size}-byte elements",
                bytes.len()
            )
            .into());
        }
        // The source slice may be unaligned for T; copying into a fresh,
        // properly aligned vector is the one copy decode has to make.
        // (`zeroed_vec` allocates zeroed memory in one call; a generic
        // `vec![T::zeroed(); n]` would fill it element by element.)
        let mut v: Vec<T> = bytemuck::zeroed_vec(bytes.len() / size);
        bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(bytes);
        Ok(v)
    }

    fn as_encoded(&self) -> Option<&[u8]> {
        Some(bytemuck::cast_slice(self.as_slice()))
    }

    fn decode_in_place(
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<(), BoxError>,
    ) -> Option<Result<Self, BoxError>> {
        let size = std::mem::size_of::<T>();
        if size == 0 || len % size != 0 {
            // Let `decode` report it, with its message.
            return None;
        }
        // Zeroed memory: a large vector comes from fresh zero pages that
        // the read fills, with no memset pass.
        let mut v: Vec<T> = bytemuck::zeroed_vec(len / size);
        Some(fill(bytemuck::cast_slice_mut(v.as_mut_slice())).map(|()| v))
    }
}

/// Strings are written as their UTF-8 bytes; decoding checks them.
impl Spill for String {
    fn weight(&self) -> usize {
        self.len()
    }

    fn encode(&self, out: &mut Vec<u8>) -> Result<(), BoxError> {
        out.extend_from_slice(self.as_bytes());
        Ok(())
    }

    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        Ok(std::str::from_utf8(bytes)?.to_owned())
    }

    fn as_encoded(&self) -> Option<&[u8]> {
        Some(self.as_bytes())
    }

    fn decode_in_place(
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<(), BoxError>,
    ) -> Option<Result<Self, BoxError>> {
        let mut bytes = vec![0u8; len];
        Some(fill(&mut bytes).and_then(|()| String::from_utf8(bytes).map_err(BoxError::from)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<V: Spill + PartialEq + std::fmt::Debug>(v: V) {
        let mut out = vec![0xAA]; // encode appends, it does not overwrite
        v.encode(&mut out).unwrap();
        assert_eq!(out[0], 0xAA);
        assert_eq!(V::decode(&out[1..]).unwrap(), v);
    }

    #[test]
    fn pod_vectors_round_trip() {
        round_trip(vec![1.5f64, -2.0, f64::MAX]);
        round_trip(vec![7u8; 33]);
        round_trip(Vec::<u32>::new());
        round_trip(vec![[1u16, 2, 3]; 5]);
    }

    #[test]
    fn weight_counts_payload_bytes() {
        assert_eq!(vec![0f64; 10].weight(), 80);
        assert_eq!(String::from("héllo").weight(), 6);
    }

    #[test]
    fn pod_decode_rejects_partial_element() {
        let err = Vec::<u64>::decode(&[0u8; 12]).unwrap_err();
        assert!(err.to_string().contains("12 bytes"), "{err}");
    }

    #[test]
    fn pod_decode_from_unaligned_slice() {
        let mut bytes = [0u8; 17];
        bytes[1..].copy_from_slice(bytemuck::cast_slice(&[3u64, 4u64]));
        assert_eq!(Vec::<u64>::decode(&bytes[1..]).unwrap(), vec![3, 4]);
    }

    /// `as_encoded` and `decode_in_place` agree with `encode` and `decode`.
    fn in_place_round_trip<V: Spill + PartialEq + std::fmt::Debug>(v: V) {
        let mut enc = Vec::new();
        v.encode(&mut enc).unwrap();
        assert_eq!(v.as_encoded(), Some(enc.as_slice()));
        let back = V::decode_in_place(enc.len(), &mut |dst| {
            dst.copy_from_slice(&enc);
            Ok(())
        })
        .expect("provided types decode in place")
        .unwrap();
        assert_eq!(back, v);
        let err = V::decode_in_place(enc.len(), &mut |_| Err("disk on fire".into()))
            .unwrap()
            .unwrap_err();
        assert_eq!(err.to_string(), "disk on fire");
    }

    #[test]
    fn provided_types_encode_and_decode_in_place() {
        in_place_round_trip(vec![1.5f64, -2.0, f64::MAX]);
        in_place_round_trip(vec![[1u16, 2, 3]; 5]);
        in_place_round_trip(String::from("spill ✓"));
        assert!(Vec::<u64>::decode_in_place(12, &mut |_| Ok(())).is_none());
    }

    #[test]
    fn strings_round_trip_and_reject_bad_utf8() {
        round_trip(String::from("spill ✓"));
        assert!(String::decode(&[0xff, 0xfe]).is_err());
    }
}
