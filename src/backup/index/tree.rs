//! A persistent, copy-on-write B+tree of byte keys and values, stored as
//! content-addressed pages.
//!
//! Each node is one page: its bytes (`encode`) are named by their keyed
//! BLAKE3 ([`Pages::id_of`]), so an index derived from its parent's shares
//! every page the stream did not touch. Changing a tree copies the path
//! from the root to the changed leaf into memory (dirty nodes); a flush
//! writes the dirty nodes bottom-up as new pages and leaves their ids in
//! the parents, so the dirty part, not the tree, bounds the memory
//! ([`Tree::flush_if_over`]).
//!
//! Pages come from a hostile store: a page is checked against its id
//! before it is parsed, its parse checks every length, and keys must be
//! strictly ascending within a node; a page that fails is an error naming
//! its id, never a wrong answer.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use super::IndexError;

/// The name of a page: its keyed BLAKE3.
pub type PageId = [u8; 32];

/// A node grows up to this many encoded bytes before it is split (a single
/// entry larger than this, e.g. a 64 KiB xattr value, gets a page alone).
const MAX_PAGE: usize = 16 * 1024;

/// Decoded pages kept for reading; the cache is emptied when it reaches this
/// many (cheap, and bounded whatever the tree).
const CACHE_PAGES: usize = 4096;

/// Where pages are read from and written to.
pub trait PageStore {
    /// The bytes of page `id` (checked by the caller against `id`).
    ///
    /// # Errors
    ///
    /// The page is missing or cannot be read.
    fn get(&self, id: &PageId) -> Result<Vec<u8>, IndexError>;

    /// Store each of `pages` (an id and its bytes; a page already stored
    /// may be stored again: it has the same bytes). All are stored when
    /// this returns.
    ///
    /// # Errors
    ///
    /// A page cannot be written.
    fn put_all(&self, pages: Vec<(PageId, Vec<u8>)>) -> Result<(), IndexError>;
}

/// A page store with its naming key: the store, and the BLAKE3 key that
/// names pages (in an encrypted repository a secret one, so page names
/// reveal nothing about their contents).
pub struct Pages<'s> {
    store: &'s dyn PageStore,
    key: [u8; 32],
    cache: RefCell<HashMap<PageId, Arc<Node>>>,
    /// Pages made by a flush, stored together at its end.
    pending: RefCell<Vec<(PageId, Vec<u8>)>>,
}

impl<'s> Pages<'s> {
    /// Pages in `store`, named with `key`.
    pub fn new(store: &'s dyn PageStore, key: [u8; 32]) -> Pages<'s> {
        Pages {
            store,
            key,
            cache: RefCell::new(HashMap::new()),
            pending: RefCell::new(Vec::new()),
        }
    }

    /// The id of a page holding `bytes`.
    pub fn id_of(&self, bytes: &[u8]) -> PageId {
        *blake3::keyed_hash(&self.key, bytes).as_bytes()
    }

    fn load(&self, id: &PageId) -> Result<Arc<Node>, IndexError> {
        if let Some(n) = self.cache.borrow().get(id) {
            return Ok(Arc::clone(n));
        }
        let bytes = self.store.get(id)?;
        if self.id_of(&bytes) != *id {
            return Err(IndexError::Page {
                id: *id,
                reason: "its contents do not match its name".into(),
            });
        }
        let node = Arc::new(decode(&bytes).map_err(|reason| IndexError::Page {
            id: *id,
            reason: reason.into(),
        })?);
        let mut cache = self.cache.borrow_mut();
        if cache.len() >= CACHE_PAGES {
            cache.clear();
        }
        cache.insert(*id, Arc::clone(&node));
        Ok(node)
    }

    /// Name `node`'s page and keep it for [`commit`](Self::commit).
    fn store(&self, node: &Node) -> PageId {
        let bytes = encode(node);
        let id = self.id_of(&bytes);
        self.pending.borrow_mut().push((id, bytes));
        id
    }

    /// Store the pages kept since the last commit.
    fn commit(&self) -> Result<(), IndexError> {
        let pages = std::mem::take(&mut *self.pending.borrow_mut());
        if pages.is_empty() {
            return Ok(());
        }
        self.store.put_all(pages)
    }
}

/// One node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    /// Keys and values, ascending, and the node's encoded size (kept up to
    /// date so that an insert does not sum every entry again).
    Leaf(Vec<(Vec<u8>, Vec<u8>)>, usize),
    /// Children with the lowest key each may hold (the first child's key is
    /// empty: it takes everything below the second's), ascending, and the
    /// node's encoded size.
    Internal(Vec<(Vec<u8>, Child)>, usize),
}

