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

/// A stream of a snapshot whose WRITEs carry data that does not compress.
fn noisy_stream(cmds: usize) -> Vec<u8> {
    let mut w = stream_format::StreamWriter::new(Vec::new(), 1).unwrap();
    w.write(&stream_format::Command::Subvol {
        path: std::borrow::Cow::Borrowed(b"s"),
        uuid: [1; 16],
        ctransid: 7,
    })
    .unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..cmds {
        let data: Vec<u8> = (0..1500 + i % 700)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        w.write(&stream_format::Command::Write {
            path: std::borrow::Cow::Borrowed(b"f"),
            offset: (i * 4000) as u64,
            data: std::borrow::Cow::Borrowed(&data),
        })
        .unwrap();
    }
    w.write(&stream_format::Command::End).unwrap();
    w.into_inner()
}

/// What `age -d -i ID FILE` gives, when the age command is here.
fn age_decrypt(dir: &Path, ident: &age::x25519::Identity, file: &Path) -> Option<Vec<u8>> {
    if Command::new("age").arg("--version").output().is_err() {
        crate::testing::skip_or_fail("age_decrypt", "needs the age command");
        return None;
    }
    let idf = dir.join("id.txt");
    std::fs::write(&idf, ident.to_string().expose_secret().as_bytes()).unwrap();
    let out = Command::new("age")
        .arg("-d")
        .arg("-i")
        .arg(&idf)
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(out.stdout)
}

/// The unfinished uploads a directory's `tmp/` holds, as files.
fn tmp_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.join("tmp"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn an_interrupted_upload_is_continued_with_the_write_key_alone() {
    let dir = tempfile::tempdir().unwrap();
    let local: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()));
    let ident = age::x25519::Identity::generate();
    let k = keys(&ident);
    let host = CryptStore::new(
        Arc::clone(&local),
        Keys {
            identities: Vec::new(),
            ..k.clone()
        },
    );
    let raw = noisy_stream(500);
    let opts = WriterOptions::new().with_frame_bytes(40 << 10);

    // Killed after about half the stream: the partial file and its record
    // are left; the listing shows the partial file alone, as the
    // plaintext of its whole chunks.
    let mut up = host.multipart(KEY).unwrap();
    up.keep_when_dropped();
    let mut w = FileWriter::new(up, opts);
    w.write_all(&raw[..raw.len() / 2]).unwrap();
    drop(w);
    let files = tmp_files(dir.path());
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(
        files.contains(&String::from("one.btrs.zst.key")),
        "{files:?}"
    );
    let listed = host.list("tmp/").unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let tmp = listed[0].key.clone();
    let size = listed[0].size;
    assert!(size > 4 * agefile::CHUNK as u64, "{size}");
    assert_eq!(size % agefile::CHUNK as u64, 0);
    let path = dir.path().join(&tmp);
    let on_disk = std::fs::read(&path).unwrap();
    assert!(on_disk.starts_with(b"age-encryption.org/v1\n"));
    assert!(!on_disk.windows(4).any(|w| w == [0x28, 0xb5, 0x2f, 0xfd]));
    let record = std::fs::read(dir.path().join("tmp/one.btrs.zst.key")).unwrap();
    assert!(record.starts_with(super::super::seal::MAGIC));

    // A changed chunk ends what is kept before it.
    let mut bad = on_disk.clone();
    let header = agefile::header_len(&on_disk).unwrap();
    bad[header + 2 * agefile::SEALED_CHUNK + 100] ^= 1;
    std::fs::write(&path, &bad).unwrap();
    let scan = crate::backup::partial::scan(&host, &tmp, size).unwrap();
    assert!(scan.kept.stored_bytes <= 2 * agefile::CHUNK as u64);
    assert!(
        scan.cut
            .as_deref()
            .unwrap_or("")
            .contains("does not authenticate"),
        "{:?}",
        scan.cut
    );
    std::fs::write(&path, &on_disk).unwrap();

    // Scanned with the write key alone; bound to its name.
    // (Its last frame runs into the chunk the writer held: cut short.)
    let scan = crate::backup::partial::scan(&host, &tmp, size).unwrap();
    assert!(scan.kept.stored_bytes > 3 * agefile::CHUNK as u64);
    assert_eq!(host.completes_as(&tmp).as_deref(), Some(KEY));
    let e = host
        .continue_upload(&tmp, scan.kept.stored_bytes, "streams/two.btrs.zst")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not streams/two.btrs.zst"), "{e}");

    let up = host
        .continue_upload(&tmp, scan.kept.stored_bytes, KEY)
        .unwrap()
        .unwrap();
    let mut w = FileWriter::continued(up, opts, scan.kept.clone());
    w.write_all(&raw[scan.kept.raw_bytes as usize..]).unwrap();
    let (trailer, stored) = w.finish(id()).unwrap();
    assert_eq!(
        trailer.stream_blake3,
        blake3::hash(&raw).to_hex().to_string()
    );
    assert!(tmp_files(dir.path()).is_empty(), "the record goes with it");
    assert_eq!(
        std::fs::metadata(dir.path().join(KEY)).unwrap().len(),
        stored
    );

    // The owner of the identity reads it back, as does `age -d`.
    let reader = CryptStore::new(Arc::clone(&local), k);
    assert!(read(&reader, KEY, stored).unwrap() == raw);
    if let Some(plain) = age_decrypt(dir.path(), &ident, &dir.path().join(KEY)) {
        assert!(plain == reader.get(KEY, None).unwrap());
    }
}

