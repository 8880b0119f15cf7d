//! Any serde type, through the [`Serde`] wrapper (feature `serde`), in
//! postcard's format. Chosen by measurement against bincode 2 and
//! MessagePack (rmp-serde) on a task record and on rows of small integers
//! (`benches/serde-formats`): postcard's encoding is the smallest, its
//! speed about bincode's on the record and somewhat slower on the rows;
//! MessagePack is the slowest to decode and the largest. postcard's wire
//! format is specified, versioned and maintained; bincode's development
//! ceased in December 2025 (RUSTSEC-2025-0141). The comparison:
//! docs/value-types.md.

use super::spill::Spill;
use crate::error::BoxError;
use ::serde::de::DeserializeOwned;
use ::serde::Serialize;
use postcard::ser_flavors::{self, Flavor};

/// The first byte of every encoding: the format that follows. A record
/// with another tag is refused rather than misread.
const POSTCARD_V1: u8 = 1;

/// Any serde type as a spillable value, encoded with postcard.
///
/// Its weight, fixed when it is made, is what [`Serde::new`] measures: the
/// value's own size plus the length of its encoding, an estimate of the
/// heap memory it owns (strings and vectors are encoded at about their
/// length). Hosts that know better say so with [`Serde::with_weight`].
///
/// ```
/// # #[cfg(feature = "serde")] {
/// use spillbuffer::{Serde, Spill};
///
/// let v = Serde::new((7u64, String::from("chunk"), vec![1.5f64; 4]));
/// let mut out = Vec::new();
/// v.encode(&mut out)?;
/// let back = Serde::<(u64, String, Vec<f64>)>::decode(&out)?;
/// assert_eq!(back.1, "chunk");
/// # }
/// # Ok::<(), spillbuffer::BoxError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Serde<T> {
    value: T,
    weight: usize,
}

impl<T: Serialize> Serde<T> {
    /// Wrap `value`, weighing it by one pass of its serializer: its size
    /// plus the length of its encoding. A value that postcard cannot
    /// encode weighs its size alone; its `encode` will then fail, and the
    /// buffer keeps it in memory and says why.
    pub fn new(value: T) -> Self {
        let encoded =
            postcard::serialize_with_flavor(&value, ser_flavors::Size::default()).unwrap_or(0);
        let weight = std::mem::size_of::<T>() + encoded;
        Serde { value, weight }
    }
}

impl<T> Serde<T> {
    /// Wrap `value` with a weight the host has measured itself: the bytes
    /// of memory it holds.
    pub fn with_weight(value: T, weight: usize) -> Self {
        Serde { value, weight }
    }

    /// The wrapped value.
    pub fn into_inner(self) -> T {
        self.value
    }
}

impl<T> std::ops::Deref for Serde<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: Serialize> From<T> for Serde<T> {
    fn from(value: T) -> Self {
        Serde::new(value)
    }
}

impl<T> Spill for Serde<T>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    fn weight(&self) -> usize {
        self.weight
    }

    fn encode(&self, out: &mut Vec<u8>) -> Result<(), BoxError> {
        out.push(POSTCARD_V1);
        postcard::serialize_with_flavor(&self.value, Append(out))
            .map_err(|e| format!("postcard could not encode the value: {e}"))?;
        Ok(())
    }

    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        let Some((&tag, body)) = bytes.split_first() else {
            return Err("empty record".into());
        };
        if tag != POSTCARD_V1 {
            return Err(format!("unknown serde format tag {tag} (expected {POSTCARD_V1})").into());
        }
        let (value, rest) = postcard::take_from_bytes::<T>(body)
            .map_err(|e| format!("postcard could not decode the value: {e}"))?;
        if !rest.is_empty() {
            return Err(format!("{} bytes left after the value", rest.len()).into());
        }
        // The weight `new` would give: the encoding's length is known.
        let weight = std::mem::size_of::<T>() + body.len();
        Ok(Serde { value, weight })
    }
}

