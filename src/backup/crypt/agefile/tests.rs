use std::io::{Read, Write};
use std::process::{Command, Stdio};

use age::secrecy::ExposeSecret;

use super::*;

const REPO: &str = "0123456789abcdef0123456789abcdef";
const KEY: &str = "streams/x.btrs.zst";

fn name(key: &str) -> ObjectName<'_> {
    ObjectName { repo: REPO, key }
}

fn bind() -> BindKey {
    BindKey::new([7u8; 32])
}

/// Bytes that are not all alike, so a misplaced chunk shows.
fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 + i / 251) as u8).collect()
}

/// An age file of `plain` for `id`'s recipient, written in pieces of
/// `piece` bytes.
fn seal(id: &age::x25519::Identity, plain: &[u8], piece: usize) -> Vec<u8> {
    let (mut out, key) = new_header(&[id.to_public()], &bind(), name(KEY)).unwrap();
    let mut w = PayloadWriter::new(key);
    for p in plain.chunks(piece.max(1)) {
        w.write(p, &mut out);
    }
    w.finish(&mut out);
    out
}

/// What the `age` crate's own reader makes of `file`.
fn age_crate_open(id: &age::x25519::Identity, file: &[u8]) -> Result<Vec<u8>, String> {
    let d = age::Decryptor::new_buffered(file).map_err(|e| e.to_string())?;
    let mut r = d
        .decrypt(std::iter::once(id as &dyn age::Identity))
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    r.read_to_end(&mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// What this module makes of `file`: header, then every chunk.
fn our_open(id: &age::x25519::Identity, file: &[u8], key: &str) -> Result<Vec<u8>, String> {
    let ids = [id.clone()];
    let how = Unwrap::Identities(&ids);
    let pk = open_header(file, &how, &bind(), name(key)).map_err(|e| e.to_string())?;
    let h = header_len(file).unwrap();
    let payload = &file[h..];
    plain_len(payload.len() as u64).ok_or("bad payload length")?;
    let mut out = Vec::new();
    open_chunks(&pk, 0, payload, true, &mut out).map_err(|i| format!("chunk {i}"))?;
    Ok(out)
}

#[test]
fn sizes_round_trip_through_the_age_crate_and_this_module() {
    let id = age::x25519::Identity::generate();
    for n in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 3 * CHUNK + 17] {
        let plain = data(n);
        for piece in [1000, CHUNK, 5 * CHUNK] {
            let file = seal(&id, &plain, piece);
            assert_eq!(age_crate_open(&id, &file).unwrap(), plain, "{n} by {piece}");
            assert_eq!(our_open(&id, &file, KEY).unwrap(), plain, "{n} by {piece}");
            let h = header_len(&file).unwrap();
            assert_eq!(plain_len((file.len() - h) as u64), Some(n as u64), "{n}");
        }
    }
}

#[test]
fn a_payload_continued_from_its_state_is_the_same_age_file() {
    let id = age::x25519::Identity::generate();
    let plain = data(5 * CHUNK + 1234);
    for cut in [0, 10, CHUNK, CHUNK + 1, 3 * CHUNK - 5, 5 * CHUNK + 1234] {
        let (mut out, key) = new_header(&[id.to_public()], &bind(), name(KEY)).unwrap();
        let mut w = PayloadWriter::new(key);
        w.write(&plain[..cut], &mut out);
        let state = w.state();
        assert_eq!(
            out.len() - header_len(&out).unwrap(),
            state.chunks as usize * SEALED_CHUNK
        );
        assert_eq!(
            state.chunks as usize * CHUNK + state.pending.len(),
            cut,
            "nothing lost at {cut}"
        );
        drop(w);
        // A new process: only the state and the bytes written.
        let mut w = PayloadWriter::resume(state);
        w.write(&plain[cut..], &mut out);
        w.finish(&mut out);
        assert_eq!(age_crate_open(&id, &out).unwrap(), plain, "cut at {cut}");
    }
}

#[test]
fn headers_bound_elsewhere_or_for_others_are_refused() {
    let id = age::x25519::Identity::generate();
    let other = age::x25519::Identity::generate();
    let file = seal(&id, b"hello", 100);
    // Another object's name, another repository, another write key.
    assert!(our_open(&id, &file, KEY).is_ok());
    assert_eq!(
        our_open(&id, &file, "streams/y.btrs.zst").unwrap_err(),
        HeaderError::Unbound.to_string()
    );
    let ids = [id.clone()];
    let how = Unwrap::Identities(&ids);
    let other_repo = ObjectName {
        repo: "ffffffffffffffffffffffffffffffff",
        key: KEY,
    };
    assert_eq!(
        open_header(&file, &how, &bind(), other_repo).err(),
        Some(HeaderError::Unbound)
    );
    assert_eq!(
        open_header(&file, &how, &BindKey::new([8u8; 32]), name(KEY)).err(),
        Some(HeaderError::Unbound)
    );
    // Someone else's identity.
    assert_eq!(
        our_open(&other, &file, KEY).unwrap_err(),
        HeaderError::NoIdentity.to_string()
    );
    // A genuine age file for the same recipient, made by someone who knows
    // only the public key: no binding.
    let mut plain_age = Vec::new();
    let enc =
        age::Encryptor::with_recipients(std::iter::once(&id.to_public() as &dyn age::Recipient))
            .unwrap();
    let mut w = enc.wrap_output(&mut plain_age).unwrap();
    w.write_all(b"hello").unwrap();
    w.finish().unwrap();
    assert_eq!(
        our_open(&id, &plain_age, KEY).unwrap_err(),
        HeaderError::Unbound.to_string()
    );
    // A header whose bytes were changed: its MAC fails.
    let mut bad = file.clone();
    let h = header_len(&bad).unwrap();
    bad[h - NONCE_BYTES - 3] ^= 1;
    assert!(our_open(&id, &bad, KEY).is_err());
    assert_eq!(header_len(b"not age"), None);
    assert_eq!(header_len(&file[..20]), None);
}

#[test]
fn flipped_truncated_and_reordered_chunks_are_refused() {
    let id = age::x25519::Identity::generate();
    let plain = data(3 * CHUNK + 100);
    let file = seal(&id, &plain, CHUNK);
    let h = header_len(&file).unwrap();
    let ids = [id.clone()];
    let pk = open_header(&file, &Unwrap::Identities(&ids), &bind(), name(KEY)).unwrap();
    let payload = &file[h..];
    // A flipped byte in chunk 1.
    let mut p = payload.to_vec();
    p[SEALED_CHUNK + 5] ^= 0x40;
    let mut out = Vec::new();
    assert_eq!(open_chunks(&pk, 0, &p, true, &mut out), Err(1));
    // Cut after chunk 2: chunk 2 is not the last chunk.
    let cut = &payload[..3 * SEALED_CHUNK];
    out.clear();
    assert_eq!(open_chunks(&pk, 0, cut, true, &mut out), Err(2));
    // ... but reads as an unfinished payload.
    out.clear();
    open_chunks(&pk, 0, cut, false, &mut out).unwrap();
    assert_eq!(out, plain[..3 * CHUNK]);
    assert_eq!(readable_unfinished(cut.len() as u64 + 7), 3 * CHUNK as u64);
    // Two chunks swapped.
    let mut sw = payload.to_vec();
    let (a, b) = sw.split_at_mut(SEALED_CHUNK);
    a.swap_with_slice(&mut b[..SEALED_CHUNK]);
    out.clear();
    assert_eq!(open_chunks(&pk, 0, &sw, true, &mut out), Err(0));
    // One chunk alone, read at its index.
    out.clear();
    open_chunks(
        &pk,
        1,
        &payload[chunk_offset(1) as usize..chunk_offset(2) as usize],
        false,
        &mut out,
    )
    .unwrap();
    assert_eq!(out, plain[CHUNK..2 * CHUNK]);
    assert_eq!(plain_len(SEALED_CHUNK as u64 + TAG as u64), None);
    assert_eq!(plain_len(5), None);
}

/// The `age` command (installed by `.ci/run`) opens what this module
/// writes, and what it makes for the same recipient is refused here.
#[test]
fn the_age_command_agrees() {
    if Command::new("age").arg("--version").output().is_err() {
        crate::testing::skip_or_fail(
            "the_age_command_agrees",
            "needs the age command (apt-get install age)",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let id = age::x25519::Identity::generate();
    let key_file = dir.path().join("key.txt");
    std::fs::write(&key_file, format!("{}\n", id.to_string().expose_secret())).unwrap();
    let plain = data(2 * CHUNK + 999);
    let file = seal(&id, &plain, 4096);
    let enc = dir.path().join("x.age");
    std::fs::write(&enc, &file).unwrap();
    let out = Command::new("age")
        .arg("-d")
        .arg("-i")
        .arg(&key_file)
        .arg(&enc)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, plain);
    let mut child = Command::new("age")
        .arg("-r")
        .arg(id.to_public().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&plain).unwrap();
    let made = child.wait_with_output().unwrap();
    assert!(made.status.success());
    assert_eq!(
        our_open(&id, &made.stdout, KEY).unwrap_err(),
        HeaderError::Unbound.to_string()
    );
    // Its payload is still age's construction: with its header checked by
    // the age crate, the chunks open here too.
    assert_eq!(age_crate_open(&id, &made.stdout).unwrap(), plain);
}

#[test]
fn chunks_open_in_place_from_any_byte() {
    let id = age::x25519::Identity::generate();
    let plain = data(4 * CHUNK + 300);
    let file = seal(&id, &plain, CHUNK);
    let h = header_len(&file).unwrap();
    let ids = [id.clone()];
    let pk = open_header(&file, &Unwrap::Identities(&ids), &bind(), name(KEY)).unwrap();
    let payload = &file[h..];
    for (first, chunks, skip) in [
        (0, 5, 0),
        (0, 5, 1),
        (1, 2, 7),
        (2, 3, CHUNK - 1),
        (4, 1, 299),
    ] {
        let last = first + chunks == 5;
        let sealed = &payload[chunk_offset(first) as usize
            ..(chunk_offset(first + chunks) as usize).min(payload.len())];
        let mut buf = b"kept".to_vec();
        buf.extend_from_slice(sealed);
        open_in_place(&pk, first, &mut buf, 4, last, skip).unwrap();
        let at = first as usize * CHUNK + skip;
        let end = ((first + chunks) as usize * CHUNK).min(plain.len());
        assert_eq!(&buf[..4], b"kept");
        assert!(buf[4..] == plain[at..end], "{first} {chunks} {skip}");
    }
    // A chunk that does not open leaves nothing of the plaintext.
    let mut buf = payload[..2 * SEALED_CHUNK].to_vec();
    buf[SEALED_CHUNK + 9] ^= 1;
    assert_eq!(open_in_place(&pk, 0, &mut buf, 0, false, 0), Err(1));
    assert!(buf.is_empty());
}
