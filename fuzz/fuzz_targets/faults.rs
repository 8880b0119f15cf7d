//! The `ops` target over the failing storage layer: fault operations fail
//! the Nth write, read or file creation, tear writes and flip bits on read.
//! Reads under an armed read fault may fail but never return a wrong
//! value; once faults clear, every key reads back as inserted.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillbuffer::testing::ops::{ops_from_bytes, Config, Runner};

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, rest)) = data.split_first() else {
        return;
    };
    let dir = std::env::temp_dir().join("spillbuffer-fuzz-faults");
    std::fs::create_dir_all(&dir).expect("fuzz directory");
    Runner::new(&dir, Config::from_byte(cfg), true).run(&ops_from_bytes(rest));
});
