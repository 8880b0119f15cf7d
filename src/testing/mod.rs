//! Test doubles for hosts and for this crate's own tests and fuzz targets:
//! a storage layer that fails on demand, the op runner of the model tests,
//! and record helpers. Built only with the `testing` feature (this crate's
//! tests, benches and fuzz targets turn it on), so a user's build carries
//! none of it.

pub use crate::store::faulty::{Faults, FaultyStorage, WriteFault};

#[doc(hidden)]
pub mod ops;

/// Decode a record exactly as a read of a small record does (the same
/// function): check the header and both checksums, then decompress.
/// Returns the encoded value bytes, or what is wrong with the record.
/// Never panics, whatever the bytes: the `record` fuzz target holds it to
/// that.
#[doc(hidden)]
pub fn decode_record(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    crate::store::get::payload(bytes, &mut out).map(<[u8]>::to_vec)
}

/// Seal `payload` into a record with valid checksums whatever its content:
/// tagged lz4 when `lz4` (the payload need not be a valid lz4 block), raw
/// otherwise, claiming `raw_len` bytes once decoded. Lets a fuzzer reach the
/// decompressor past the checksums.
#[doc(hidden)]
pub fn seal_record(payload: &[u8], lz4: bool, raw_len: u64) -> Vec<u8> {
    use crate::store::codec::Codec;
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
    use crate::store::codec;
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
