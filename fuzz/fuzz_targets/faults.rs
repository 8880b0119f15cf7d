//! The `ops` target over the failing storage layer: fault operations fail
//! the Nth write, read or file creation, tear writes and flip bits on read.
//! Reads under an armed read fault may fail but never return a wrong
//! value; once faults clear, every key reads back as inserted.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillbuffer::testing::ops::run_input;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join("spillbuffer-fuzz-faults");
    std::fs::create_dir_all(&dir).expect("fuzz directory");
    run_input(&dir, data, true);
});
