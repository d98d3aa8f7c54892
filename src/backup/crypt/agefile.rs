//! Stream objects as age files (age-encryption.org/v1), so that
//! `age -d -i KEY FILE | zstd -d | btrfs receive DIR` restores one without
//! btrsend.
//!
//! An age file is a header (recipient stanzas that wrap a random 16-byte
//! file key, and an HMAC of the header under a key derived from it), a
//! 16-byte nonce, then the payload: the plaintext cut into 64 KiB chunks,
//! each sealed with ChaCha20-Poly1305 under the payload key
//! (HKDF-SHA256 of the file key, salted with the nonce), with a nonce of
//! the chunk's index (11 bytes, big-endian) and a last-chunk flag.
//!
//! The `age` crate writes and checks the header: it wraps the file key for
//! each recipient and computes the header's MAC; a recipient of ours (`Binding`) sees the file
//! key as a recipient (age's extension point) and adds one stanza of ours.
//! The payload is sealed and opened here, with `ring`'s ChaCha20-Poly1305
//! and RustCrypto's `hkdf`, because a stream object must be written
//! in pieces that outlive the process: an interrupted upload is continued
//! from the chunk where it stopped ([`PayloadWriter::resume`]), and frames
//! are read at any offset. The `age` crate's own payload writer cannot
//! start at a chunk other than the first. The construction is age's,
//! byte for byte; the tests check it against the `age` crate and the
//! `age` command both ways.
//!
//! # The binding stanza
//!
//! Anyone who knows the public recipients can make an age file for them.
//! What tells a stream object of this repository from one made by someone
//! else, or moved from another key, is the stanza `btrsend-bind`: a keyed
//! BLAKE3 (under a key derived from the repository's write key) of the
//! repository's id, the object's key and the file key. A reader recomputes
//! it after unwrapping the file key and refuses the object when it does not
//! match, before it decrypts a byte. Other age implementations ignore the
//! stanza (it is not one of theirs).

use std::cell::RefCell;
use std::collections::HashSet;

use age::secrecy::ExposeSecret;
use age_core::format::{FileKey, Stanza};
use hkdf::Hkdf;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use sha2::Sha256;
use zeroize::{Zeroize, Zeroizing};

/// Plaintext bytes in a chunk (the last may hold fewer).
pub const CHUNK: usize = 64 << 10;
/// The Poly1305 tag after each chunk.
pub const TAG: usize = 16;
/// A whole chunk as stored.
pub const SEALED_CHUNK: usize = CHUNK + TAG;
/// The nonce between the header and the payload.
pub const NONCE_BYTES: usize = 16;
/// Longest header accepted (a header with a few X25519 stanzas takes
/// about 200 bytes each).
pub const MAX_HEADER: usize = 64 << 10;
/// The tag of the binding stanza.
pub const BIND_TAG: &str = "btrsend-bind";

/// The key that makes and checks binding stanzas (derived from the write
/// key).
#[derive(Clone)]
pub struct BindKey(Zeroizing<[u8; 32]>);

impl BindKey {
    /// The binding key of a repository's write key.
    pub fn new(key: [u8; 32]) -> BindKey {
        BindKey(Zeroizing::new(key))
    }

    /// The stanza body for an object: keyed BLAKE3 of the repository id,
    /// the object's key and the file key.
    fn tag(&self, repo: &str, object: &str, file_key: &[u8; 16]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        for part in [repo.as_bytes(), object.as_bytes()] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
        h.update(file_key);
        *h.finalize().as_bytes()
    }
}

/// What the object a header belongs to is: the repository and the key.
#[derive(Clone, Copy)]
pub struct ObjectName<'a> {
    /// The repository's id.
    pub repo: &'a str,
    /// The object's key (its final key: `streams/…`).
    pub key: &'a str,
}

/// The payload key of one object.
#[derive(Clone)]
pub struct PayloadKey(Zeroizing<[u8; 32]>);

impl PayloadKey {
    /// age's derivation: HKDF-SHA256(salt = nonce, ikm = file key,
    /// info = "payload").
    fn derive(file_key: &[u8; 16], nonce: &[u8; NONCE_BYTES]) -> PayloadKey {
        let mut out = Zeroizing::new([0u8; 32]);
        // A 32-byte output is always within HKDF-SHA256's limit.
        let _ = Hkdf::<Sha256>::new(Some(nonce), file_key).expand(b"payload", &mut *out);
        PayloadKey(out)
    }

    /// The key's bytes, for a sealed state that a continuation reads back.
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A payload key from its bytes.
    pub fn from_bytes(b: [u8; 32]) -> PayloadKey {
        PayloadKey(Zeroizing::new(b))
    }

