//! `btrsend backup init`: a new repository, encrypted as `--encryption`
//! says (which has no default: no repository is left unencrypted by
//! accident), and in recipients mode the write-key file of this host.

use std::io::Write;
use std::path::{Path, PathBuf};

use btrsend::backup::Repository;
use btrsend::backup::crypt::keys;
use btrsend::backup::crypt::repo::{self, Encryption};
use clap::{Args, ValueEnum};

use super::RepoSpec;
use super::secrets::{self, PassArgs};
use crate::exit::UsageError;
use crate::text::printable;

/// How a repository is encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Everything encrypted with keys a passphrase unlocks.
    Passphrase,
    /// Stream objects encrypted for age recipients (public keys): the
    /// host that backs up holds only a write key and cannot read them.
    Recipients,
    /// Not encrypted (plain zstd and JSON, format 1).
    None,
}

/// Arguments of `btrsend backup init`.
#[derive(Debug, Args)]
#[command(after_long_help = INIT_HELP)]
pub struct InitArgs {
    #[command(flatten)]
    repo: RepoSpec,
    /// How to encrypt the repository: passphrase, recipients or none
    /// (required).
    #[arg(long = "encryption", value_name = "MODE")]
    encryption: Option<Mode>,
    #[command(flatten)]
    pass: PassArgs,
    /// An age recipient (age1…, as age-keygen -y prints it) that can read
    /// the repository (recipients mode). Repeatable.
    #[arg(
        long = "recipient",
        value_name = "AGE_PUBKEY",
        help_heading = "Encryption"
    )]
    recipient: Vec<String>,
    /// A file of recipients, one per line (recipients mode).
    #[arg(
        long = "recipients-file",
        value_name = "FILE",
        help_heading = "Encryption"
    )]
    recipients_file: Vec<PathBuf>,
    /// Where to write the write key (recipients mode; default:
    /// ~/.config/btrsend/keys/ID.json, where run and import look for it).
    /// It must not exist.
    #[arg(long = "write-key", value_name = "FILE", help_heading = "Encryption")]
    write_key: Option<PathBuf>,
}

const INIT_HELP: &str = "\
passphrase: catalogs and stream files are encrypted and authenticated under
keys that the passphrase unlocks (age's scrypt); more passphrases can be
added with `btrsend backup key`. Every command needs the passphrase.

recipients: stream files are encrypted for age recipients (public keys made
by age-keygen); catalogs are sealed with a write key that init writes to
this host (--write-key). run, import, list and forget need only the write
key, which reads snapshot names, times and sizes but no file name or
content; verify and restore need an identity of a recipient (--identity).

none: plain zstd and JSON (repository format 1).

A stream file of an encrypted repository is an age file: with an identity,
`age -d -i KEY FILE | zstd -d | btrfs receive DIR` restores it without
btrsend. See btrsend-repository(5) for what each key can and cannot do.";

fn usage(what: String) -> anyhow::Error {
    anyhow::Error::new(UsageError(what))
}

/// The recipients the options give.
fn recipients(a: &InitArgs) -> anyhow::Result<Vec<keys::Recipient>> {
    let mut text = a.recipient.join("\n");
    for f in &a.recipients_file {
        let t = std::fs::read_to_string(f)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", f.display()))?;
        text.push('\n');
        text.push_str(&t);
    }
    let r = keys::parse_recipients(&text).map_err(|e| usage(format!("--recipient: {e}")))?;
    if r.is_empty() {
        return Err(usage(String::from(
            "--encryption recipients needs --recipient AGE_PUBKEY or --recipients-file FILE",
        )));
    }
    Ok(r)
}

/// Where the write key goes; checked before the repository is made, so
/// that a repository is never left without its write key.
fn write_key_target(a: &InitArgs) -> anyhow::Result<Option<PathBuf>> {
    if let Some(p) = &a.write_key {
        if p.symlink_metadata().is_ok() {
            return Err(usage(format!(
                "--write-key {}: exists already (init never overwrites a key)",
                p.display()
            )));
        }
        return Ok(Some(p.clone()));
    }
    Ok(None)
}

/// Write `bytes` to a new file `path` (mode 0600; its directory made 0700
/// if missing).
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Run `btrsend backup init`.
pub fn run(a: &InitArgs) -> anyhow::Result<()> {
    let Some(mode) = a.encryption else {
        return Err(usage(String::from(
            "init needs --encryption MODE: passphrase (keys a passphrase unlocks), recipients (age public keys; this host gets a write key that cannot read backups) or none (unencrypted)",
        )));
    };
    let spec = a.repo.spec()?;
    let wk_target = write_key_target(a)?;
    let enc = match mode {
        Mode::None => Encryption::None,
        Mode::Passphrase => {
            let name = printable(&spec);
            let passphrase = match a.pass.passphrase()? {
                Some(p) => p,
                None => secrets::prompt(&format!("New passphrase of {name}"), true)
                    .map_err(|e| anyhow::anyhow!("{e}"))?,
            };
            Encryption::Passphrase {
                passphrase,
                log_n: secrets::scrypt_log_n()?,
            }
        }
        Mode::Recipients => Encryption::Recipients(recipients(a)?),
    };
    let store = a.repo.store(&spec)?;
    let location = repo::location_of(&*store);
    let (repo, keys) = Repository::init_encrypted(store, &enc)?;
    let name = printable(repo.store().name());
    let mut out = crate::exit::stdout();
    match (&enc, keys) {
        (Encryption::Recipients(r), Some(keys)) => {
            let path = match wk_target {
                Some(p) => p,
                None => secrets::key_dir()
                    .map(|d| repo::write_key_path(&d, &keys.repo))
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "{name} was made, but there is no HOME or XDG_CONFIG_HOME to keep its write key in: remove it and run init again with --write-key FILE"
                        )
                    })?,
            };
            let bytes = keys
                .write_key_file(&location)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            write_new(&path, &bytes).map_err(|e| {
                anyhow::anyhow!(
                    "{name} was made, but its write key could not be written to {}: {e}; remove the repository and run init again",
                    path.display()
                )
            })?;
            writeln!(
                out,
                "made the empty repository {name}, encrypted for {} recipient{}",
                r.len(),
                if r.len() == 1 { "" } else { "s" }
            )?;
            writeln!(
                out,
                "its write key (fingerprint {}) is in {}: run and import need it; keep it on this host, never in the repository; list, verify and restore need an identity of a recipient (--identity)",
                keys.write.fingerprint(),
                printable(&path.display().to_string())
            )?;
        }
        (Encryption::Passphrase { .. }, _) => writeln!(
            out,
            "made the empty repository {name}, encrypted with a passphrase (without it nothing stored can be read: keep it safe)"
        )?,
        _ => writeln!(out, "made the empty repository {name} (unencrypted)")?,
    }
    Ok(())
}
