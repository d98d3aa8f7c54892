//! Making and opening an encrypted repository (format 2): the config's
//! encryption fields and MAC, the key objects, and the secrets a host
//! brings ([`Secrets`]) turned into the [`Keys`] of a [`CryptStore`](super::store::CryptStore).

use std::path::{Path, PathBuf};

use age::secrecy::SecretString;

use super::keys::{KeyError, Keys, WriteKey};
use crate::backup::BackupError;
use crate::backup::repository::Config;
use crate::backup::store::{Store, random_u64};

/// Where the key objects live.
pub const KEYS_DIR: &str = "keys/";
/// The recipients key object.
pub const RECIPIENTS_KEY: &str = "keys/recipients.age";
/// The repository format of encrypted repositories.
pub const VERSION: u32 = 2;

/// How `init` encrypts a repository.
pub enum Encryption {
    /// Not at all (a format 1 repository, as before encryption).
    None,
    /// With a passphrase; `log_n`: scrypt's work factor (`None`: age's
    /// default, about a second of work).
    Passphrase {
        /// The passphrase.
        passphrase: SecretString,
        /// scrypt's work factor.
        log_n: Option<u8>,
    },
    /// For age recipients; the host that runs `init` gets the write key.
    Recipients(Vec<age::x25519::Recipient>),
}

impl Encryption {
    /// The mode's name, as `--encryption` and the config spell it.
    pub fn mode(&self) -> &'static str {
        match self {
            Encryption::None => "none",
            Encryption::Passphrase { .. } => "passphrase",
            Encryption::Recipients(_) => "recipients",
        }
    }
}

/// The secrets a host brings to open a repository.
#[derive(Default)]
pub struct Secrets<'a> {
    /// A passphrase (passphrase mode).
    pub passphrase: Option<SecretString>,
    /// Asked for the passphrase when the repository needs one and none was
    /// given (a prompt on a terminal).
    pub ask_passphrase: Option<&'a dyn Fn() -> Result<SecretString, String>>,
    /// Identities (recipients mode: reading).
    pub identities: Vec<age::x25519::Identity>,
    /// The keys of a write-key file (recipients mode: writing).
    pub write_key: Option<Keys>,
    /// Where `init` keeps write-key files, each named by its repository's
    /// id ([`write_key_path`]): looked up when no write key is given.
    pub write_key_dir: Option<PathBuf>,
}

impl Secrets<'_> {
    /// Whether any secret was given.
    pub fn any(&self) -> bool {
        self.passphrase.is_some() || !self.identities.is_empty() || self.write_key.is_some()
    }
}

/// Where `init` puts the write-key file of repository `id` in `dir`.
pub fn write_key_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.json"))
}

/// The repository's location as write-key files record it: a local
/// directory's absolute path, else the name the user gave.
pub fn location_of(store: &dyn Store) -> String {
    match store.local_root() {
        Some(root) => std::fs::canonicalize(root)
            .unwrap_or_else(|_| root.to_owned())
            .display()
            .to_string(),
        None => store.name().to_owned(),
    }
}

/// The write-key files in `dir` (those that do not parse are skipped:
/// the directory is the user's own).
fn write_keys_in(dir: &Path) -> Vec<(Keys, String)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|b| Keys::from_write_key_file(&b).ok())
        .collect()
}

fn key_error(store: &dyn Store, what: String) -> BackupError {
    BackupError::Key {
        repo: store.name().to_owned(),
        what,
    }
}

/// The config's fields its MAC covers.
fn mac_fields(c: &Config) -> [&str; 4] {
    [
        c.format.as_str(),
        c.id.as_str(),
        c.created.as_str(),
        c.encryption.as_deref().unwrap_or(""),
    ]
}

/// A new random key object name.
pub(crate) fn pass_key_name() -> String {
    format!("{KEYS_DIR}pass-{:016x}.age", random_u64())
}

