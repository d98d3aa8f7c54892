//! A direct-mapped memo keyed by number: answers looked up once and asked
//! for again (the send's inode items, the indexer's inode kinds).
//!
//! Number `n` can only be in slot `n % slots`, and a new answer replaces
//! what was there. A lookup costs a division and one comparison (a hash
//! map's hashing showed in profiles), and numbers that collide only make
//! the memo miss: never slower than without it, and never a wrong answer.

/// A memo of `V`s by `u64` (see the module docs).
#[derive(Debug)]
pub(crate) struct SlotMemo<V> {
    /// Empty until the first answer; then `len` long.
    slots: Vec<Option<(u64, V)>>,
    len: usize,
}

impl<V: Copy> SlotMemo<V> {
    /// A memo of `len` slots (at least one), allocated with its first
    /// answer. A power of two keeps consecutive numbers, as a directory's
    /// new files have, in distinct slots.
    pub(crate) fn new(len: usize) -> SlotMemo<V> {
        SlotMemo {
            slots: Vec::new(),
            len: len.max(1),
        }
    }

    /// The answer for `n`, if the memo has it.
    pub(crate) fn get(&self, n: u64) -> Option<V> {
        match self.slots.get(self.slot(n))? {
            Some((known, answer)) if *known == n => Some(*answer),
            _ => None,
        }
    }

    /// Keep `answer` for `n`.
    pub(crate) fn put(&mut self, n: u64, answer: V) {
        if self.slots.is_empty() {
            self.slots = vec![None; self.len];
        }
        let at = self.slot(n);
        if let Some(s) = self.slots.get_mut(at) {
            *s = Some((n, answer));
        }
    }

    /// Drop the answer for `n`, if the memo has it.
    pub(crate) fn forget(&mut self, n: u64) {
        let at = self.slot(n);
        if let Some(s) = self.slots.get_mut(at)
            && s.is_some_and(|(known, _)| known == n)
        {
            *s = None;
        }
    }

    fn slot(&self, n: u64) -> usize {
        // The remainder is below `len`, so it fits.
        (n % self.len as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::SlotMemo;

    #[test]
    fn the_memo_answers_only_for_the_number_it_holds() {
        const SLOTS: usize = 1 << 12;
        let mut memo = SlotMemo::<Option<u32>>::new(SLOTS);
        assert_eq!(memo.get(5), None, "an empty memo knows nothing");
        // 5 has no answer of its own: that answer is kept too.
        memo.put(5, None);
        assert_eq!(memo.get(5), Some(None));
        // Another number of the same slot is not answered with 5's.
        let other = 5 + SLOTS as u64;
        assert_eq!(memo.get(other), None);
        memo.put(other, None);
        assert_eq!(memo.get(other), Some(None));
        assert_eq!(memo.get(5), None, "the slot's new number replaced 5");
        // Neighbours take slots of their own.
        memo.put(6, None);
        assert_eq!(memo.get(other), Some(None));
        assert_eq!(memo.get(u64::MAX), None);
        memo.put(u64::MAX, None);
        assert_eq!(memo.get(u64::MAX), Some(None));
        // Forgetting a number leaves its slot's other numbers alone.
        memo.forget(5);
        assert_eq!(memo.get(other), Some(None));
        memo.forget(other);
        assert_eq!(memo.get(other), None);
        assert_eq!(memo.get(6), Some(None));
    }
}
