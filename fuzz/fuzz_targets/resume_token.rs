//! Fuzz resume tokens (`btrsend::resume::Token`): the text a user gives to
//! `send --resume` (and a state file holds), and the bytes a continuation
//! stream's header carries to the receiver. Any input must parse or give
//! an error, never panic; a token read must write back to the same text
//! and bytes. Random bytes almost never carry a right check hash, so the
//! input's first 84 bytes also make a token's fields, sealed with a right
//! hash, to reach the field checks behind it: exactly the valid ones must
//! read back.
#![no_main]

use btrsend::resume::{FIRST_COMMAND, Shape, Token};
use libfuzzer_sys::fuzz_target;

fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[at..at + N]);
    out
}

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data)
        && let Ok(t) = Token::parse(s)
    {
        assert_eq!(Token::parse(&t.to_string()), Ok(t));
    }
    if let Ok(t) = Token::from_bytes(data) {
        assert_eq!(Token::from_bytes(&t.to_bytes()), Ok(t));
    }
    if let Some(b) = data.get(..84) {
        let t = Token {
            uuid: array(b, 0),
            ctransid: u64::from_le_bytes(array(b, 16)),
            parent_uuid: array(b, 24),
            parent_ctransid: u64::from_le_bytes(array(b, 40)),
            // Small versions often, to reach the checks past this one.
            version: u32::from(b[48] % 5),
            index: u64::from_le_bytes(array(b, 52)) >> (b[49] % 64),
            offset: u64::from_le_bytes(array(b, 60)) >> (b[50] % 64),
            shape: Shape(array(b, 68)),
        };
        let valid = (1..=3).contains(&t.version) && t.index > 0 && t.offset >= FIRST_COMMAND;
        match Token::from_bytes(&t.to_bytes()) {
            Ok(back) => {
                assert!(valid, "{t:?} read back");
                assert_eq!(back, t);
                assert_eq!(Token::parse(&t.to_string()), Ok(t));
            }
            Err(e) => assert!(!valid, "{t:?} refused: {e}"),
        }
    }
});
