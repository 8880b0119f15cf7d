//! Boxed and shared slices of plain-old-data (`Box<[T]>`, `Arc<[T]>`,
//! feature `slices`): the same encoding as `Vec<T>`, their bytes, so a
//! value spilled as one reads back as any of the three. Written straight
//! from their memory and read back straight into it.

use super::pod::elements;
use super::spill::Spill;
use crate::error::BoxError;
use std::sync::Arc;

impl<T: bytemuck::Pod + Send + Sync> Spill for Box<[T]> {
    fn weight(&self) -> usize {
        std::mem::size_of_val(&**self)
    }

    fn encode(&self, out: &mut Vec<u8>) -> Result<(), BoxError> {
        out.extend_from_slice(bytemuck::cast_slice(self));
        Ok(())
    }

    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        Vec::<T>::decode(bytes).map(Vec::into_boxed_slice)
    }

    fn as_encoded(&self) -> Option<&[u8]> {
        Some(bytemuck::cast_slice(self))
    }

    fn decode_in_place(
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<(), BoxError>,
    ) -> Option<Result<Self, BoxError>> {
        // The vector's capacity is its length: boxing it keeps the memory
        // the read filled (a test checks).
        Vec::<T>::decode_in_place(len, fill).map(|r| r.map(Vec::into_boxed_slice))
    }
}

/// The weight is the whole slice, whoever else holds it: the buffer keeps
/// it alive, and cannot know whether other handles will outlive it.
impl<T: bytemuck::Pod + Send + Sync> Spill for Arc<[T]> {
    fn weight(&self) -> usize {
        std::mem::size_of_val(&**self)
    }

    fn encode(&self, out: &mut Vec<u8>) -> Result<(), BoxError> {
        out.extend_from_slice(bytemuck::cast_slice(self));
        Ok(())
    }

    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        let mut arc = zeroed_arc::<T>(elements::<T>(bytes.len())?);
        fill_arc(&mut arc, &mut |dst| {
            dst.copy_from_slice(bytes);
            Ok(())
        })?;
        Ok(arc)
    }

    fn as_encoded(&self) -> Option<&[u8]> {
        Some(bytemuck::cast_slice(self))
    }

    fn decode_in_place(
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<(), BoxError>,
    ) -> Option<Result<Self, BoxError>> {
        let mut arc = zeroed_arc::<T>(elements::<T>(len).ok()?);
        Some(fill_arc(&mut arc, fill).map(|()| arc))
    }
}

/// A shared slice of `n` zeroed `T`s, allocated once with its reference
/// counts (an `Arc<[T]>` made from a `Vec` would copy the elements into a
/// second allocation). Unlike `zeroed_vec` this writes the zeros; a
/// zero-page allocation (`Arc::new_zeroed_slice`) needs Rust 1.92.
fn zeroed_arc<T: bytemuck::Pod>(n: usize) -> Arc<[T]> {
    std::iter::repeat_n(T::zeroed(), n).collect()
}

/// Let `fill` write the bytes of `arc`, which nothing else holds yet.
fn fill_arc<T: bytemuck::Pod>(
    arc: &mut Arc<[T]>,
    fill: &mut dyn FnMut(&mut [u8]) -> Result<(), BoxError>,
) -> Result<(), BoxError> {
    let slice = Arc::get_mut(arc).ok_or("a freshly made slice is shared")?;
    fill(bytemuck::cast_slice_mut(slice))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::check;

    #[test]
    fn slices_round_trip() {
        check::round_trip(Box::<[f64]>::from([1.5, -2.0, f64::MAX]));
        check::round_trip(Arc::<[f64]>::from([1.5, -2.0, f64::MAX]));
        check::round_trip(Box::<[u32]>::from([]));
        check::round_trip(Arc::<[[u16; 3]]>::from(vec![[1, 2, 3]; 5]));
        check::in_place_round_trip(Box::<[u64]>::from(vec![7; 100]));
        check::in_place_round_trip(Arc::<[u64]>::from(vec![7; 100]));
    }

    #[test]
    fn slices_read_the_same_records_as_vectors() {
        let v = vec![3.0f64, 4.0];
        let mut enc = Vec::new();
        v.encode(&mut enc).unwrap();
        assert_eq!(&*Box::<[f64]>::decode(&enc).unwrap(), v.as_slice());
        assert_eq!(&*Arc::<[f64]>::decode(&enc).unwrap(), v.as_slice());
    }

    #[test]
    fn slices_weigh_their_elements() {
        assert_eq!(Box::<[f64]>::from(vec![0.0; 10]).weight(), 80);
        let shared = Arc::<[u32]>::from(vec![0; 10]);
        let other = Arc::clone(&shared);
        assert_eq!(shared.weight(), 40);
        assert_eq!(other.weight(), 40);
    }

    #[test]
    fn slices_decode_in_place_into_their_own_memory() {
        let b = check::decoded_in_place(&Box::<[u64]>::from(vec![5; 1 << 14]));
        assert!(check::holds_read(b.as_ptr().cast(), b.len() * 8));
        let a = check::decoded_in_place(&Arc::<[u64]>::from(vec![5; 1 << 14]));
        assert!(check::holds_read(a.as_ptr().cast(), a.len() * 8));
        assert!(a.iter().all(|&x| x == 5));
    }

    #[test]
    fn slices_reject_partial_elements() {
        let err = Box::<[u64]>::decode(&[0u8; 12]).unwrap_err();
        assert!(err.to_string().contains("12 bytes"), "{err}");
        let err = Arc::<[u64]>::decode(&[0u8; 9]).unwrap_err();
        assert!(err.to_string().contains("9 bytes"), "{err}");
        assert!(Box::<[u64]>::decode_in_place(12, &mut |_| Ok(())).is_none());
        assert!(Arc::<[u64]>::decode_in_place(12, &mut |_| Ok(())).is_none());
    }
}
