//! Fuzz the undo journal a receive into directories keeps in
//! `DIR/.btrsend-resume/NAME/undo-K`: anyone who can write beside DIR can
//! change it. Any bytes must give entries or an error, never panic; every
//! entry read must encode back to itself. The first input byte chooses:
//! the bytes as a whole journal file (whose entries' check sums random
//! bytes almost never get right), or the rest as entry bodies (each after
//! a one-byte length) framed with right sums, so that the entry decoder
//! is reached: then the journal is read, and has at most those entries.
//!
//! Seeds (what a receive writes): `seeds/undo_journal/`, given after the corpus:
//! `cargo fuzz run undo_journal corpus/undo_journal seeds/undo_journal`.
#![no_main]

use btrsend::receive::apply::fuzz;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        let _ = fuzz::journal(rest);
        return;
    }
    let mut file = b"bsundo01".to_vec();
    file.extend_from_slice(&u64::from(mode >> 1).to_le_bytes());
    let mut framed = 0;
    while let Some((&len, tail)) = rest.split_first() {
        let (body, tail) = tail.split_at(usize::from(len).min(tail.len()));
        file.extend_from_slice(&u32::try_from(body.len()).unwrap().to_le_bytes());
        file.extend_from_slice(&blake3::hash(body).as_bytes()[..4]);
        file.extend_from_slice(body);
        framed += 1;
        rest = tail;
    }
    let (read, done) = fuzz::journal(&file).expect("a journal with its magic is read");
    assert!(read <= framed);
    assert_eq!(done, u64::from(mode >> 1));
});