/// A postcard output that appends to a caller's vector (postcard's own
/// vector output owns its vector).
struct Append<'a>(&'a mut Vec<u8>);

impl Flavor for Append<'_> {
    type Output = ();

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::check;
    use ::serde::Deserialize;
    use std::collections::BTreeMap;

    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    enum State {
        Waiting,
        Running { worker: String },
        Done(u32),
    }

    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    struct Task {
        id: u64,
        key: String,
        deps: Vec<String>,
        state: State,
        priority: Option<i32>,
        tags: BTreeMap<String, String>,
        values: Vec<f64>,
    }

    fn task(n: usize) -> Task {
        Task {
            id: 0xDEAD_BEEF_u64 * n as u64,
            key: format!("('sum-chunk', {n}, 3)"),
            deps: (0..3).map(|i| format!("('load', {i})")).collect(),
            state: State::Running {
                worker: "tcp://10.0.0.7:4041".into(),
            },
            priority: Some(-2),
            tags: [("owner".to_string(), "etl".to_string())].into(),
            values: (0..n).map(|i| i as f64 * 0.5).collect(),
        }
    }

    #[test]
    fn serde_values_round_trip() {
        check::round_trip(Serde::new(task(10)));
        check::round_trip(Serde::new(task(0)));
        check::round_trip(Serde::new(State::Waiting));
        check::round_trip(Serde::new(State::Done(7)));
        check::round_trip(Serde::new(String::new()));
        check::round_trip(Serde::new((1u8, vec![Some(2i64), None])));
    }

    #[test]
    fn serde_weight_is_size_plus_encoding_and_survives_a_round_trip() {
        let v = Serde::new(task(100));
        let mut out = Vec::new();
        v.encode(&mut out).unwrap();
        assert_eq!(v.weight(), std::mem::size_of::<Task>() + out.len() - 1);
        assert!(v.weight() > 800, "100 f64s weigh at least their bytes");
        assert_eq!(Serde::<Task>::decode(&out).unwrap().weight(), v.weight());
        assert_eq!(Serde::with_weight(task(1), 12345).weight(), 12345);
    }

    #[test]
    fn serde_refuses_corrupt_input() {
        let v = Serde::new(task(20));
        let mut enc = Vec::new();
        v.encode(&mut enc).unwrap();
        // A flipped byte may still be a well-formed task (a different
        // number); the store's checksum catches those. What must never
        // happen is a panic, or a value from a damaged length.
        check::corrupt_input::<Serde<Task>>(&enc, |t| t.values.len() == 20);
        let err = Serde::<Task>::decode(&[]).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
        let mut wrong_tag = enc.clone();
        wrong_tag[0] = 9;
        let err = Serde::<Task>::decode(&wrong_tag).unwrap_err();
        assert!(err.to_string().contains("tag 9"), "{err}");
        let mut trailing = enc.clone();
        trailing.push(0);
        let err = Serde::<Task>::decode(&trailing).unwrap_err();
        assert!(err.to_string().contains("1 bytes left"), "{err}");
    }

    #[test]
    fn serde_decode_of_a_huge_declared_length_fails_without_allocating_it() {
        // tag, then a varint claiming 2^62 elements for a Vec<u64>.
        let bytes = [1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40];
        assert!(Serde::<Vec<u64>>::decode(&bytes).is_err());
    }

    #[test]
    fn serde_values_postcard_cannot_encode_fail_with_a_message() {
        /// A sequence of unknown length: postcard needs lengths up front.
        struct Unsized;
        impl Serialize for Unsized {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use ::serde::ser::SerializeSeq;
                s.serialize_seq(None)?.end()
            }
        }
        impl<'de> Deserialize<'de> for Unsized {
            fn deserialize<D: ::serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
                Ok(Unsized)
            }
        }
        let v = Serde::new(Unsized);
        assert_eq!(v.weight(), 0);
        let err = v.encode(&mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("postcard"), "{err}");
    }
}
