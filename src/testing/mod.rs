//! Test doubles for hosts and for this crate's own fault tests: a storage
//! layer that fails on demand.

pub use crate::store::faulty::{Faults, FaultyStorage, WriteFault};

#[doc(hidden)]
pub mod ops;

/// Decode a record the way a read does: check the header and both
/// checksums, then decompress. Returns the encoded value bytes, or what is
/// wrong with the record. Never panics, whatever the bytes: the `record`
/// fuzz target holds it to that.
#[doc(hidden)]
pub fn decode_record(bytes: &[u8]) -> Result<Vec<u8>, String> {
    use crate::codec::{self, Codec};
    let rec = crate::store::record::open(bytes)?;
    match rec.codec {
        Codec::Raw => Ok(rec.payload.to_vec()),
        Codec::Lz4 => {
            let raw_len = usize::try_from(rec.raw_len)
                .map_err(|_| "record too large for this machine".to_string())?;
            let mut out = Vec::new();
            codec::decompress_into(rec.payload, raw_len, &mut out)?;
            Ok(out)
        }
    }
}

/// Seal `payload` into a record with valid checksums whatever its content:
/// tagged lz4 when `lz4` (the payload need not be a valid lz4 block), raw
/// otherwise, claiming `raw_len` bytes once decoded. Lets a fuzzer reach the
/// decompressor past the checksums.
#[doc(hidden)]
pub fn seal_record(payload: &[u8], lz4: bool, raw_len: u64) -> Vec<u8> {
    use crate::codec::Codec;
    use crate::store::record;
    let mut buf = vec![0u8; record::HEADER];
    buf.extend_from_slice(payload);
    let codec = if lz4 { Codec::Lz4 } else { Codec::Raw };
    record::seal(&mut buf, codec, raw_len);
    buf
}

/// Encode `raw` as a spill would: lz4 when `lz4` and it pays, raw
/// otherwise.
#[doc(hidden)]
pub fn encode_record(raw: &[u8], lz4: bool) -> Vec<u8> {
    use crate::codec;
    use crate::store::record;
    let mut out = Vec::new();
    match lz4
        .then(|| codec::compress_into(raw, &mut out, record::HEADER))
        .flatten()
    {
        Some(n) => {
            out.truncate(record::HEADER + n);
            record::seal(&mut out, codec::Codec::Lz4, raw.len() as u64);
            out
        }
        None => seal_record(raw, false, raw.len() as u64),
    }
}