    /// The cipher; `None` cannot happen (ring refuses only a key of
    /// another length than 32 bytes).
    fn cipher(&self) -> Option<LessSafeKey> {
        UnboundKey::new(&CHACHA20_POLY1305, &self.0[..])
            .ok()
            .map(LessSafeKey::new)
    }
}

/// The chunk nonce: the index in 11 bytes big-endian, then the last flag.
fn chunk_nonce(index: u64, last: bool) -> Nonce {
    let mut n = [0u8; 12];
    n[3..11].copy_from_slice(&index.to_be_bytes());
    n[11] = u8::from(last);
    Nonce::assume_unique_for_key(n)
}

/// A recipient that wraps nothing: it keeps the file key age drew and
/// returns the binding stanza for it.
struct Binding<'a> {
    bind: &'a BindKey,
    name: ObjectName<'a>,
    file_key: RefCell<Option<Zeroizing<[u8; 16]>>>,
}

impl age::Recipient for Binding<'_> {
    fn wrap_file_key(
        &self,
        file_key: &FileKey,
    ) -> Result<(Vec<Stanza>, HashSet<String>), age::EncryptError> {
        let fk: &[u8; 16] = file_key.expose_secret();
        *self.file_key.borrow_mut() = Some(Zeroizing::new(*fk));
        let body = self.bind.tag(self.name.repo, self.name.key, fk).to_vec();
        Ok((
            vec![Stanza {
                tag: String::from(BIND_TAG),
                args: Vec::new(),
                body,
            }],
            HashSet::new(),
        ))
    }
}

/// Make a new object's header (and nonce) for `recipients`, bound to
/// `name`; returns its bytes and the payload key.
///
/// # Errors
///
/// What age refused, as text.
pub fn new_header(
    recipients: &[age::x25519::Recipient],
    bind: &BindKey,
    name: ObjectName<'_>,
) -> Result<(Vec<u8>, PayloadKey), String> {
    let binding = Binding {
        bind,
        name,
        file_key: RefCell::new(None),
    };
    let all = recipients
        .iter()
        .map(|r| r as &dyn age::Recipient)
        .chain(std::iter::once(&binding as &dyn age::Recipient));
    let enc = age::Encryptor::with_recipients(all).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(512);
    // An empty payload: the header and the nonce, then the one empty last
    // chunk (a tag), which is dropped: the payload is sealed here.
    let w = enc.wrap_output(&mut out).map_err(|e| e.to_string())?;
    w.finish().map_err(|e| e.to_string())?;
    out.truncate(out.len().saturating_sub(TAG));
    let fk = binding
        .file_key
        .borrow_mut()
        .take()
        .ok_or_else(|| String::from("age did not wrap a file key"))?;
    let nonce = nonce_of(&out).ok_or_else(|| String::from("no nonce after the header"))?;
    Ok((out, PayloadKey::derive(&fk, &nonce)))
}

/// The nonce: the last [`NONCE_BYTES`] of a header as [`new_header`] or
/// [`header_len`] gives it.
fn nonce_of(prefix: &[u8]) -> Option<[u8; NONCE_BYTES]> {
    prefix
        .len()
        .checked_sub(NONCE_BYTES)
        .and_then(|at| prefix[at..].try_into().ok())
}

/// Where the payload of an age file starts (after the header's MAC line
/// and the nonce), from its first bytes; `None` when they do not hold a
/// whole header.
pub fn header_len(prefix: &[u8]) -> Option<usize> {
    const MAC_LINE: &[u8] = b"\n--- ";
    if !prefix.starts_with(b"age-encryption.org/v1\n") {
        return None;
    }
    let at = prefix.windows(MAC_LINE.len()).position(|w| w == MAC_LINE)?;
    let end = at + 1 + prefix[at + 1..].iter().position(|&b| b == b'\n')? + 1;
    let len = end + NONCE_BYTES;
    (len <= prefix.len() && len <= MAX_HEADER).then_some(len)
}

/// How a header's file key is found.
pub enum Unwrap<'a> {
    /// With the identities (the stanzas for them).
    Identities(&'a [age::x25519::Identity]),
}

/// An identity for age's header check: it unwraps the file key and checks
/// the binding stanza, keeping the file key for the payload.
struct Checked<'a> {
    how: &'a Unwrap<'a>,
    bind: &'a BindKey,
    name: ObjectName<'a>,
    file_key: RefCell<Option<Zeroizing<[u8; 16]>>>,
    unbound: RefCell<bool>,
}

