//! Fuzz `btrsend::backup::fuzz::crypt_keys`: repository bytes someone else may
//! have written must give a result or an error, never a panic, a hang or
//! an unbounded allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| btrsend::backup::fuzz::crypt_keys(data));
