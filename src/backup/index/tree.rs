//! A persistent, copy-on-write B+tree of byte keys and values, stored as
//! content-addressed pages.
//!
//! Each node is one page: its bytes (`encode`) are named by their keyed
//! BLAKE3 ([`Pages::id_of`]), so an index derived from its parent's shares
//! every page the stream did not touch. Changing a tree copies the path
//! from the root to the changed leaf into memory (dirty nodes); a flush
//! writes the dirty nodes bottom-up as new pages and leaves their
//! references in the parents, so the dirty part, not the tree, bounds the
//! memory ([`Tree::flush_if_over`]).
//!
//! The pages of one flush are stored together as one pack: a page is a
//! range of a pack, and a parent's reference to a child names the child
//! and where it lies ([`PageRef`]): making one object a flush, not one a
//! page, is what keeps indexing a tree of many small files cheap. A child
//! in its parent's own pack is referred to by its range alone, so a pack
//! is named after it is written, by its pages' names and lengths: an
//! index built again from the same stream is made of the same packs.
//! Indexes made before packs stored each page as an object of its own;
//! they are read as they are ([`Place::Object`]).
//!
//! Pages come from a hostile store: a page is checked against its id
//! before it is parsed, its parse checks every length, and keys must be
//! strictly ascending within a node; a page that fails is an error naming
//! its id, never a wrong answer. A reference's place is a hint the page's
//! name then checks: the tree's contents follow from the root's name.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use super::IndexError;
pub(crate) use super::records::Records;

/// The name of a page: its keyed BLAKE3.
pub type PageId = [u8; 32];

/// The name of a pack: the keyed BLAKE3 of its pages' names and stored
/// lengths.
pub type PackId = [u8; 32];

/// Where a page's stored bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Place {
    /// An object of its own, named after the page (indexes made before
    /// packs).
    Object,
    /// A range of a stored pack.
    Packed {
        /// The pack.
        pack: PackId,
        /// Where the page's stored bytes start in it.
        offset: u64,
        /// Their length.
        len: u64,
    },
    /// A range of the pack the flush under way is writing (named at its
    /// end).
    Here {
        /// Where the page's stored bytes start in it.
        offset: u64,
        /// Their length.
        len: u64,
    },
}

impl Place {
    /// This place once the pack being written is stored as `pack`.
    fn in_pack(self, pack: PackId) -> Place {
        match self {
            Place::Here { offset, len } => Place::Packed { pack, offset, len },
            p => p,
        }
    }
}

/// The range `offset`, `len` of `bytes`; `None` when it does not lie in
/// them.
pub(crate) fn range_of(bytes: &[u8], offset: u64, len: u64) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    let end = usize::try_from(offset.checked_add(len)?).ok()?;
    bytes.get(start..end)
}

/// A page: its name and where it is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PageRef {
    /// The page's name.
    pub id: PageId,
    /// Where it is.
    pub place: Place,
}

/// A node grows up to this many encoded bytes before it is split (a single
/// entry larger than this, e.g. a 64 KiB xattr value, gets a page alone).
const MAX_PAGE: usize = 16 * 1024;

/// Decoded pages kept for reading; the cache is emptied when it reaches this
/// many (cheap, and bounded whatever the tree).
const CACHE_PAGES: usize = 4096;

/// Where pages are read from and written to.
pub trait PageStore {
    /// The bytes of page `r` (checked by the caller against its name),
    /// from what is stored (never asked for a page of the pack being
    /// written).
    ///
    /// # Errors
    ///
    /// The page is missing or cannot be read.
    fn get(&self, r: &PageRef) -> Result<Vec<u8>, IndexError>;

    /// What a pack holds for page `id` whose bytes are `page` (the store's
    /// encoding of them: compressed, sealed): the same length whenever the
    /// same page is stored.
    ///
    /// # Errors
    ///
    /// The page cannot be encoded.
    fn blob(&self, id: &PageId, page: &[u8]) -> Result<Vec<u8>, IndexError>;

    /// Store the pack `name`, `bytes` made of the blobs of `members` (at
    /// their [`Place::Here`] ranges), unless a pack of that name is there
    /// (it then holds the same pages at the same ranges). Stored when
    /// this returns.
    ///
    /// # Errors
    ///
    /// The pack cannot be written.
    fn put_pack(
        &self,
        name: &PackId,
        bytes: Vec<u8>,
        members: &[PageRef],
    ) -> Result<(), IndexError>;
}

/// A page store with its naming key: the store, and the BLAKE3 key that
/// names pages (in an encrypted repository a secret one, so page names
/// reveal nothing about their contents).
pub struct Pages<'s> {
    store: &'s dyn PageStore,
    key: [u8; 32],
    /// Decoded pages by reference (the place too: a walk that marks the
    /// packs in use must see each page where its parent says it is).
    cache: RefCell<HashMap<PageRef, Arc<Node>>>,
    /// The pack a flush is making, stored at its end.
    pack: RefCell<PackBuf>,
}

/// A pack being made: its bytes and its pages.
#[derive(Default)]
struct PackBuf {
    bytes: Vec<u8>,
    members: Vec<PageRef>,
}