#[test]
fn a_payload_is_continued_at_any_byte() {
    let dir = tempfile::tempdir().unwrap();
    let local: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()));
    let ident = age::x25519::Identity::generate();
    let crypt = CryptStore::new(Arc::clone(&local), keys(&ident));
    let chunk = agefile::CHUNK;
    let plain: Vec<u8> = (0..5 * chunk + 100).map(|i| (i * 31 % 253) as u8).collect();
    for keep in [0, 77, 2 * chunk, 2 * chunk + 77, 5 * chunk] {
        let mut up = crypt.multipart(KEY).unwrap();
        up.keep_when_dropped();
        up.write(&plain).unwrap();
        drop(up);
        let listed = crypt.list("tmp/").unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        // Five whole chunks are sealed; the writer holds the last bytes.
        assert_eq!(listed[0].size, 5 * chunk as u64);
        let mut up = crypt
            .continue_upload(&listed[0].key, keep as u64, KEY)
            .unwrap()
            .unwrap();
        // Goes on with other bytes than the first upload's, from `keep`.
        let tail: Vec<u8> = plain[keep..].iter().map(|b| b ^ 0xff).collect();
        up.write(&tail).unwrap();
        let stored = up.stored_size(plain.len() as u64);
        up.complete().unwrap();
        let mut want = plain[..keep].to_vec();
        want.extend_from_slice(&tail);
        let fresh = CryptStore::new(Arc::clone(&local), crypt.keys().clone());
        let n = fresh.plain_len(KEY, stored).unwrap();
        assert!(fresh.get(KEY, Some(0..n)).unwrap() == want, "keep {keep}");
        if let Some(p) = age_decrypt(dir.path(), &ident, &dir.path().join(KEY)) {
            assert!(p == want, "age -d, keep {keep}");
        }
        assert!(tmp_files(dir.path()).is_empty());
        local.delete(KEY).unwrap();
    }
}

#[test]
fn records_of_unfinished_uploads_are_checked_and_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let local: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()));
    let ident = age::x25519::Identity::generate();
    let k = keys(&ident);
    let crypt = CryptStore::new(Arc::clone(&local), k.clone());
    let plain = vec![3u8; 3 * agefile::CHUNK];
    let mut up = crypt.multipart(KEY).unwrap();
    up.keep_when_dropped();
    up.write(&plain).unwrap();
    drop(up);
    let tmp = crypt.list("tmp/").unwrap()[0].key.clone();
    let record = dir.path().join("tmp/one.btrs.zst.key");
    let good = std::fs::read(&record).unwrap();

    // A record from another repository (another write key), or moved to
    // another upload's name, opens nothing: the partial file reads as
    // empty and does not continue.
    let other = CryptStore::new(
        Arc::clone(&local),
        Keys {
            write: WriteKey::generate().unwrap(),
            ..k.clone()
        },
    );
    assert_eq!(other.list("tmp/").unwrap()[0].size, 0);
    let e = other
        .continue_upload(&tmp, 0, KEY)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("record does not open"), "{e}");
    let moved = format!("{}.7.00", tmp.replace("one.", "two."));
    std::fs::copy(dir.path().join(&tmp), dir.path().join(&moved)).unwrap();
    std::fs::write(dir.path().join("tmp/two.btrs.zst.key"), &good).unwrap();
    let fresh = CryptStore::new(Arc::clone(&local), k.clone());
    let sizes: Vec<(String, u64)> = fresh
        .list("tmp/")
        .unwrap()
        .into_iter()
        .map(|o| (o.key, o.size))
        .collect();
    assert!(sizes.contains(&(moved.clone(), 0)), "{sizes:?}");
    assert!(
        sizes.contains(&(tmp.clone(), 2 * agefile::CHUNK as u64)),
        "{sizes:?}"
    );
    fresh.discard_unfinished(&moved).unwrap();
    assert_eq!(
        tmp_files(dir.path()),
        vec![
            tmp.trim_start_matches("tmp/").to_owned(),
            String::from("one.btrs.zst.key")
        ]
    );

    // A partial file whose header was replaced is not continued.
    let mut bytes = std::fs::read(dir.path().join(&tmp)).unwrap();
    bytes[30] ^= 1;
    std::fs::write(dir.path().join(&tmp), &bytes).unwrap();
    let fresh = CryptStore::new(Arc::clone(&local), k.clone());
    let e = fresh
        .continue_upload(&tmp, 0, KEY)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not the one its record was made for"), "{e}");

    // Discarding the partial file takes its record; a record alone lists
    // as an empty unfinished upload.
    fresh.discard_unfinished(&tmp).unwrap();
    assert!(tmp_files(dir.path()).is_empty());
    std::fs::write(&record, &good).unwrap();
    let listed = fresh.list("tmp/").unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].size, 0);
    fresh.discard_unfinished(&listed[0].key).unwrap();
    assert!(tmp_files(dir.path()).is_empty());
}