/// A child of an internal node: a stored page, or a node changed since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Child {
    Stored(PageId),
    Dirty(Box<Node>),
}

const LEAF: u8 = 1;
const INTERNAL: u8 = 2;

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
            for (k, v) in entries {
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
                match c {
                    Child::Stored(id) => out.extend_from_slice(id),
                    // Callers flush children first.
                    Child::Dirty(_) => unreachable!("encode of a node with a dirty child"),
                }
            }
        }
    }
    out
}

/// Parse a page, checking every length and the order of keys.
pub(crate) fn decode(bytes: &[u8]) -> Result<Node, &'static str> {
    let (&kind, rest) = bytes.split_first().ok_or("empty page")?;
    let mut c = Cursor(rest);
    let n = c.varint()?;
    // Each entry takes at least two bytes: a count beyond that is a lie.
    if n > rest.len() as u64 {
        return Err("entry count beyond the page");
    }
    let node = match kind {
        LEAF => {
            let mut entries: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let k = c.lv()?.to_vec();
                let v = c.lv()?.to_vec();
                if entries.last().is_some_and(|(p, _)| *p >= k) {
                    return Err("keys out of order");
                }
                entries.push((k, v));
            }
            if entries.is_empty() {
                return Err("empty leaf");
            }
            let size = leaf_size(&entries);
            Node::Leaf(entries, size)
        }
        INTERNAL => {
            let mut children: Vec<(Vec<u8>, Child)> = Vec::with_capacity(n as usize);
            for i in 0..n {
                let k = c.lv()?.to_vec();
                let id: PageId = c.bytes(32)?.try_into().map_err(|_| "truncated")?;
                if i == 0 && !k.is_empty() || i > 0 && children.last().is_some_and(|(p, _)| *p >= k)
                {
                    return Err("keys out of order");
                }
                children.push((k, Child::Stored(id)));
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

fn leaf_size(e: &[(Vec<u8>, Vec<u8>)]) -> usize {
    e.iter().map(|(k, v)| entry_size(k, v.len())).sum::<usize>() + NODE_HEADER
}

fn internal_size(c: &[(Vec<u8>, Child)]) -> usize {
    c.iter().map(|(k, _)| entry_size(k, 32)).sum::<usize>() + NODE_HEADER
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
    pub fn open(pages: &'p Pages<'s>, root: Option<PageId>) -> Tree<'p, 's> {
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
            Some(root) => get_in(self.pages, root, key),
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
            let _ = scan_in(self.pages, root, from, f)?;
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
            Some(root) => floor_in(self.pages, root, key),
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
            self.root = Some(Child::Dirty(Box::new(Node::Leaf(
                vec![(key.to_vec(), value.to_vec())],
                size,
            ))));
            self.dirty += 1;
            return Ok(());
        };
        let split = insert_in(self.pages, &mut self.dirty, &mut root, key, value);
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
                let size = entry_size(&[], 32) + entry_size(&sep, 32) + NODE_HEADER;
                Child::Dirty(Box::new(Node::Internal(
                    vec![(Vec::new(), root), (sep, Child::Dirty(Box::new(right)))],
                    size,
                )))
            }
        });
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
        let removed = remove_in(self.pages, &mut self.dirty, &mut root, key);
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

    /// Write every changed node as a page; the root's id (`None`: empty).
    ///
    /// # Errors
    ///
    /// A page cannot be written.
    pub fn flush(&mut self) -> Result<Option<PageId>, IndexError> {
        let Some(root) = &mut self.root else {
            return Ok(None);
        };
        flush_in(self.pages, root);
        self.pages.commit()?;
        self.dirty = 0;
        match root {
            Child::Stored(id) => Ok(Some(*id)),
            Child::Dirty(_) => unreachable!("flushed"),
        }
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
    root: PageId,
    read_leaves: bool,
    seen: &mut std::collections::HashSet<PageId>,
    mut damaged: Option<&mut Vec<PageId>>,
) -> Result<(), IndexError> {
    let mut height = 0usize;
    let mut id = root;
    loop {
        match &*pages.load(&id)? {
            Node::Leaf(..) => break,
            Node::Internal(c, _) => match c.first() {
                Some((_, Child::Stored(first))) => {
                    id = *first;
                    height += 1;
                }
                _ => break,
            },
        }
    }
    walk_below(pages, root, height, read_leaves, seen, &mut damaged)
}