/// Make the config, key objects and keys of a new encrypted repository in
/// `store` (the config is stored by the caller, first). `config` is filled
/// in (mode and MAC).
///
/// # Errors
///
/// Store errors; a random source or age that fails.
pub(crate) fn init(
    store: &dyn Store,
    config: &mut Config,
    enc: &Encryption,
) -> Result<Keys, BackupError> {
    let invalid = |e: String| BackupError::Invalid(format!("{}: {e}", store.name()));
    let write = WriteKey::generate().map_err(invalid)?;
    let keys = match enc {
        Encryption::None => return Err(invalid(String::from("not an encrypted repository"))),
        Encryption::Passphrase { .. } => {
            let id = age::x25519::Identity::generate();
            Keys {
                repo: config.id.clone(),
                write,
                recipients: vec![id.to_public()],
                identities: vec![id],
            }
        }
        Encryption::Recipients(r) if r.is_empty() => {
            return Err(invalid(String::from(
                "recipients mode needs at least one recipient",
            )));
        }
        Encryption::Recipients(r) => Keys {
            repo: config.id.clone(),
            write,
            recipients: r.clone(),
            identities: Vec::new(),
        },
    };
    config.version = VERSION;
    config.encryption = Some(enc.mode().to_owned());
    config.mac = Some(keys.write.config_mac(&mac_fields(config)));
    Ok(keys)
}

/// Store the key objects of a new repository (after its config).
///
/// # Errors
///
/// Store errors.
pub(crate) fn store_key_objects(
    store: &dyn Store,
    keys: &Keys,
    enc: &Encryption,
) -> Result<(), BackupError> {
    let invalid = |e: String| BackupError::Invalid(format!("{}: {e}", store.name()));
    let (key, bytes) = match enc {
        Encryption::Passphrase { passphrase, log_n } => (
            pass_key_name(),
            keys.passphrase_object(passphrase, *log_n)
                .map_err(invalid)?,
        ),
        Encryption::Recipients(_) => (
            RECIPIENTS_KEY.to_owned(),
            keys.recipients_object().map_err(invalid)?,
        ),
        Encryption::None => return Ok(()),
    };
    store.put_if_absent(&key, &bytes)?;
    Ok(())
}

/// Refuse secrets for an unencrypted repository: a config that says
/// "unencrypted" where the user holds keys is a downgrade someone with
/// write access to the repository could make.
///
/// # Errors
///
/// [`BackupError::Key`].
pub(crate) fn check_plain(
    store: &dyn Store,
    config: &Config,
    secrets: &Secrets,
) -> Result<(), BackupError> {
    if secrets.any() {
        return Err(key_error(
            store,
            String::from(
                "this repository is not encrypted (format 1), but a passphrase, identity or write key was given: refusing (if it was made encrypted, its config was replaced)",
            ),
        ));
    }
    if let Some(dir) = &secrets.write_key_dir {
        let here = location_of(store);
        if let Some((_, loc)) = write_keys_in(dir)
            .into_iter()
            .find(|(k, loc)| k.repo == config.id || *loc == here)
        {
            return Err(key_error(
                store,
                format!(
                    "this repository is not encrypted (format 1), but this host has a write key for it ({} names {loc}): refusing (its config was replaced?)",
                    dir.display()
                ),
            ));
        }
    }
    Ok(())
}

