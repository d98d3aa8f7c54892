use std::io::{Read, Write};
use std::process::Command;

use age::secrecy::ExposeSecret;

use super::*;
use crate::backup::crypt::keys::WriteKey;
use crate::backup::file::tests::{id, stream};
use crate::backup::file::{FileWriter, StreamFile, WriterOptions};

const KEY: &str = "streams/one.btrs.zst";

fn keys(id: &age::x25519::Identity) -> Keys {
    Keys {
        repo: String::from("0123456789abcdef0123456789abcdef"),
        write: WriteKey::generate().unwrap(),
        recipients: vec![id.to_public()],
        identities: vec![id.clone()],
    }
}

/// A stream file of `raw` written through `store` as `key`; its stored size.
fn write(store: &dyn Store, key: &str, raw: &[u8]) -> u64 {
    let up = store.multipart(key).unwrap();
    let mut w = FileWriter::new(up, WriterOptions::new().with_frame_bytes(100 << 10));
    for c in raw.chunks(50_000) {
        w.write_all(c).unwrap();
    }
    w.finish(id()).unwrap().1
}

fn read(store: &dyn Store, key: &str, stored: u64) -> Result<Vec<u8>, String> {
    let f = StreamFile::open(store, key, stored).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    f.raw_reader(store)
        .read_to_end(&mut out)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

#[test]
fn stream_files_and_catalogs_round_trip_encrypted() {
    let dir = tempfile::tempdir().unwrap();
    let local: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()));
    let ident = age::x25519::Identity::generate();
    let crypt = CryptStore::new(Arc::clone(&local), keys(&ident));
    let raw = stream(600);
    let stored = write(&crypt, KEY, &raw);
    let listed = crypt.list(STREAMS_DIR).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].size, stored, "the size given is the stored size");
    assert_eq!(read(&crypt, KEY, stored).unwrap(), raw);
    // On disk: an age file; no plaintext, not even the zstd magic.
    let on_disk = std::fs::read(dir.path().join(KEY)).unwrap();
    assert!(on_disk.starts_with(b"age-encryption.org/v1\n"));
    assert!(!on_disk.windows(4).any(|w| w == [0x28, 0xb5, 0x2f, 0xfd]));
    assert!(!on_disk.windows(14).any(|w| w == b"btrsend-stream"));

    // A catalog: sealed on disk, plain through the store, bound to its name.
    let cat = b"{\"format\":\"btrsend-catalog\",\"secret-name\":1}";
    assert!(
        crypt
            .put_if_absent("catalog/0000000000000001.json", cat)
            .unwrap()
    );
    assert_eq!(
        crypt.get("catalog/0000000000000001.json", None).unwrap(),
        cat
    );
    let sealed = std::fs::read(dir.path().join("catalog/0000000000000001.json")).unwrap();
    assert!(!sealed.windows(11).any(|w| w == b"secret-name"));
    std::fs::write(dir.path().join("catalog/0000000000000002.json"), &sealed).unwrap();
    let e = crypt
        .get("catalog/0000000000000002.json", None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not authenticate"), "{e}");

    // What `age -d -i KEY FILE | zstd -d` makes of it: the raw stream.
    if Command::new("age").arg("--version").output().is_ok() {
        let idf = dir.path().join("id.txt");
        std::fs::write(&idf, ident.to_string().expose_secret().as_bytes()).unwrap();
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "age -d -i {} {} | zstd -dc",
                idf.display(),
                dir.path().join(KEY).display()
            ))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout == raw, "age | zstd gives the raw stream");
    } else {
        crate::testing::skip_or_fail(
            "stream_files_and_catalogs_round_trip_encrypted (age part)",
            "needs the age command",
        );
    }
}

/// The plaintext of the object (the stream file, zstd frames and trailer).
fn good_plain(store: &CryptStore, stored: u64) -> Vec<u8> {
    let n = store.plain_len(KEY, stored).unwrap();
    store.get(KEY, Some(0..n)).unwrap()
}

#[test]
fn moved_cut_flipped_and_foreign_objects_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let local: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()));
    let ident = age::x25519::Identity::generate();
    let k = keys(&ident);
    let crypt = CryptStore::new(Arc::clone(&local), k.clone());
    let raw = stream(300);
    let stored = write(&crypt, KEY, &raw);
    let path = dir.path().join(KEY);
    let good = std::fs::read(&path).unwrap();
    let good_plain = good_plain(&crypt, stored);
    let other = dir.path().join("streams/two.btrs.zst");

    // Moved to another name.
    std::fs::write(&other, &good).unwrap();
    let e = read(&crypt, "streams/two.btrs.zst", stored).unwrap_err();
    assert!(e.contains("not bound to this repository and name"), "{e}");

    // The same bytes under the same name in another repository (same
    // recipients, another write key): a fresh store, so nothing is cached.
    let elsewhere = CryptStore::new(
        Arc::clone(&local),
        Keys {
            write: WriteKey::generate().unwrap(),
            ..k.clone()
        },
    );
    let e = read(&elsewhere, KEY, stored).unwrap_err();
    assert!(e.contains("not bound"), "{e}");

    // One flipped byte in the payload, a fresh reader each time.
    let mut bad = good.clone();
    let at = bad.len() - 100;
    bad[at] ^= 1;
    std::fs::write(&path, &bad).unwrap();
    let fresh = CryptStore::new(Arc::clone(&local), k.clone());
    let e = read(&fresh, KEY, stored).unwrap_err();
    assert!(e.contains("does not authenticate"), "{e}");

    // Cut short by a tag's length, or by a byte.
    for cut in [agefile::TAG as u64, 1] {
        std::fs::write(&path, &good[..(stored - cut) as usize]).unwrap();
        let fresh = CryptStore::new(Arc::clone(&local), k.clone());
        assert!(read(&fresh, KEY, stored - cut).is_err(), "cut {cut}");
    }

    // Re-encrypted by someone who knows only the public recipient.
    let mut forged = Vec::new();
    let enc =
        age::Encryptor::with_recipients(std::iter::once(&ident.to_public() as &dyn age::Recipient))
            .unwrap();
    let mut w = enc.wrap_output(&mut forged).unwrap();
    w.write_all(&good_plain).unwrap();
    w.finish().unwrap();
    std::fs::write(&path, &forged).unwrap();
    let fresh = CryptStore::new(Arc::clone(&local), k.clone());
    let e = read(&fresh, KEY, forged.len() as u64).unwrap_err();
    assert!(e.contains("not bound"), "{e}");

    // The write key alone reads no stream content.
    std::fs::write(&path, &good).unwrap();
    let write_only = CryptStore::new(
        Arc::clone(&local),
        Keys {
            identities: Vec::new(),
            ..k
        },
    );
    let e = read(&write_only, KEY, stored).unwrap_err();
    assert!(e.contains("needs an identity"), "{e}");
}
