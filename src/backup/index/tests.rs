//! The tree against a `BTreeMap`, and indexes of the kernel's streams
//! against the kernel's manifests of the snapshots they were sent from.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::io::Read;

use super::tree::{PageRef, Pages, Place, Tree};
use super::{DataSource, IndexError, IndexRoot, Snapshot, Snapshots, index_stream};
use crate::manifest::{self, Options};
use crate::testing::FixtureMeta;

type Mem = super::tree::MemPages;

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn tree_agrees_with_a_btreemap_through_inserts_removes_and_flushes() {
    let mem = Mem::default();
    let pages = Pages::new(&mem, [7; 32]);
    let mut tree = Tree::open(&pages, None);
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut roots = Vec::new();
    for step in 0..60_000u64 {
        let k = format!("k{:06}", rng.below(20_000)).into_bytes();
        match rng.below(10) {
            0..=5 => {
                let v = vec![b'v'; rng.below(300) as usize];
                tree.insert(&k, &v).unwrap();
                model.insert(k, v);
            }
            6..=8 => assert_eq!(tree.remove(&k).unwrap(), model.remove(&k)),
            _ => assert_eq!(tree.get(&k).unwrap(), model.get(&k).cloned()),
        }
        if step % 7_919 == 0 {
            let root = tree.flush().unwrap();
            roots.push((root, model.clone()));
        }
    }
    let root = tree.flush().unwrap();
    roots.push((root, model.clone()));
    // Every flushed version is still whole: pages are never overwritten.
    for (root, want) in roots {
        let t = Tree::open(&pages, root);
        let mut got = Vec::new();
        t.scan(b"", &mut |k, v| {
            got.push((k.to_vec(), v.to_vec()));
            Ok(std::ops::ControlFlow::Continue(()))
        })
        .unwrap();
        assert_eq!(got, want.into_iter().collect::<Vec<_>>());
    }
    // floor: the last key at or before.
    let t = Tree::open(&pages, root);
    for probe in ["k000000", "k010000x", "k2", "a"] {
        let want = model
            .range(..=probe.as_bytes().to_vec())
            .next_back()
            .map(|(k, v)| (k.clone(), v.clone()));
        assert_eq!(t.floor(probe.as_bytes()).unwrap(), want, "{probe}");
    }
    assert!(mem.pages().len() > 100, "the tree spans many pages");
}

#[test]
fn a_damaged_or_missing_page_is_an_error_not_an_answer() {
    let mem = Mem::default();
    let pages = Pages::new(&mem, [1; 32]);
    let mut tree = Tree::open(&pages, None);
    for i in 0..5_000u32 {
        tree.insert(&i.to_be_bytes(), b"value").unwrap();
    }
    tree.flush().unwrap();
    // A second flush: the new root's pack is not the leaf's.
    tree.insert(&u32::MAX.to_be_bytes(), b"value").unwrap();
    let root = tree.flush().unwrap().unwrap();
    // The first page stored: the leftmost leaf, in the first pack.
    let leaf = mem.pages()[0];
    let pack = |r: PageRef| match r.place {
        Place::Packed { pack, .. } => pack,
        p => panic!("{p:?}"),
    };
    assert_ne!(pack(leaf), pack(root));
    // A flipped byte: the page no longer matches its name.
    assert!(mem.damage(&leaf, |b| b[3] ^= 1));
    let fresh = Pages::new(&mem, [1; 32]);
    let t = Tree::open(&fresh, Some(root));
    let mut seen = 0;
    let r = t.scan(b"", &mut |_, _| {
        seen += 1;
        Ok(std::ops::ControlFlow::Continue(()))
    });
    assert!(
        matches!(r, Err(IndexError::Page { id, .. }) if id == leaf.id),
        "{r:?}"
    );
    // Missing: its pack is gone, the root's is there.
    mem.remove(&leaf);
    let fresh = Pages::new(&mem, [1; 32]);
    let t = Tree::open(&fresh, Some(root));
    let r = t.scan(b"", &mut |_, _| Ok(std::ops::ControlFlow::Continue(())));
    assert!(matches!(r, Err(IndexError::MissingPage { .. })), "{r:?}");
    // A page under another key is not taken either.
    let other = Pages::new(&mem, [2; 32]);
    let t = Tree::open(&other, Some(root));
    assert!(matches!(t.get(b"x"), Err(IndexError::Page { .. })));
}

/// Raw streams in memory, by source name.
#[derive(Default)]
struct Streams(HashMap<String, Vec<u8>>);