impl age::Identity for Checked<'_> {
    fn unwrap_stanza(&self, _: &Stanza) -> Option<Result<FileKey, age::DecryptError>> {
        None
    }

    fn unwrap_stanzas(&self, stanzas: &[Stanza]) -> Option<Result<FileKey, age::DecryptError>> {
        let Unwrap::Identities(ids) = self.how;
        let fk = match ids
            .iter()
            .find_map(|i| age::Identity::unwrap_stanzas(i, stanzas))?
        {
            Ok(fk) => fk,
            Err(e) => return Some(Err(e)),
        };
        let bytes: [u8; 16] = *fk.expose_secret();
        let want = self.bind.tag(self.name.repo, self.name.key, &bytes);
        let bound = stanzas.iter().any(|s| {
            s.tag == BIND_TAG
                && s.args.is_empty()
                && s.body.len() == 32
                && constant_time_eq(&s.body, &want)
        });
        if !bound {
            *self.unbound.borrow_mut() = true;
            return Some(Err(age::DecryptError::InvalidHeader));
        }
        *self.file_key.borrow_mut() = Some(Zeroizing::new(bytes));
        Some(Ok(fk))
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Not an age header, or cut short.
    #[error("not an age file, or its header is cut short or longer than {MAX_HEADER} bytes")]
    Malformed,
    /// None of the identities opens it.
    #[error("none of the identities given opens it (encrypted to other recipients)")]
    NoIdentity,
    /// Its binding stanza is missing or does not match: the object was
    /// made by someone without the repository's write key, or for another
    /// object or repository.
    #[error(
        "it is not bound to this repository and name (made by someone without the repository's write key, or moved from another object or repository)"
    )]
    Unbound,
    /// The header's MAC or a stanza is wrong.
    #[error("its header does not authenticate: {0}")]
    Invalid(String),
}

/// Check the header at the start of `prefix` ([`header_len`] bytes or
/// more) and return the payload key.
///
/// # Errors
///
/// [`HeaderError`].
pub fn open_header(
    prefix: &[u8],
    how: &Unwrap<'_>,
    bind: &BindKey,
    name: ObjectName<'_>,
) -> Result<PayloadKey, HeaderError> {
    let len = header_len(prefix).ok_or(HeaderError::Malformed)?;
    let checked = Checked {
        how,
        bind,
        name,
        file_key: RefCell::new(None),
        unbound: RefCell::new(false),
    };
    let dec = age::Decryptor::new_buffered(&prefix[..len]).map_err(|e| match e {
        age::DecryptError::InvalidHeader | age::DecryptError::UnknownFormat => {
            HeaderError::Malformed
        }
        e => HeaderError::Invalid(e.to_string()),
    })?;
    if dec.is_scrypt() {
        return Err(HeaderError::NoIdentity);
    }
    match dec.decrypt(std::iter::once(&checked as &dyn age::Identity)) {
        Ok(_) => {}
        Err(_) if *checked.unbound.borrow() => return Err(HeaderError::Unbound),
        Err(age::DecryptError::NoMatchingKeys) => return Err(HeaderError::NoIdentity),
        Err(e) => return Err(HeaderError::Invalid(e.to_string())),
    }
    let fk = checked
        .file_key
        .borrow_mut()
        .take()
        .ok_or(HeaderError::NoIdentity)?;
    let nonce = nonce_of(&prefix[..len]).ok_or(HeaderError::Malformed)?;
    Ok(PayloadKey::derive(&fk, &nonce))
}

/// The plaintext length of a whole age file whose payload (after the
/// header) is `payload` bytes; `None` when no age writer makes a payload
/// of that length.
pub fn plain_len(payload: u64) -> Option<u64> {
    let sealed = SEALED_CHUNK as u64;
    let chunks = payload.div_ceil(sealed).max(1);
    let last = payload.checked_sub((chunks - 1) * sealed)?;
    if last < TAG as u64 || (chunks > 1 && last == TAG as u64) {
        return None;
    }
    Some(payload - chunks * TAG as u64)
}

/// The plaintext readable from an unfinished payload of `payload` bytes:
/// its whole chunks (none of them last).
pub fn readable_unfinished(payload: u64) -> u64 {
    payload / SEALED_CHUNK as u64 * CHUNK as u64
}

/// Where chunk `i` starts in the payload.
pub fn chunk_offset(i: u64) -> u64 {
    i * SEALED_CHUNK as u64
}

/// Open the chunks `sealed` holds, the first of them chunk `first`, into
/// `out` (appended); `last`: the final one is the payload's last chunk.
///
/// # Errors
///
/// The index of the chunk that does not authenticate.
pub fn open_chunks(
    key: &PayloadKey,
    first: u64,
    sealed: &[u8],
    last: bool,
    out: &mut Vec<u8>,
) -> Result<(), u64> {
    let from = out.len();
    out.extend_from_slice(sealed);
    open_in_place(key, first, out, from, last, 0)
}

