//! What continuing an unfinished encrypted stream object needs, and where
//! it is kept.
//!
//! A stream object is an age file whose payload key comes from a file key
//! wrapped for the recipients: a host holding only the write key cannot
//! unwrap it, so it cannot read back an upload it was killed in the middle
//! of. The payload key, the header's length and hash, and the key the
//! object completes as are therefore kept beside the upload, sealed under
//! the write key ([`seal`](super::seal)), as an [`Unfinished`] record:
//!
//! * a directory: in the file `tmp/NAME.key` (`NAME` the final object's
//!   name), written before the upload's first byte and removed once the
//!   object is complete;
//! * S3: in the upload's marker (its `state`), with the writer's place
//!   at the end of each part recorded: the chunks sealed so far, the
//!   plaintext of the chunk being filled (up to 64 KiB), and the stream
//!   file's own checkpoint.
//!
//! The record is sealed with the name `tmp/NAME.key` as associated data,
//! and names its final object inside: a record moved to another upload, or
//! made without the write key, does not open. What a write key can read is
//! therefore also the contents of an upload that is not finished, which
//! the host holding it was writing anyway; never a complete object's.

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::agefile::{self, PayloadKey, PayloadState};
use super::seal::SealKey;
use crate::backup::store::TMP_DIR;
use crate::backup::treehash::{hex, unhex};

/// The suffix of a directory upload's record (`tmp/NAME.key`).
pub const RECORD_SUFFIX: &str = ".key";

/// The name of the record of an upload of `key` (`streams/NAME`):
/// `tmp/NAME.key`.
pub fn record_key(key: &str) -> String {
    let base = key.rsplit('/').next().unwrap_or(key);
    format!("{TMP_DIR}/{base}{RECORD_SUFFIX}")
}

/// The final object's name (`NAME.btrs.zst`) that a key in `tmp/` belongs
/// to: a directory's partial file `tmp/NAME.PID.RANDOM`, a record
/// `tmp/NAME.key`, or what a killed write of that record left
/// (`tmp/NAME.key.PID.RANDOM`); and what follows it.
pub fn split_tmp(tmp: &str) -> Option<(&str, &str)> {
    let name = tmp.strip_prefix(TMP_DIR)?.strip_prefix('/')?;
    let at = name.find(".btrs.zst.")? + ".btrs.zst".len();
    Some((&name[..at], &name[at + 1..]))
}

/// What a `tmp/` key of a directory repository is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmpKind {
    /// The partial file of an upload.
    Partial,
    /// The record of an upload.
    Record,
    /// Anything else: a record's write cut short, a file not of ours.
    Other,
}

/// What `tmp` is (see [`TmpKind`]).
pub fn tmp_kind(tmp: &str) -> TmpKind {
    match split_tmp(tmp) {
        Some((_, "key")) => TmpKind::Record,
        Some((_, rest)) if !rest.starts_with("key") => TmpKind::Partial,
        _ => TmpKind::Other,
    }
}

/// The record of an unfinished stream object (see the module docs).
#[derive(Serialize, Deserialize)]
pub struct Unfinished {
    /// The key the object completes as (`streams/NAME`).
    pub key: String,
    /// The header's length, with the nonce: where the payload starts.
    pub header: u64,
    /// The header's BLAKE3, hex: a partial file whose header is not the
    /// one written is not continued.
    pub header_hash: String,
    /// The payload key, hex.
    payload_key: String,
    /// S3: chunks sealed and stored when the state was recorded.
    #[serde(default)]
    pub chunks: u64,
    /// S3: the plaintext of the chunk being filled then, hex.
    #[serde(default)]
    pending: String,
    /// S3: the stream file writer's state there.
    #[serde(default)]
    pub checkpoint: Option<String>,
}

impl std::fmt::Debug for Unfinished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unfinished")
            .field("key", &self.key)
            .field("header", &self.header)
            .field("chunks", &self.chunks)
            .finish_non_exhaustive()
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        self.payload_key.zeroize();
        self.pending.zeroize();
    }
}

impl Unfinished {
    /// The record of a new upload of `key` whose header is `header`.
    pub fn new(key: &str, header: &[u8], payload: &PayloadKey) -> Unfinished {
        Unfinished {
            key: key.to_owned(),
            header: header.len() as u64,
            header_hash: blake3::hash(header).to_hex().to_string(),
            payload_key: hex(payload.bytes()),
            chunks: 0,
            pending: String::new(),
            checkpoint: None,
        }
    }

    /// The same record, at a writer's place `at` with the stream file's
    /// `checkpoint` (S3).
    pub fn at(&self, at: &PayloadState, checkpoint: String) -> Unfinished {
        Unfinished {
            key: self.key.clone(),
            header: self.header,
            header_hash: self.header_hash.clone(),
            payload_key: self.payload_key.clone(),
            chunks: at.chunks,
            pending: hex(&at.pending),
            checkpoint: Some(checkpoint),
        }
    }