impl DataSource for Streams {
    fn read(&self, source: &str, offset: u64, buf: &mut [u8]) -> Result<(), IndexError> {
        let s = self.0.get(source).ok_or(IndexError::Store(source.into()))?;
        let start = offset as usize;
        buf.copy_from_slice(
            s.get(start..start + buf.len())
                .ok_or(IndexError::Store("past the end".into()))?,
        );
        Ok(())
    }
}

/// Indexes by snapshot UUID.
#[derive(Default)]
struct Known(RefCell<HashMap<[u8; 16], IndexRoot>>);

impl Snapshots for Known {
    fn index_of(&self, uuid: &[u8; 16]) -> Option<IndexRoot> {
        self.0.borrow().get(uuid).cloned()
    }
}

fn read_zst(path: &std::path::Path) -> Vec<u8> {
    let mut out = Vec::new();
    zstd::Decoder::new(std::fs::File::open(path).unwrap())
        .unwrap()
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// Index `stream` (a fixture file) and check the result against the
/// kernel's manifest of `snapshot`.
fn index_and_check(
    fx: &FixtureMeta,
    pages: &Pages<'_>,
    streams: &mut Streams,
    known: &Known,
    stream: &std::path::Path,
    snapshot: &str,
) {
    let name = stream.file_name().unwrap().to_string_lossy().into_owned();
    let raw = read_zst(stream);
    let (uuid, root) = index_stream(pages, &raw[..], &name, known)
        .unwrap_or_else(|e| panic!("{}: {name}: {e}", fx.name()));
    streams.0.insert(name.clone(), raw);
    known.0.borrow_mut().insert(uuid, root.clone());
    let got = Snapshot::open(pages, root)
        .manifest(Options { holes: false }, streams)
        .unwrap_or_else(|e| panic!("{}: {name}: {e}", fx.name()));
    let want = manifest::strip_holes(&fx.manifest(snapshot).unwrap());
    // A nested subvolume is not in its parent's stream.
    let want: String = want
        .lines()
        .filter(|l| !l.ends_with(" subvol"))
        .map(|l| format!("{l}\n"))
        .collect();
    if let Some(d) = manifest::diff(&want, &got, 20) {
        panic!("{}: {name} indexed is not {snapshot}:\n{d}", fx.name());
    }
}

#[test]
fn indexes_of_the_kernels_full_streams_equal_the_kernels_manifests() {
    for fx in FixtureMeta::all().unwrap() {
        for version in ["v1", "v2c"] {
            let mem = Mem::default();
            let pages = Pages::new(&mem, [0; 32]);
            let mut streams = Streams::default();
            let known = Known::default();
            for snap in &fx.snapshots {
                let path = fx.full_stream(snap, version);
                if path.is_file() {
                    index_and_check(&fx, &pages, &mut streams, &known, &path, snap);
                }
            }
        }
    }
}

#[test]
fn indexes_built_along_the_kernels_incremental_chains_equal_its_manifests() {
    for fx in FixtureMeta::all().unwrap() {
        for version in ["v1", "v2c"] {
            let mem = Mem::default();
            let pages = Pages::new(&mem, [0; 32]);
            let mut streams = Streams::default();
            let known = Known::default();
            // Every snapshot first as a full stream (so each pair's parent
            // has an index), then each pair on top of its parent's.
            for snap in &fx.snapshots {
                let path = fx.full_stream(snap, version);
                if path.is_file() {
                    index_and_check(&fx, &pages, &mut streams, &known, &path, snap);
                }
            }
            for pair in &fx.pairs {
                let path = fx.inc_stream(pair, version);
                if path.is_file() {
                    index_and_check(&fx, &pages, &mut streams, &known, &path, &pair.child);
                }
            }
            // Streams with clone sources (`clonesend NAME SNAP ...`).
            for (key, value) in &fx.other {
                if key != "clonesend" {
                    continue;
                }
                let mut words = value.split_whitespace();
                let (Some(name), Some(snap)) = (words.next(), words.next()) else {
                    continue;
                };
                let path = fx.dir.join(format!("{name}.{version}.stream.zst"));
                if path.is_file() {
                    index_and_check(&fx, &pages, &mut streams, &known, &path, snap);
                }
            }
        }
    }
}

#[test]
fn removing_every_key_of_a_prefix_leaves_none() {
    let mem = Mem::default();
    let pages = Pages::new(&mem, [3; 32]);
    let mut tree = Tree::open(&pages, None);
    let key = |d: u64, f: u64| {
        let mut k = vec![2];
        k.extend_from_slice(&d.to_be_bytes());
        k.extend_from_slice(format!("file-{f:05}-with-a-longish-name").as_bytes());
        k
    };
    for d in 0..100 {
        for f in 0..100 {
            tree.insert(&key(d, f), &[0; 8]).unwrap();
        }
    }
    tree.flush().unwrap();
    for f in 0..100 {
        assert!(tree.remove(&key(50, f)).unwrap().is_some());
    }
    let mut prefix = vec![2];
    prefix.extend_from_slice(&50u64.to_be_bytes());
    let left = tree.prefixed(&prefix).unwrap();
    assert!(left.is_empty(), "{:?}", left.first());
}

/// A stream of `cmds` after a SUBVOL, ended (`finish` writes END).
fn stream_of(cmds: &[stream_format::Command<'static>]) -> Vec<u8> {
    use std::borrow::Cow;
    use stream_format::{Command, StreamWriter};
    let mut w = StreamWriter::new(Vec::new(), 1).unwrap();
    w.write(&Command::Subvol {
        path: Cow::Borrowed(b"s"),
        uuid: [9; 16],
        ctransid: 1,
    })
    .unwrap();
    for c in cmds {
        w.write(c).unwrap();
    }
    w.finish().unwrap()
}

/// MKDIR of `p` (its inode number unused by the indexer).
fn mkdir(p: &'static [u8]) -> stream_format::Command<'static> {
    stream_format::Command::Mkdir {
        path: std::borrow::Cow::Borrowed(p),
        ino: 300,
    }
}

/// MKFILE of `p` (its inode number unused by the indexer).
fn mkfile(p: &'static [u8]) -> stream_format::Command<'static> {
    stream_format::Command::Mkfile {
        path: std::borrow::Cow::Borrowed(p),
        ino: 301,
    }
}

/// WRITE of `x` at the start of `p`.
fn write_x(p: &'static [u8]) -> stream_format::Command<'static> {
    stream_format::Command::Write {
        path: std::borrow::Cow::Borrowed(p),
        offset: 0,
        data: std::borrow::Cow::Borrowed(b"x"),
    }
}

/// CHMOD of `p` to 0644.
fn chmod(p: &'static [u8]) -> stream_format::Command<'static> {
    stream_format::Command::Chmod {
        path: std::borrow::Cow::Borrowed(p),
        mode: 0o644,
    }
}

#[test]
fn hostile_streams_are_refused_with_the_command_named() {
    use std::borrow::Cow::Borrowed as B;
    use stream_format::Command as C;
    let cases: Vec<(Vec<C<'static>>, &str)> = vec![
        (vec![mkdir(b"../x")], "'..' component refused"),
        (vec![mkdir(b"/x")], "absolute path refused"),
        (vec![mkdir(b"a"), mkdir(b"a")], "the name exists already"),
        (vec![mkfile(b"f"), mkdir(b"f/x")], "not a directory"),
        (
            vec![mkdir(b"a"), mkfile(b"a/f"), C::Rmdir { path: B(b"a") }],
            "not empty",
        ),
        (
            vec![
                mkdir(b"a"),
                mkdir(b"a/b"),
                C::Rename {
                    path: B(b"a"),
                    path_to: B(b"a/b/c"),
                },
            ],
            "below itself",
        ),
        (
            vec![C::Unlink {
                path: B(b"nothing"),
            }],
            "no such file",
        ),
        (
            vec![
                mkdir(b"d"),
                C::Link {
                    path: B(b"l"),
                    path_link: B(b"d"),
                },
            ],
            "LINK to a directory",
        ),
        (
            vec![
                mkfile(b"f"),
                C::Clone {
                    offset: 0,
                    len: 4096,
                    path: B(b"f"),
                    clone_uuid: [5; 16],
                    clone_ctransid: 1,
                    clone_path: B(b"g"),
                    clone_offset: 0,
                },
            ],
            "the clone source has no index",
        ),
        (vec![mkdir(b"d"), write_x(b"d")], "not a regular file"),
        (
            vec![
                mkfile(b"f"),
                C::RemoveXattr {
                    path: B(b"f"),
                    name: B(b"user.x"),
                },
            ],
            "does not have",
        ),
        // A new file renamed at once is made under its final name alone
        // (see Held), with the checks of both commands.
        (
            vec![
                mkdir(b"a"),
                mkfile(b"a"),
                C::Rename {
                    path: B(b"a"),
                    path_to: B(b"b"),
                },
            ],
            "MKFILE",
        ),
        (
            vec![
                mkfile(b"f"),
                C::Rename {
                    path: B(b"f"),
                    path_to: B(b"f/x"),
                },
            ],
            "not a directory",
        ),
        (
            vec![
                mkfile(b"f"),
                C::Rename {
                    path: B(b"f"),
                    path_to: B(b"none/x"),
                },
            ],
            "no such file",
        ),
        (vec![mkfile(b"f"), mkfile(b"f")], "the name exists already"),
        // A RENAME's and a LINK's second path are checked as the first:
        // a name `..` or `.` is never made.
        (
            vec![
                mkfile(b"f"),
                C::Rename {
                    path: B(b"f"),
                    path_to: B(b".."),
                },
            ],
            "'..' component refused",
        ),
        (
            vec![
                mkdir(b"d"),
                C::Rename {
                    path: B(b"d"),
                    path_to: B(b"."),
                },
            ],
            "'.' component refused",
        ),
        (
            vec![
                mkfile(b"f"),
                C::Link {
                    path: B(b"l"),
                    path_link: B(b"d/../f"),
                },
            ],
            "'..' component refused",
        ),
        (
            vec![C::Mkfile {
                path: std::borrow::Cow::Owned(vec![b'n'; 256]),
                ino: 301,
            }],
            "a name longer than 255 bytes",
        ),
        // The commands applied undecoded (`apply_quick`) when they name
        // the path the last one did, as CHMOD here does, are refused as
        // the decoded ones are.
        (
            vec![mkdir(b"d"), chmod(b"d"), write_x(b"d")],
            "not a regular file",
        ),
        (
            vec![
                mkfile(b"f"),
                chmod(b"f"),
                C::Chown {
                    path: B(b"f"),
                    uid: 1 << 32,
                    gid: 0,
                },
            ],
            "uid out of range",
        ),
        (
            vec![
                mkfile(b"f"),
                chmod(b"f"),
                C::Chown {
                    path: B(b"f"),
                    uid: 0,
                    gid: u64::MAX,
                },
            ],
            "gid out of range",
        ),
        (
            vec![
                mkfile(b"f"),
                chmod(b"f"),
                C::Utimes {
                    path: B(b"f"),
                    atime: stream_format::Timespec { sec: 1, nsec: 0 },
                    mtime: stream_format::Timespec {
                        sec: 1,
                        nsec: 1_000_000_000,
                    },
                    ctime: stream_format::Timespec { sec: 1, nsec: 0 },
                    otime: None,
                },
            ],
            "nanoseconds out of range",
        ),
    ];
    for (cmds, want) in cases {
        let mem = Mem::default();
        let pages = Pages::new(&mem, [0; 32]);
        let raw = stream_of(&cmds);
        let err = index_stream(&pages, &raw[..], "s", &Known::default()).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, IndexError::Apply { .. }) && msg.contains(want),
            "{cmds:?}: {msg}"
        );
        assert!(msg.contains("at stream offset"), "{msg}");
    }
    // A stream that stops before END is not an index, even when the
    // last command was a held MKFILE.
    let mut raw = stream_of(&[mkdir(b"a"), mkfile(b"a/f")]);
    raw.truncate(raw.len() - 10);
    let mem = Mem::default();
    let pages = Pages::new(&mem, [0; 32]);
    let r = index_stream(&pages, &raw[..], "s", &Known::default());
    assert!(r.is_err(), "{r:?}");
}

#[test]
fn indexes_made_before_packs_are_read_and_built_on() {
    // Every fixture with incremental pairs: each full stream's index is
    // stored again as objects (as indexes made before packs are), must
    // list what it did, and the pairs are indexed on those.
    let (mut pairs, mut internal) = (0, 0);
    for fx in FixtureMeta::all().unwrap() {
        if fx.pairs.is_empty() {
            continue;
        }
        let mem = Mem::default();
        let pages = Pages::new(&mem, [0; 32]);
        let mut streams = Streams::default();
        let known = Known::default();
        for snap in &fx.snapshots {
            let path = fx.full_stream(snap, "v2c");
            if path.is_file() {
                index_and_check(&fx, &pages, &mut streams, &known, &path, snap);
            }
        }
        let opts = Options { holes: false };
        for root in known.0.borrow_mut().values_mut() {
            let packed = Snapshot::open(&pages, root.clone())
                .manifest(opts, &streams)
                .unwrap();
            let top = root.top().unwrap();
            let id = super::tree::as_objects(&pages, &mem, &top);
            // A tree of more than one page has internal pages, which change.
            internal += usize::from(id != top.id);
            root.set_top(Some(PageRef {
                id,
                place: Place::Object,
            }));
            assert!(root.at.is_none());
            let fresh = Pages::new(&mem, [0; 32]);
            let old = Snapshot::open(&fresh, root.clone())
                .manifest(opts, &streams)
                .unwrap();
            assert_eq!(old, packed, "{}", fx.name());
        }
        for pair in &fx.pairs {
            let path = fx.inc_stream(pair, "v2c");
            if path.is_file() {
                index_and_check(&fx, &pages, &mut streams, &known, &path, &pair.child);
                pairs += 1;
            }
        }
    }
    assert!(pairs > 5, "{pairs} pairs");
    assert!(internal > 0, "no tree had internal pages");
}

#[test]
fn a_new_file_renamed_at_once_is_indexed_as_the_two_commands_make_it() {
    use std::borrow::Cow::Borrowed as B;
    use stream_format::Command as C;
    let rename = |a: &'static [u8], b: &'static [u8]| C::Rename {
        path: B(a),
        path_to: B(b),
    };
    let write = |p: &'static [u8]| C::Write {
        path: B(p),
        offset: 0,
        data: B(b"data"),
    };
    // New files renamed to new names, over a file, into a directory, and
    // one written under its first name before it is renamed.
    let cmds = |between: bool| {
        let mut v = vec![mkdir(b"d"), mkfile(b"o1")];
        let renamed = |v: &mut Vec<C<'static>>, a, b| {
            if between {
                // Any command between the two makes the file first (this
                // one changes nothing: new inodes are root's).
                v.push(C::Chown {
                    path: B(a),
                    uid: 0,
                    gid: 0,
                });
            }
            v.push(rename(a, b));
        };
        renamed(&mut v, b"o1", b"f");
        v.push(write(b"f"));
        v.push(mkfile(b"o2"));
        renamed(&mut v, b"o2", b"f");
        v.push(mkfile(b"o3"));
        renamed(&mut v, b"o3", b"d/g");
        v.push(mkfile(b"o4"));
        v.push(write(b"o4"));
        v.push(rename(b"o4", b"d/h"));
        v.push(C::Symlink {
            path: B(b"o5"),
            ino: 302,
            path_link: B(b"f"),
        });
        renamed(&mut v, b"o5", b"l");
        v
    };
    let listing = |between: bool| {
        let mem = Mem::default();
        let pages = Pages::new(&mem, [0; 32]);
        let raw = stream_of(&cmds(between));
        let (_, root) = index_stream(&pages, &raw[..], "s", &Known::default()).unwrap();
        let snap = Snapshot::open(&pages, root);
        let mut out = Vec::new();
        snap.walk(&mut |path, ino, i| {
            out.push(format!(
                "{} {ino} {:?} {} {} {:o}",
                String::from_utf8_lossy(path),
                i.kind,
                i.size,
                i.nlink,
                i.mode
            ));
            Ok(())
        })
        .unwrap();
        out
    };
    let fused = listing(false);
    assert_eq!(
        fused,
        [
            "d 257 Dir 4 1 700",
            "d/g 260 File 0 1 600",
            "d/h 261 File 4 1 600",
            "f 259 File 0 1 600",
            "l 262 Symlink 1 1 777",
        ],
        "{fused:#?}"
    );
    assert_eq!(fused, listing(true));
}

/// Index `raw` (named `name`) on `known`, keeping its bytes as data.
fn index_raw(
    pages: &Pages<'_>,
    streams: &mut Streams,
    known: &Known,
    raw: Vec<u8>,
    name: &str,
) -> IndexRoot {
    let (uuid, root) =
        index_stream(pages, &raw[..], name, known).unwrap_or_else(|e| panic!("{name}: {e}"));
    streams.0.insert(name.to_owned(), raw);
    known.0.borrow_mut().insert(uuid, root.clone());
    root
}

/// The synthetic full stream of every snapshot an incremental stream of
/// the fixtures makes (the kernel's full stream of its parent, then the
/// pair), written from the chain's index: indexed on nothing, its digest
/// is the chain's (the proof passes), and it holds the kernel's manifest
/// of the snapshot (holes aside: see `synthesize`'s docs). The digest
/// tells different snapshots apart, naming the first path that differs.
#[test]
fn synthetic_full_streams_of_the_kernels_chains_are_proven_and_equal_its_manifests() {
    use super::proof;
    use super::synth::{self, Head};
    let mut proven = 0;
    for fx in FixtureMeta::all().unwrap() {
        for version in ["v1", "v2c"] {
            for pair in &fx.pairs {
                let (full, inc) = (
                    fx.full_stream(&pair.parent, version),
                    fx.inc_stream(pair, version),
                );
                if !full.is_file() || !inc.is_file() {
                    continue;
                }
                let mem = Mem::default();
                let pages = Pages::new(&mem, [0; 32]);
                let mut streams = Streams::default();
                let known = Known::default();
                let parent = index_raw(&pages, &mut streams, &known, read_zst(&full), "full");
                let chain = index_raw(&pages, &mut streams, &known, read_zst(&inc), "inc");
                let snap = Snapshot::open(&pages, chain);
                let mut want = proof::TreeDigest::new();
                let mut out = stream_format::StreamWriter::new(Vec::new(), 1).unwrap();
                let head = Head {
                    name: pair.child.as_bytes(),
                    uuid: [7; 16],
                    ctransid: 9,
                };
                synth::write_proved(&snap, &streams, head, &mut out, &mut want)
                    .unwrap_or_else(|e| panic!("{}: {}: {e}", fx.name(), pair.child));
                let raw = out.into_inner();
                let fresh = Known::default();
                let made = index_raw(&pages, &mut streams, &fresh, raw, "synthetic");
                let made = Snapshot::open(&pages, made);
                let got = proof::digest(&made, &streams).unwrap();
                let what = format!(
                    "{} {version}: {} from {}",
                    fx.name(),
                    pair.child,
                    pair.parent
                );
                assert_eq!(got.finish(), want.finish(), "{what}: the proof fails");
                assert_eq!(got.paths(), want.paths(), "{what}");
                let manifest = made.manifest(Options { holes: false }, &streams).unwrap();
                let kernel = manifest::strip_holes(&fx.manifest(&pair.child).unwrap());
                let kernel: String = kernel
                    .lines()
                    .filter(|l| !l.ends_with(" subvol"))
                    .map(|l| format!("{l}\n"))
                    .collect();
                if let Some(d) = manifest::diff(&kernel, &manifest, 20) {
                    panic!("{what}: the synthetic full stream is not the snapshot:\n{d}");
                }
                // The parent's tree is another: its digest differs, and
                // the first path that differs is named.
                let before = Snapshot::open(&pages, parent);
                if fx.manifest(&pair.parent).unwrap() != fx.manifest(&pair.child).unwrap() {
                    let theirs = proof::digest(&before, &streams).unwrap();
                    assert_ne!(theirs.finish(), got.finish(), "{what}");
                    let at =
                        proof::first_difference((&before, &streams), (&made, &streams)).unwrap();
                    assert!(at.is_some(), "{what}: no path named");
                }
                proven += 1;
            }
        }
    }
    assert!(proven >= 10, "only {proven} chains in the fixtures");
}

/// A directory holding an entry for a directory above it (a loop only a
/// forged index can hold) ends a walk where the loop closes, with an error
/// naming that directory, not 2048 levels of it later.
#[test]
fn a_directory_loop_in_an_index_is_refused_where_it_closes() {
    use super::model::{FileType, dirent_key, inode_key};
    let mem = Mem::default();
    let pages = Pages::new(&mem, [1; 32]);
    let raw = stream_of(&[mkdir(b"a"), mkdir(b"a/b"), mkfile(b"a/b/f")]);
    let (_, mut root) = index_stream(&pages, &raw[..], "s", &Known::default()).unwrap();
    let snap = Snapshot::open(&pages, root.clone());
    let (a, b) = (snap.lookup(b"a").unwrap(), snap.lookup(b"a/b").unwrap());
    assert_eq!(snap.inode(a).unwrap().kind, FileType::Dir);
    let mut paths = Vec::new();
    snap.walk(&mut |p, _, _| {
        paths.push(p.to_vec());
        Ok(())
    })
    .unwrap();
    assert_eq!(paths, [&b"a"[..], b"a/b", b"a/b/f"]);
    // a/b/up is a again.
    let mut tree = Tree::open(&pages, root.top());
    tree.insert(&dirent_key(b, b"up"), &a.to_le_bytes())
        .unwrap();
    root.set_top(tree.flush().unwrap());
    let forged = Snapshot::open(&pages, root);
    let mut seen = 0;
    let r = forged.walk(&mut |_, _, _| {
        seen += 1;
        Ok(())
    });
    assert!(
        matches!(&r, Err(IndexError::Record { key, reason, .. })
            if *key == inode_key(a) && reason.contains("loop")),
        "{r:?}"
    );
    // a, a/b, a/b/f, a/b/up: the loop is seen where it closes.
    assert_eq!(seen, 4);
}

/// A name removed just as the cache of changed entries is full (the
/// removal puts the cache in the tree first) is gone from the index: a
/// directory made under one name and renamed, as a kernel stream makes
/// every new directory, has its final name alone.
#[test]
fn a_name_removed_as_the_entry_cache_fills_is_gone() {
    use std::borrow::Cow::{Borrowed as B, Owned as O};
    use stream_format::Command as C;
    let full = super::apply::CACHED_PATHS;
    let mut cmds = vec![mkdir(b"o1")];
    // One entry in the cache already; these fill it.
    for i in 1..full {
        cmds.push(C::Mkdir {
            path: O(format!("d{i}").into_bytes()),
            ino: 300,
        });
    }
    cmds.push(C::Rename {
        path: B(b"o1"),
        path_to: B(b"x"),
    });
    let mem = Mem::default();
    let pages = Pages::new(&mem, [0; 32]);
    let raw = stream_of(&cmds);
    let (_, root) = index_stream(&pages, &raw[..], "s", &Known::default()).unwrap();
    let mut names = Vec::new();
    Snapshot::open(&pages, root)
        .walk(&mut |path, _, _| {
            names.push(path.to_vec());
            Ok(())
        })
        .unwrap();
    assert!(names.iter().any(|n| n == b"x"), "x is missing");
    assert!(!names.iter().any(|n| n == b"o1"), "o1 is still listed");
    assert_eq!(names.len(), full, "one entry a directory made");
}

/// Names no stream can give (`..`, `.`, a `/`, a NUL, none, 256 bytes) in
/// a forged index are refused where a listing meets them: they never
/// reach a tar member, a FUSE directory or a synthetic stream.
#[test]
fn names_no_file_system_allows_in_an_index_are_refused() {
    use super::model::{ROOT_INO, dirent_key, xattr_key};
    let mem = Mem::default();
    let pages = Pages::new(&mem, [1; 32]);
    let raw = stream_of(&[
        mkdir(b"a"),
        mkfile(b"a/f"),
        stream_format::Command::SetXattr {
            path: std::borrow::Cow::Borrowed(b"a/f"),
            name: std::borrow::Cow::Borrowed(b"user.ok"),
            data: std::borrow::Cow::Borrowed(b"v"),
        },
    ]);
    let (_, root) = index_stream(&pages, &raw[..], "s", &Known::default()).unwrap();
    let f = Snapshot::open(&pages, root.clone()).lookup(b"a/f").unwrap();
    let long = vec![b'n'; 256];
    for bad in [&b".."[..], b".", b"x/../../y", b"nul\0", b"", &long] {
        let mut tree = Tree::open(&pages, root.top());
        tree.insert(&dirent_key(ROOT_INO, bad), &f.to_le_bytes())
            .unwrap();
        let mut forged = root.clone();
        forged.set_top(tree.flush().unwrap());
        let snap = Snapshot::open(&pages, forged);
        let r = snap.walk(&mut |_, _, _| Ok(()));
        assert!(
            matches!(&r, Err(IndexError::Record { key, reason, .. })
                if *key == dirent_key(ROOT_INO, bad) && reason.contains("no file system allows")),
            "{bad:?}: {r:?}"
        );
    }
    // The name the stream gave is read.
    assert_eq!(
        Snapshot::open(&pages, root.clone()).xattrs(f).unwrap(),
        [(b"user.ok".to_vec(), b"v".to_vec())]
    );
    for bad in [&b"user.a\0b"[..], b"", &long] {
        let mut tree = Tree::open(&pages, root.top());
        tree.insert(&xattr_key(f, bad), b"v").unwrap();
        let mut forged = root.clone();
        forged.set_top(tree.flush().unwrap());
        let r = Snapshot::open(&pages, forged).xattrs(f);
        assert!(
            matches!(&r, Err(IndexError::Record { reason, .. }) if reason.contains("no file system allows")),
            "{bad:?}: {r:?}"
        );
    }
}

/// Orphan-named entries (`o<ino>-<gen>-<idx>`) the stream leaves in place
/// are found whether the indexer still keeps them apart (a few), no longer
/// can (more than it keeps), or they went to the tree (more than its cache
/// of entries): making one again is refused, and once renamed away its
/// name is free.
#[test]
fn orphan_names_left_in_place_are_found_however_many() {
    use std::borrow::Cow::Owned as O;
    use stream_format::Command as C;
    let kept = super::apply::ORPHANS;
    let cached = super::apply::CACHED_PATHS;
    for n in [3, kept, kept + 5, cached + 5] {
        let name = |i: usize| format!("d/o{}-1-0", 1000 + i).into_bytes();
        let mut cmds = vec![mkdir(b"d")];
        for i in 0..n {
            cmds.push(C::Mkfile {
                path: O(name(i)),
                ino: 301,
            });
        }
        // The first one made again, before anything: refused.
        let mut again = cmds.clone();
        again.push(C::Mkfile {
            path: O(name(0)),
            ino: 301,
        });
        let mem = Mem::default();
        let pages = Pages::new(&mem, [0; 32]);
        let raw = stream_of(&again);
        let err = index_stream(&pages, &raw[..], "s", &Known::default()).unwrap_err();
        assert!(
            err.to_string().contains("the name exists already"),
            "{n}: {err}"
        );
        // Renamed away, its name is free to make again.
        cmds.push(C::Rename {
            path: O(name(0)),
            path_to: O(b"d/kept".to_vec()),
        });
        cmds.push(C::Mkfile {
            path: O(name(0)),
            ino: 301,
        });
        let raw = stream_of(&cmds);
        let (_, root) = index_stream(&pages, &raw[..], "s", &Known::default()).unwrap();
        let snap = Snapshot::open(&pages, root);
        let mut count = 0;
        snap.walk(&mut |_, _, _| {
            count += 1;
            Ok(())
        })
        .unwrap();
        // d, its n orphan-named files and d/kept.
        assert_eq!(count, n + 2, "{n}");
        assert_ne!(
            snap.lookup(b"d/kept").unwrap(),
            snap.lookup(&name(0)).unwrap()
        );
    }
}

/// Indexing a stream as `run` stores it (its bytes in batches through a
/// channel, each command split in its batch when it lies whole there, read
/// across batches when not) makes the same index, page for page, as
/// reading the stream whole: for every full and incremental stream of the
/// fixtures, in batches of many sizes. Those indexes hold the kernel's
/// manifests (the two tests of the kernel's streams above), so these do.
#[test]
fn streams_indexed_in_batches_make_the_indexes_read_whole_do() {
    use super::apply::index_own_stream;
    use super::inline::ChannelReader;
    let mut compared = 0;
    for fx in FixtureMeta::all().unwrap() {
        for pair in &fx.pairs {
            let full = read_zst(&fx.full_stream(&pair.parent, "v2c"));
            let inc = read_zst(&fx.inc_stream(pair, "v2c"));
            for batch in [1, 7, 64, 1000, 1 << 20] {
                let mem = Mem::default();
                let pages = Pages::new(&mem, [9; 32]);
                let (whole, batched) = (Known::default(), Known::default());
                for (name, raw) in [("full", &full), ("inc", &inc)] {
                    let want = index_stream(&pages, &raw[..], name, &whole)
                        .unwrap_or_else(|e| panic!("{}: {name}: {e}", fx.name()));
                    whole.0.borrow_mut().insert(want.0, want.1.clone());
                    let (tx, rx) = std::sync::mpsc::channel();
                    // Batches of `batch` bytes, every third one shorter (by
                    // where it starts), so commands begin and end anywhere.
                    let mut at = 0;
                    for i in 0.. {
                        if at >= raw.len() {
                            break;
                        }
                        let n = if i % 3 == 2 { 1 + at % batch } else { batch };
                        let end = (at + n).min(raw.len());
                        tx.send(raw[at..end].to_vec()).unwrap();
                        at = end;
                    }
                    drop(tx);
                    let got = index_own_stream(&pages, ChannelReader::new(rx), name, &batched)
                        .unwrap_or_else(|e| panic!("{}: {name} in {batch}s: {e}", fx.name()));
                    assert_eq!(got, want, "{}: {name} in batches of {batch}", fx.name());
                    batched.0.borrow_mut().insert(got.0, got.1);
                    compared += 1;
                }
            }
        }
    }
    assert!(compared >= 20, "{compared} streams compared");
}
