//! Tree comparison for incremental send: walk the snapshot's ("left") and
//! the parent's ("right") fs trees together in key order and report the
//! items that are new, deleted, changed or (in leaves that differ) the same
//! — the kernel's `btrfs_compare_trees` (Linux `fs/btrfs/send.c`).
//!
//! When two node pointers at the same level and key name the same block
//! (same address and generation), the whole subtree is shared by both
//! snapshots and is skipped without being read: the cost grows with the
//! changes, not with the size of the trees.
//!
//! Readahead: whenever a side enters a node, at that level each side's
//! children that lie in the key range of the other side's node there (or
//! of its neighbours already in the cache) and are not shared with them —
//! the blocks the comparison will read — are announced to the block source
//! (`BlockSource::will_need`; a node's fan-out bounds them), as the tree
//! `Cursor`'s forward scan announces the siblings ahead. Children outside
//! that range are not announced: they may be shared subtrees, which must
//! not be read.

use crate::error::Result;
use crate::ondisk::KeyPtr;
use crate::tree::check::BlockExpect;
use crate::tree::key::Key;
use crate::tree::node::{NodePtr, TreeBlock};
use crate::tree::walk::{BlockSource, ItemRef, TreeRoot};
use crate::types::{Generation, Logical};
use zerocopy::IntoBytes;

/// What happened to an item between the parent and the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Only in the snapshot (left).
    New,
    /// Only in the parent (right).
    Deleted,
    /// In both, with different bytes.
    Changed,
    /// In both, identical, in leaves that are not shared.
    Same,
}

/// One side of the comparison: the path from the root to the current
/// position (block, slot), the deepest entry last.
struct Side<'s, S> {
    source: &'s S,
    path: Vec<(TreeBlock, usize)>,
    end: bool,
    /// The last advance pushed a child block.
    descended: bool,
}

/// Announce the children of `node` that `other` (the other side's node at
/// the same level, if any) does not point to (none when the source's
/// readahead window is 0).
fn announce<S: BlockSource>(source: &S, node: &TreeBlock, others: &[TreeBlock]) {
    let window = source.readahead_window();
    let n = node.node();
    if window == 0 || n.is_leaf() || others.is_empty() {
        return;
    }
    // Children in the key range the other nodes cover and not shared with
    // them (the same key and block, as the comparison checks) are read by
    // the comparison; outside that range, nothing is known. Both sides'
    // pointers are in key order: one forward position per other node
    // answers every child (a merge, not a search per child).
    let theirs: Vec<&[KeyPtr]> = others
        .iter()
        .filter_map(|o| o.node().ptrs())
        .filter(|t| !t.is_empty())
        .collect();
    let mut pos = vec![0usize; theirs.len()];
    let level = n.level().saturating_sub(1);
    let mut upcoming = Vec::new();
    for p in n.ptrs().unwrap_or_default() {
        let key = Key::from(&p.key);
        let mut in_range = false;
        let mut shared = false;
        for (t, i) in theirs.iter().zip(pos.iter_mut()) {
            let (Some(first), Some(last)) = (t.first(), t.last()) else {
                continue;
            };
            if key < Key::from(&first.key) || key > Key::from(&last.key) {
                continue;
            }
            in_range = true;
            while t.get(*i).is_some_and(|q| Key::from(&q.key) < key) {
                *i = i.saturating_add(1);
            }
            // Same key, block and generation: the same 33 bytes.
            if t.get(*i).is_some_and(|q| q.as_bytes() == p.as_bytes()) {
                shared = true;
                break;
            }
        }
        if in_range && !shared {
            upcoming.push(BlockExpect {
                logical: Logical(p.blockptr.get()),
                tree: node.tree(),
                generation: Generation(p.generation.get()),
                level,
                first_key: Some(key),
            });
        }
    }
    if !upcoming.is_empty() {
        source.will_need(&upcoming);
    }
}