    /// The payload key.
    pub fn payload_key(&self) -> Option<PayloadKey> {
        let b = Zeroizing::new(unhex(&self.payload_key)?);
        Some(PayloadKey::from_bytes(b.as_slice().try_into().ok()?))
    }

    /// The writer's place it recorded (S3).
    pub fn state(&self) -> Option<PayloadState> {
        let pending = unhex(&self.pending)?;
        (pending.len() <= agefile::CHUNK).then_some(())?;
        Some(PayloadState {
            key: self.payload_key()?,
            chunks: self.chunks,
            pending,
        })
    }

    /// The stored bytes of the upload at the recorded place: the header
    /// and the chunks sealed.
    pub fn stored_bytes(&self) -> Option<u64> {
        self.chunks
            .checked_mul(agefile::SEALED_CHUNK as u64)?
            .checked_add(self.header)
    }

    /// The plaintext bytes at the recorded place.
    pub fn plain_bytes(&self) -> Option<u64> {
        self.chunks
            .checked_mul(agefile::CHUNK as u64)?
            .checked_add(self.pending.len() as u64 / 2)
    }

    /// Sealed under `seal` for repository `repo` as the record of its key.
    ///
    /// # Errors
    ///
    /// The system's random source failed.
    pub fn seal(&self, seal: &SealKey, repo: &str) -> Result<Vec<u8>, String> {
        let json = Zeroizing::new(serde_json::to_vec(self).map_err(|e| e.to_string())?);
        seal.seal(repo, &record_key(&self.key), &json)
    }

    /// Open the record `sealed` of an upload whose final object is named
    /// `name` (`NAME.btrs.zst`), and check it.
    ///
    /// # Errors
    ///
    /// Why it is refused, as text.
    pub fn open(seal: &SealKey, repo: &str, name: &str, sealed: &[u8]) -> Result<Self, String> {
        let at = format!("{TMP_DIR}/{name}{RECORD_SUFFIX}");
        let json = Zeroizing::new(
            seal.open(repo, &at, sealed)
                .map_err(|e| format!("its record does not open: {e}"))?,
        );
        let u: Unfinished =
            serde_json::from_slice(&json).map_err(|e| format!("its record is unreadable: {e}"))?;
        if record_key(&u.key) != at || u.key.rsplit('/').next() != Some(name) {
            return Err(String::from("its record names another object"));
        }
        let header_ok = (agefile::NONCE_BYTES as u64..=agefile::MAX_HEADER as u64)
            .contains(&u.header)
            && u.header_hash.len() == 64;
        if !header_ok || u.payload_key().is_none() {
            return Err(String::from("its record is inconsistent"));
        }
        if u.checkpoint.is_some() && u.state().is_none() {
            return Err(String::from("its record is inconsistent"));
        }
        Ok(u)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tmp_names() {
        assert_eq!(
            record_key("streams/a-1-2.btrs.zst"),
            "tmp/a-1-2.btrs.zst.key"
        );
        assert_eq!(tmp_kind("tmp/a-1-2.btrs.zst.key"), TmpKind::Record);
        assert_eq!(tmp_kind("tmp/a-1-2.btrs.zst.77.00ff"), TmpKind::Partial);
        assert_eq!(tmp_kind("tmp/a-1-2.btrs.zst.key.77.00ff"), TmpKind::Other);
        assert_eq!(tmp_kind("tmp/lock"), TmpKind::Other);
        assert_eq!(
            split_tmp("tmp/a-1-2.btrs.zst.77.00ff"),
            Some(("a-1-2.btrs.zst", "77.00ff"))
        );
    }

    #[test]
    fn records_open_only_as_themselves() {
        let seal = SealKey::new([7; 32]);
        let pk = PayloadKey::from_bytes([9; 32]);
        let u = Unfinished::new("streams/a.btrs.zst", &[1; 200], &pk);
        let sealed = u.seal(&seal, "repo").unwrap();
        let back = Unfinished::open(&seal, "repo", "a.btrs.zst", &sealed).unwrap();
        assert_eq!(back.payload_key().unwrap().bytes(), pk.bytes());
        assert_eq!(back.header, 200);
        assert!(Unfinished::open(&seal, "repo", "b.btrs.zst", &sealed).is_err());
        assert!(Unfinished::open(&seal, "other", "a.btrs.zst", &sealed).is_err());
        assert!(Unfinished::open(&SealKey::new([8; 32]), "repo", "a.btrs.zst", &sealed).is_err());
        let state = PayloadState {
            key: pk,
            chunks: 3,
            pending: vec![5; 1000],
        };
        let at = u.at(&state, String::from("{}"));
        let back = Unfinished::open(
            &seal,
            "repo",
            "a.btrs.zst",
            &at.seal(&seal, "repo").unwrap(),
        )
        .unwrap();
        assert_eq!(back.plain_bytes(), Some(3 * agefile::CHUNK as u64 + 1000));
        assert_eq!(
            back.stored_bytes(),
            Some(200 + 3 * agefile::SEALED_CHUNK as u64)
        );
        assert_eq!(back.state().unwrap().pending, vec![5; 1000]);
    }
}