impl<'s> Pages<'s> {
    /// Pages in `store`, named with `key`.
    pub fn new(store: &'s dyn PageStore, key: [u8; 32]) -> Pages<'s> {
        Pages {
            store,
            key,
            cache: RefCell::new(HashMap::new()),
            pack: RefCell::new(PackBuf::default()),
        }
    }

    /// The id of a page holding `bytes`.
    pub fn id_of(&self, bytes: &[u8]) -> PageId {
        *blake3::keyed_hash(&self.key, bytes).as_bytes()
    }

    fn load(&self, r: &PageRef) -> Result<Arc<Node>, IndexError> {
        if let Some(n) = self.cache.borrow().get(r) {
            return Ok(Arc::clone(n));
        }
        let from = match r.place {
            Place::Object => None,
            Place::Packed { pack, .. } => Some(pack),
            Place::Here { .. } => {
                return Err(IndexError::Page {
                    id: r.id,
                    reason: "read from a pack not yet written".into(),
                });
            }
        };
        let bytes = self.store.get(r)?;
        if self.id_of(&bytes) != r.id {
            return Err(IndexError::Page {
                id: r.id,
                reason: "its contents do not match its name".into(),
            });
        }
        let node = Arc::new(
            decode(&bytes, from.as_ref()).map_err(|reason| IndexError::Page {
                id: r.id,
                reason: reason.into(),
            })?,
        );
        let mut cache = self.cache.borrow_mut();
        if cache.len() >= CACHE_PAGES {
            cache.clear();
        }
        cache.insert(*r, Arc::clone(&node));
        Ok(node)
    }

    /// Add `node`'s page to the pack being made; its reference there.
    fn store(&self, node: &Node) -> Result<PageRef, IndexError> {
        let bytes = encode(node);
        let id = self.id_of(&bytes);
        let blob = self.store.blob(&id, &bytes)?;
        let mut p = self.pack.borrow_mut();
        let r = PageRef {
            id,
            place: Place::Here {
                offset: p.bytes.len() as u64,
                len: blob.len() as u64,
            },
        };
        p.bytes.extend_from_slice(&blob);
        p.members.push(r);
        Ok(r)
    }

    /// Store the pack made since the last commit; its name (`None`: no
    /// page was made).
    fn commit(&self) -> Result<Option<PackId>, IndexError> {
        let p = std::mem::take(&mut *self.pack.borrow_mut());
        if p.members.is_empty() {
            return Ok(None);
        }
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(b"btrsend index pack\0");
        for m in &p.members {
            h.update(&m.id);
            if let Place::Here { len, .. } = m.place {
                h.update(&len.to_le_bytes());
            }
        }
        let name = *h.finalize().as_bytes();
        self.store.put_pack(&name, p.bytes, &p.members)?;
        Ok(Some(name))
    }
}

/// One node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    /// Keys and values, ascending, and the node's encoded size (kept up to
    /// date so that an insert does not sum every entry again).
    Leaf(Records, usize),
    /// Children with the lowest key each may hold (the first child's key is
    /// empty: it takes everything below the second's), ascending, and the
    /// node's encoded size.
    Internal(Vec<(Vec<u8>, Child)>, usize),
}

/// A child of an internal node: a stored page, or a node changed since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Child {
    Stored(PageRef),
    Dirty(Box<Node>),
}

const LEAF: u8 = 1;
/// An internal node whose children are objects of their own (before packs).
const INTERNAL_OBJECTS: u8 = 2;
/// An internal node whose children are references with places.
const INTERNAL: u8 = 3;

/// How a child's place is written after its name.
const AT_OBJECT: u64 = 0;
const AT_PACK: u64 = 1;
const AT_SAME_PACK: u64 = 2;

/// The most a child's reference takes: name, tag, pack, offset, length.
const CHILD_REF: usize = 32 + 1 + 32 + 10 + 10;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: usize) -> usize {
    let bits = usize::BITS - v.leading_zeros();
    (bits.max(1) as usize).div_ceil(7)
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn varint(&mut self) -> Result<u64, &'static str> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.0.split_first().ok_or("truncated")?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("over-long number")
    }

    fn bytes(&mut self, n: u64) -> Result<&'a [u8], &'static str> {
        let n = usize::try_from(n).map_err(|_| "length out of range")?;
        if n > self.0.len() {
            return Err("truncated");
        }
        let (a, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(a)
    }

    fn lv(&mut self) -> Result<&'a [u8], &'static str> {
        let n = self.varint()?;
        self.bytes(n)
    }
}

/// The bytes of a page (children must be stored).
pub(crate) fn encode(node: &Node) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAX_PAGE + 64);
    match node {
        Node::Leaf(entries, _) => {
            out.push(LEAF);
            put_varint(&mut out, entries.len() as u64);
            for (k, v) in entries.iter() {
                put_varint(&mut out, k.len() as u64);
                out.extend_from_slice(k);
                put_varint(&mut out, v.len() as u64);
                out.extend_from_slice(v);
            }
        }
        Node::Internal(children, _) => {
            out.push(INTERNAL);
            put_varint(&mut out, children.len() as u64);
            for (k, c) in children {
                put_varint(&mut out, k.len() as u64);
                out.extend_from_slice(k);
                let Child::Stored(r) = c else {
                    // Callers flush children first.
                    unreachable!("encode of a node with a dirty child")
                };
                out.extend_from_slice(&r.id);
                match r.place {
                    Place::Object => put_varint(&mut out, AT_OBJECT),
                    Place::Packed { pack, offset, len } => {
                        put_varint(&mut out, AT_PACK);
                        out.extend_from_slice(&pack);
                        put_varint(&mut out, offset);
                        put_varint(&mut out, len);
                    }
                    Place::Here { offset, len } => {
                        put_varint(&mut out, AT_SAME_PACK);
                        put_varint(&mut out, offset);
                        put_varint(&mut out, len);
                    }
                }
            }
        }
    }
    out
}

