//! Entry points for the fuzz targets (`fuzz/`): each parser of repository
//! bytes that someone else may have written, run over one input the way
//! btrsend runs it. Every one must return (an error is fine) without
//! panicking, hanging or allocating without bound. Not an API.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Mutex;

use super::catalog::Catalog;
use super::file::StreamFile;
use super::store::{ObjectInfo, Store, StoreError, Upload};

/// A store in memory holding the fuzzed objects.
#[derive(Debug, Default)]
struct MemStore(Mutex<BTreeMap<String, Vec<u8>>>);

impl MemStore {
    fn with(key: &str, data: &[u8]) -> MemStore {
        let s = MemStore::default();
        if let Ok(mut m) = s.0.lock() {
            m.insert(key.to_owned(), data.to_vec());
        }
        s
    }
}

fn missing(key: &str) -> StoreError {
    StoreError::NotFound {
        location: key.to_owned(),
    }
}

impl Store for MemStore {
    fn name(&self) -> &str {
        "fuzz"
    }

    fn get(&self, key: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, StoreError> {
        let m = self.0.lock().map_err(|_| missing(key))?;
        let obj = m.get(key).ok_or_else(|| missing(key))?;
        let Some(r) = range else {
            return Ok(obj.clone());
        };
        let (Ok(a), Ok(b)) = (usize::try_from(r.start), usize::try_from(r.end)) else {
            return Err(missing(key));
        };
        obj.get(a..b)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| StoreError::Other {
                op: "read",
                location: key.to_owned(),
                error: "short object".into(),
            })
    }

