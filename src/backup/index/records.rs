//! [`Records`]: keys and their values, in key order, kept in one buffer.
//!
//! A leaf of the index's tree holds a few hundred small records, and the
//! indexer puts its changes in the tree in runs of thousands: as a vector
//! of two vectors each, every record cost two allocations to make and two
//! frees when its page was written, which took a tenth of the time a
//! large stream took to index. Here a record is a slot (where its key
//! starts, the lengths of key and value) over bytes shared by all.

use std::cmp::Ordering;

/// Where one record's bytes are: its key at `start`, its value right
/// after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    start: usize,
    key_len: usize,
    value_len: usize,
}

impl Slot {
    fn key_end(self) -> usize {
        self.start + self.key_len
    }

    fn end(self) -> usize {
        self.key_end() + self.value_len
    }
}

/// Records in the order of their slots: bytes no slot names any more
/// (removed or replaced values) are dropped once they are as many as the
/// bytes in use.
#[derive(Clone, Default)]
pub(crate) struct Records {
    bytes: Vec<u8>,
    slots: Vec<Slot>,
    /// Bytes the slots name.
    live: usize,
}

impl Records {
    /// Room for `records` records of `bytes` bytes in all.
    pub(crate) fn with_capacity(bytes: usize, records: usize) -> Records {
        Records {
            bytes: Vec::with_capacity(bytes),
            slots: Vec::with_capacity(records),
            live: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Record `i`'s key.
    pub(crate) fn key(&self, i: usize) -> &[u8] {
        let s = self.slots[i];
        &self.bytes[s.start..s.key_end()]
    }

    /// Record `i`'s value.
    pub(crate) fn value(&self, i: usize) -> &[u8] {
        let s = self.slots[i];
        &self.bytes[s.key_end()..s.end()]
    }

    /// Record `i`'s key and value.
    pub(crate) fn get(&self, i: usize) -> (&[u8], &[u8]) {
        (self.key(i), self.value(i))
    }

    /// The records from `from` on, in order.
    pub(crate) fn iter_from(&self, from: usize) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        (from..self.len()).map(|i| self.get(i))
    }

    /// Every record, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.iter_from(0)
    }

    /// The bytes `key` and `value` take, as a new slot.
    fn add_bytes(&mut self, key: &[u8], value: &[u8]) -> Slot {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(key);
        self.bytes.extend_from_slice(value);
        self.live += key.len() + value.len();
        Slot {
            start,
            key_len: key.len(),
            value_len: value.len(),
        }
    }

    /// Add a record after the others.
    pub(crate) fn push(&mut self, key: &[u8], value: &[u8]) {
        let s = self.add_bytes(key, value);
        self.slots.push(s);
    }

    /// Add a record at `i`.
    pub(crate) fn insert(&mut self, i: usize, key: &[u8], value: &[u8]) {
        let s = self.add_bytes(key, value);
        self.slots.insert(i, s);
    }

    /// Give record `i` the value `value`.
    pub(crate) fn set_value(&mut self, i: usize, value: &[u8]) {
        let s = self.slots[i];
        if s.value_len == value.len() {
            self.bytes[s.key_end()..s.end()].copy_from_slice(value);
            return;
        }
        let key = self.key(i).to_vec();
        self.live -= s.end() - s.start;
        self.slots[i] = self.add_bytes(&key, value);
        self.compact_if_sparse();
    }

    /// Remove record `i`; its value.
    pub(crate) fn remove(&mut self, i: usize) -> Vec<u8> {
        let v = self.value(i).to_vec();
        let s = self.slots.remove(i);
        self.live -= s.end() - s.start;
        self.compact_if_sparse();
        v
    }

    /// The records from `i` on, taken out.
    pub(crate) fn split_off(&mut self, i: usize) -> Records {
        let tail = self.slots.split_off(i);
        let mut out = Records::with_capacity(0, tail.len());
        out.bytes
            .reserve(tail.iter().map(|s| s.end() - s.start).sum());
        for s in tail {
            self.live -= s.end() - s.start;
            let (k, v) = self.bytes[s.start..s.end()].split_at(s.key_len);
            out.push(k, v);
        }
        self.compact_if_sparse();
        out
    }

    /// Where `key` is (`Ok`), or where it would go (`Err`).
    pub(crate) fn search(&self, key: &[u8]) -> Result<usize, usize> {
        self.slots
            .binary_search_by(|s| self.bytes[s.start..s.key_end()].cmp(key))
    }

    /// The number of records whose keys satisfy `pred`, which holds for
    /// a first part of them alone.
    pub(crate) fn partition_point(&self, pred: impl Fn(&[u8]) -> bool) -> usize {
        self.slots
            .partition_point(|s| pred(&self.bytes[s.start..s.key_end()]))
    }

    /// Put the records in key order (records of one key keep their order).
    pub(crate) fn sort(&mut self) {
        let bytes = &self.bytes;
        self.slots
            .sort_by(|a, b| bytes[a.start..a.key_end()].cmp(&bytes[b.start..b.key_end()]));
    }

    /// Whether the keys ascend, no key twice.
    pub(crate) fn is_ascending(&self) -> bool {
        (1..self.len()).all(|i| self.key(i - 1) < self.key(i))
    }

    /// Drop the bytes no record uses, when they are as many as the used.
    fn compact_if_sparse(&mut self) {
        if self.bytes.len() <= 2 * self.live + 256 {
            return;
        }
        let mut bytes = Vec::with_capacity(self.live);
        for s in &mut self.slots {
            let start = bytes.len();
            bytes.extend_from_slice(&self.bytes[s.start..s.end()]);
            s.start = start;
        }
        self.bytes = bytes;
    }

