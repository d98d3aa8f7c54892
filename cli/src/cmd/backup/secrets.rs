//! The secrets of an encrypted repository, from the options every
//! subcommand takes, the environment, the user's key directory and, for a
//! passphrase, a prompt on the terminal. Nothing here prints a secret.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use btrsend::backup::crypt::SecretString;
use btrsend::backup::crypt::keys::{self, Keys};
use btrsend::backup::crypt::repo::Secrets;
use clap::Args;

use crate::exit::UsageError;

/// The passphrase's file, else this variable.
pub const PASSWORD_FILE_ENV: &str = "BTRSEND_PASSWORD_FILE";
/// The passphrase itself.
pub const PASSWORD_ENV: &str = "BTRSEND_PASSWORD";
/// An identity file.
pub const IDENTITY_ENV: &str = "BTRSEND_IDENTITY_FILE";
/// A write-key file.
pub const WRITE_KEY_ENV: &str = "BTRSEND_WRITE_KEY_FILE";
/// The variables the options of the repository copied or compared from
/// fall back to (`copy --from`, the first of `verify --compare`): its own,
/// so that the other repository's never open it by mistake.
pub const FROM_PASSWORD_FILE_ENV: &str = "BTRSEND_FROM_PASSWORD_FILE";
/// The passphrase of the repository copied or compared from.
pub const FROM_PASSWORD_ENV: &str = "BTRSEND_FROM_PASSWORD";
/// An identity file of the repository copied or compared from.
pub const FROM_IDENTITY_ENV: &str = "BTRSEND_FROM_IDENTITY_FILE";
/// A write-key file of the repository copied or compared from.
pub const FROM_WRITE_KEY_ENV: &str = "BTRSEND_FROM_WRITE_KEY_FILE";

/// The variables one repository's secrets fall back to.
struct Env {
    password_file: &'static str,
    password: &'static str,
    identity: &'static str,
    write_key: &'static str,
}

const ENV: Env = Env {
    password_file: PASSWORD_FILE_ENV,
    password: PASSWORD_ENV,
    identity: IDENTITY_ENV,
    write_key: WRITE_KEY_ENV,
};

const FROM_ENV: Env = Env {
    password_file: FROM_PASSWORD_FILE_ENV,
    password: FROM_PASSWORD_ENV,
    identity: FROM_IDENTITY_ENV,
    write_key: FROM_WRITE_KEY_ENV,
};

/// The secrets of the other repository of `copy` (its --from) and of
/// `verify --compare` (the first), as options of their own.
#[derive(Debug, Args, Clone, Default)]
pub struct FromKeyArgs {
    /// Read the passphrase of the repository copied or compared from (copy
    /// --from, the first of verify --compare) from the first line of FILE
    /// (default: the file BTRSEND_FROM_PASSWORD_FILE names, then
    /// BTRSEND_FROM_PASSWORD, then a prompt on a terminal).
    #[arg(
        id = "from_password_file",
        long = "from-password-file",
        value_name = "FILE",
        conflicts_with = "from_password_command",
        help_heading = "Encryption of the repository copied or compared from"
    )]
    pub password_file: Option<PathBuf>,
    /// Run CMD with sh -c for that passphrase.
    #[arg(
        id = "from_password_command",
        long = "from-password-command",
        value_name = "CMD",
        help_heading = "Encryption of the repository copied or compared from"
    )]
    pub password_command: Option<String>,
    /// An age identity file of one of its recipients (default: the file
    /// BTRSEND_FROM_IDENTITY_FILE names). Repeatable.
    #[arg(
        id = "from_identity",
        long = "from-identity",
        value_name = "FILE",
        help_heading = "Encryption of the repository copied or compared from"
    )]
    pub identity: Vec<PathBuf>,
    /// Its write-key file, which reads its catalog (enough for verify
    /// --compare; copy reads the streams and needs an identity) (default:
    /// the file BTRSEND_FROM_WRITE_KEY_FILE names, then the one init put in
    /// ~/.config/btrsend/keys/).
    #[arg(
        id = "from_write_key",
        long = "from-write-key",
        value_name = "FILE",
        help_heading = "Encryption of the repository copied or compared from"
    )]
    pub write_key: Option<PathBuf>,
}

