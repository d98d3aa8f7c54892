//! Memory for tree blocks.
//!
//! A send reads every tree block it needs once and keeps it in the block
//! cache, so nearly every read wants memory never touched before: from the
//! heap that costs a page fault per 4 KiB (a warm incremental send of a
//! 500k-file tree took ~4,600 faults, a fifth of its time). Blocks are
//! instead carved from regions of anonymous memory advised for transparent
//! huge pages — one fault per 2 MiB where the system allows it — and the
//! slot of a dropped block is reused by the next read of that size.
//!
//! Regions are kept for the life of the process: the pool grows to the
//! largest number of blocks held at once (the block cache's bound plus the
//! reads in flight) and no further. When a region cannot be mapped, blocks
//! come from the heap.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, PoisonError};

/// Size of one region (virtual; pages are touched as slots are used).
const REGION: usize = 32 << 20;

/// Free slots by slot size (a filesystem has one node size; a few at most).
type FreeLists = Vec<(usize, Vec<&'static mut [u8]>)>;

static POOL: Mutex<FreeLists> = Mutex::new(Vec::new());

enum Slot {
    Pooled(&'static mut [u8]),
    Heap(Box<[u8]>),
}

/// A buffer for one tree block, from the pool (or the heap). Its contents
/// on creation are unspecified (a reused slot holds an older block's
/// bytes): the reader overwrites all of it.
pub struct BlockBuf {
    slot: Option<Slot>,
}

impl BlockBuf {
    /// A buffer of `len` bytes.
    pub fn new(len: usize) -> BlockBuf {
        let pooled = {
            let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
            let i = match pool.iter().position(|(size, _)| *size == len) {
                Some(i) => i,
                None => {
                    pool.push((len, Vec::new()));
                    pool.len().saturating_sub(1)
                }
            };
            pool.get_mut(i).and_then(|(_, free)| {
                if free.is_empty() {
                    grow(len, free);
                }
                free.pop()
            })
        };
        let slot = match pooled {
            Some(s) => Slot::Pooled(s),
            None => Slot::Heap(vec![0; len].into_boxed_slice()),
        };
        BlockBuf { slot: Some(slot) }
    }

    /// A buffer holding a copy of `bytes` (tests, small blocks).
    pub fn copy_of(bytes: &[u8]) -> BlockBuf {
        let mut buf = BlockBuf::new(bytes.len());
        buf.copy_from_slice(bytes);
        buf
    }
}

/// Map a region and cut it into free slots of `len` bytes (nothing when
/// the mapping fails or `len` does not fit).
fn grow(len: usize, free: &mut Vec<&'static mut [u8]>) {
    if len == 0 || len > REGION {
        return;
    }
    let Ok(map) = memmap2::MmapMut::map_anon(REGION) else {
        return;
    };
    // Advice only: without huge pages the region works the same.
    let _ = map.advise(memmap2::Advice::HugePage);
    let region: &'static mut memmap2::MmapMut = Box::leak(Box::new(map));
    let region: &'static mut [u8] = region.as_mut();
    // Reversed, so slots are handed out in address order.
    free.extend(region.chunks_exact_mut(len).rev());
}

impl Deref for BlockBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.slot {
            Some(Slot::Pooled(s)) => s,
            Some(Slot::Heap(b)) => b,
            None => &[],
        }
    }
}

impl DerefMut for BlockBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.slot {
            Some(Slot::Pooled(s)) => s,
            Some(Slot::Heap(b)) => b,
            None => &mut [],
        }
    }
}

impl Drop for BlockBuf {
    fn drop(&mut self) {
        if let Some(Slot::Pooled(s)) = self.slot.take() {
            let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((_, free)) = pool.iter_mut().find(|(size, _)| *size == s.len()) {
                free.push(s);
            }
        }
    }
}

impl fmt::Debug for BlockBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockBuf")
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_distinct() {
        // An odd size no filesystem uses, so other tests do not share it.
        let len = 12_288 + 7;
        let a = BlockBuf::copy_of(&vec![1; len]);
        let b = BlockBuf::copy_of(&vec![2; len]);
        assert_eq!(a.len(), len);
        assert!(a.iter().all(|&x| x == 1) && b.iter().all(|&x| x == 2));
        let addr = a.as_ptr() as usize;
        drop(a);
        let c = BlockBuf::new(len);
        assert_eq!(c.as_ptr() as usize, addr, "the freed slot is reused");
        assert!(b.iter().all(|&x| x == 2), "other slots are untouched");
        assert_ne!(c.as_ptr(), b.as_ptr());
    }

    #[test]
    fn sizes_beyond_a_region_come_from_the_heap() {
        let big = BlockBuf::new(REGION + 1);
        assert_eq!(big.len(), REGION + 1);
        assert!(big.iter().all(|&x| x == 0));
        assert_eq!(BlockBuf::new(0).len(), 0);
    }
}