    /// `a`'s records and the records `run` of `b`, in key order: where
    /// both have a key, `b`'s record is taken.
    pub(crate) fn merge(a: &Records, b: &Records, run: std::ops::Range<usize>) -> Records {
        // Room for the part of `b` taken alone: a run of thousands of
        // records is merged into leaves a few at a time, and each dirty
        // leaf keeps the room it was made with until it is written.
        let taken: usize = b.slots[run.clone()].iter().map(|s| s.end() - s.start).sum();
        let mut out = Records::with_capacity(a.live + taken, a.len() + run.len());
        let (mut i, mut j) = (0, run.start);
        while i < a.len() || j < run.end {
            let take_b = match (i < a.len(), j < run.end) {
                (true, true) => match a.key(i).cmp(b.key(j)) {
                    Ordering::Less => false,
                    Ordering::Greater => true,
                    Ordering::Equal => {
                        i += 1;
                        true
                    }
                },
                (true, false) => false,
                _ => true,
            };
            if take_b {
                let (k, v) = b.get(j);
                out.push(k, v);
                j += 1;
            } else {
                let (k, v) = a.get(i);
                out.push(k, v);
                i += 1;
            }
        }
        out
    }

    /// The records `range` of `self` added after `out`'s.
    pub(crate) fn copy_into(&self, range: std::ops::Range<usize>, out: &mut Records) {
        for i in range {
            let (k, v) = self.get(i);
            out.push(k, v);
        }
    }
}

impl PartialEq for Records {
    fn eq(&self, other: &Records) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Records {}

impl std::fmt::Debug for Records {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<K: AsRef<[u8]>, V: AsRef<[u8]>> FromIterator<(K, V)> for Records {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Records {
        let mut r = Records::default();
        for (k, v) in iter {
            r.push(k.as_ref(), v.as_ref());
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(r: &Records) -> Vec<(Vec<u8>, Vec<u8>)> {
        r.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect()
    }

    #[test]
    fn records_follow_a_vector_of_pairs() {
        // The same edits on both, checked after each: values of changing
        // lengths leave garbage that compaction must not lose records in.
        let mut r = Records::default();
        let mut want: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for step in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = (x % 400).to_be_bytes().to_vec();
            let value = vec![step as u8; (x % 37) as usize];
            match (x >> 20) % 4 {
                0 | 1 => match want.binary_search_by(|(k, _)| k.cmp(&key)) {
                    Ok(i) => {
                        want[i].1.clone_from(&value);
                        assert_eq!(r.search(&key), Ok(i));
                        r.set_value(i, &value);
                    }
                    Err(i) => {
                        want.insert(i, (key.clone(), value.clone()));
                        assert_eq!(r.search(&key), Err(i));
                        r.insert(i, &key, &value);
                    }
                },
                2 => {
                    if let Ok(i) = want.binary_search_by(|(k, _)| k.cmp(&key)) {
                        let (_, v) = want.remove(i);
                        assert_eq!(r.remove(i), v);
                    }
                }
                _ => {
                    let at = want.partition_point(|(k, _)| *k < key);
                    assert_eq!(r.partition_point(|k| k < key.as_slice()), at);
                    let tail = want.split_off(at);
                    let rt = r.split_off(at);
                    assert_eq!(pairs(&rt), tail);
                    want.extend(tail);
                    // Merged back in two runs, each past the end of the records.
                    let half = rt.len() / 2;
                    let mut head = Records::default();
                    rt.copy_into(0..half, &mut head);
                    r = Records::merge(&r, &head, 0..half);
                    r = Records::merge(&r, &rt, half..rt.len());
                }
            }
            assert_eq!(pairs(&r), want, "step {step}");
            assert!(r.bytes.len() <= 2 * r.live + 256 + 64, "step {step}");
        }
    }

    #[test]
    fn merge_takes_the_second_records_value_and_sort_orders_keys() {
        let a: Records = [(b"a", b"1"), (b"c", b"1"), (b"e", b"1")]
            .into_iter()
            .collect();
        let b: Records = [(b"b", b"2"), (b"c", b"2"), (b"f", b"2")]
            .into_iter()
            .collect();
        let m = Records::merge(&a, &b, 0..b.len());
        assert_eq!(Records::merge(&a, &b, 1..2), {
            let x: Records = [(b"a", b"1"), (b"c", b"2"), (b"e", b"1")]
                .into_iter()
                .collect();
            x
        });
        let want: Vec<(Vec<u8>, Vec<u8>)> =
            [("a", "1"), ("b", "2"), ("c", "2"), ("e", "1"), ("f", "2")]
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect();
        assert_eq!(pairs(&m), want);
        assert!(m.is_ascending());
        // A few records of a large run make a leaf of their size.
        let big: Records = (0u32..10_000)
            .map(|i| (i.to_be_bytes(), [7u8; 40]))
            .collect();
        let leaf = Records::merge(&a, &big, 5..8);
        assert_eq!(leaf.len(), 6);
        assert!(leaf.bytes.capacity() < 1024, "{}", leaf.bytes.capacity());
        let mut s: Records = [(b"z", b"1"), (b"a", b"2"), (b"m", b"3")]
            .into_iter()
            .collect();
        assert!(!s.is_ascending());
        s.sort();
        assert_eq!(
            s.iter().map(|(k, _)| k.to_vec()).collect::<Vec<_>>(),
            [b"a".to_vec(), b"m".to_vec(), b"z".to_vec()]
        );
    }
}
