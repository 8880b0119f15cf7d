//! Plain-old-data vectors (`Vec<T: bytemuck::Pod>`): written as their
//! bytes, with no per-element work, and read back straight into the
//! vector's own memory.

use super::spill::Spill;
use crate::error::BoxError;

impl<T: bytemuck::Pod + Send + Sync> Spill for Vec<T> {
    fn weight(&self) -> usize {
        std::mem::size_of_val(self.as_slice())
    }

    fn encode(&self, out: &mut Vec<u8>) -> Result<(), BoxError> {
        out.extend_from_slice(bytemuck::cast_slice(self.as_slice()));
        Ok(())
    }

    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        let n = elements::<T>(bytes.len())?;
        // The source slice may be unaligned for T; copying into a fresh,
        // properly aligned vector is the one copy decode has to make.
        // (`zeroed_vec` allocates zeroed memory in one call; a generic
        // `vec![T::zeroed(); n]` would fill it element by element.)
        let mut v: Vec<T> = bytemuck::zeroed_vec(n);
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
        // A length that is no whole number of elements: let `decode`
        // report it, with its message.
        let n = elements::<T>(len).ok()?;
        // Zeroed memory: a large vector comes from fresh zero pages that
        // the read fills, with no memset pass. Its capacity is exactly
        // `n`, so `into_boxed_slice` keeps the allocation.
        let mut v: Vec<T> = bytemuck::zeroed_vec(n);
        Some(fill(bytemuck::cast_slice_mut(v.as_mut_slice())).map(|()| v))
    }
}

/// How many `T`s `len` encoded bytes hold, or why they cannot be `T`s.
pub(crate) fn elements<T>(len: usize) -> Result<usize, BoxError> {
    let size = std::mem::size_of::<T>();
    if size == 0 {
        return Err("cannot decode a vector of zero-sized elements".into());
    }
    if len % size != 0 {
        return Err(format!("{len} bytes is not a whole number of {size}-byte elements").into());
    }
    Ok(len / size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::check;

    #[test]
    fn pod_vectors_round_trip() {
        check::round_trip(vec![1.5f64, -2.0, f64::MAX]);
        check::round_trip(vec![7u8; 33]);
        check::round_trip(Vec::<u32>::new());
        check::round_trip(vec![[1u16, 2, 3]; 5]);
    }

    #[test]
    fn weight_counts_payload_bytes() {
        assert_eq!(vec![0f64; 10].weight(), 80);
        assert_eq!(vec![[0u16; 3]; 4].weight(), 24);
    }

    #[test]
    fn pod_decode_rejects_partial_element() {
        let err = Vec::<u64>::decode(&[0u8; 12]).unwrap_err();
        assert!(err.to_string().contains("12 bytes"), "{err}");
        assert!(Vec::<u64>::decode_in_place(12, &mut |_| Ok(())).is_none());
        assert!(Vec::<()>::decode(&[]).is_err());
    }

    #[test]
    fn pod_decode_from_unaligned_slice() {
        let mut bytes = [0u8; 17];
        bytes[1..].copy_from_slice(bytemuck::cast_slice(&[3u64, 4u64]));
        assert_eq!(Vec::<u64>::decode(&bytes[1..]).unwrap(), vec![3, 4]);
    }

    #[test]
    fn pod_vectors_encode_and_decode_in_place() {
        check::in_place_round_trip(vec![1.5f64, -2.0, f64::MAX]);
        check::in_place_round_trip(vec![[1u16, 2, 3]; 5]);
        let v = check::decoded_in_place(&vec![9u64; 1000]);
        assert!(check::holds_read(v.as_ptr().cast(), v.len() * 8));
    }
}
