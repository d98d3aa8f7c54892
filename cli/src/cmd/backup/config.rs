//! The backup config file (`--config FILE`, default
//! `/etc/btrsend/btrsend.toml`): named jobs, each with its sources and its
//! destinations, read into the same options the command line gives.
//!
//! The file is TOML. Every option of `backup run`, `forget`, `verify` and
//! `status` has a key named as the option with `_` for `-`; the positional
//! SNAPSHOTs are `snapshots`. Sources are the job's (`[job.NAME]`), the
//! repository and everything per repository the destination's
//! (`[[job.NAME.destination]]`). Values are checked while they are read,
//! so that toml's spans place every error at its line and key; unknown
//! keys are errors (a misspelt `keep_daly` must not silently keep
//! nothing). Secrets are given by reference only: an inline `password`
//! or `passphrase`, or an identity pasted as a value, is refused, since a
//! config file is readable by more people and tools than a key file.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use btrsend::backup::retention::{Keep, Within};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use toml::Spanned;

use crate::exit::UsageError;

/// The file read when `--config` is not given (see [`ConfigArg`]).
pub const DEFAULT_CONFIG: &str = "/etc/btrsend/btrsend.toml";
/// Where the default file is instead, when set.
pub const CONFIG_ENV: &str = "BTRSEND_CONFIG";

/// `--config` and `--job`, on the commands that act per job.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigArg {
    /// Act on the jobs of the config file FILE (TOML; see
    /// btrsend-backup-config(1)) instead of one --repo: every job, one
    /// destination after another, or those --job names. Options given on
    /// the command line override the file's keys. Without --config and
    /// without --repo or BTRSEND_REPOSITORY, the file BTRSEND_CONFIG names,
    /// else /etc/btrsend/btrsend.toml, is read if it exists.
    #[arg(long = "config", value_name = "FILE", conflicts_with = "repo")]
    pub config: Option<PathBuf>,
    /// Only the job NAME of the config file (repeatable; default: every
    /// job).
    #[arg(long = "job", value_name = "NAME", conflicts_with = "repo")]
    pub job: Vec<String>,
}

impl ConfigArg {
    /// The config file to read: `--config`, else (with `--job`, or without
    /// any repository given) the default one if it exists; `None`: act on
    /// the one repository the options give.
    pub fn path(&self, repo_given: bool) -> Option<PathBuf> {
        if let Some(p) = &self.config {
            return Some(p.clone());
        }
        let default = default_path();
        if !self.job.is_empty() {
            return Some(default);
        }
        if repo_given {
            return None;
        }
        default.exists().then_some(default)
    }
}

/// The default config file: `$BTRSEND_CONFIG`, else
/// `/etc/btrsend/btrsend.toml`.
pub fn default_path() -> PathBuf {
    std::env::var_os(CONFIG_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_CONFIG), PathBuf::from)
}

/// A parsed config file.
#[derive(Debug)]
pub struct Config {
    /// The file, as named.
    pub path: PathBuf,
    text: String,
    file: File,
}

/// The file's top level.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    run: Section,
    #[serde(default)]
    forget: Section,
    #[serde(default)]
    verify: Section,
    #[serde(default)]
    status: Section,
    #[serde(default)]
    repair: Section,
    #[serde(default)]
    job: BTreeMap<String, Spanned<Job>>,
}

/// `[run]`, `[forget]`, `[verify]`, `[status]`, `[repair]`: what is per command rather
/// than per destination.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Section {
    /// `--metrics-file` of that command.
    pub metrics_file: Option<Spanned<PathBuf>>,
}

