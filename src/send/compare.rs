//! Tree comparison for incremental send: walk the snapshot's ("left") and
//! the parent's ("right") fs trees together in key order and report the
//! items that are new, deleted, changed or (in leaves that differ) the same
//! — the kernel's `btrfs_compare_trees` (`shared/docs/send-algorithm.md`
//! §13).
//!
//! When two node pointers at the same level and key name the same block
//! (same address and generation), the whole subtree is shared by both
//! snapshots and is skipped without being read: the cost grows with the
//! changes, not with the size of the trees.

use crate::error::Result;
use crate::tree::key::Key;
use crate::tree::node::{BlockExpect, NodePtr, TreeBlock};
use crate::tree::walk::{BlockSource, ItemRef, TreeRoot};

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

    fn item(&self) -> Option<ItemRef<'_>> {
        let (b, slot) = self.top()?;
        let it = b.node().item(*slot)?;
        Some(ItemRef {
            key: it.key,
            data: it.data,
            leaf: b.logical(),
            slot: u32::try_from(*slot).ok()?,
            tree: b.tree(),
        })
    }

    /// `tree_advance`: in a leaf, or when `only_next`, step to the next
    /// slot (climbing while a node is exhausted); else descend to the child
    /// at the current slot.
    fn advance(&mut self, only_next: bool) -> Result<()> {
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
    };
    let mut r = Side {
        source,
        path: vec![(source.read_block(&right.expect())?, 0)],
        end: false,
    };
    l.end = l.top().is_none_or(|(b, _)| b.node().nritems() == 0);
    r.end = r.top().is_none_or(|(b, _)| b.node().nritems() == 0);
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
    // kernel-made fixture images (tests/integration/send_incremental.rs).
}