fn walk_below(
    pages: &Pages<'_>,
    id: PageId,
    height: usize,
    read_leaves: bool,
    seen: &mut std::collections::HashSet<PageId>,
    damaged: &mut Option<&mut Vec<PageId>>,
) -> Result<(), IndexError> {
    if !seen.insert(id) {
        return Ok(());
    }
    if height == 0 && !read_leaves {
        return Ok(());
    }
    let node = match pages.load(&id) {
        Ok(n) => n,
        Err(IndexError::Page { id, .. }) if damaged.is_some() => {
            if let Some(d) = damaged {
                d.push(id);
            }
            return Ok(());
        }
        Err(e) => return Err(e),
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
                id,
                reason: "its depth in the tree is not its kind's".into(),
            };
            match damaged {
                Some(d) => {
                    d.push(id);
                    Ok(())
                }
                None => Err(e),
            }
        }
    }
}

fn node<'a>(pages: &Pages<'_>, child: &'a Child) -> Result<Loaded<'a>, IndexError> {
    match child {
        Child::Dirty(n) => Ok(Loaded::Borrowed(n)),
        Child::Stored(id) => pages.load(id).map(Loaded::Shared),
    }
}

fn get_in(pages: &Pages<'_>, child: &Child, key: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
    let n = node(pages, child)?;
    match &*n {
        Node::Leaf(e, _) => Ok(e
            .binary_search_by(|(k, _)| k.as_slice().cmp(key))
            .ok()
            .map(|i| e[i].1.clone())),
        Node::Internal(c, _) => get_in(pages, &c[child_for(c, key)].1, key),
    }
}