/// `[job.NAME]`: the sources, the hooks and the destinations.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// The positional SNAPSHOTs of `run`.
    #[serde(default)]
    pub snapshots: Strings,
    /// `--device`.
    #[serde(default)]
    pub device: Paths,
    /// `--degraded`.
    #[serde(default)]
    pub degraded: bool,
    /// `--snapshot`.
    #[serde(default)]
    pub snapshot: Paths,
    /// `--snapshot-dir`.
    pub snapshot_dir: Option<PathBuf>,
    /// `--keep-snapshots`.
    pub keep_snapshots: Option<usize>,
    /// A command run with `sh -c` before the job.
    pub before: Option<String>,
    /// A command run after the job, whatever its outcome.
    pub after: Option<String>,
    /// A command run after the job (and after `after`) when it failed.
    pub on_error: Option<String>,
    /// The repositories.
    #[serde(default)]
    pub destination: Vec<Spanned<Destination>>,
}

/// `[[job.NAME.destination]]`: a repository (or a received-subvolume
/// target) and its options.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Destination {
    /// `--repo`.
    pub repo: Option<Spanned<String>>,
    /// `--target` (instead of `repo`: run, list, forget and status only).
    pub target: Option<Spanned<String>>,
    /// `--password-file`.
    pub password_file: Option<Spanned<SecretPath>>,
    /// `--password-command`.
    pub password_command: Option<String>,
    /// `--identity` (also `identity_file`, the name issue 35 gives it).
    #[serde(default, alias = "identity_file")]
    pub identity: Option<Spanned<SecretPaths>>,
    /// `--write-key`.
    pub write_key: Option<Spanned<SecretPath>>,
    /// `--ssh-command` (an ssh:// repo).
    pub ssh_command: Option<String>,
    /// `--remote-path` (an ssh:// repo).
    pub remote_path: Option<String>,
    /// Refused: secrets only by reference.
    #[serde(default, rename = "password")]
    _password: Option<Inline>,
    /// Refused, as `password`.
    #[serde(default, rename = "passphrase")]
    _passphrase: Option<Inline>,
    /// `--full-every`.
    pub full_every: Option<u32>,
    /// `--full-every-days`.
    pub full_every_days: Option<u32>,
    /// `--compression-level`.
    pub compression_level: Option<Level>,
    /// `--limit-rate`.
    pub limit_rate: Option<Rate>,
    /// `--retry-lock`.
    pub retry_lock: Option<Dur>,
    /// `forget --keep-last`.
    pub keep_last: Option<KeepKey>,
    /// `forget --keep-hourly`.
    pub keep_hourly: Option<KeepKey>,
    /// `forget --keep-daily`.
    pub keep_daily: Option<KeepKey>,
    /// `forget --keep-weekly`.
    pub keep_weekly: Option<KeepKey>,
    /// `forget --keep-monthly`.
    pub keep_monthly: Option<KeepKey>,
    /// `forget --keep-yearly`.
    pub keep_yearly: Option<KeepKey>,
    /// `forget --keep-within`.
    pub keep_within: Option<WithinKey>,
    /// `status --max-age`.
    pub max_age: Option<Dur>,
    /// `verify --read-data`.
    pub read_data: Option<bool>,
}

/// A string or an array of strings.
#[derive(Debug, Default, Clone)]
pub struct Strings(pub Vec<String>);

/// A path or an array of paths.
#[derive(Debug, Default, Clone)]
pub struct Paths(pub Vec<PathBuf>);

/// The path of a file that holds a secret; a value that is the secret
/// itself (an age identity) is refused.
#[derive(Debug, Clone)]
pub struct SecretPath(pub PathBuf);

/// A [`SecretPath`] or an array of them.
#[derive(Debug, Default, Clone)]
pub struct SecretPaths(pub Vec<PathBuf>);

/// A zstd level, 1 to 19.
#[derive(Debug, Clone, Copy)]
pub struct Level(pub i32);

/// A rate in bytes per second, as `--limit-rate` reads it (`10M`), or an
/// integer.
#[derive(Debug, Clone, Copy)]
pub struct Rate(pub u64);

/// A duration as `--retry-lock` and `--max-age` read it (`30s`, `10m`,
/// `26h`), or an integer of seconds.
#[derive(Debug, Clone, Copy)]
pub struct Dur(pub Duration);

