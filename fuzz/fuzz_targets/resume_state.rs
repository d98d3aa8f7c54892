//! Fuzz the resume state file a receive keeps in
//! `DIR/.btrsend-resume/NAME/state` (and `durable`): anyone who can write
//! beside DIR can change it. Any text must parse or give an error, never
//! panic. The first input byte chooses: the text as it is (whose first
//! line, a token, random text almost never makes), or the text after a
//! valid token line, so that the lines behind it (boot id, FILEATTRs) are
//! reached: that must parse.
//!
//! Seeds (what a receive writes): `seeds/resume_state/`, given after the corpus:
//! `cargo fuzz run resume_state corpus/resume_state seeds/resume_state`.
#![no_main]

use btrsend::receive::apply::fuzz;
use btrsend::resume::{Shape, Token};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    if mode & 1 == 0 {
        fuzz::state(text);
        return;
    }
    let token = Token {
        uuid: [7; 16],
        ctransid: 12,
        parent_uuid: [0; 16],
        parent_ctransid: 0,
        version: 2,
        index: u64::from(mode),
        offset: 4096,
        shape: Shape([9; 16]),
    };
    assert!(fuzz::state(&format!("{token}\n{text}")));
});