/// Parse a page, checking every length and the order of keys; `pack` is
/// the pack it was read from (none: an object of its own), where its
/// children in the same pack are.
pub(crate) fn decode(bytes: &[u8], pack: Option<&PackId>) -> Result<Node, &'static str> {
    let (&kind, rest) = bytes.split_first().ok_or("empty page")?;
    let mut c = Cursor(rest);
    let n = c.varint()?;
    // Each entry takes at least two bytes: a count beyond that is a lie.
    if n > rest.len() as u64 {
        return Err("entry count beyond the page");
    }
    let node = match kind {
        LEAF => {
            let mut entries = Records::with_capacity(bytes.len(), n as usize);
            for i in 0..n as usize {
                let k = c.lv()?;
                let v = c.lv()?;
                if i > 0 && entries.key(i - 1) >= k {
                    return Err("keys out of order");
                }
                entries.push(k, v);
            }
            if entries.is_empty() {
                return Err("empty leaf");
            }
            let size = leaf_size(&entries);
            Node::Leaf(entries, size)
        }
        INTERNAL | INTERNAL_OBJECTS => {
            let mut children: Vec<(Vec<u8>, Child)> = Vec::with_capacity(n as usize);
            for i in 0..n {
                let k = c.lv()?.to_vec();
                let id: PageId = c.bytes(32)?.try_into().map_err(|_| "truncated")?;
                let place = if kind == INTERNAL_OBJECTS {
                    Place::Object
                } else {
                    match c.varint()? {
                        AT_OBJECT => Place::Object,
                        AT_PACK => {
                            let pack: PackId = c.bytes(32)?.try_into().map_err(|_| "truncated")?;
                            let (offset, len) = (c.varint()?, c.varint()?);
                            Place::Packed { pack, offset, len }
                        }
                        AT_SAME_PACK => {
                            let pack = *pack.ok_or("a same-pack child of a page outside a pack")?;
                            let (offset, len) = (c.varint()?, c.varint()?);
                            Place::Packed { pack, offset, len }
                        }
                        _ => return Err("unknown kind of child reference"),
                    }
                };
                if i == 0 && !k.is_empty() || i > 0 && children.last().is_some_and(|(p, _)| *p >= k)
                {
                    return Err("keys out of order");
                }
                children.push((k, Child::Stored(PageRef { id, place })));
            }
            if children.is_empty() {
                return Err("empty internal node");
            }
            let size = internal_size(&children);
            Node::Internal(children, size)
        }
        _ => return Err("unknown page kind"),
    };
    if !c.0.is_empty() {
        return Err("trailing bytes");
    }
    Ok(node)
}

fn entry_size(k: &[u8], v_len: usize) -> usize {
    varint_len(k.len()) + k.len() + varint_len(v_len) + v_len
}

/// Room for a node's kind and entry count.
const NODE_HEADER: usize = 10;

fn leaf_size(e: &Records) -> usize {
    e.iter().map(|(k, v)| entry_size(k, v.len())).sum::<usize>() + NODE_HEADER
}

fn child_size(k: &[u8]) -> usize {
    varint_len(k.len()) + k.len() + CHILD_REF
}

fn internal_size(c: &[(Vec<u8>, Child)]) -> usize {
    c.iter().map(|(k, _)| child_size(k)).sum::<usize>() + NODE_HEADER
}

/// Where a split cuts `sizes` (at least one entry on each side): the first
/// index of the right half.
fn split_point(sizes: impl Iterator<Item = usize>, total: usize) -> usize {
    let mut acc = 0;
    let mut at = 0;
    for (i, s) in sizes.enumerate() {
        if i > 0 && acc >= total / 2 {
            return i;
        }
        acc += s;
        at = i;
    }
    at.max(1)
}

/// A node borrowed from the dirty tree or shared from the cache.
enum Loaded<'a> {
    Borrowed(&'a Node),
    Shared(Arc<Node>),
}

impl std::ops::Deref for Loaded<'_> {
    type Target = Node;
    fn deref(&self) -> &Node {
        match self {
            Loaded::Borrowed(n) => n,
            Loaded::Shared(n) => n,
        }
    }
}

/// What a scan's callback says: go on, or stop here.
pub type Scan = ControlFlow<()>;

/// A key and its value.
pub type Record = (Vec<u8>, Vec<u8>);

/// A scan's callback: each key and value in order.
pub type Visit<'f> = dyn FnMut(&[u8], &[u8]) -> Result<Scan, IndexError> + 'f;

/// A tree: a root (none for an empty tree) over its pages.
pub struct Tree<'p, 's> {
    pages: &'p Pages<'s>,
    root: Option<Child>,
    /// Nodes copied into memory since the last flush.
    dirty: usize,
}

impl<'p, 's> Tree<'p, 's> {
    /// The tree whose root page is `root` (`None`: empty).
    pub fn open(pages: &'p Pages<'s>, root: Option<PageRef>) -> Tree<'p, 's> {
        Tree {
            pages,
            root: root.map(Child::Stored),
            dirty: 0,
        }
    }

    /// The pages the tree reads and writes.
    pub fn pages(&self) -> &'p Pages<'s> {
        self.pages
    }