/// A `keep_*` count: an integer (-1: all) or `"unlimited"`.
#[derive(Debug, Clone, Copy)]
pub struct KeepKey(pub Keep);

/// `keep_within`: `1y6m`, `30d`, `2d12h`.
#[derive(Debug, Clone, Copy)]
pub struct WithinKey(pub Within);

/// A key whose very presence is an error.
#[derive(Debug)]
struct Inline;

fn one_or_many<'de, D, T>(
    d: D,
    what: &'static str,
    f: fn(String) -> Result<T, String>,
) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
{
    struct V<T> {
        what: &'static str,
        f: fn(String) -> Result<T, String>,
    }
    impl<'de, T> Visitor<'de> for V<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{} or an array of them", self.what)
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<Vec<T>, E> {
            (self.f)(s.to_owned()).map(|v| vec![v]).map_err(E::custom)
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::new();
            while let Some(s) = seq.next_element::<String>()? {
                out.push((self.f)(s).map_err(de::Error::custom)?);
            }
            Ok(out)
        }
    }
    d.deserialize_any(V { what, f })
}

fn non_empty(s: String) -> Result<String, String> {
    if s.is_empty() {
        Err(String::from("an empty string"))
    } else {
        Ok(s)
    }
}

fn secret_path(s: String) -> Result<PathBuf, String> {
    let s = non_empty(s)?;
    // An identity or write key pasted where its file's path belongs.
    if s.starts_with("AGE-SECRET-KEY-") || s.trim_start().starts_with('{') {
        return Err(String::from(
            "a secret written inline is refused: give the path of a file that holds it",
        ));
    }
    Ok(PathBuf::from(s))
}

impl<'de> Deserialize<'de> for Strings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        one_or_many(d, "a string", non_empty).map(Strings)
    }
}

impl<'de> Deserialize<'de> for Paths {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        one_or_many(d, "a path", |s| non_empty(s).map(PathBuf::from)).map(Paths)
    }
}

impl<'de> Deserialize<'de> for SecretPaths {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        one_or_many(d, "the path of a file", secret_path).map(SecretPaths)
    }
}

impl<'de> Deserialize<'de> for SecretPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        secret_path(String::deserialize(d)?)
            .map(SecretPath)
            .map_err(de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for Inline {
    fn deserialize<D: Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        Err(de::Error::custom(
            "a secret written inline is refused: use password_file or password_command",
        ))
    }
}

/// An integer, or a string `parse` reads.
fn int_or_str<'de, D, T>(
    d: D,
    what: &'static str,
    int: fn(i64) -> Result<T, String>,
    text: fn(&str) -> Result<T, String>,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
{
    struct V<T> {
        what: &'static str,
        int: fn(i64) -> Result<T, String>,
        text: fn(&str) -> Result<T, String>,
    }
    impl<T> Visitor<'_> for V<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.what)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
            (self.int)(v).map_err(E::custom)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
            let v = i64::try_from(v).map_err(|_| E::custom(format!("{v}: too large")))?;
            (self.int)(v).map_err(E::custom)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
            (self.text)(v).map_err(E::custom)
        }
    }
    d.deserialize_any(V { what, int, text })
}

impl<'de> Deserialize<'de> for Level {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = i64::deserialize(d)?;
        match i32::try_from(n) {
            Ok(l) if (1..=19).contains(&l) => Ok(Level(l)),
            _ => Err(de::Error::custom(format!(
                "{n}: not a zstd level from 1 to 19"
            ))),
        }
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        int_or_str(
            d,
            "a rate in bytes per second (an integer, or e.g. \"10M\")",
            |n| {
                u64::try_from(n)
                    .ok()
                    .filter(|&n| n > 0)
                    .map(Rate)
                    .ok_or_else(|| format!("{n}: not a rate"))
            },
            |s| btrsend::rate::parse_rate(s).map(Rate),
        )
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        int_or_str(
            d,
            "a duration (seconds, or e.g. \"30s\", \"10m\", \"26h\")",
            |n| {
                u64::try_from(n)
                    .map(|s| Dur(Duration::from_secs(s)))
                    .map_err(|_| format!("{n}: not a duration"))
            },
            |s| super::parse_duration(s).map(Dur),
        )
    }
}

