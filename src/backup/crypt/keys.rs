//! The keys of an encrypted repository, and the files that hold them.
//!
//! * The **write key**: 32 random bytes drawn at `init`. Every symmetric key
//!   is derived from it with BLAKE3's key derivation: the key that seals
//!   catalogs and upload states, the key of the objects' binding stanzas,
//!   the key of the config's MAC. It writes backups and reads the catalog;
//!   it never decrypts a stream object.
//! * The **recipients**: age X25519 public keys. Stream objects are
//!   encrypted to them; an identity (private key) of one of them reads.
//!   In passphrase mode the repository has an identity of its own, kept in
//!   the passphrase key objects.
//!
//! Where they are kept:
//!
//! * `keys/pass-RANDOM.age` (passphrase mode): an age file encrypted with
//!   a passphrase (age's scrypt recipient: the work factor is in its
//!   header), holding the write key, the recipients and the repository's
//!   identity. One per passphrase; adding, changing or removing a
//!   passphrase writes or deletes one of them and re-encrypts nothing else.
//! * `keys/recipients.age` (recipients mode): the write key and the
//!   recipients, encrypted to the recipients, so an identity holder can
//!   read the catalog.
//! * The write-key file (recipients mode), on the host that backs up and
//!   never in the repository: the write key, the recipients and the
//!   repository's id and location.
//!
//! All three hold one JSON object (`KeyRecord`: format, version,
//! repository, write_key, recipients, identity, location, created).

use std::str::FromStr;

use age::secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

pub use age::x25519::{Identity, Recipient};

use super::agefile::BindKey;
use super::seal::SealKey;

/// The repository's write key (see the module docs).
#[derive(Clone)]
pub struct WriteKey(Zeroizing<[u8; 32]>);

impl std::fmt::Debug for WriteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WriteKey({})", self.fingerprint())
    }
}

impl WriteKey {
    /// A new random key.
    ///
    /// # Errors
    ///
    /// The system's random source failed.
    pub fn generate() -> Result<WriteKey, String> {
        let mut k = Zeroizing::new([0u8; 32]);
        super::random(&mut *k)?;
        Ok(WriteKey(k))
    }

    /// A key from its bytes (for the fuzz targets).
    #[doc(hidden)]
    pub fn from_bytes(b: [u8; 32]) -> WriteKey {
        WriteKey(Zeroizing::new(b))
    }

    fn derive(&self, purpose: &str) -> [u8; 32] {
        blake3::derive_key(purpose, &*self.0)
    }

    /// The key that seals catalogs and upload states.
    pub fn seal_key(&self) -> SealKey {
        SealKey::new(self.derive("btrsend 2026-11-28 repository object seal"))
    }

    /// The key that names index pages (so equal pages of two
    /// repositories, or a guessed page, show nothing).
    pub fn derive_index_key(&self) -> [u8; 32] {
        self.derive("btrsend 2026-11-28 index page names")
    }

    /// The key of the stream objects' binding stanzas.
    pub fn bind_key(&self) -> BindKey {
        BindKey::new(self.derive("btrsend 2026-11-28 stream object binding"))
    }

    /// The MAC of the config's fields (hex).
    pub fn config_mac(&self, fields: &[&str]) -> String {
        let key = self.derive("btrsend 2026-11-28 config mac");
        let mut h = blake3::Hasher::new_keyed(&key);
        for f in fields {
            h.update(&(f.len() as u64).to_le_bytes());
            h.update(f.as_bytes());
        }
        h.finalize().to_hex().to_string()
    }

