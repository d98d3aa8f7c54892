//! Small objects sealed with the write key: catalogs, the states of
//! unfinished uploads. XChaCha20-Poly1305 (RustCrypto) with a random
//! 24-byte nonce; the associated data is the repository's id and the
//! object's key, so an object moved to another name (an older catalog
//! generation under a newer one's name) or copied from another repository
//! does not open.
//!
//! ```text
//! "btrsend-sealed-1\n" | nonce (24 bytes) | ciphertext | tag (16 bytes)
//! ```

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use zeroize::Zeroizing;

/// The first bytes of a sealed object.
pub const MAGIC: &[u8] = b"btrsend-sealed-1\n";
const NONCE: usize = 24;
const TAG: usize = 16;

/// A key that seals objects (derived from the write key).
#[derive(Clone)]
pub struct SealKey(Zeroizing<[u8; 32]>);

/// Why a sealed object does not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// It is not a sealed object (or is cut short).
    #[error("not an encrypted object of this format (or cut short)")]
    Malformed,
    /// It does not authenticate.
    #[error(
        "it does not authenticate under this repository's write key and name (changed, moved from another name or repository, or made without the key)"
    )]
    Forged,
}

impl SealKey {
    /// A sealing key from its bytes.
    pub fn new(key: [u8; 32]) -> SealKey {
        SealKey(Zeroizing::new(key))
    }

    fn aad(repo: &str, key: &str) -> Vec<u8> {
        let mut aad = Vec::with_capacity(16 + repo.len() + key.len());
        for part in [repo.as_bytes(), key.as_bytes()] {
            aad.extend_from_slice(&(part.len() as u64).to_le_bytes());
            aad.extend_from_slice(part);
        }
        aad
    }

    /// Seal `plain` as the object `key` of repository `repo`.
    ///
    /// # Errors
    ///
    /// The system's random source failed.
    pub fn seal(&self, repo: &str, key: &str, plain: &[u8]) -> Result<Vec<u8>, String> {
        let mut nonce = [0u8; NONCE];
        super::random(&mut nonce)?;
        let cipher = XChaCha20Poly1305::new((&*self.0).into());
        let sealed = cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plain,
                    aad: &Self::aad(repo, key),
                },
            )
            .map_err(|_| String::from("cannot seal"))?;
        let mut out = Vec::with_capacity(MAGIC.len() + NONCE + sealed.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// Open the object `key` of repository `repo`.
    ///
    /// # Errors
    ///
    /// [`SealError`].
    pub fn open(&self, repo: &str, key: &str, sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        let body = sealed.strip_prefix(MAGIC).ok_or(SealError::Malformed)?;
        if body.len() < NONCE + TAG {
            return Err(SealError::Malformed);
        }
        let (nonce, ct) = body.split_at(NONCE);
        let cipher = XChaCha20Poly1305::new((&*self.0).into());
        cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: ct,
                    aad: &Self::aad(repo, key),
                },
            )
            .map_err(|_| SealError::Forged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_only_as_itself() {
        let k = SealKey::new([1; 32]);
        let s = k.seal("repo", "catalog/2", b"{\"x\":1}").unwrap();
        assert_eq!(k.open("repo", "catalog/2", &s).unwrap(), b"{\"x\":1}");
        // Another name, another repository, another key.
        assert_eq!(k.open("repo", "catalog/3", &s), Err(SealError::Forged));
        assert_eq!(k.open("other", "catalog/2", &s), Err(SealError::Forged));
        assert_eq!(
            SealKey::new([2; 32]).open("repo", "catalog/2", &s),
            Err(SealError::Forged)
        );
        // Every flipped byte after the magic, and every cut.
        for i in MAGIC.len()..s.len() {
            let mut b = s.clone();
            b[i] ^= 0x10;
            assert_eq!(
                k.open("repo", "catalog/2", &b),
                Err(SealError::Forged),
                "{i}"
            );
        }
        for n in 0..s.len() {
            assert!(k.open("repo", "catalog/2", &s[..n]).is_err(), "{n}");
        }
        assert_eq!(
            k.open("repo", "catalog/2", b"{}"),
            Err(SealError::Malformed)
        );
        // Two seals of the same bytes differ (random nonces).
        assert_ne!(s, k.seal("repo", "catalog/2", b"{\"x\":1}").unwrap());
    }
}
