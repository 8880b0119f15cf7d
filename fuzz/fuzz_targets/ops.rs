//! Arbitrary operation sequences on a buffer with a tiny target, checked
//! against a `HashMap` model and `validate()` after every step (or, with
//! bit 0 of the second byte, only on flushes so that IO overlaps with the
//! operations). The first byte picks the configuration, the rest decode
//! into operations; see `spillbuffer::testing::ops::run_input`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillbuffer::testing::ops::run_input;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join("spillbuffer-fuzz-ops");
    std::fs::create_dir_all(&dir).expect("fuzz directory");
    run_input(&dir, data, false);
});
