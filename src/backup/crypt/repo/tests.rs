//! An encrypted repository end to end, on kernel-made streams: imported,
//! listed, verified and restored byte for byte; nothing of them readable
//! in the repository's files; wrong and missing secrets refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::backup::store::LocalStore;
use crate::backup::{ImportOptions, NoProgress, Repository, RestoreTarget};

fn streams() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/send-streams")
}

fn pass(s: &str) -> SecretString {
    SecretString::from(s.to_owned())
}

fn passphrase(s: &str) -> Encryption {
    Encryption::Passphrase {
        passphrase: pass(s),
        log_n: Some(10),
    }
}

fn store(dir: &Path) -> Arc<dyn Store> {
    Arc::new(LocalStore::new(dir))
}

/// Every byte of every file under `dir`.
fn all_bytes(dir: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(all_bytes(&p));
        } else {
            out.extend(std::fs::read(&p).unwrap());
        }
    }
    out
}

/// Import the kernel's full and incremental stream, then restore the
/// incremental one's chain as raw streams: the kernel's bytes.
fn round_trip(repo: &Repository) {
    let full = streams().join("b_full.v1.stream");
    let inc = streams().join("b_inc.v1.stream");
    let opts = ImportOptions {
        wait_lock: Duration::ZERO,
        ..ImportOptions::default()
    };
    let r = repo
        .import(&[inc.clone(), full.clone()], &opts, &NoProgress)
        .unwrap();
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    let list = repo.list().unwrap();
    assert_eq!(list.len(), 2);
    let v = repo.verify(true, Duration::ZERO, &NoProgress).unwrap();
    assert!(v.problems.is_empty(), "{:?}", v.problems);
    let mut out = Vec::new();
    let last = list.iter().find(|e| e.parent_uuid.is_some()).unwrap();
    repo.restore(
        &last.id.to_string(),
        RestoreTarget::Writer(&mut out),
        Duration::ZERO,
        &NoProgress,
    )
    .unwrap();
    let mut want = std::fs::read(&full).unwrap();
    want.extend(std::fs::read(&inc).unwrap());
    assert!(out == want, "restored streams are the kernel's");
}

#[test]
fn passphrase_repository_round_trips_and_hides_everything() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, keys) =
        Repository::init_encrypted(store(dir.path()), &passphrase("s3cret")).unwrap();
    assert!(keys.is_some());
    round_trip(&repo);
    // Reopened with the passphrase.
    let secrets = Secrets {
        passphrase: Some(pass("s3cret")),
        ..Secrets::default()
    };
    let again = Repository::open_with(store(dir.path()), &secrets).unwrap();
    assert_eq!(again.list().unwrap().len(), 2);
    // Names the kernel's streams hold, and their paths, appear nowhere.
    let raw = all_bytes(dir.path());
    let dump = std::fs::read_to_string(streams().join("b_full.v1.dump")).unwrap();
    assert!(dump.contains("o257-7-0"), "the canary is in the stream");
    for canary in [
        &b"o257-7-0"[..],
        b"c673fea8",
        b"btrsend-catalog",
        b"btrsend-stream",
        b"s3cret",
    ] {
        assert!(
            !raw.windows(canary.len()).any(|w| w == canary),
            "{} in the repository",
            String::from_utf8_lossy(canary)
        );
    }
    // Wrong and missing passphrases.
    let wrong = Secrets {
        passphrase: Some(pass("guess")),
        ..Secrets::default()
    };
    let e = Repository::open_with(store(dir.path()), &wrong).unwrap_err();
    assert!(
        e.is_key() && e.to_string().contains("wrong passphrase"),
        "{e}"
    );
    let e = Repository::open_with(store(dir.path()), &Secrets::default()).unwrap_err();
    assert!(
        e.is_key() && e.to_string().contains("--password-file"),
        "{e}"
    );
    // The config changed (its mode, its id): refused.
    let cfg = dir.path().join("config");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, text.replace("passphrase", "recipients")).unwrap();
    let e = Repository::open_with(store(dir.path()), &secrets).unwrap_err();
    assert!(e.is_key(), "{e}");
    std::fs::write(&cfg, text.replace("\"version\": 2", "\"version\": 1")).unwrap();
    let e = Repository::open_with(store(dir.path()), &secrets).unwrap_err();
    assert!(e.to_string().contains("not encrypted"), "{e}");
}

#[test]
fn recipients_repository_writes_with_the_write_key_reads_with_an_identity() {
    let dir = tempfile::tempdir().unwrap();
    let id = age::x25519::Identity::generate();
    let (_, keys) = Repository::init_encrypted(
        store(dir.path()),
        &Encryption::Recipients(vec![id.to_public()]),
    )
    .unwrap();
    let keys = keys.unwrap();
    assert!(keys.identities.is_empty(), "init holds no identity");
    let file = keys
        .write_key_file(&dir.path().display().to_string())
        .unwrap();
    let (write_key, _) = Keys::from_write_key_file(&file).unwrap();
    let writer = Secrets {
        write_key: Some(write_key.clone()),
        ..Secrets::default()
    };
    let repo = Repository::open_with(store(dir.path()), &writer).unwrap();
    let full = streams().join("b_full.v1.stream");
    let opts = ImportOptions {
        wait_lock: Duration::ZERO,
        ..ImportOptions::default()
    };
    let r = repo
        .import(std::slice::from_ref(&full), &opts, &NoProgress)
        .unwrap();
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    // The write key reads the catalog, never a stream's contents.
    assert_eq!(repo.list().unwrap().len(), 1);
    let mut out = Vec::new();
    let e = repo
        .restore(
            "latest",
            RestoreTarget::Writer(&mut out),
            Duration::ZERO,
            &NoProgress,
        )
        .unwrap_err();
    assert!(
        e.is_key() && e.to_string().contains("write key alone cannot"),
        "{e}"
    );
    assert!(out.is_empty());
    // The identity reads.
    let reader = Secrets {
        identities: vec![id],
        ..Secrets::default()
    };
    let repo = Repository::open_with(store(dir.path()), &reader).unwrap();
    repo.restore(
        "latest",
        RestoreTarget::Writer(&mut out),
        Duration::ZERO,
        &NoProgress,
    )
    .unwrap();
    assert!(out == std::fs::read(&full).unwrap());
    // Another identity, and another repository's write key.
    let other = Secrets {
        identities: vec![age::x25519::Identity::generate()],
        ..Secrets::default()
    };
    let e = Repository::open_with(store(dir.path()), &other).unwrap_err();
    assert!(e.is_key(), "{e}");
    let dir2 = tempfile::tempdir().unwrap();
    let e = Repository::open_with(store(dir2.path()), &Secrets::default());
    assert!(e.is_err());
    let (_, keys2) = Repository::init_encrypted(
        store(dir2.path()),
        &Encryption::Recipients(vec![age::x25519::Identity::generate().to_public()]),
    )
    .unwrap();
    let foreign = Secrets {
        write_key: keys2,
        ..Secrets::default()
    };
    let e = Repository::open_with(store(dir.path()), &foreign).unwrap_err();
    assert!(e.to_string().contains("not of this one"), "{e}");
    // A plain repository refuses keys.
    let dir3 = tempfile::tempdir().unwrap();
    Repository::init_in(store(dir3.path())).unwrap();
    let e = Repository::open_with(store(dir3.path()), &writer).unwrap_err();
    assert!(e.is_key() && e.to_string().contains("not encrypted"), "{e}");
}