    /// The value of `key`.
    ///
    /// # Errors
    ///
    /// A page is missing or damaged.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
        match &self.root {
            None => Ok(None),
            Some(root) => get_in(self.pages, root, key, 0),
        }
    }

    /// Call `f` with every key at or after `from` and its value, in key
    /// order, until it breaks.
    ///
    /// # Errors
    ///
    /// A page is missing or damaged, or the first error of `f`.
    pub fn scan(&self, from: &[u8], f: &mut Visit<'_>) -> Result<(), IndexError> {
        if let Some(root) = &self.root {
            // Whether `f` stopped early is known to `f`.
            let _ = scan_in(self.pages, root, from, f, 0)?;
        }
        Ok(())
    }

    /// The last key at or before `key`, with its value.
    ///
    /// # Errors
    ///
    /// A page is missing or damaged.
    pub fn floor(&self, key: &[u8]) -> Result<Option<Record>, IndexError> {
        match &self.root {
            None => Ok(None),
            Some(root) => floor_in(self.pages, root, key, 0),
        }
    }

    /// Every key starting with `prefix`, with its value, in order.
    ///
    /// # Errors
    ///
    /// A page is missing or damaged.
    pub fn prefixed(&self, prefix: &[u8]) -> Result<Vec<Record>, IndexError> {
        let mut out = Vec::new();
        self.scan(prefix, &mut |k, v| {
            if !k.starts_with(prefix) {
                return Ok(ControlFlow::Break(()));
            }
            out.push((k.to_vec(), v.to_vec()));
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(out)
    }

    /// Set `key` to `value`.
    ///
    /// # Errors
    ///
    /// A page on the way is missing or damaged.
    pub fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<(), IndexError> {
        let Some(mut root) = self.root.take() else {
            let size = entry_size(key, value.len()) + NODE_HEADER;
            let mut e = Records::default();
            e.push(key, value);
            self.root = Some(Child::Dirty(Box::new(Node::Leaf(e, size))));
            self.dirty += 1;
            return Ok(());
        };
        let split = insert_in(self.pages, &mut self.dirty, &mut root, (key, value), 0);
        let split = match split {
            Ok(s) => s,
            Err(e) => {
                self.root = Some(root);
                return Err(e);
            }
        };
        self.root = Some(match split {
            None => root,
            Some((sep, right)) => {
                self.dirty += 2;
                let size = child_size(&[]) + child_size(&sep) + NODE_HEADER;
                Child::Dirty(Box::new(Node::Internal(
                    vec![(Vec::new(), root), (sep, Child::Dirty(Box::new(right)))],
                    size,
                )))
            }
        });
        Ok(())
    }

    /// Set each key of `items` (ascending, no key twice) to its value:
    /// what [`insert`](Self::insert) of each does, with one descent for
    /// the keys that fall in one leaf, and nodes that a run of keys
    /// overfills cut into full pages rather than halves.
    ///
    /// # Errors
    ///
    /// A page on the way is missing or damaged.
    pub(crate) fn insert_sorted(&mut self, items: &Records) -> Result<(), IndexError> {
        debug_assert!(items.is_ascending());
        let mut items = Items {
            all: items,
            next: 0,
        };
        if self.root.is_none() {
            if items.all.is_empty() {
                return Ok(());
            }
            let (k, v) = items.all.get(0);
            self.insert(k, v)?;
            items.next = 1;
        }
        let Some(mut root) = self.root.take() else {
            unreachable!("made above")
        };
        let r = insert_run(
            self.pages,
            &mut self.dirty,
            &mut root,
            (&mut items, None),
            0,
        );
        self.root = Some(root);
        let mut right = r?;
        while !right.is_empty() {
            // The root split: a new root over it and its new siblings.
            let Some(old) = self.root.take() else {
                unreachable!("put back above")
            };
            let mut c = Vec::with_capacity(right.len() + 1);
            c.push((Vec::new(), old));
            c.extend(
                right
                    .drain(..)
                    .map(|(sep, n)| (sep, Child::Dirty(Box::new(n)))),
            );
            self.dirty += c.len();
            let size = internal_size(&c);
            let mut top = Node::Internal(c, size);
            right = cut(&mut top);
            self.root = Some(Child::Dirty(Box::new(top)));
        }
        Ok(())
    }

    /// Remove `key`; its value, if it was there.
    ///
    /// # Errors
    ///
    /// A page on the way is missing or damaged.
    pub fn remove(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
        if self.get(key)?.is_none() {
            return Ok(None);
        }
        let Some(mut root) = self.root.take() else {
            return Ok(None);
        };
        let removed = remove_in(self.pages, &mut self.dirty, &mut root, key, 0);
        let (value, empty) = match removed {
            Ok(r) => r,
            Err(e) => {
                self.root = Some(root);
                return Err(e);
            }
        };
        if !empty {
            // An internal root with one child gives way to that child.
            while let Child::Dirty(n) = &mut root {
                match &mut **n {
                    Node::Internal(c, _) if c.len() == 1 => {
                        // OK to unwrap: one child.
                        root = c.pop().unwrap().1;
                    }
                    _ => break,
                }
            }
            self.root = Some(root);
        }
        Ok(value)
    }

    /// Write every changed node as a page, all in one pack; the root page
    /// (`None`: empty).
    ///
    /// # Errors
    ///
    /// A page cannot be written.
    pub fn flush(&mut self) -> Result<Option<PageRef>, IndexError> {
        let Some(root) = &mut self.root else {
            return Ok(None);
        };
        flush_in(self.pages, root)?;
        let pack = self.pages.commit()?;
        self.dirty = 0;
        let Child::Stored(r) = root else {
            unreachable!("flushed")
        };
        if let Some(pack) = pack {
            r.place = r.place.in_pack(pack);
        }
        Ok(Some(*r))
    }

    /// [`flush`](Self::flush) when more than `limit` nodes are in memory.
    ///
    /// # Errors
    ///
    /// A page cannot be written.
    pub fn flush_if_over(&mut self, limit: usize) -> Result<(), IndexError> {
        if self.dirty > limit {
            self.flush()?;
        }
        Ok(())
    }
}

/// Every page of the tree whose root page is `root`, each checked as a
/// read checks it, its id added to `seen`; a subtree whose root `seen`
/// has already is not walked again (trees share them). Without
/// `read_leaves`, leaves are known by their parents' links alone (all
/// leaves of a tree are at one depth, found down its first children), so
/// a walk reads only the internal pages: what `forget` needs to know which
/// pages are in use.
///
/// With `damaged`, a damaged page (its bytes wrong) is added to it and the
/// walk goes on past it; without, it is an error.
///
/// # Errors
///
/// A page read is missing or damaged, or a leaf stands where the depth
/// says an internal page must.
pub fn walk_pages(
    pages: &Pages<'_>,
    root: PageRef,
    read_leaves: bool,
    seen: &mut std::collections::HashSet<PageRef>,
    mut damaged: Option<&mut Vec<PageRef>>,
) -> Result<(), IndexError> {
    let mut height = 0usize;
    let mut at = root;
    loop {
        let Some(node) = load_or_note(pages, at, height, &mut damaged)? else {
            return Ok(());
        };
        match &*node {
            Node::Leaf(..) => break,
            Node::Internal(c, _) => match c.first() {
                Some((_, Child::Stored(first))) => {
                    at = *first;
                    height += 1;
                }
                _ => break,
            },
        }
    }
    walk_below(pages, root, height, read_leaves, seen, &mut damaged)
}

/// Page `at`, `depth` levels below the root; `None` when it is damaged
/// and `damaged` collects it (it is added there).
fn load_or_note(
    pages: &Pages<'_>,
    at: PageRef,
    depth: usize,
    damaged: &mut Option<&mut Vec<PageRef>>,
) -> Result<Option<Arc<Node>>, IndexError> {
    match load_at(pages, &at, depth) {
        Ok(n) => Ok(Some(n)),
        Err(IndexError::Page { .. }) if damaged.is_some() => {
            if let Some(d) = damaged {
                d.push(at);
            }
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn walk_below(
    pages: &Pages<'_>,
    at: PageRef,
    height: usize,
    read_leaves: bool,
    seen: &mut std::collections::HashSet<PageRef>,
    damaged: &mut Option<&mut Vec<PageRef>>,
) -> Result<(), IndexError> {
    if !seen.insert(at) {
        return Ok(());
    }
    if height == 0 && !read_leaves {
        return Ok(());
    }
    // The descent to the first leaf bounded the height (a page at another
    // depth is refused below): no level here is past MAX_DEPTH.
    let Some(node) = load_or_note(pages, at, 0, damaged)? else {
        return Ok(());
    };
    match (&*node, height) {
        (Node::Leaf(..), 0) => Ok(()),
        (Node::Internal(c, _), 1..) => {
            for (_, ch) in c {
                if let Child::Stored(child) = ch {
                    walk_below(pages, *child, height - 1, read_leaves, seen, damaged)?;
                }
            }
            Ok(())
        }
        _ => {
            let e = IndexError::Page {
                id: at.id,
                reason: "its depth in the tree is not its kind's".into(),
            };
            match damaged {
                Some(d) => {
                    d.push(at);
                    Ok(())
                }
                None => Err(e),
            }
        }
    }
}

fn node<'a>(pages: &Pages<'_>, child: &'a Child, depth: usize) -> Result<Loaded<'a>, IndexError> {
    match child {
        Child::Dirty(n) => Ok(Loaded::Borrowed(n)),
        Child::Stored(r) => load_at(pages, r, depth).map(Loaded::Shared),
    }
}

/// The most levels a tree may have: far more than any index reaches (a
/// level more takes twice the leaves, at least), and few enough that a
/// store holding a chain of pages cannot make a walk use up the stack.
const MAX_DEPTH: usize = 64;

/// Page `r`, `depth` levels below the root: refused past [`MAX_DEPTH`].
fn load_at(pages: &Pages<'_>, r: &PageRef, depth: usize) -> Result<Arc<Node>, IndexError> {
    if depth > MAX_DEPTH {
        return Err(IndexError::Page {
            id: r.id,
            reason: format!("more than {MAX_DEPTH} levels below the root"),
        });
    }
    pages.load(r)
}

fn get_in(
    pages: &Pages<'_>,
    child: &Child,
    key: &[u8],
    depth: usize,
) -> Result<Option<Vec<u8>>, IndexError> {
    let n = node(pages, child, depth)?;
    match &*n {
        Node::Leaf(e, _) => Ok(e.search(key).ok().map(|i| e.value(i).to_vec())),
        Node::Internal(c, _) => get_in(pages, &c[child_for(c, key)].1, key, depth + 1),
    }
}

fn floor_in(
    pages: &Pages<'_>,
    child: &Child,
    key: &[u8],
    depth: usize,
) -> Result<Option<Record>, IndexError> {
    let n = node(pages, child, depth)?;
    match &*n {
        Node::Leaf(e, _) => {
            let i = e.partition_point(|k| k <= key);
            Ok(i.checked_sub(1)
                .map(|i| (e.key(i).to_vec(), e.value(i).to_vec())))
        }
        Node::Internal(c, _) => {
            // A child's lower bound may sit below its lowest key (after
            // removals): an empty answer there sends the search left.
            for j in (0..=child_for(c, key)).rev() {
                if let Some(found) = floor_in(pages, &c[j].1, key, depth + 1)? {
                    return Ok(Some(found));
                }
            }
            Ok(None)
        }
    }
}

fn scan_in(
    pages: &Pages<'_>,
    child: &Child,
    from: &[u8],
    f: &mut Visit<'_>,
    depth: usize,
) -> Result<Scan, IndexError> {
    let n = node(pages, child, depth)?;
    match &*n {
        Node::Leaf(e, _) => {
            let start = e.partition_point(|k| k < from);
            for (k, v) in e.iter_from(start) {
                if f(k, v)?.is_break() {
                    return Ok(ControlFlow::Break(()));
                }
            }
        }
        Node::Internal(c, _) => {
            for (_, ch) in &c[child_for(c, from)..] {
                if scan_in(pages, ch, from, f, depth + 1)?.is_break() {
                    return Ok(ControlFlow::Break(()));
                }
            }
        }
    }
    Ok(ControlFlow::Continue(()))
}

/// `child` as a node in memory, copied from its page if it was stored.
fn make_dirty<'a>(
    pages: &Pages<'_>,
    dirty: &mut usize,
    child: &'a mut Child,
    depth: usize,
) -> Result<&'a mut Node, IndexError> {
    if let Child::Stored(r) = child {
        let n = load_at(pages, r, depth)?;
        *child = Child::Dirty(Box::new((*n).clone()));
        *dirty += 1;
    }
    match child {
        Child::Dirty(n) => Ok(n),
        Child::Stored(_) => unreachable!("made dirty above"),
    }
}

/// Insert into the subtree at `child`; the right half (with its lowest
/// key) when the node had to split.
fn insert_in(
    pages: &Pages<'_>,
    dirty: &mut usize,
    child: &mut Child,
    (key, value): (&[u8], &[u8]),
    depth: usize,
) -> Result<Option<(Vec<u8>, Node)>, IndexError> {
    let n = make_dirty(pages, dirty, child, depth)?;
    match n {
        Node::Leaf(e, size) => {
            match e.search(key) {
                Ok(i) => {
                    *size =
                        *size - entry_size(key, e.value(i).len()) + entry_size(key, value.len());
                    e.set_value(i, value);
                }
                Err(i) => {
                    *size += entry_size(key, value.len());
                    e.insert(i, key, value);
                }
            }
            if *size > MAX_PAGE && e.len() >= 2 {
                let at = split_point(e.iter().map(|(k, v)| entry_size(k, v.len())), *size);
                let right = e.split_off(at);
                *size = leaf_size(e);
                let right_size = leaf_size(&right);
                return Ok(Some((right.key(0).to_vec(), Node::Leaf(right, right_size))));
            }
            Ok(None)
        }
        Node::Internal(c, size) => {
            let i = child_for(c, key);
            if let Some((sep, right)) =
                insert_in(pages, dirty, &mut c[i].1, (key, value), depth + 1)?
            {
                *size += child_size(&sep);
                c.insert(i + 1, (sep, Child::Dirty(Box::new(right))));
                *dirty += 1;
            }
            if *size > MAX_PAGE && c.len() >= 2 {
                let at = split_point(c.iter().map(|(k, _)| child_size(k)), *size);
                let mut right = c.split_off(at);
                let sep = std::mem::take(&mut right[0].0);
                *size = internal_size(c);
                let right_size = internal_size(&right);
                return Ok(Some((sep, Node::Internal(right, right_size))));
            }
            Ok(None)
        }
    }
}

/// The items a run takes: sorted records, from `next` on still to insert.
struct Items<'a> {
    all: &'a Records,
    next: usize,
}

impl Items<'_> {
    /// The next key to insert.
    fn peek(&self) -> Option<&[u8]> {
        (self.next < self.all.len()).then(|| self.all.key(self.next))
    }
}