/// Open, in place, the chunks `buf[from..]` holds, the first of them chunk
/// `first` (`last`: the final one is the payload's last chunk), keeping
/// the plaintext from byte `skip` of the first chunk on: `buf[from..]`
/// becomes that plaintext. Each chunk's plaintext is written where the one
/// before ended (ring decrypts and shifts in one pass), so reading a frame
/// copies nothing but the tail of its first chunk.
///
/// # Errors
///
/// The index of the chunk that does not authenticate (`buf[from..]` is
/// then zeroed and cut off).
pub fn open_in_place(
    key: &PayloadKey,
    first: u64,
    buf: &mut Vec<u8>,
    from: usize,
    last: bool,
    skip: usize,
) -> Result<(), u64> {
    let sealed = buf.len() - from;
    if sealed == 0 {
        return if last { Err(first) } else { Ok(()) };
    }
    let fail = |buf: &mut Vec<u8>, index: u64| {
        buf[from..].zeroize();
        buf.truncate(from);
        Err(index)
    };
    let Some(cipher) = key.cipher() else {
        return fail(buf, first);
    };
    let n = sealed.div_ceil(SEALED_CHUNK);
    let mut w = from;
    for k in 0..n {
        let index = first + k as u64;
        let is_last = last && k + 1 == n;
        let start = from + k * SEALED_CHUNK;
        let end = (start + SEALED_CHUNK).min(buf.len());
        if end - start < TAG || (!is_last && end - start != SEALED_CHUNK) {
            return fail(buf, index);
        }
        let body_end = end - TAG;
        let mut tag = [0u8; TAG];
        tag.copy_from_slice(&buf[body_end..end]);
        let opened = cipher.open_in_place_separate_tag(
            chunk_nonce(index, is_last),
            Aad::empty(),
            tag.into(),
            &mut buf[w..body_end],
            start - w..,
        );
        if opened.is_err() {
            return fail(buf, index);
        }
        let body = body_end - start;
        let drop = if k == 0 { skip.min(body) } else { 0 };
        if drop > 0 {
            buf.copy_within(w + drop..w + body, w);
        }
        w += body - drop;
    }
    buf.truncate(w);
    Ok(())
}

/// Seals the payload chunk by chunk. A whole chunk is held back until more
/// bytes come: only [`PayloadWriter::finish`] knows which chunk is the
/// last.
pub struct PayloadWriter {
    key: PayloadKey,
    next: u64,
    buf: Zeroizing<Vec<u8>>,
}

/// What a continued payload starts from: the chunks sealed so far and the
/// bytes of the chunk being filled.
pub struct PayloadState {
    /// The payload key.
    pub key: PayloadKey,
    /// Chunks sealed and written.
    pub chunks: u64,
    /// The plaintext held for the next chunk (less than a whole chunk, or
    /// a whole one not yet known not to be the last).
    pub pending: Vec<u8>,
}

impl PayloadWriter {
    /// A writer of a new payload.
    pub fn new(key: PayloadKey) -> PayloadWriter {
        PayloadWriter {
            key,
            next: 0,
            buf: Zeroizing::new(Vec::with_capacity(CHUNK)),
        }
    }

    /// A writer that goes on from `state`.
    pub fn resume(state: PayloadState) -> PayloadWriter {
        let mut buf = Zeroizing::new(Vec::with_capacity(CHUNK));
        buf.extend_from_slice(&state.pending);
        PayloadWriter {
            key: state.key,
            next: state.chunks,
            buf,
        }
    }

    /// Where it stands: what a continuation needs.
    pub fn state(&self) -> PayloadState {
        PayloadState {
            key: self.key.clone(),
            chunks: self.next,
            pending: self.buf.to_vec(),
        }
    }

    /// Plaintext bytes taken so far.
    pub fn plain_bytes(&self) -> u64 {
        self.next * CHUNK as u64 + self.buf.len() as u64
    }

    /// Take `data`; append the chunks it completes, sealed, to `out`.
    pub fn write(&mut self, mut data: &[u8], out: &mut Vec<u8>) {
        let Some(cipher) = self.key.cipher() else {
            return;
        };
        while !data.is_empty() {
            if self.buf.len() == CHUNK {
                self.seal(&cipher, false, out);
            }
            let take = (CHUNK - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
    }

    /// Seal what is held as the last chunk into `out`.
    pub fn finish(mut self, out: &mut Vec<u8>) {
        if let Some(cipher) = self.key.cipher() {
            self.seal(&cipher, true, out);
        }
    }

    fn seal(&mut self, cipher: &LessSafeKey, last: bool, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&self.buf);
        // Sealing cannot fail for a chunk of at most 64 KiB.
        if let Ok(tag) = cipher.seal_in_place_separate_tag(
            chunk_nonce(self.next, last),
            Aad::empty(),
            &mut out[start..],
        ) {
            out.extend_from_slice(tag.as_ref());
        }
        self.buf.clear();
        self.next += 1;
    }
}

#[cfg(test)]
mod tests;