impl<'de> Deserialize<'de> for KeepKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        int_or_str(
            d,
            "a count (an integer, -1 or \"unlimited\": all)",
            |n| n.to_string().parse::<Keep>().map(KeepKey),
            |s| s.parse::<Keep>().map(KeepKey),
        )
    }
}

impl<'de> Deserialize<'de> for WithinKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse::<Within>()
            .map(WithinKey)
            .map_err(de::Error::custom)
    }
}

/// Line and column (from 1) of byte `at` of `text`.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let before = text.get(..at).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// The key a line sets (`key = …`), or its table header (`[a.b]`).
fn key_of_line(text: &str, line: usize) -> Option<String> {
    let l = text.lines().nth(line.checked_sub(1)?)?.trim();
    if l.starts_with('[') {
        return Some(l.trim_matches(|c| c == '[' || c == ']').trim().to_owned());
    }
    let (k, _) = l.split_once('=')?;
    let k = k.trim();
    (!k.is_empty()).then(|| k.to_owned())
}

/// A usage error (exit status 2) in the file: `FILE:LINE:COL: KEY: what`.
#[derive(Debug)]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// Line, from 1 (0: no place in the file).
    pub line: usize,
    /// Column, from 1.
    pub col: usize,
    /// The key at that place, when there is one.
    pub key: Option<String>,
    /// What is wrong.
    pub what: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.col)?;
        }
        if let Some(k) = &self.key {
            write!(f, ": {k}")?;
        }
        write!(f, ": {}", self.what)
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Read and check `path`.
    ///
    /// # Errors
    ///
    /// A file that cannot be read (exit status 1), or a [`ConfigError`]
    /// wrapped in a [`UsageError`] (exit status 2).
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read the config file {}: {e}", path.display()))?;
        Config::parse(path, text)
    }

    /// Check `text`, the contents of `path`.
    ///
    /// # Errors
    ///
    /// As [`Config::load`].
    pub fn parse(path: &Path, text: String) -> anyhow::Result<Config> {
        let file: File = match toml::from_str(&text) {
            Ok(f) => f,
            Err(e) => {
                let span = e.span();
                let (line, col) = span.as_ref().map_or((0, 0), |s| line_col(&text, s.start));
                let key = (line > 0).then(|| key_of_line(&text, line)).flatten();
                let what = e.message().trim_end().replace('\n', "; ");
                return Err(usage(ConfigError {
                    path: path.to_owned(),
                    line,
                    col,
                    key,
                    what,
                }));
            }
        };
        let c = Config {
            path: path.to_owned(),
            text,
            file,
        };
        c.check()?;
        Ok(c)
    }

    /// The error at `span` of the file.
    pub fn error_at(&self, span: std::ops::Range<usize>, key: &str, what: String) -> anyhow::Error {
        let (line, col) = line_col(&self.text, span.start);
        usage(ConfigError {
            path: self.path.clone(),
            line,
            col,
            key: Some(key.to_owned()),
            what,
        })
    }

    /// What the keys cannot say alone: each job has sources that go
    /// together and at least one destination.
    fn check(&self) -> anyhow::Result<()> {
        if self.file.job.is_empty() {
            return Err(usage(ConfigError {
                path: self.path.clone(),
                line: 0,
                col: 0,
                key: None,
                what: String::from("no job: define at least one [job.NAME] table"),
            }));
        }
        for (name, job) in &self.file.job {
            let here =
                |what: &str| self.error_at(job.span(), &format!("job.{name}"), what.to_owned());
            if name.is_empty() || name.chars().any(char::is_control) {
                return Err(here("a job's name must be non-empty and printable"));
            }
            let j = job.get_ref();
            if j.destination.is_empty() {
                return Err(here(
                    "no destination: add a [[job.NAME.destination]] table with repo = \"...\"",
                ));
            }
            sources_agree(
                &j.snapshots.0,
                &j.device.0,
                &j.snapshot.0,
                j.snapshot_dir.is_some(),
                j.keep_snapshots.is_some(),
                false,
            )
            .map_err(|e| here(&e))?;
            for d in &j.destination {
                let dest = d.get_ref();
                let (key, loc) = match (&dest.repo, &dest.target) {
                    (Some(r), None) => ("repo", r),
                    (None, Some(t)) => ("target", t),
                    _ => {
                        return Err(self.error_at(
                            d.span(),
                            &format!("job.{name}.destination"),
                            String::from("a destination has either repo or target (one of them)"),
                        ));
                    }
                };
                if loc.get_ref().is_empty() {
                    return Err(self.error_at(
                        loc.span(),
                        key,
                        format!(
                            "an empty {}",
                            if key == "repo" {
                                "repository"
                            } else {
                                "target"
                            }
                        ),
                    ));
                }
                if dest.target.is_some()
                    && let Some(k) = dest.repository_only()
                {
                    return Err(self.error_at(
                        loc.span(),
                        k,
                        format!("{k} applies to a repository, not to a target"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The jobs `names` selects, in the order of the file (every job when
    /// `names` is empty).
    ///
    /// # Errors
    ///
    /// A name the file does not define (a usage error naming those it
    /// does).
    pub fn jobs(&self, names: &[String]) -> anyhow::Result<Vec<(&str, &Job)>> {
        for n in names {
            if !self.file.job.contains_key(n) {
                let known: Vec<&str> = self.file.job.keys().map(String::as_str).collect();
                return Err(anyhow::Error::new(UsageError(format!(
                    "{}: no job {} (jobs: {})",
                    self.path.display(),
                    crate::text::printable(n),
                    known.join(", ")
                ))));
            }
        }
        let mut jobs: Vec<(&str, &Spanned<Job>)> = self
            .file
            .job
            .iter()
            .filter(|(n, _)| names.is_empty() || names.contains(n))
            .map(|(n, j)| (n.as_str(), j))
            .collect();
        // The file's order: a job written first runs first.
        jobs.sort_by_key(|(_, j)| j.span().start);
        Ok(jobs.into_iter().map(|(n, j)| (n, j.get_ref())).collect())
    }

    /// The `[COMMAND]` section.
    pub fn section(&self, command: &str) -> Option<&Section> {
        match command {
            "run" => Some(&self.file.run),
            "forget" => Some(&self.file.forget),
            "verify" => Some(&self.file.verify),
            "status" => Some(&self.file.status),
            "repair" => Some(&self.file.repair),
            _ => None,
        }
    }
}

impl Job {
    /// The job's devices (and `degraded`) as the source of a command
    /// that reads one (verify --against-source, repair), unless `devices`
    /// were given on the command line.
    pub fn source_unless_given(&self, devices: &mut Vec<PathBuf>, degraded: &mut bool) {
        if devices.is_empty() {
            devices.clone_from(&self.device.0);
            *degraded |= self.degraded;
        }
    }
}

impl Destination {
    /// The repository or target it names (one of them, as checked when
    /// the file is read; empty for neither).
    pub fn location(&self) -> &str {
        self.repo
            .as_ref()
            .or(self.target.as_ref())
            .map_or("", |r| r.get_ref().as_str())
    }

    /// The first key given that only a repository takes.
    fn repository_only(&self) -> Option<&'static str> {
        [
            ("password_file", self.password_file.is_some()),
            ("password_command", self.password_command.is_some()),
            ("identity", self.identity.is_some()),
            ("write_key", self.write_key.is_some()),
            ("full_every", self.full_every.is_some()),
            ("full_every_days", self.full_every_days.is_some()),
            ("compression_level", self.compression_level.is_some()),
            ("read_data", self.read_data.is_some()),
        ]
        .into_iter()
        .find_map(|(k, given)| given.then_some(k))
    }

    /// The retention policy's keys, as `forget` reads them.
    pub fn keeps(&self) -> [Option<Keep>; 6] {
        [
            self.keep_last,
            self.keep_hourly,
            self.keep_daily,
            self.keep_weekly,
            self.keep_monthly,
            self.keep_yearly,
        ]
        .map(|k| k.map(|k| k.0))
    }
}

/// The sources `run` gets agree: `--device` and `--snapshot` exclude each
/// other, `--snapshot` needs `--snapshot-dir` and the other way round,
/// `--keep-snapshots` needs `--snapshot`; with `need_one`, some snapshot
/// is named.
pub fn sources_agree(
    snapshots: &[String],
    devices: &[PathBuf],
    snapshot: &[PathBuf],
    snapshot_dir: bool,
    keep_snapshots: bool,
    need_one: bool,
) -> Result<(), String> {
    if !devices.is_empty() && !snapshot.is_empty() {
        return Err(String::from(
            "device and snapshot exclude each other (--snapshot takes snapshots in a mounted btrfs)",
        ));
    }
    if !snapshot.is_empty() && !snapshot_dir {
        return Err(String::from("snapshot needs snapshot_dir (--snapshot-dir)"));
    }
    if snapshot.is_empty() && snapshot_dir {
        return Err(String::from("snapshot_dir needs snapshot (--snapshot)"));
    }
    if snapshot.is_empty() && keep_snapshots {
        return Err(String::from("keep_snapshots needs snapshot (--snapshot)"));
    }
    if need_one && snapshots.is_empty() && snapshot.is_empty() {
        return Err(String::from(
            "no snapshot to store: give SNAPSHOT... or --snapshot SUBVOL (in a config file: snapshots or snapshot)",
        ));
    }
    Ok(())
}

fn usage(e: ConfigError) -> anyhow::Error {
    anyhow::Error::new(UsageError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(Path::new("b.toml"), text.to_owned()).map_err(|e| e.to_string())
    }

    #[test]
    fn every_key() {
        let c = parse(
            r#"
[run]
metrics_file = "/m/run.prom"
[job.home]
snapshot = "/mnt/pool/home"
snapshot_dir = "/mnt/pool/snaps"
keep_snapshots = 7
before = "true"
after = "true"
on_error = "true"
[[job.home.destination]]
repo = "/backup/home"
password_file = "/etc/btrsend/pass"
full_every = 5
full_every_days = 0
compression_level = 19
limit_rate = "10M"
retry_lock = "10m"
keep_last = 1
keep_hourly = -1
keep_daily = 7
keep_weekly = "unlimited"
keep_monthly = 12
keep_yearly = 2
keep_within = "1y6m"
max_age = 93600
read_data = true
[[job.home.destination]]
repo = "s3://b/home"
identity_file = ["/k/id.txt"]
write_key = "/k/wk.json"
[job.dev]
device = ["/dev/sdb1"]
degraded = true
snapshots = ["snaps/a.*", "id:257"]
[[job.dev.destination]]
repo = "/backup/dev"
"#,
        )
        .unwrap();
        let jobs = c.jobs(&[]).unwrap();
        let names: Vec<&str> = jobs.iter().map(|j| j.0).collect();
        assert_eq!(names, ["home", "dev"], "file order");
        let home = jobs[0].1;
        assert_eq!(home.snapshot.0, [PathBuf::from("/mnt/pool/home")]);
        assert_eq!(home.keep_snapshots, Some(7));
        let d = home.destination[0].get_ref();
        assert_eq!(d.limit_rate.unwrap().0, 10 << 20);
        assert_eq!(d.retry_lock.unwrap().0, Duration::from_secs(600));
        assert_eq!(d.max_age.unwrap().0, Duration::from_secs(93600));
        assert_eq!(d.compression_level.unwrap().0, 19);
        assert_eq!(
            d.keeps(),
            [
                Some(Keep::Count(1)),
                Some(Keep::Unlimited),
                Some(Keep::Count(7)),
                Some(Keep::Unlimited),
                Some(Keep::Count(12)),
                Some(Keep::Count(2))
            ]
        );
        let s3 = home.destination[1].get_ref();
        assert_eq!(
            s3.identity.as_ref().unwrap().get_ref().0,
            [PathBuf::from("/k/id.txt")]
        );
        assert_eq!(jobs[1].1.snapshots.0, ["snaps/a.*", "id:257"]);
        assert!(jobs[1].1.degraded);
        assert_eq!(c.jobs(&["dev".into()]).unwrap().len(), 1);
        assert!(
            c.jobs(&["nope".into()])
                .unwrap_err()
                .to_string()
                .contains("no job nope (jobs: dev, home)")
        );
    }

    #[test]
    fn the_contrib_example_parses() {
        let text = include_str!("../../../../contrib/btrsend.toml");
        let c = parse(text).unwrap();
        let jobs = c.jobs(&[]).unwrap();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].1.destination.len(), 2);
    }

    #[test]
    fn errors_name_line_and_key() {
        let e = parse(
            "[job.a]\nsnapshots = [\"x\"]\n[[job.a.destination]]\nrepo = \"/r\"\nkeep_daly = 7\n",
        )
        .unwrap_err();
        assert!(
            e.starts_with("b.toml:5:1: keep_daly: unknown field `keep_daly`"),
            "{e}"
        );
        let e = parse("[job.a]\nsnapshots = [\"x\"]\n[[job.a.destination]]\nrepo = \"/r\"\npassword = \"hunter2\"\n").unwrap_err();
        assert_eq!(
            e,
            "b.toml:5:12: password: a secret written inline is refused: use password_file or password_command"
        );
        assert!(!e.contains("hunter2"));
        let e = parse("[job.a]\nsnapshots = \"x\"\n[[job.a.destination]]\nrepo = \"/r\"\nlimit_rate = \"fast\"\n").unwrap_err();
        assert!(e.starts_with("b.toml:5:14: limit_rate: "), "{e}");
        let e = parse("[job.a]\nsnapshots = \"x\"\n[[job.a.destination]]\nrepo = \"/r\"\ncompression_level = 22\n").unwrap_err();
        assert!(
            e.starts_with("b.toml:5:21: compression_level: 22: not a zstd level"),
            "{e}"
        );
        let e = parse("[job.a]\nsnapshots = \"x\"\n").unwrap_err();
        assert!(e.starts_with("b.toml:1:1: job.a: no destination"), "{e}");
        let e = parse("[job.a]\ndevice = \"/d\"\nsnapshot = \"/s\"\nsnapshot_dir = \"/x\"\n[[job.a.destination]]\nrepo = \"/r\"\n").unwrap_err();
        assert!(
            e.contains(": job.a: device and snapshot exclude each other"),
            "{e}"
        );
        let e = parse(
            "[job.a]\n[[job.a.destination]]\nrepo = \"/r\"\nidentity = \"AGE-SECRET-KEY-1XYZ\"\n",
        )
        .unwrap_err();
        assert!(
            e.starts_with("b.toml:4:12: identity: a secret written inline is refused"),
            "{e}"
        );
        assert!(!e.contains("1XYZ"), "{e}");
        let e = parse("").unwrap_err();
        assert_eq!(e, "b.toml: no job: define at least one [job.NAME] table");
        let e = parse("[job.a\n").unwrap_err();
        assert!(e.starts_with("b.toml:1:"), "{e}");
    }
}
