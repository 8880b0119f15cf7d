//! Checks every `Spill` impl's tests share: round trips through both
//! paths, the in-place path's use of the read memory, and corrupt input.

use super::spill::Spill;
use std::cell::Cell;
use std::fmt::Debug;

/// `encode` appends (it does not overwrite), and `decode` gives back an
/// equal value.
pub(crate) fn round_trip<V: Spill + PartialEq + Debug>(v: V) {
    let mut out = vec![0xAA];
    v.encode(&mut out).unwrap();
    assert_eq!(out[0], 0xAA);
    assert_eq!(V::decode(&out[1..]).unwrap(), v);
}

/// `as_encoded` (when given) and `decode_in_place` agree with `encode` and
/// `decode`, and an error from `fill` comes back as is.
pub(crate) fn in_place_round_trip<V: Spill + PartialEq + Debug>(v: V) {
    let mut enc = Vec::new();
    v.encode(&mut enc).unwrap();
    if let Some(bytes) = v.as_encoded() {
        assert_eq!(bytes, enc.as_slice());
    }
    assert_eq!(decoded_in_place(&v), v);
    let err = V::decode_in_place(enc.len(), &mut |_| Err("disk on fire".into()))
        .expect("type decodes in place")
        .unwrap_err();
    assert_eq!(err.to_string(), "disk on fire");
}

thread_local! {
    /// Address range of the memory the last `decoded_in_place` filled.
    static READ_INTO: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

/// `v` encoded, then rebuilt by `decode_in_place` as the store does it,
/// remembering where the read landed (see [`holds_read`]).
pub(crate) fn decoded_in_place<V: Spill>(v: &V) -> V {
    let mut enc = Vec::new();
    v.encode(&mut enc).unwrap();
    V::decode_in_place(enc.len(), &mut |dst| {
        READ_INTO.set((dst.as_ptr() as usize, dst.len()));
        dst.copy_from_slice(&enc);
        Ok(())
    })
    .expect("type decodes in place")
    .unwrap()
}

/// Do the `len` bytes at `ptr` lie inside the memory the last
/// [`decoded_in_place`] read into (so the value uses the read in place)?
pub(crate) fn holds_read(ptr: *const u8, len: usize) -> bool {
    let (start, read_len) = READ_INTO.get();
    let p = ptr as usize;
    p >= start && p + len <= start + read_len
}

/// Every way of damaging `enc` that a test can afford: each truncation (of
/// a sample of lengths for long encodings), and each byte (or a sample)
/// flipped to a few values. `decode` must return an error for every
/// truncation and never panic; for a flipped byte it must either fail or
/// give a value `ok` accepts (a flipped byte in plain data is plain data:
/// the store's checksum is what catches those). No error may come from a
/// panic caught inside `decode`.
#[cfg(any(feature = "arrow", feature = "serde"))]
pub(crate) fn corrupt_input<V: Spill>(enc: &[u8], ok: impl Fn(&V) -> bool) {
    let step = (enc.len() / 512).max(1);
    let no_panic = |e: crate::error::BoxError, what: &str| {
        assert!(!e.to_string().contains("panicked"), "{what}: {e}");
    };
    for len in (0..enc.len()).step_by(step) {
        match V::decode(&enc[..len]) {
            Ok(_) => panic!("a truncation to {len} of {} bytes decoded", enc.len()),
            Err(e) => no_panic(e, &format!("truncation to {len}")),
        }
    }
    let mut bytes = enc.to_vec();
    for at in (0..enc.len()).step_by(step) {
        for flip in [0x01u8, 0x80, 0xFF] {
            bytes[at] ^= flip;
            match V::decode(&bytes) {
                Ok(v) => assert!(ok(&v), "byte {at} ^ {flip:#x} decoded to a bad value"),
                Err(e) => no_panic(e, &format!("byte {at} ^ {flip:#x}")),
            }
            bytes[at] ^= flip;
        }
    }
}