/// Insert into the subtree at `child` every next item of `items` below
/// `upper` (none: every one); the new right siblings the subtree's node
/// was cut into (with their lowest keys), in order.
fn insert_run(
    pages: &Pages<'_>,
    dirty: &mut usize,
    child: &mut Child,
    (items, upper): (&mut Items<'_>, Option<&[u8]>),
    depth: usize,
) -> Result<Vec<(Vec<u8>, Node)>, IndexError> {
    let below = |k: &[u8]| upper.is_none_or(|u| k < u);
    let n = make_dirty(pages, dirty, child, depth)?;
    match n {
        Node::Leaf(e, size) => {
            let from = items.next;
            while items.peek().is_some_and(below) {
                items.next += 1;
            }
            if items.next == from {
                return Ok(Vec::new());
            }
            // Merge the run into the leaf; a run key replaces the leaf's.
            let run = from..items.next;
            if e.is_empty() || e.key(e.len() - 1) < items.all.key(from) {
                // Past the leaf's end, as a new file's records are.
                let was = leaf_size(e);
                if was <= MAX_PAGE {
                    *size = was;
                    return Ok(append_cut(e, size, items.all, run));
                }
                items.all.copy_into(run, e);
            } else {
                *e = Records::merge(e, items.all, run);
            }
            *size = leaf_size(e);
        }
        Node::Internal(c, size) => {
            let mut i = 0;
            while let Some(k) = items.peek() {
                if !below(k) {
                    break;
                }
                i = i.max(child_for(c, k));
                let child_upper = match c.get(i + 1) {
                    Some((sep, _)) => Some(sep.clone()),
                    None => upper.map(<[u8]>::to_vec),
                };
                let right = insert_run(
                    pages,
                    dirty,
                    &mut c[i].1,
                    (items, child_upper.as_deref()),
                    depth + 1,
                )?;
                let added = right.len();
                *dirty += added;
                c.splice(
                    i + 1..i + 1,
                    right
                        .into_iter()
                        .map(|(sep, n)| (sep, Child::Dirty(Box::new(n)))),
                );
                i += added;
            }
            *size = internal_size(c);
        }
    }
    Ok(cut(n))
}

/// Append the records `run` of `all` to the leaf `e` of `size` (at most a
/// page; its keys all below the run's): the leaves [`cut`] makes of the
/// whole, without copying or sizing the leaf's records again (a run of
/// new files' records is appended to the last leaf, many pages of it).
fn append_cut(
    e: &mut Records,
    size: &mut usize,
    all: &Records,
    run: std::ops::Range<usize>,
) -> Vec<(Vec<u8>, Node)> {
    // Where each piece after `e` starts, and each piece's size.
    let mut starts = Vec::new();
    let mut sizes = Vec::new();
    let mut acc = *size;
    let mut in_piece = e.len();
    for i in run.clone() {
        let (k, v) = all.get(i);
        let s = entry_size(k, v.len());
        if in_piece > 0 && acc + s > MAX_PAGE {
            starts.push(i);
            sizes.push(acc);
            acc = NODE_HEADER;
            in_piece = 0;
        }
        acc += s;
        in_piece += 1;
    }
    sizes.push(acc);
    starts.push(run.end);
    let mut sizes = sizes.into_iter();
    all.copy_into(run.start..starts[0], e);
    *size = sizes.next().unwrap_or(NODE_HEADER);
    starts
        .windows(2)
        .zip(sizes)
        .map(|(w, s)| {
            let mut piece = Records::with_capacity(s, w[1] - w[0]);
            all.copy_into(w[0]..w[1], &mut piece);
            (piece.key(0).to_vec(), Node::Leaf(piece, s))
        })
        .collect()
}

/// Cut `n`, if it outgrew a page, into pieces of at most a page (but for
/// an entry alone larger): `n` keeps the first, the others (with their
/// lowest keys) are returned. Pieces are filled in order, so keys that
/// come in ascending order leave full pages behind them, and the last
/// piece, where the next ones go, takes what is left.
fn cut(n: &mut Node) -> Vec<(Vec<u8>, Node)> {
    /// The first index of each piece after the first.
    fn pieces(sizes: &[usize]) -> Vec<usize> {
        let mut starts = Vec::new();
        let mut acc = NODE_HEADER;
        for (i, &s) in sizes.iter().enumerate() {
            if i > 0 && acc + s > MAX_PAGE {
                starts.push(i);
                acc = NODE_HEADER;
            }
            acc += s;
        }
        starts
    }
    match n {
        Node::Leaf(e, size) if *size > MAX_PAGE && e.len() >= 2 => {
            let sizes: Vec<usize> = e.iter().map(|(k, v)| entry_size(k, v.len())).collect();
            let starts = pieces(&sizes);
            let mut out = Vec::with_capacity(starts.len());
            for &at in starts.iter().rev() {
                let right = e.split_off(at);
                let s = leaf_size(&right);
                out.push((right.key(0).to_vec(), Node::Leaf(right, s)));
            }
            out.reverse();
            *size = leaf_size(e);
            out
        }
        Node::Internal(c, size) if *size > MAX_PAGE && c.len() >= 2 => {
            let sizes: Vec<usize> = c.iter().map(|(k, _)| child_size(k)).collect();
            let starts = pieces(&sizes);
            let mut out = Vec::with_capacity(starts.len());
            for &at in starts.iter().rev() {
                let mut right = c.split_off(at);
                let sep = std::mem::take(&mut right[0].0);
                let s = internal_size(&right);
                out.push((sep, Node::Internal(right, s)));
            }
            out.reverse();
            *size = internal_size(c);
            out
        }
        _ => Vec::new(),
    }
}

/// Remove `key` (known to be there) from the subtree at `child`: its value,
/// and whether the subtree is now empty.
fn remove_in(
    pages: &Pages<'_>,
    dirty: &mut usize,
    child: &mut Child,
    key: &[u8],
    depth: usize,
) -> Result<(Option<Vec<u8>>, bool), IndexError> {
    let n = make_dirty(pages, dirty, child, depth)?;
    match n {
        Node::Leaf(e, size) => {
            let v = e.search(key).ok().map(|i| e.remove(i));
            if let Some(v) = &v {
                *size -= entry_size(key, v.len());
            }
            Ok((v, e.is_empty()))
        }
        Node::Internal(c, size) => {
            let i = child_for(c, key);
            let (v, empty) = remove_in(pages, dirty, &mut c[i].1, key, depth + 1)?;
            if empty {
                let (k, _) = c.remove(i);
                *size -= child_size(&k);
                if let Some(first) = c.first_mut() {
                    *size -= child_size(&first.0) - child_size(&[]);
                    first.0.clear();
                }
            }
            Ok((v, c.is_empty()))
        }
    }
}

fn flush_in(pages: &Pages<'_>, child: &mut Child) -> Result<(), IndexError> {
    let Child::Dirty(n) = child else {
        return Ok(());
    };
    if let Node::Internal(c, _) = &mut **n {
        for (_, ch) in c.iter_mut() {
            flush_in(pages, ch)?;
        }
    }
    *child = Child::Stored(pages.store(n)?);
    Ok(())
}

/// The child of `children` whose range holds `key`.
fn child_for(children: &[(Vec<u8>, Child)], key: &[u8]) -> usize {
    // The first child takes everything below the second's key.
    children
        .partition_point(|(k, _)| k.as_slice() <= key)
        .saturating_sub(1)
}

/// The tree at `r` stored again the way indexes made before packs are:
/// every page an object of its own, internal pages naming their children
/// alone; its root's name (for tests of those indexes).
#[cfg(test)]
pub(crate) fn as_objects(pages: &Pages<'_>, mem: &MemPages, r: &PageRef) -> PageId {
    let node = pages.load(r).unwrap();
    let bytes = match &*node {
        Node::Leaf(..) => encode(&node),
        Node::Internal(c, _) => {
            let mut out = vec![INTERNAL_OBJECTS];
            put_varint(&mut out, c.len() as u64);
            for (k, ch) in c {
                let Child::Stored(cr) = ch else {
                    unreachable!("a stored page")
                };
                put_varint(&mut out, k.len() as u64);
                out.extend_from_slice(k);
                out.extend_from_slice(&as_objects(pages, mem, cr));
            }
            out
        }
    };
    let id = pages.id_of(&bytes);
    mem.put_object(id, bytes);
    id
}

/// Pages in memory, with at most `limit` of them kept (more are dropped:
/// reading one back then fails as a missing page): for tests and
/// fuzzing. A pack's blobs are its pages' bytes as they are; pages may
/// also be put as objects of their own ([`MemPages::put_object`]).
#[derive(Debug, Default)]
pub struct MemPages {
    objects: RefCell<HashMap<PageId, Vec<u8>>>,
    packs: RefCell<HashMap<PackId, Vec<u8>>>,
    /// Every page stored in a pack, in the order stored.
    members: RefCell<Vec<PageRef>>,
    limit: Option<usize>,
}

impl MemPages {
    /// An empty store keeping at most `limit` pages.
    pub fn bounded(limit: usize) -> MemPages {
        MemPages {
            limit: Some(limit),
            ..MemPages::default()
        }
    }

    /// Store `bytes` as page `id`, an object of its own.
    pub fn put_object(&self, id: PageId, bytes: Vec<u8>) {
        self.objects.borrow_mut().insert(id, bytes);
    }

    /// Every page stored in a pack, in the order stored.
    pub fn pages(&self) -> Vec<PageRef> {
        self.members.borrow().clone()
    }

    /// Change the stored bytes of page `r` (a test damaging it); false if
    /// it is not there.
    pub fn damage(&self, r: &PageRef, f: impl FnOnce(&mut [u8])) -> bool {
        match r.place {
            Place::Object => self
                .objects
                .borrow_mut()
                .get_mut(&r.id)
                .map(|b| f(b))
                .is_some(),
            Place::Packed { pack, offset, len } => self
                .packs
                .borrow_mut()
                .get_mut(&pack)
                .and_then(|b| b.get_mut(offset as usize..(offset + len) as usize))
                .map(f)
                .is_some(),
            Place::Here { .. } => false,
        }
    }

    /// Remove the pack that holds `r`, or its object.
    pub fn remove(&self, r: &PageRef) {
        match r.place {
            Place::Object => {
                self.objects.borrow_mut().remove(&r.id);
            }
            Place::Packed { pack, .. } => {
                self.packs.borrow_mut().remove(&pack);
            }
            Place::Here { .. } => {}
        }
    }
}

impl PageStore for MemPages {
    fn get(&self, r: &PageRef) -> Result<Vec<u8>, IndexError> {
        let missing = IndexError::MissingPage { id: r.id };
        match r.place {
            Place::Object => self.objects.borrow().get(&r.id).cloned().ok_or(missing),
            Place::Packed { pack, offset, len } => self
                .packs
                .borrow()
                .get(&pack)
                .and_then(|b| range_of(b, offset, len))
                .map(<[u8]>::to_vec)
                .ok_or(missing),
            Place::Here { .. } => Err(missing),
        }
    }

    fn blob(&self, _: &PageId, page: &[u8]) -> Result<Vec<u8>, IndexError> {
        Ok(page.to_vec())
    }

    fn put_pack(
        &self,
        name: &PackId,
        bytes: Vec<u8>,
        members: &[PageRef],
    ) -> Result<(), IndexError> {
        let mut kept = self.members.borrow_mut();
        if self.limit.is_some_and(|l| kept.len() >= l) {
            return Ok(());
        }
        if self.packs.borrow().contains_key(name) {
            return Ok(());
        }
        self.packs.borrow_mut().insert(*name, bytes);
        kept.extend(members.iter().map(|m| PageRef {
            id: m.id,
            place: m.place.in_pack(*name),
        }));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Mem = MemPages;

    /// Every dirty node's kept size against its entries, and the sizes
    /// of the nodes below.
    fn check_sizes(child: &Child) {
        let Child::Dirty(n) = child else {
            return;
        };
        match &**n {
            Node::Leaf(e, size) => assert_eq!(*size, leaf_size(e)),
            Node::Internal(c, size) => {
                assert_eq!(*size, internal_size(c));
                c.iter().for_each(|(_, ch)| check_sizes(ch));
            }
        }
    }

    /// Every record of `t`, in order.
    fn records(t: &Tree<'_, '_>) -> Vec<Record> {
        let mut out = Vec::new();
        t.scan(b"", &mut |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            Ok(ControlFlow::Continue(()))
        })
        .unwrap();
        out
    }

    #[test]
    fn sorted_runs_insert_what_single_inserts_do() {
        let mem = Mem::default();
        let pages = Pages::new(&mem, [5; 32]);
        let mut runs = Tree::open(&pages, None);
        // Single inserts in a store of their own: their splits in halves
        // may leave a page over the size with a large entry and others.
        let mem_one = Mem::default();
        let pages_one = Pages::new(&mem_one, [5; 32]);
        let mut one = Tree::open(&pages_one, None);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for round in 0..12 {
            let mut batch = std::collections::BTreeMap::new();
            for _ in 0..(1 + round * 700) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Mostly ascending keys past the ends, some into the
                // middle (over keys there), now and then a value alone
                // larger than a page.
                let key = if x.is_multiple_of(3) {
                    (x % 5000).to_be_bytes()
                } else {
                    (10_000 * round + x % 9000).to_be_bytes()
                };
                let len = if x.is_multiple_of(211) {
                    20_000
                } else {
                    (x % 90) as usize
                };
                batch.insert(key.to_vec(), vec![round as u8; len]);
            }
            for (k, v) in &batch {
                one.insert(k, v).unwrap();
            }
            runs.insert_sorted(&batch.into_iter().collect()).unwrap();
            if let Some(root) = &runs.root {
                check_sizes(root);
            }
            assert_eq!(records(&runs), records(&one), "round {round}");
            if round % 4 == 3 {
                runs.flush().unwrap();
                one.flush().unwrap();
            }
        }
        let top = runs.flush().unwrap();
        let again = Pages::new(&mem, [5; 32]);
        assert_eq!(records(&Tree::open(&again, top)), records(&one));
        // Every stored page is within a page's size, or holds one entry.
        for r in mem.pages() {
            let bytes = mem.get(&r).unwrap();
            let Place::Packed { pack, .. } = r.place else {
                unreachable!()
            };
            let n = decode(&bytes, Some(&pack)).unwrap();
            let entries = match &n {
                Node::Leaf(e, _) => e.len(),
                Node::Internal(c, _) => c.len(),
            };
            assert!(
                bytes.len() <= MAX_PAGE || entries == 1,
                "{} bytes",
                bytes.len()
            );
        }
    }

    #[test]
    fn a_chain_of_pages_deeper_than_any_index_is_refused() {
        // A store holding a leaf under 100,000 internal pages of one child
        // each: every walk refuses it, none runs out of stack.
        let mem = Mem::default();
        let pages = Pages::new(&mem, [4; 32]);
        let leaf = encode(&Node::Leaf([(b"k", b"v")].into_iter().collect(), 0));
        let mut id = pages.id_of(&leaf);
        mem.put_object(id, leaf);
        for _ in 0..100_000 {
            let mut page = vec![INTERNAL_OBJECTS, 1, 0];
            page.extend_from_slice(&id);
            id = pages.id_of(&page);
            mem.put_object(id, page);
        }
        let top = PageRef {
            id,
            place: Place::Object,
        };
        let deep = |r: Result<(), IndexError>| match r {
            Err(IndexError::Page { reason, .. }) => assert!(reason.contains("levels"), "{reason}"),
            r => panic!("{r:?}"),
        };
        let mut t = Tree::open(&pages, Some(top));
        deep(t.get(b"k").map(drop));
        deep(t.floor(b"k").map(drop));
        deep(t.scan(b"", &mut |_, _| Ok(ControlFlow::Continue(()))));
        deep(t.insert(b"j", b"w"));
        deep(t.insert_sorted(&[(b"j", b"w")].into_iter().collect()));
        let mut t = Tree::open(&pages, Some(top));
        deep(t.remove(b"k").map(drop));
        let mut seen = std::collections::HashSet::new();
        deep(walk_pages(&pages, top, true, &mut seen, None));
        let mut damaged = Vec::new();
        walk_pages(&pages, top, true, &mut seen, Some(&mut damaged)).unwrap();
        assert_eq!(damaged.len(), 1);
    }

    #[test]
    fn kept_sizes_follow_inserts_removes_and_splits() {
        let mem = Mem::default();
        let pages = Pages::new(&mem, [7; 32]);
        let mut t = Tree::open(&pages, None);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..3 {
            for _ in 0..4000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let key = (x % 3000).to_be_bytes();
                if x.is_multiple_of(5) {
                    t.remove(&key).unwrap();
                } else {
                    let len = if x.is_multiple_of(97) {
                        20_000
                    } else {
                        (x % 300) as usize
                    };
                    t.insert(&key, &vec![round as u8; len]).unwrap();
                }
                if let Some(root) = &t.root {
                    check_sizes(root);
                }
            }
            // The next round starts from stored pages, sizes read back.
            t.flush().unwrap();
        }
        for r in mem.pages() {
            let bytes = mem.get(&r).unwrap();
            let Place::Packed { pack, .. } = r.place else {
                unreachable!()
            };
            let n = decode(&bytes, Some(&pack)).unwrap();
            let (Node::Leaf(_, size) | Node::Internal(_, size)) = &n;
            assert!(*size >= bytes.len(), "{size} < {}", bytes.len());
        }
    }
}