    fn put_if_absent(&self, key: &str, data: &[u8]) -> Result<bool, StoreError> {
        let mut m = self.0.lock().map_err(|_| missing(key))?;
        if m.contains_key(key) {
            return Ok(false);
        }
        m.insert(key.to_owned(), data.to_vec());
        Ok(true)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let m = self.0.lock().map_err(|_| missing(prefix))?;
        Ok(m.iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| ObjectInfo {
                key: k.clone(),
                size: v.len() as u64,
            })
            .collect())
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        if let Ok(mut m) = self.0.lock() {
            m.remove(key);
        }
        Ok(())
    }

    fn multipart(&self, key: &str) -> Result<Box<dyn Upload>, StoreError> {
        Err(StoreError::Other {
            op: "write",
            location: key.to_owned(),
            error: "read-only".into(),
        })
    }

    fn check_reachable(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A catalog generation as `Catalog::load` reads it, then the walks
/// `restore`, `verify` and `forget` make over a checked one.
pub fn catalog(data: &[u8]) {
    let store = MemStore::with("catalog/0000000000000001.json", data);
    let Ok(cat) = Catalog::load(&store) else {
        return;
    };
    for e in &cat.entries {
        assert!(cat.chain(e.id).is_ok(), "a checked catalog has every chain");
        assert!(cat.get(e.id).is_some(), "a checked catalog finds every id");
        let _ = e.timestamp();
    }
}

/// A stream file as `verify --read-data` and `restore` read it: trailer
/// and frame table, the first command, every frame checked and
/// decompressed, the raw stream decoded.
pub fn stream_file(data: &[u8]) {
    const KEY: &str = "streams/x.btrs.zst";
    let store = MemStore::with(KEY, data);
    let Ok(f) = StreamFile::open(&store, KEY, data.len() as u64) else {
        return;
    };
    let _ = f.first_ident(&store);
    for i in 0..f.trailer.frames.len() {
        if let Ok(bytes) = f.read_frame(&store, i) {
            let _ = f.decompress(i, &bytes);
        }
    }
    let mut r = stream_format::StreamReader::with_options(
        f.raw_reader(&store),
        stream_format::ReaderOptions::new().with_max_version(3),
    );
    while let Ok(Some(_)) = r.next_raw() {}
}

/// A partial stream file in `tmp/` as the next `run` scans it.
pub fn partial(data: &[u8]) {
    const KEY: &str = "tmp/00000000-0000-4000-8000-000000000001-5-00000000.btrs.zst.1.0";
    let store = MemStore::with(KEY, data);
    let _ = super::partial::scan(&store, KEY, data.len() as u64);
}

/// The state an S3 upload marker records, as the next `run` reads it.
pub fn checkpoint(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let _ = super::partial::from_checkpoint(s, data.len() as u64, "streams/x.btrs.zst");
}

/// A fixed identity for the encrypted targets (published here: it guards
/// nothing).
const FUZZ_IDENTITY: &str =
    "AGE-SECRET-KEY-1W65PN4FNQQ3RKNS5ACW2X8FQRYPRAC2JRCVTKUUHQ3VF9VHJ52WQ657RWP";

fn fuzz_keys() -> Option<super::crypt::keys::Keys> {
    use std::str::FromStr;
    let id = age::x25519::Identity::from_str(FUZZ_IDENTITY).ok()?;
    Some(super::crypt::keys::Keys {
        repo: String::from("0123456789abcdef0123456789abcdef"),
        write: super::crypt::keys::WriteKey::from_bytes([7; 32]),
        recipients: vec![id.to_public()],
        identities: vec![id],
    })
}

/// A stream object of an encrypted repository as `verify --read-data`
/// reads it (header, binding, chunks, then the stream file inside), and
/// the same bytes as a payload opened chunk by chunk under a fixed key.
pub fn crypt_object(data: &[u8]) {
    use super::crypt::agefile;
    const KEY: &str = "streams/x.btrs.zst";
    let _ = agefile::header_len(data);
    let pk = agefile::PayloadKey::from_bytes([9; 32]);
    let mut out = Vec::new();
    for last in [false, true] {
        out.clear();
        let _ = agefile::open_chunks(&pk, 0, data, last, &mut out);
    }
    let _ = agefile::plain_len(data.len() as u64);
    let Some(keys) = fuzz_keys() else {
        return;
    };
    let inner: std::sync::Arc<dyn Store> = std::sync::Arc::new(MemStore::with(KEY, data));
    let store = super::crypt::store::CryptStore::new(inner, keys);
    let Ok(f) = StreamFile::open(&store, KEY, data.len() as u64) else {
        return;
    };
    for i in 0..f.trailer.frames.len() {
        let _ = f.read_frame(&store, i);
    }
}

/// The key files and sealed objects an encrypted repository reads: a
/// write-key file, the recipients key object, a sealed catalog.
pub fn crypt_keys(data: &[u8]) {
    let _ = super::crypt::keys::Keys::from_write_key_file(data);
    let Some(keys) = fuzz_keys() else {
        return;
    };
    let _ = super::crypt::keys::Keys::from_recipients_object(data, &keys.identities, &keys.repo);
    let _ = keys
        .write
        .seal_key()
        .open(&keys.repo, "catalog/0000000000000001.json", data);
}

/// An index page someone else may have written, stored under its own name
/// (so it passes the name check and reaches the parser) as an object of
/// its own (first byte 0) or alone in a pack (first byte 2), or a stream
/// applied to an empty index (any other first byte); then read as a
/// snapshot's whole tree: every path walked, described and its data read
/// through a source of zeros.
pub fn index(data: &[u8]) {
    use super::index::model::ROOT_INO;
    use super::index::{
        DataSource, IndexError, IndexRoot, Pages, Snapshot, Snapshots, index_stream,
    };

    struct Zeros;
    impl DataSource for Zeros {
        fn read(&self, _: &str, _: u64, buf: &mut [u8]) -> Result<(), IndexError> {
            buf.fill(0);
            Ok(())
        }
    }
    struct NoSnapshots;
    impl Snapshots for NoSnapshots {
        fn index_of(&self, _: &[u8; 16]) -> Option<IndexRoot> {
            None
        }
    }

    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mem = super::index::tree::MemPages::bounded(4096);
    let pages = Pages::new(&mem, [0; 32]);
    let pages_root = |tree, at| IndexRoot {
        tree: Some(tree),
        at,
        next_ino: ROOT_INO + 1,
        sources: vec!["streams/s.btrs.zst".into()],
    };
    let root = match mode {
        // A page of its own, as indexes made before packs store them.
        0 => {
            let id = pages.id_of(rest);
            mem.put_object(id, rest.to_vec());
            pages_root(id, None)
        }
        // A page alone in a pack: its children in the same pack are
        // ranges of its own bytes.
        2 => {
            use super::index::{PageStore, RootPlace};
            let pack = [9; 32];
            let _ = mem.put_pack(&pack, rest.to_vec(), &[]);
            let at = RootPlace {
                pack,
                offset: 0,
                len: rest.len() as u64,
            };
            pages_root(pages.id_of(rest), Some(at))
        }
        _ => match index_stream(&pages, rest, "streams/s.btrs.zst", &NoSnapshots) {
            Ok((_, root)) => root,
            Err(_) => return,
        },
    };
    let snap = Snapshot::open(&pages, root);
    let opts = crate::manifest::Options::default();
    let mut visited = 0usize;
    let _ = snap.walk(&mut |path, ino, inode| {
        visited += 1;
        // Sizes come from the page: read at most a little of each file.
        let mut buf = [0u8; 512];
        let _ = snap.read(ino, inode, inode.size.saturating_sub(256), &mut buf, &Zeros);
        let _ = snap.data_ranges(ino, inode.size.min(1 << 20));
        let _ = snap.lookup(path);
        if visited > 10_000 {
            return Err(IndexError::Store("enough".into()));
        }
        Ok(())
    });
    // Describing hashes a file's data, which costs its size as in a real
    // manifest: a page may claim any size, so only small ones (a root
    // claiming a 1 GB file took minutes under the sanitizers, all of it
    // hashing zeros; 2026-11-29).
    if let Ok(i) = snap.inode(ROOT_INO)
        && i.size <= 1 << 20
    {
        let _ = snap.describe(b"", ROOT_INO, &i, opts, &Zeros);
    }
}

/// Bytes a far end of `btrsend serve` may send either way: as a client's
/// requests to the server loop (first byte even: into a new directory,
/// append-only when the second byte is odd, a target when its bit 1
/// is set), or as a server's replies to
/// a client that shakes hands and then gets, lists, puts, uploads and
/// locks.
pub fn remote(data: &[u8]) {
    use super::remote::{client::RemoteStore, proto, server};
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let mut frames = rest;
    while let Ok(Some(_)) = proto::read_frame::<proto::Reply>(&mut frames) {}
    if first % 2 == 0 {
        let dir = std::env::temp_dir().join(format!(
            "btrsend-fuzz-remote-{}-{:016x}",
            std::process::id(),
            super::store::random_u64()
        ));
        if std::fs::create_dir(&dir).is_err() {
            return;
        }
        let options = server::ServeOptions {
            append_only: rest.first().is_some_and(|b| b % 2 == 1),
            restrict_to: vec![dir.clone()],
        };
        // The handshake the fuzzer cannot guess (a path in the test's
        // directory), then its bytes as the requests.
        let mut input = Vec::new();
        // The second byte's next bit picks a target connection (the
        // `Target*` requests, receiving into the test's directory).
        let target = rest.first().is_some_and(|b| b & 2 == 2);
        let path = if target {
            dir.join("target")
        } else {
            dir.join("repo")
        };
        if target {
            let _ = std::fs::create_dir_all(&path);
        }
        let hello = proto::Request::Hello {
            protocol: proto::PROTOCOL_VERSION,
            version: String::new(),
            path: path.display().to_string(),
            target,
        };
        if proto::write_frame(&mut input, &hello, &[]).is_ok() {
            input.extend_from_slice(rest);
            let _ = server::serve(&mut input.as_slice(), &mut std::io::sink(), &options);
        }
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let replies = std::io::Cursor::new(rest.to_vec());
    let Ok(store) = RemoteStore::connect(
        "fuzz",
        "/repo",
        Box::new(replies),
        Box::new(std::io::sink()),
    ) else {
        return;
    };
    let _ = store.get("config", None);
    let _ = store.get("streams/x.btrs.zst", Some(3..9));
    let _ = store.list("catalog/");
    let _ = store.put_if_absent("catalog/0000000000000002.json", b"{}");
    let _ = store.hold_lock(true, std::time::Duration::ZERO);
    if let Ok(mut upload) = store.multipart("streams/y.btrs.zst") {
        let _ = upload.write(b"frame");
        let _ = upload.complete();
    }
    let _ = store.delete("tmp/z");
}