impl FromKeyArgs {
    /// As [`KeyArgs::secrets`], from the `--from-*` options and the
    /// `BTRSEND_FROM_*` variables.
    ///
    /// # Errors
    ///
    /// As [`KeyArgs::secrets`].
    pub fn secrets<'p>(
        &self,
        ask: &'p dyn Fn() -> Result<SecretString, String>,
    ) -> anyhow::Result<Secrets<'p>> {
        KeyArgs {
            pass: PassArgs {
                password_file: self.password_file.clone(),
                password_command: self.password_command.clone(),
            },
            identity: self.identity.clone(),
            write_key: self.write_key.clone(),
        }
        .secrets_in(ask, &FROM_ENV)
    }
}

/// scrypt's work factor for new passphrases (for tests: lower is weaker).
pub const SCRYPT_ENV: &str = "BTRSEND_SCRYPT_LOG_N";

/// Where a passphrase comes from (init and the others alike).
#[derive(Debug, Args, Clone, Default)]
pub struct PassArgs {
    /// Read the passphrase from the first line of FILE (default: the file
    /// BTRSEND_PASSWORD_FILE names, then BTRSEND_PASSWORD, then a prompt
    /// when standard input is a terminal).
    #[arg(
        long = "password-file",
        value_name = "FILE",
        conflicts_with = "password_command",
        help_heading = "Encryption"
    )]
    pub password_file: Option<PathBuf>,
    /// Run CMD with sh -c and read the passphrase from the first line of
    /// its output (a password manager, say).
    #[arg(
        long = "password-command",
        value_name = "CMD",
        help_heading = "Encryption"
    )]
    pub password_command: Option<String>,
}

/// The secrets of an encrypted repository, as options.
#[derive(Debug, Args, Clone, Default)]
pub struct KeyArgs {
    #[command(flatten)]
    pub pass: PassArgs,
    /// An age identity file (as age-keygen makes it) of one of the
    /// repository's recipients: reading a repository encrypted for
    /// recipients needs it (default: the file BTRSEND_IDENTITY_FILE names).
    /// Repeatable.
    #[arg(long = "identity", value_name = "FILE", help_heading = "Encryption")]
    pub identity: Vec<PathBuf>,
    /// The write-key file init wrote for a repository encrypted for
    /// recipients: run and import need it (default: the file
    /// BTRSEND_WRITE_KEY_FILE names, then the one init put in
    /// ~/.config/btrsend/keys/).
    #[arg(long = "write-key", value_name = "FILE", help_heading = "Encryption")]
    pub write_key: Option<PathBuf>,
}

fn usage(what: String) -> anyhow::Error {
    anyhow::Error::new(UsageError(what))
}

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The first line of `bytes`, as a passphrase.
fn first_line(bytes: Vec<u8>, from: &str) -> anyhow::Result<SecretString> {
    let bytes = zeroize::Zeroizing::new(bytes);
    let line = bytes.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        anyhow::bail!("{from}: the passphrase is empty");
    }
    let text = std::str::from_utf8(line)
        .map_err(|_| anyhow::anyhow!("{from}: the passphrase is not UTF-8"))?;
    Ok(SecretString::from(text.to_owned()))
}

fn read_secret_file(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("cannot read the {what} {}: {e}", path.display()))
}

impl PassArgs {
    /// The passphrase from the options or the environment (`None`: none
    /// given there).
    ///
    /// # Errors
    ///
    /// A file that cannot be read, a command that fails, an empty line.
    pub fn passphrase(&self) -> anyhow::Result<Option<SecretString>> {
        self.passphrase_in(&ENV)
    }

    fn passphrase_in(&self, env: &Env) -> anyhow::Result<Option<SecretString>> {
        if let Some(p) = &self.password_file {
            return first_line(
                read_secret_file(p, "password file")?,
                &p.display().to_string(),
            )
            .map(Some);
        }
        if let Some(cmd) = &self.password_command {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(cmd)
                .stdin(std::process::Stdio::inherit())
                .stderr(std::process::Stdio::inherit())
                .output()
                .map_err(|e| anyhow::anyhow!("cannot run the --password-command: {e}"))?;
            if !out.status.success() {
                anyhow::bail!("the --password-command failed ({})", out.status);
            }
            return first_line(out.stdout, "the --password-command's output").map(Some);
        }
        if let Some(p) = env_path(env.password_file) {
            return first_line(
                read_secret_file(&p, "password file")?,
                &format!("{} ({})", p.display(), env.password_file),
            )
            .map(Some);
        }
        if let Ok(p) = std::env::var(env.password)
            && !p.is_empty()
        {
            return Ok(Some(SecretString::from(p)));
        }
        Ok(None)
    }
}

