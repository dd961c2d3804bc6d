//! Fuzz target: see `toolgate::fuzzing::arguments`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| toolgate::fuzzing::arguments(data));
