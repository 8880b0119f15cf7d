//! Arbitrary operation sequences on a buffer with a tiny target, checked
//! against a `HashMap` model and `validate()` after every step. The first
//! byte picks the configuration, the rest decode into operations; see
//! `spillbuffer::testing::ops`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillbuffer::testing::ops::{ops_from_bytes, Config, Runner};

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, rest)) = data.split_first() else {
        return;
    };
    let dir = std::env::temp_dir().join("spillbuffer-fuzz-ops");
    std::fs::create_dir_all(&dir).expect("fuzz directory");
    Runner::new(&dir, Config::from_byte(cfg), false).run(&ops_from_bytes(rest));
});