/// Ask for the passphrase on the terminal (`twice`: and again, to check).
pub fn prompt(what: &str, twice: bool) -> Result<SecretString, String> {
    if !std::io::stdin().is_terminal() {
        return Err(format!(
            "{what} is needed and standard input is no terminal to ask on: give it with --password-file FILE, --password-command CMD, {PASSWORD_FILE_ENV} or {PASSWORD_ENV}"
        ));
    }
    let p = rpassword::prompt_password(format!("{what}: "))
        .map_err(|e| format!("cannot read the passphrase: {e}"))?;
    if p.is_empty() {
        return Err(String::from("the passphrase is empty"));
    }
    if twice {
        let again = rpassword::prompt_password("The same again: ")
            .map_err(|e| format!("cannot read the passphrase: {e}"))?;
        if again != p {
            return Err(String::from("the two passphrases differ"));
        }
    }
    Ok(SecretString::from(p))
}

/// The directory where init keeps write-key files:
/// `$XDG_CONFIG_HOME/btrsend/keys`, else `~/.config/btrsend/keys`.
pub fn key_dir() -> Option<PathBuf> {
    env_path("XDG_CONFIG_HOME")
        .or_else(|| env_path("HOME").map(|h| h.join(".config")))
        .map(|c| c.join("btrsend").join("keys"))
}

/// The keys of a write-key file.
pub fn read_write_key(path: &Path) -> anyhow::Result<Keys> {
    let bytes = zeroize::Zeroizing::new(read_secret_file(path, "write-key file")?);
    Keys::from_write_key_file(&bytes)
        .map(|(k, _)| k)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

impl KeyArgs {
    /// The secrets these options and the environment give; a passphrase
    /// not given is asked for on the terminal, if the repository needs one.
    ///
    /// # Errors
    ///
    /// A file that cannot be read or parsed.
    pub fn secrets<'p>(
        &self,
        ask: &'p dyn Fn() -> Result<SecretString, String>,
    ) -> anyhow::Result<Secrets<'p>> {
        self.secrets_in(ask, &ENV)
    }

    fn secrets_in<'p>(
        &self,
        ask: &'p dyn Fn() -> Result<SecretString, String>,
        env: &Env,
    ) -> anyhow::Result<Secrets<'p>> {
        let mut id_files = self.identity.clone();
        if id_files.is_empty()
            && let Some(p) = env_path(env.identity)
        {
            id_files.push(p);
        }
        let mut identities = Vec::new();
        for f in &id_files {
            let text = zeroize::Zeroizing::new(read_secret_file(f, "identity file")?);
            let text = std::str::from_utf8(&text)
                .map_err(|_| usage(format!("{}: not an age identity file", f.display())))?;
            identities.extend(
                keys::parse_identities(text).map_err(|e| usage(format!("{}: {e}", f.display())))?,
            );
        }
        let write_key = match self.write_key.clone().or_else(|| env_path(env.write_key)) {
            Some(p) => Some(read_write_key(&p)?),
            None => None,
        };
        let passphrase = self.pass.passphrase_in(env)?;
        if passphrase.is_some() || !identities.is_empty() || write_key.is_some() {
            btrsend::backup::crypt::no_core_dumps();
        }
        Ok(Secrets {
            passphrase,
            ask_passphrase: Some(ask),
            identities,
            write_key,
            write_key_dir: key_dir(),
        })
    }
}

/// scrypt's work factor for a new passphrase: BTRSEND_SCRYPT_LOG_N when
/// set (10 to 30), else age's (about a second of work).
pub fn scrypt_log_n() -> anyhow::Result<Option<u8>> {
    match std::env::var(SCRYPT_ENV) {
        Ok(v) if !v.is_empty() => match v.parse::<u8>() {
            Ok(n) if (10..=30).contains(&n) => Ok(Some(n)),
            _ => Err(usage(format!(
                "{SCRYPT_ENV}={v}: not a work factor from 10 to 30"
            ))),
        },
        _ => Ok(None),
    }
}