impl<S: BlockSource> Side<'_, S> {
    fn top(&self) -> Option<&(TreeBlock, usize)> {
        self.path.last()
    }

    fn level(&self) -> u8 {
        self.top().map_or(0, |(b, _)| b.node().level())
    }

    /// The key at the current position (item key in a leaf, pointer key in
    /// a node).
    fn key(&self) -> Option<Key> {
        let (b, slot) = self.top()?;
        b.node().key(*slot)
    }

    fn ptr(&self) -> Option<NodePtr> {
        let (b, slot) = self.top()?;
        b.node().ptr(*slot)
    }

    /// The node at `level` on the path and its neighbours at that level
    /// that the source holds already (the blocks a node at that level of
    /// the other tree may share children with).
    fn around(&self, level: u8) -> Vec<TreeBlock> {
        let Some(i) = self
            .path
            .iter()
            .position(|(b, _)| b.node().level() == level)
        else {
            return Vec::new();
        };
        let mut out = vec![self.path[i].0.clone()];
        if let Some((parent, slot)) = i.checked_sub(1).and_then(|p| self.path.get(p)) {
            let pn = parent.node();
            for s in [slot.checked_sub(1), slot.checked_add(1)]
                .into_iter()
                .flatten()
            {
                if let Some(p) = pn.ptr(s)
                    && let Some(b) = self.source.cached(&BlockExpect {
                        logical: p.blockptr,
                        tree: parent.tree(),
                        generation: p.generation,
                        level,
                        first_key: Some(p.key),
                    })
                {
                    out.push(b);
                }
            }
        }
        out
    }

    fn item(&self) -> Option<ItemRef<'_>> {
        let (b, slot) = self.top()?;
        let it = b.node().item(*slot)?;
        Some(ItemRef {
            key: it.key,
            data: it.data,
            leaf: b.logical(),
            slot: u32::try_from(*slot).ok()?,
            tree: b.tree(),
            block: Some(b.bytes()),
        })
    }

    /// `tree_advance`: in a leaf, or when `only_next`, step to the next
    /// slot (climbing while a node is exhausted); else descend to the child
    /// at the current slot.
    fn advance(&mut self, only_next: bool) -> Result<()> {
        self.descended = false;
        if self.level() == 0 || only_next {
            loop {
                let Some((b, slot)) = self.path.last_mut() else {
                    self.end = true;
                    return Ok(());
                };
                *slot = slot.saturating_add(1);
                if *slot < b.node().nritems() {
                    return Ok(());
                }
                if self.path.len() == 1 {
                    self.end = true;
                    return Ok(());
                }
                self.path.pop();
            }
        }
        let Some((parent, slot)) = self.top() else {
            self.end = true;
            return Ok(());
        };
        let Some(ptr) = parent.node().ptr(*slot) else {
            self.end = true;
            return Ok(());
        };
        let expect = BlockExpect {
            logical: ptr.blockptr,
            tree: parent.tree(),
            generation: ptr.generation,
            level: parent.node().level().saturating_sub(1),
            first_key: Some(ptr.key),
        };
        let child = self.source.read_block(&expect)?;
        self.path.push((child, 0));
        self.descended = true;
        if self
            .path
            .last()
            .is_some_and(|(b, _)| b.node().nritems() == 0)
        {
            // An empty leaf (only an empty tree has one): nothing here.
            self.advance(true)?;
        }
        Ok(())
    }
}

/// Compare the trees at `left` (the snapshot) and `right` (the parent),
/// calling `f(change, left_item, right_item)` for every item event in key
/// order (`left_item` is `None` for [`Change::Deleted`], `right_item` for
/// [`Change::New`]).
///
/// # Errors
///
/// Block read errors, and whatever `f` returns.
pub(crate) fn compare_trees<S, E>(
    source: &S,
    left: TreeRoot,
    right: TreeRoot,
    mut f: impl FnMut(Change, Option<&ItemRef<'_>>, Option<&ItemRef<'_>>) -> Result<(), E>,
) -> Result<(), E>
where
    S: BlockSource,
    E: From<crate::Error>,
{
    let mut l = Side {
        source,
        path: vec![(source.read_block(&left.expect())?, 0)],
        end: false,
        descended: true,
    };
    let mut r = Side {
        source,
        path: vec![(source.read_block(&right.expect())?, 0)],
        end: false,
        descended: true,
    };
    l.end = l.top().is_none_or(|(b, _)| b.node().nritems() == 0);
    r.end = r.top().is_none_or(|(b, _)| b.node().nritems() == 0);
    // Node pairs whose children were announced lately.
    let mut announced: Vec<(u64, u64)> = Vec::new();
    // 0: stay, 1: advance, 2: advance without descending.
    let (mut adv_l, mut adv_r) = (0u8, 0u8);
    loop {
        if adv_l != 0 && !l.end {
            l.advance(adv_l == 2)?;
        }
        if adv_r != 0 && !r.end {
            r.advance(adv_r == 2)?;
        }
        adv_l = 0;
        adv_r = 0;
        // A side entered a node: announce, at that level, each side's
        // children the other side's nodes there do not share.
        let entered = [
            std::mem::take(&mut l.descended).then(|| l.level()),
            std::mem::take(&mut r.descended).then(|| r.level()),
        ];
        for level in entered.into_iter().flatten().filter(|&level| level > 0) {
            let (la, ra) = (l.around(level), r.around(level));
            if let (Some(ln), Some(rn)) = (la.first(), ra.first()) {
                // Once per pair of nodes.
                let pair = (ln.logical().get(), rn.logical().get());
                if !announced.contains(&pair) {
                    announced.push(pair);
                    if announced.len() > 64 {
                        announced.remove(0);
                    }
                    announce(source, ln, &ra);
                    announce(source, rn, &la);
                }
            }
        }
        if l.end && r.end {
            return Ok(());
        }
        if l.end {
            if r.level() == 0
                && let Some(it) = r.item()
            {
                f(Change::Deleted, None, Some(&it))?;
            }
            adv_r = 1;
            continue;
        }
        if r.end {
            if l.level() == 0
                && let Some(it) = l.item()
            {
                f(Change::New, Some(&it), None)?;
            }
            adv_l = 1;
            continue;
        }
        let (ll, rl) = (l.level(), r.level());
        if ll == 0 && rl == 0 {
            let (Some(li), Some(ri)) = (l.item(), r.item()) else {
                return Ok(());
            };
            match li.key.cmp(&ri.key) {
                std::cmp::Ordering::Less => {
                    f(Change::New, Some(&li), None)?;
                    adv_l = 1;
                }
                std::cmp::Ordering::Greater => {
                    f(Change::Deleted, None, Some(&ri))?;
                    adv_r = 1;
                }
                std::cmp::Ordering::Equal => {
                    let change = if li.data == ri.data {
                        Change::Same
                    } else {
                        Change::Changed
                    };
                    f(change, Some(&li), Some(&ri))?;
                    adv_l = 1;
                    adv_r = 1;
                }
            }
        } else if ll == rl {
            match l.key().cmp(&r.key()) {
                std::cmp::Ordering::Less => adv_l = 1,
                std::cmp::Ordering::Greater => adv_r = 1,
                std::cmp::Ordering::Equal => {
                    let (lp, rp) = (l.ptr(), r.ptr());
                    let shared = lp.is_some_and(|a| {
                        rp.is_some_and(|b| a.blockptr == b.blockptr && a.generation == b.generation)
                    });
                    if shared {
                        adv_l = 2;
                        adv_r = 2;
                    } else {
                        adv_l = 1;
                        adv_r = 1;
                    }
                }
            }
        } else if ll < rl {
            adv_r = 1;
        } else {
            adv_l = 1;
        }
    }
}