    /// A short public name of the key (safe to print: it reveals nothing
    /// of the key).
    pub fn fingerprint(&self) -> String {
        let d = self.derive("btrsend 2026-11-28 write key fingerprint");
        d[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    fn to_hex(&self) -> Zeroizing<String> {
        let mut s = Zeroizing::new(String::with_capacity(64));
        for b in self.0.iter() {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    fn from_hex(s: &str) -> Option<WriteKey> {
        if s.len() != 64 {
            return None;
        }
        let mut k = Zeroizing::new([0u8; 32]);
        for (i, b) in k.iter_mut().enumerate() {
            *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(WriteKey(k))
    }

    /// Whether two keys are the same key.
    pub fn same(&self, other: &WriteKey) -> bool {
        self.0
            .iter()
            .zip(other.0.iter())
            .fold(0u8, |a, (x, y)| a | (x ^ y))
            == 0
    }
}

/// What a host holds to use an encrypted repository.
#[derive(Clone)]
pub struct Keys {
    /// The repository's id.
    pub repo: String,
    /// The write key.
    pub write: WriteKey,
    /// The recipients stream objects are encrypted to.
    pub recipients: Vec<age::x25519::Recipient>,
    /// Identities that read stream objects (none: write-only).
    pub identities: Vec<age::x25519::Identity>,
}

/// The JSON inside a key object or a write-key file.
#[derive(Serialize, Deserialize)]
struct KeyRecord {
    format: String,
    version: u32,
    repository: String,
    write_key: Zeroizing<String>,
    recipients: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    identity: Option<Zeroizing<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    location: Option<String>,
    created: String,
}

const KEY_FORMAT: &str = "btrsend-key";
const WRITE_KEY_FORMAT: &str = "btrsend-write-key";

/// Why keys could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The passphrase or identity does not open it.
    #[error("{0}")]
    NotYours(String),
    /// It opens but is not a key of this format or repository.
    #[error("{0}")]
    Invalid(String),
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the identities' secrets.
        f.debug_struct("Keys")
            .field("repo", &self.repo)
            .field("write", &self.write)
            .field("recipients", &self.recipients.len())
            .field("identities", &self.identities.len())
            .finish()
    }
}

impl Keys {
    fn record(&self, format: &str, identity: bool, location: Option<&str>) -> KeyRecord {
        KeyRecord {
            format: format.to_owned(),
            version: 1,
            repository: self.repo.clone(),
            write_key: self.write.to_hex(),
            recipients: self.recipients.iter().map(ToString::to_string).collect(),
            identity: identity
                .then(|| self.identities.first())
                .flatten()
                .map(|i| Zeroizing::new(i.to_string().expose_secret().to_owned())),
            location: location.map(str::to_owned),
            created: jiff::Timestamp::now().to_string(),
        }
    }

    fn from_record(r: KeyRecord, format: &str, repo: Option<&str>) -> Result<Keys, KeyError> {
        if r.format != format || r.version != 1 {
            return Err(KeyError::Invalid(format!(
                "format {} version {} (this btrsend reads {format} version 1)",
                r.format, r.version
            )));
        }
        if let Some(repo) = repo
            && r.repository != repo
        {
            return Err(KeyError::Invalid(format!(
                "it is a key of repository {}, not of this one ({repo})",
                r.repository
            )));
        }
        let write = WriteKey::from_hex(&r.write_key)
            .ok_or_else(|| KeyError::Invalid(String::from("its write key is not 64 hex digits")))?;
        let recipients = parse_recipients(&r.recipients.join("\n"))
            .map_err(|e| KeyError::Invalid(format!("its recipients: {e}")))?;
        let identities = match &r.identity {
            Some(s) => vec![
                age::x25519::Identity::from_str(s)
                    .map_err(|_| KeyError::Invalid(String::from("its identity does not parse")))?,
            ],
            None => Vec::new(),
        };
        Ok(Keys {
            repo: r.repository,
            write,
            recipients,
            identities,
        })
    }

    /// A passphrase key object (`keys/pass-….age`): these keys, the
    /// repository's identity included, encrypted with `passphrase`;
    /// `log_n`: scrypt's work factor (`None`: age's, about a second here).
    ///
    /// # Errors
    ///
    /// What age refused, as text.
    pub fn passphrase_object(
        &self,
        passphrase: &SecretString,
        log_n: Option<u8>,
    ) -> Result<Vec<u8>, String> {
        let json = Zeroizing::new(
            serde_json::to_vec(&self.record(KEY_FORMAT, true, None)).map_err(|e| e.to_string())?,
        );
        let mut r = age::scrypt::Recipient::new(passphrase.clone());
        if let Some(n) = log_n {
            r.set_work_factor(n);
        }
        age::encrypt(&r, &json).map_err(|e| e.to_string())
    }

    /// The keys in a passphrase key object of repository `repo`.
    ///
    /// # Errors
    ///
    /// [`KeyError::NotYours`] when the passphrase does not open it.
    pub fn from_passphrase_object(
        bytes: &[u8],
        passphrase: &SecretString,
        repo: &str,
    ) -> Result<Keys, KeyError> {
        let id = age::scrypt::Identity::new(passphrase.clone());
        let json = Zeroizing::new(age::decrypt(&id, bytes).map_err(|e| match e {
            age::DecryptError::ExcessiveWork { required, .. } => KeyError::Invalid(format!(
                "it asks for an scrypt work factor of {required}, more than this host allows"
            )),
            age::DecryptError::DecryptionFailed
            | age::DecryptError::NoMatchingKeys
            | age::DecryptError::KeyDecryptionFailed => {
                KeyError::NotYours(String::from("the passphrase does not open it"))
            }
            e => KeyError::Invalid(format!("not a passphrase key object: {e}")),
        })?);
        let r: KeyRecord = serde_json::from_slice(&json)
            .map_err(|e| KeyError::Invalid(format!("unreadable JSON: {e}")))?;
        Self::from_record(r, KEY_FORMAT, Some(repo))
    }

    /// The recipients key object (`keys/recipients.age`): the write key and
    /// the recipients (not an identity), encrypted to the recipients.
    ///
    /// # Errors
    ///
    /// What age refused, as text.
    pub fn recipients_object(&self) -> Result<Vec<u8>, String> {
        let json = Zeroizing::new(
            serde_json::to_vec(&self.record(KEY_FORMAT, false, None)).map_err(|e| e.to_string())?,
        );
        let enc = age::Encryptor::with_recipients(
            self.recipients.iter().map(|r| r as &dyn age::Recipient),
        )
        .map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        let mut w = enc.wrap_output(&mut out).map_err(|e| e.to_string())?;
        std::io::Write::write_all(&mut w, &json).map_err(|e| e.to_string())?;
        w.finish().map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// The keys in the recipients key object of repository `repo`, opened
    /// with `identities` (which become the keys' identities).
    ///
    /// # Errors
    ///
    /// [`KeyError::NotYours`] when no identity opens it.
    pub fn from_recipients_object(
        bytes: &[u8],
        identities: &[age::x25519::Identity],
        repo: &str,
    ) -> Result<Keys, KeyError> {
        let dec = age::Decryptor::new_buffered(bytes)
            .map_err(|e| KeyError::Invalid(format!("not an age file: {e}")))?;
        let mut r = dec
            .decrypt(identities.iter().map(|i| i as &dyn age::Identity))
            .map_err(|e| match e {
                age::DecryptError::NoMatchingKeys => KeyError::NotYours(String::from(
                    "none of the identities given is one of the repository's recipients",
                )),
                e => KeyError::Invalid(e.to_string()),
            })?;
        let mut json = Zeroizing::new(Vec::new());
        std::io::Read::read_to_end(&mut r, &mut json)
            .map_err(|e| KeyError::Invalid(e.to_string()))?;
        let rec: KeyRecord = serde_json::from_slice(&json)
            .map_err(|e| KeyError::Invalid(format!("unreadable JSON: {e}")))?;
        let mut keys = Self::from_record(rec, KEY_FORMAT, Some(repo))?;
        keys.identities = identities.to_vec();
        Ok(keys)
    }

    /// The write-key file's bytes: these keys (no identity) and the
    /// repository's location as the user named it.
    ///
    /// # Errors
    ///
    /// JSON encoding failed.
    pub fn write_key_file(&self, location: &str) -> Result<Zeroizing<Vec<u8>>, String> {
        let mut v =
            serde_json::to_vec_pretty(&self.record(WRITE_KEY_FORMAT, false, Some(location)))
                .map_err(|e| e.to_string())?;
        v.push(b'\n');
        Ok(Zeroizing::new(v))
    }

    /// The keys in a write-key file, and the location it names.
    ///
    /// # Errors
    ///
    /// [`KeyError::Invalid`].
    pub fn from_write_key_file(bytes: &[u8]) -> Result<(Keys, String), KeyError> {
        let r: KeyRecord = serde_json::from_slice(bytes)
            .map_err(|e| KeyError::Invalid(format!("not a write-key file: {e}")))?;
        let location = r.location.clone().unwrap_or_default();
        Ok((Self::from_record(r, WRITE_KEY_FORMAT, None)?, location))
    }
}

/// Recipients, one per line (`age1…`; `#` comments and blank lines are
/// skipped), as `age-keygen -y` prints them.
///
/// # Errors
///
/// The line that is not an X25519 recipient.
pub fn parse_recipients(text: &str) -> Result<Vec<age::x25519::Recipient>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(age::x25519::Recipient::from_str(line).map_err(|_| {
            format!(
                "line {}: not an age X25519 recipient (age1…): {:?}",
                i + 1,
                line.chars().take(80).collect::<String>()
            )
        })?);
    }
    Ok(out)
}

/// Identities, as an age identity file holds them (`AGE-SECRET-KEY-1…`
/// lines; `#` comments and blank lines skipped).
///
/// # Errors
///
/// The number of the line that is not an X25519 identity (its text is
/// never shown: it may be a secret).
pub fn parse_identities(text: &str) -> Result<Vec<age::x25519::Identity>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(age::x25519::Identity::from_str(line).map_err(|_| {
            format!(
                "line {}: not an age X25519 identity (AGE-SECRET-KEY-1…)",
                i + 1
            )
        })?);
    }
    if out.is_empty() {
        return Err(String::from("it holds no identity"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        let id = age::x25519::Identity::generate();
        Keys {
            repo: String::from("r1"),
            write: WriteKey::generate().unwrap(),
            recipients: vec![id.to_public()],
            identities: vec![id],
        }
    }

    #[test]
    fn key_objects_and_files_round_trip() {
        let k = keys();
        let pass = SecretString::from(String::from("correct horse"));
        let obj = k.passphrase_object(&pass, Some(10)).unwrap();
        let back = Keys::from_passphrase_object(&obj, &pass, "r1").unwrap();
        assert!(back.write.same(&k.write));
        assert_eq!(back.identities.len(), 1);
        assert_eq!(back.recipients[0].to_string(), k.recipients[0].to_string());
        let wrong = SecretString::from(String::from("wrong"));
        assert!(matches!(
            Keys::from_passphrase_object(&obj, &wrong, "r1"),
            Err(KeyError::NotYours(_))
        ));
        assert!(matches!(
            Keys::from_passphrase_object(&obj, &pass, "r2"),
            Err(KeyError::Invalid(_))
        ));
        // No secret in the object's bytes.
        let hex = k.write.to_hex();
        assert!(!String::from_utf8_lossy(&obj).contains(hex.as_str()));

        let obj = k.recipients_object().unwrap();
        let back = Keys::from_recipients_object(&obj, &k.identities, "r1").unwrap();
        assert!(back.write.same(&k.write));
        let other = age::x25519::Identity::generate();
        assert!(matches!(
            Keys::from_recipients_object(&obj, &[other], "r1"),
            Err(KeyError::NotYours(_))
        ));

        let file = k.write_key_file("/backup/home").unwrap();
        let text = String::from_utf8(file.to_vec()).unwrap();
        assert!(!text.contains("AGE-SECRET-KEY"), "no identity in it");
        let (back, loc) = Keys::from_write_key_file(&file).unwrap();
        assert_eq!(loc, "/backup/home");
        assert!(back.write.same(&k.write));
        assert!(back.identities.is_empty());
        assert_eq!(k.write.fingerprint().len(), 16);
    }

    #[test]
    fn recipient_and_identity_lines() {
        let id = age::x25519::Identity::generate();
        let text = format!("# made by age-keygen\n\n{}\n", id.to_public());
        assert_eq!(parse_recipients(&text).unwrap().len(), 1);
        assert!(parse_recipients("age1nope").unwrap_err().contains("line 1"));
        let secret = id.to_string().expose_secret().to_owned();
        assert_eq!(
            parse_identities(&format!("# c\n{secret}\n")).unwrap().len(),
            1
        );
        let Err(e) = parse_identities("AGE-SECRET-KEY-1SECRETBUTBROKEN") else {
            panic!("a broken identity parsed")
        };
        assert!(!e.contains("SECRETBUTBROKEN"), "{e}");
        assert!(parse_identities("# nothing\n").is_err());
    }
}
