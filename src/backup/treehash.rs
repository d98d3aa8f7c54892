//! The BLAKE3 of a raw stream, hashed so that its state can be written
//! down and taken up again by another process (a `backup run` continuing
//! the multipart upload a killed run left, see [`partial`](super::partial)).
//!
//! `blake3::Hasher` has no serialised form. BLAKE3 is a tree hash, and
//! blake3's `hazmat` module hashes its subtrees separately: the input is
//! cut into [`BLOCK`]-byte blocks (16 chunks, a power of two, so each
//! whole block is a subtree of the tree the one-shot hash builds), each
//! block is hashed as a subtree at its offset into a chaining value, and
//! the values are merged as the reference implementation's incremental
//! hasher merges its chunks: after the `n`-th block, once per trailing zero
//! bit of `n`. The state is then small and plain: the stack of merged
//! chaining values (at most 64), the number of whole blocks, and the bytes
//! of the block being filled (less than [`BLOCK`]). A block is hashed only
//! once more input follows it, so the stack never holds the root; the last
//! block (whole or not) is hashed at the end and merged in from the right,
//! the last merge with the root flag. The result is `blake3::hash` of the
//! whole input, byte for byte (the tests check it at every kind of length
//! and cut point).

use blake3::hazmat::{
    ChainingValue, HasherExt, Mode, merge_subtrees_non_root, merge_subtrees_root,
};
use serde::{Deserialize, Serialize};

/// Bytes per block: 16 chunks of 1 KiB (a SIMD batch of blake3).
pub(crate) const BLOCK: usize = 16 << 10;

/// An incremental BLAKE3 whose state can be saved ([`TreeHasher::state`])
/// and restored ([`TreeHasher::from_state`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct TreeHasher {
    /// Chaining values of merged subtrees, largest (leftmost) first.
    stack: Vec<ChainingValue>,
    /// Whole blocks hashed into the stack.
    blocks: u64,
    /// The block being filled (its bytes, fewer than [`BLOCK`] once more
    /// input arrives; exactly [`BLOCK`] at most).
    buf: Vec<u8>,
}

/// A [`TreeHasher`]'s state, as it is recorded (hex strings).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HashState {
    /// Whole blocks hashed.
    pub(crate) blocks: u64,
    /// The chaining values of the stack, hex, leftmost first.
    pub(crate) stack: Vec<String>,
    /// The bytes of the block being filled, hex.
    pub(crate) tail: String,
}

