//! Fuzz `btrsend::backup::fuzz::remote`: what the far end of `btrsend
//! serve` sends, either way (requests to the server loop, replies to the
//! client store), must give a reply or an error, never a panic, a hang,
//! an unbounded allocation or a file outside the served directory.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| btrsend::backup::fuzz::remote(data));
