//! Fuzz `btrsend::backup::fuzz::index`: index pages someone else may have
//! written, and streams applied to an index, must give a result or an
//! error, never a panic, a hang or an unbounded allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| btrsend::backup::fuzz::index(data));