pub(crate) fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(2 * b.len());
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl TreeHasher {
    pub(crate) fn new() -> TreeHasher {
        TreeHasher::default()
    }

    /// The chaining value of whole block number `index`.
    fn block_cv(index: u64, block: &[u8]) -> ChainingValue {
        let mut h = blake3::Hasher::new();
        h.set_input_offset(index * BLOCK as u64);
        h.update(block);
        h.finalize_non_root()
    }

    /// Push the chaining value of the next whole block, merging as the
    /// count of blocks says.
    fn push(&mut self, mut cv: ChainingValue) {
        self.blocks += 1;
        let mut n = self.blocks;
        while n.is_multiple_of(2) {
            // OK: a merge per trailing zero of the count, and each block
            // pushed one value before: the stack holds one per set bit.
            let Some(left) = self.stack.pop() else { break };
            cv = merge_subtrees_non_root(&left, &cv, Mode::Hash);
            n >>= 1;
        }
        self.stack.push(cv);
    }

    /// Hash more input.
    pub(crate) fn update(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.buf.len() == BLOCK {
                // More input follows the full block: it is not the last.
                let cv = Self::block_cv(self.blocks, &self.buf);
                self.buf.clear();
                self.push(cv);
            }
            if self.buf.is_empty() && data.len() > BLOCK {
                // Whole blocks straight from the input (not the last byte:
                // the last block is hashed at the end).
                let cv = Self::block_cv(self.blocks, &data[..BLOCK]);
                self.push(cv);
                data = &data[BLOCK..];
                continue;
            }
            let n = (BLOCK - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
    }

    /// The hash of all the input.
    pub(crate) fn finalize(&self) -> blake3::Hash {
        if self.stack.is_empty() {
            return blake3::hash(&self.buf);
        }
        let mut cv = Self::block_cv(self.blocks, &self.buf);
        let mut stack = self.stack.clone();
        while stack.len() > 1 {
            let left = stack.pop().unwrap_or_default();
            cv = merge_subtrees_non_root(&left, &cv, Mode::Hash);
        }
        let left = stack.pop().unwrap_or_default();
        merge_subtrees_root(&left, &cv, Mode::Hash)
    }

    /// The state, to be recorded.
    pub(crate) fn state(&self) -> HashState {
        HashState {
            blocks: self.blocks,
            stack: self.stack.iter().map(|cv| hex(cv)).collect(),
            tail: hex(&self.buf),
        }
    }

    /// A hasher from a recorded state; `None` when it is not one
    /// [`TreeHasher::state`] can give.
    pub(crate) fn from_state(s: &HashState) -> Option<TreeHasher> {
        let stack = s
            .stack
            .iter()
            .map(|h| unhex(h)?.try_into().ok())
            .collect::<Option<Vec<ChainingValue>>>()?;
        let buf = unhex(&s.tail)?;
        let whole = stack.is_empty() && s.blocks == 0;
        let consistent = u64::from(s.blocks.count_ones()) == stack.len() as u64
            && buf.len() <= BLOCK
            && (whole || !buf.is_empty());
        consistent.then_some(TreeHasher {
            stack,
            blocks: s.blocks,
            buf,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 + i / 251) as u8).collect()
    }

    #[test]
    fn it_is_blake3_at_every_kind_of_length() {
        let lens = [
            0,
            1,
            1023,
            1024,
            1025,
            BLOCK - 1,
            BLOCK,
            BLOCK + 1,
            2 * BLOCK,
            2 * BLOCK + 7,
            3 * BLOCK,
            4 * BLOCK,
            5 * BLOCK + 1000,
            8 * BLOCK,
            8 * BLOCK + 1,
            13 * BLOCK + 4321,
            64 * BLOCK,
            100 * BLOCK + 1,
        ];
        for n in lens {
            let data = input(n);
            let want = blake3::hash(&data);
            let mut one = TreeHasher::new();
            one.update(&data);
            assert_eq!(one.finalize(), want, "{n} bytes at once");
            let mut pieces = TreeHasher::new();
            for c in data.chunks(777) {
                pieces.update(c);
            }
            assert_eq!(pieces.finalize(), want, "{n} bytes in pieces");
        }
    }

    #[test]
    fn a_recorded_state_goes_on_to_the_same_hash() {
        let data = input(37 * BLOCK + 555);
        let want = blake3::hash(&data);
        for cut in [
            0,
            1,
            BLOCK,
            BLOCK + 1,
            5 * BLOCK - 3,
            16 * BLOCK,
            data.len() - 1,
            data.len(),
        ] {
            let mut h = TreeHasher::new();
            h.update(&data[..cut]);
            let json = serde_json::to_string(&h.state()).unwrap();
            let s: HashState = serde_json::from_str(&json).unwrap();
            let mut again = TreeHasher::from_state(&s).unwrap();
            again.update(&data[cut..]);
            assert_eq!(again.finalize(), want, "cut at {cut}");
        }
    }

    #[test]
    fn an_impossible_state_is_refused() {
        let mut h = TreeHasher::new();
        h.update(&input(3 * BLOCK + 10));
        let good = h.state();
        assert!(TreeHasher::from_state(&good).is_some());
        let mut s = good.clone();
        s.blocks = 4;
        assert!(
            TreeHasher::from_state(&s).is_none(),
            "one value per set bit"
        );
        let mut s = good.clone();
        s.stack[0].pop();
        assert!(TreeHasher::from_state(&s).is_none());
        let mut s = good.clone();
        s.tail = "zz".into();
        assert!(TreeHasher::from_state(&s).is_none());
        let mut s = good;
        s.tail = String::new();
        assert!(TreeHasher::from_state(&s).is_none(), "blocks but no tail");
    }
}