#[cfg(test)]
mod tests {
    // The comparison is tested against a merge-join of both trees on the
    // kernel-made fixture images (tests/integration/send_incremental.rs);
    // here: its readahead announcements.

    use std::cell::RefCell;
    use std::collections::HashSet;

    use super::*;
    use crate::fs::Filesystem;
    use crate::send::find_subvolume;

    /// Records reads and announcements; announces with a window of 64.
    struct Recorder<'a> {
        inner: &'a crate::volume::Volume,
        announced: RefCell<HashSet<u64>>,
        read: RefCell<Vec<(u64, bool)>>,
        wasted: RefCell<HashSet<u64>>,
    }

    impl BlockSource for Recorder<'_> {
        fn read_block(&self, expect: &BlockExpect) -> Result<TreeBlock> {
            let at = expect.logical.get();
            let was = self.announced.borrow().contains(&at);
            self.read.borrow_mut().push((at, was));
            self.wasted.borrow_mut().remove(&at);
            self.inner.read_block(expect)
        }
        fn will_need(&self, upcoming: &[BlockExpect]) {
            for e in upcoming {
                let at = e.logical.get();
                if self.announced.borrow_mut().insert(at) {
                    self.wasted.borrow_mut().insert(at);
                }
            }
        }
        fn readahead_window(&self) -> usize {
            64
        }
    }

    #[test]
    fn compare_announces_the_blocks_it_reads_and_not_shared_ones() {
        let zst = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/002-many-files/dev1.img.zst");
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("dev1.img");
        let mut dec = zstd::stream::read::Decoder::new(std::fs::File::open(zst).unwrap()).unwrap();
        std::io::copy(&mut dec, &mut std::fs::File::create(&img).unwrap()).unwrap();
        let fs = Filesystem::open(&[&img]).unwrap();
        let (m1, m2) = (
            find_subvolume(&fs, "snaps/m1").unwrap(),
            find_subvolume(&fs, "snaps/m2").unwrap(),
        );
        let rec = Recorder {
            inner: fs.volume(),
            announced: RefCell::default(),
            read: RefCell::default(),
            wasted: RefCell::default(),
        };
        let mut events = 0;
        compare_trees(&rec, m2.root.tree_root(), m1.root.tree_root(), |_, _, _| {
            events += 1;
            Ok::<(), crate::Error>(())
        })
        .unwrap();
        let read = rec.read.borrow();
        // The two roots are read before anything can be announced.
        let after_roots = read.len() - 2;
        let announced_first = read.iter().filter(|(_, was)| *was).count();
        let wasted = rec.wasted.borrow().len();
        assert!(
            events > 0 && after_roots > 20,
            "too small: {after_roots} blocks"
        );
        assert!(
            announced_first * 10 >= after_roots * 7,
            "only {announced_first} of {after_roots} blocks read were announced first"
        );
        assert!(
            wasted * 50 <= announced_first,
            "{wasted} blocks announced but never read (shared subtrees must not be)"
        );
    }
}
