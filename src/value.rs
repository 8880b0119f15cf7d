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
        Ok(bytemuck::pod_collect_to_vec(bytes))
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

    #[test]
    fn strings_round_trip_and_reject_bad_utf8() {
        round_trip(String::from("spill ✓"));
        assert!(String::decode(&[0xff, 0xfe]).is_err());
    }
}