/// The keys `secrets` give for the encrypted repository whose config is
/// `config`, the config's MAC checked; the store to use, encrypting.
///
/// # Errors
///
/// [`BackupError::Key`] for a missing or wrong secret; store errors.
pub(crate) fn open(
    s: &dyn Store,
    config: &Config,
    secrets: &Secrets,
) -> Result<(Keys, Option<String>), BackupError> {
    let mut opened_by = None;
    let keys = match config.encryption.as_deref() {
        Some("passphrase") => {
            let asked;
            let pass = match (&secrets.passphrase, secrets.ask_passphrase) {
                (Some(p), _) => p,
                (None, Some(ask)) => {
                    asked = ask().map_err(|e| key_error(s, e))?;
                    &asked
                }
                (None, None) => {
                    return Err(key_error(
                        s,
                        String::from(
                            "the repository is encrypted with a passphrase: give it with --password-file FILE, --password-command CMD, BTRSEND_PASSWORD_FILE or BTRSEND_PASSWORD (or type it at the prompt on a terminal)",
                        ),
                    ));
                }
            };
            let mut found = None;
            let mut why = Vec::new();
            for o in s.list(KEYS_DIR)? {
                if !o.key.ends_with(".age") || o.key == RECIPIENTS_KEY {
                    continue;
                }
                let bytes = s.get(&o.key, None)?;
                match Keys::from_passphrase_object(&bytes, pass, &config.id) {
                    Ok(k) => {
                        found = Some(k);
                        opened_by = Some(o.key.clone());
                        break;
                    }
                    Err(KeyError::NotYours(_)) => {}
                    Err(KeyError::Invalid(e)) => why.push(format!("{}: {e}", o.key)),
                }
            }
            found.ok_or_else(|| {
                let mut what = String::from(
                    "the passphrase opens none of the repository's keys (wrong passphrase?)",
                );
                if !why.is_empty() {
                    what.push_str(&format!("; refused: {}", why.join("; ")));
                }
                key_error(s, what)
            })?
        }
        Some("recipients") => {
            let from_identity = if secrets.identities.is_empty() {
                None
            } else {
                let bytes = s.get(RECIPIENTS_KEY, None)?;
                Some(
                    Keys::from_recipients_object(&bytes, &secrets.identities, &config.id)
                        .map_err(|e| key_error(s, format!("{RECIPIENTS_KEY}: {e}")))?,
                )
            };
            if let Some(w) = &secrets.write_key
                && w.repo != config.id
            {
                return Err(key_error(
                    s,
                    format!(
                        "the write key given is of repository {}, not of this one ({})",
                        w.repo, config.id
                    ),
                ));
            }
            let looked_up = match (&secrets.write_key, &secrets.write_key_dir) {
                (None, Some(dir)) => {
                    let path = write_key_path(dir, &config.id);
                    match std::fs::read(&path) {
                        Ok(b) => Some(
                            Keys::from_write_key_file(&b)
                                .map(|(k, _)| k)
                                .map_err(|e| key_error(s, format!("{}: {e}", path.display())))?,
                        ),
                        Err(_) => None,
                    }
                }
                _ => None,
            };
            let write_key = secrets.write_key.as_ref().or(looked_up.as_ref());
            match (from_identity, write_key) {
                (Some(k), Some(w)) if !k.write.same(&w.write) => {
                    return Err(key_error(
                        s,
                        format!(
                            "{RECIPIENTS_KEY} holds another write key than the write-key file given (fingerprints {} and {}): the repository's keys were replaced",
                            k.write.fingerprint(),
                            w.write.fingerprint()
                        ),
                    ));
                }
                (Some(k), _) => k,
                (None, Some(w)) => w.clone(),
                (None, None) => {
                    return Err(key_error(
                        s,
                        String::from(
                            "the repository is encrypted for age recipients: reading it needs an identity (--identity FILE or BTRSEND_IDENTITY_FILE), writing it the write key init wrote (--write-key FILE or BTRSEND_WRITE_KEY_FILE)",
                        ),
                    ));
                }
            }
        }
        other => {
            return Err(BackupError::Invalid(format!(
                "{}: config: unknown encryption {:?}",
                s.name(),
                other.unwrap_or("")
            )));
        }
    };
    let mac = keys.write.config_mac(&mac_fields(config));
    if config.mac.as_deref() != Some(mac.as_str()) {
        return Err(key_error(
            s,
            String::from(
                "config: its MAC does not match under the repository's write key: the config was changed",
            ),
        ));
    }
    Ok((keys, opened_by))
}

#[cfg(test)]
mod tests;
