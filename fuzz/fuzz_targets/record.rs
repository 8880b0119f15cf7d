//! Arbitrary bytes into the record decoder: `Ok` or a clean error, never a
//! panic or an out-of-bounds read. The first byte picks how the rest is
//! used, so that the fuzzer also reaches the lz4 decoder behind the
//! checksums:
//! - 0: the bytes as a whole record (header, checksums, payload);
//! - 1: the bytes as an lz4 payload sealed with valid checksums, claiming
//!   the decoded length in the first two bytes;
//! - 2: a round trip: encode the bytes (lz4 or raw), decode, compare.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillbuffer::testing::{decode_record, encode_record, seal_record};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 3 {
        0 => drop(decode_record(rest)),
        1 => {
            if rest.len() < 2 {
                return;
            }
            let raw_len = u16::from_le_bytes([rest[0], rest[1]]) as u64;
            drop(decode_record(&seal_record(&rest[2..], true, raw_len)));
        }
        _ => {
            for lz4 in [false, true] {
                let rec = encode_record(rest, lz4);
                assert_eq!(decode_record(&rec).as_deref(), Ok(rest));
                // Any truncation is a clean error.
                assert!(decode_record(&rec[..rec.len() - 1]).is_err());
            }
        }
    }
});
