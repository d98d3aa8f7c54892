//! Fuzz the start mark a receive keeps in `DIR/.btrsend-resume/NAME/start`
//! (which tells a later receive that it made `DIR/NAME` and may start it
//! over): anyone who can write beside DIR can change it. Any text must
//! parse or give nothing, never panic; a mark read must read back the same
//! from the text written for it.
//!
//! Seeds (what a receive writes): `seeds/start_mark/`, given after the corpus:
//! `cargo fuzz run start_mark corpus/start_mark seeds/start_mark`.
#![no_main]

use btrsend::receive::apply::fuzz;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        fuzz::start(text);
    }
});
