//! Strings: written as their UTF-8 bytes; read back into their own memory
//! and checked.

use super::spill::Spill;
use crate::error::BoxError;

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
    use crate::value::check;

    #[test]
    fn strings_round_trip_and_reject_bad_utf8() {
        check::round_trip(String::from("spill ✓"));
        check::in_place_round_trip(String::from("spill ✓"));
        assert_eq!(String::from("héllo").weight(), 6);
        assert!(String::decode(&[0xff, 0xfe]).is_err());
        let bad = String::decode_in_place(2, &mut |dst| {
            dst.copy_from_slice(&[0xff, 0xfe]);
            Ok(())
        });
        assert!(bad.unwrap().is_err());
    }
}