fn floor_in(pages: &Pages<'_>, child: &Child, key: &[u8]) -> Result<Option<Record>, IndexError> {
    let n = node(pages, child)?;
    match &*n {
        Node::Leaf(e, _) => {
            let i = e.partition_point(|(k, _)| k.as_slice() <= key);
            Ok(i.checked_sub(1).map(|i| e[i].clone()))
        }
        Node::Internal(c, _) => {
            // A child's lower bound may sit below its lowest key (after
            // removals): an empty answer there sends the search left.
            for j in (0..=child_for(c, key)).rev() {
                if let Some(found) = floor_in(pages, &c[j].1, key)? {
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
) -> Result<Scan, IndexError> {
    let n = node(pages, child)?;
    match &*n {
        Node::Leaf(e, _) => {
            let start = e.partition_point(|(k, _)| k.as_slice() < from);
            for (k, v) in &e[start..] {
                if f(k, v)?.is_break() {
                    return Ok(ControlFlow::Break(()));
                }
            }
        }
        Node::Internal(c, _) => {
            for (_, ch) in &c[child_for(c, from)..] {
                if scan_in(pages, ch, from, f)?.is_break() {
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
) -> Result<&'a mut Node, IndexError> {
    if let Child::Stored(id) = child {
        let n = pages.load(id)?;
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
    key: &[u8],
    value: &[u8],
) -> Result<Option<(Vec<u8>, Node)>, IndexError> {
    let n = make_dirty(pages, dirty, child)?;
    match n {
        Node::Leaf(e, size) => {
            match e.binary_search_by(|(k, _)| k.as_slice().cmp(key)) {
                Ok(i) => {
                    *size = *size - entry_size(key, e[i].1.len()) + entry_size(key, value.len());
                    e[i].1 = value.to_vec();
                }
                Err(i) => {
                    *size += entry_size(key, value.len());
                    e.insert(i, (key.to_vec(), value.to_vec()));
                }
            }
            if *size > MAX_PAGE && e.len() >= 2 {
                let at = split_point(e.iter().map(|(k, v)| entry_size(k, v.len())), *size);
                let right = e.split_off(at);
                *size = leaf_size(e);
                let right_size = leaf_size(&right);
                return Ok(Some((right[0].0.clone(), Node::Leaf(right, right_size))));
            }
            Ok(None)
        }
        Node::Internal(c, size) => {
            let i = child_for(c, key);
            if let Some((sep, right)) = insert_in(pages, dirty, &mut c[i].1, key, value)? {
                *size += entry_size(&sep, 32);
                c.insert(i + 1, (sep, Child::Dirty(Box::new(right))));
                *dirty += 1;
            }
            if *size > MAX_PAGE && c.len() >= 2 {
                let at = split_point(c.iter().map(|(k, _)| entry_size(k, 32)), *size);
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

/// Remove `key` (known to be there) from the subtree at `child`: its value,
/// and whether the subtree is now empty.
fn remove_in(
    pages: &Pages<'_>,
    dirty: &mut usize,
    child: &mut Child,
    key: &[u8],
) -> Result<(Option<Vec<u8>>, bool), IndexError> {
    let n = make_dirty(pages, dirty, child)?;
    match n {
        Node::Leaf(e, size) => {
            let v = e
                .binary_search_by(|(k, _)| k.as_slice().cmp(key))
                .ok()
                .map(|i| e.remove(i))
                .map(|(k, v)| {
                    *size -= entry_size(&k, v.len());
                    v
                });
            Ok((v, e.is_empty()))
        }
        Node::Internal(c, size) => {
            let i = child_for(c, key);
            let (v, empty) = remove_in(pages, dirty, &mut c[i].1, key)?;
            if empty {
                let (k, _) = c.remove(i);
                *size -= entry_size(&k, 32);
                if let Some(first) = c.first_mut() {
                    *size -= entry_size(&first.0, 32) - entry_size(&[], 32);
                    first.0.clear();
                }
            }
            Ok((v, c.is_empty()))
        }
    }
}

fn flush_in(pages: &Pages<'_>, child: &mut Child) {
    let Child::Dirty(n) = child else {
        return;
    };
    if let Node::Internal(c, _) = &mut **n {
        for (_, ch) in c.iter_mut() {
            flush_in(pages, ch);
        }
    }
    *child = Child::Stored(pages.store(n));
}

/// The child of `children` whose range holds `key`.
fn child_for(children: &[(Vec<u8>, Child)], key: &[u8]) -> usize {
    // The first child takes everything below the second's key.
    children
        .partition_point(|(k, _)| k.as_slice() <= key)
        .saturating_sub(1)
}

/// Pages in memory, with at most `limit` of them kept (more are dropped:
/// reading one back then fails as a missing page): for tests and
/// fuzzing.
#[derive(Debug, Default)]
pub struct MemPages {
    pages: std::cell::RefCell<std::collections::HashMap<PageId, Vec<u8>>>,
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

    /// The pages, by name, to look at or change (a test damaging one).
    pub fn map(&self) -> std::cell::RefMut<'_, std::collections::HashMap<PageId, Vec<u8>>> {
        self.pages.borrow_mut()
    }
}

impl PageStore for MemPages {
    fn get(&self, id: &PageId) -> Result<Vec<u8>, IndexError> {
        self.pages
            .borrow()
            .get(id)
            .cloned()
            .ok_or(IndexError::MissingPage { id: *id })
    }

    fn put_all(&self, pages: Vec<(PageId, Vec<u8>)>) -> Result<(), IndexError> {
        let mut m = self.pages.borrow_mut();
        if self.limit.is_none_or(|l| m.len() < l) {
            m.extend(pages);
        }
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
        for bytes in mem.map().values() {
            let n = decode(bytes).unwrap();
            let (Node::Leaf(_, size) | Node::Internal(_, size)) = &n;
            assert!(*size >= bytes.len(), "{size} < {}", bytes.len());
        }
    }
}
