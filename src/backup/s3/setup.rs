//! Where an S3 repository's connection settings come from: credentials,
//! region and endpoint, looked for as the AWS command-line tools look for
//! them, and the retry policy.
//!
//! Credentials, first found wins:
//! 1. `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (and
//!    `AWS_SESSION_TOKEN`) in the environment;
//! 2. `AWS_WEB_IDENTITY_TOKEN_FILE` with `AWS_ROLE_ARN` (Kubernetes),
//!    fetched by `object_store`;
//! 3. the profile `AWS_PROFILE` (default `default`): its
//!    `aws_access_key_id`, `aws_secret_access_key` and `aws_session_token`
//!    in the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, default
//!    `~/.aws/credentials`, sections `[NAME]`), else in the shared config
//!    file (`AWS_CONFIG_FILE`, default `~/.aws/config`, sections
//!    `[profile NAME]` and `[default]`);
//! 4. `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` or `…_FULL_URI` (ECS, EKS),
//!    fetched by `object_store`;
//! 5. the instance metadata service (169.254.169.254), only when
//!    `BTRSEND_S3_INSTANCE_METADATA=1` asks for it: a machine outside EC2
//!    would otherwise wait for a service that is not there and report an
//!    error about an address the admin never configured.
//!
//! With none, the error says what to set, at once, without a request.
//! `AWS_SKIP_SIGNATURE=true` sends unsigned requests (a public bucket).
//! Profiles that get their keys elsewhere (`role_arn`, `credential_process`,
//! `sso_session`…) are refused with a message naming the setting.
//!
//! Region: `AWS_REGION`, `AWS_DEFAULT_REGION`, the config profile's
//! `region`, else `us-east-1`. Endpoint: `AWS_ENDPOINT_URL_S3`,
//! `AWS_ENDPOINT_URL`, `AWS_ENDPOINT`, the config profile's `endpoint_url`,
//! else AWS.
//!
//! The shared files are read as the AWS tools read them (INI): `[section]`
//! lines, `key = value` (or `key: value`) lines, keys case-insensitive,
//! comment lines starting with `#` or `;`, and a `#` or `;` after
//! whitespace in a value starts a comment; an indented line continues the
//! key before it (a nested block such as `s3 =` with its settings), and is
//! skipped. Both files come from the user, but may have been written by a
//! tool or copied from elsewhere: each is read up to 1 MiB, and no value
//! from them appears in a message (only section names and file paths), so
//! no secret reaches a log.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The most a shared credentials or config file may hold.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// How long a failing request is retried by default: a network blip of a
/// minute (a router restart, a Wi-Fi handover, a server restart) passes
/// unnoticed, with margin for the last backoff.
pub(super) const DEFAULT_RETRY_TIMEOUT: Duration = Duration::from_secs(120);

/// The longest retry timeout allowed: a retried request keeps its
/// signature, which S3 accepts for 15 minutes.
pub(super) const MAX_RETRY_TIMEOUT: Duration = Duration::from_secs(600);

/// The variable that sets the retry timeout.
pub(super) const RETRY_ENV: &str = "BTRSEND_S3_RETRY_TIMEOUT";

/// The variable that allows the instance metadata service.
pub(super) const IMDS_ENV: &str = "BTRSEND_S3_INSTANCE_METADATA";

/// The credentials found.
pub(super) enum Credentials {
    /// Keys, and where they were found (for messages: `the environment
    /// (AWS_ACCESS_KEY_ID)`, `profile "backup" in /root/.aws/credentials`).
    Keys {
        key_id: String,
        secret: String,
        token: Option<String>,
        source: String,
    },
    /// A provider `object_store` runs (web identity, container, instance
    /// metadata), named for messages.
    Provider(&'static str),
    /// Unsigned requests (`AWS_SKIP_SIGNATURE`).
    Anonymous,
}

impl Credentials {
    /// Where the credentials come from, for messages.
    pub(super) fn source(&self) -> &str {
        match self {
            Credentials::Keys { source, .. } => source,
            Credentials::Provider(p) => p,
            Credentials::Anonymous => "AWS_SKIP_SIGNATURE (no credentials)",
        }
    }
}

impl fmt::Debug for Credentials {
    // Never the secret, nor the key id or token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credentials({})", self.source())
    }
}

/// An S3 connection's settings.
#[derive(Debug)]
pub(super) struct Settings {
    pub credentials: Credentials,
    pub region: String,
    /// The endpoint, when not AWS.
    pub endpoint: Option<String>,
    /// How long a failing request is retried.
    pub retry_timeout: Duration,
}

/// The settings from the environment `env` (a variable's value; empty
/// counts as unset) and the shared files it points at, or that lie in
/// `home` (`HOME`, else the password database's: a system service
/// started by systemd has no `HOME`).
///
/// # Errors
///
/// A message that names what to set: no credentials, a profile that is not
/// there or gets its keys in a way btrsend does not support, half a key
/// pair, an unreadable file, a bad retry timeout.
pub(super) fn resolve(
    env: &dyn Fn(&str) -> Option<String>,
    home: Option<&Path>,
) -> Result<Settings, String> {
    let var = |name: &str| env(name).filter(|v| !v.is_empty());
    let retry_timeout = match var(RETRY_ENV) {
        None => DEFAULT_RETRY_TIMEOUT,
        Some(v) => parse_duration(&v)
            .filter(|d| *d <= MAX_RETRY_TIMEOUT)
            .ok_or_else(|| {
                format!(
                    "{RETRY_ENV}={}: not a duration of at most 10m (e.g. 0, 30s, 2m)",
                    v.escape_debug()
                )
            })?,
    };
    let file = |name: &str, default: &str| -> Option<PathBuf> {
        match var(name) {
            Some(p) => Some(expand_home(&p, home)),
            None => home.map(|h| h.join(default)),
        }
    };
    let explicit_profile = var("AWS_PROFILE");
    let profile = explicit_profile.clone().unwrap_or_else(|| "default".into());
    let cred_path = file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
    let conf_path = file("AWS_CONFIG_FILE", ".aws/config");
    let cred_file = cred_path.as_deref().map(read_ini).transpose()?.flatten();
    let conf_file = conf_path.as_deref().map(read_ini).transpose()?.flatten();
    let in_cred = cred_file.as_ref().and_then(|f| f.section(&profile));
    let in_conf = conf_file.as_ref().and_then(|f| {
        if profile == "default" {
            f.section("default")
                .or_else(|| f.section("profile default"))
        } else {
            f.section(&format!("profile {profile}"))
        }
    });
    let shown = |p: &Option<PathBuf>, var: &str| match p {
        Some(p) => p.display().to_string(),
        None => format!("{var} (no home directory)"),
    };
    if explicit_profile.is_some() && in_cred.is_none() && in_conf.is_none() {
        return Err(format!(
            "no S3 credentials: the profile {:?} (AWS_PROFILE) is neither in {} nor in {}",
            profile,
            shown(&cred_path, "AWS_SHARED_CREDENTIALS_FILE"),
            shown(&conf_path, "AWS_CONFIG_FILE"),
        ));
    }

    let region = var("AWS_REGION")
        .or_else(|| var("AWS_DEFAULT_REGION"))
        .or_else(|| in_conf.and_then(|s| s.get("region")).map(str::to_owned))
        .unwrap_or_else(|| String::from("us-east-1"));
    let endpoint = var("AWS_ENDPOINT_URL_S3")
        .or_else(|| var("AWS_ENDPOINT_URL"))
        .or_else(|| var("AWS_ENDPOINT"))
        .or_else(|| {
            in_conf
                .and_then(|s| s.get("endpoint_url"))
                .map(str::to_owned)
        });

    let keys_in = |s: &Section, source: String| -> Result<Option<Credentials>, String> {
        match (s.get("aws_access_key_id"), s.get("aws_secret_access_key")) {
            (Some(id), Some(secret)) => Ok(Some(Credentials::Keys {
                key_id: id.to_owned(),
                secret: secret.to_owned(),
                token: s.get("aws_session_token").map(str::to_owned),
                source,
            })),
            (None, None) => Ok(None),
            (Some(_), None) => Err(format!(
                "S3 credentials: {source} has aws_access_key_id but no aws_secret_access_key"
            )),
            (None, Some(_)) => Err(format!(
                "S3 credentials: {source} has aws_secret_access_key but no aws_access_key_id"
            )),
        }
    };
    let settings = |credentials| Settings {
        credentials,
        region: region.clone(),
        endpoint: endpoint.clone(),
        retry_timeout,
    };

    // 1. The environment.
    match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
        (Some(key_id), Some(secret)) => {
            return Ok(settings(Credentials::Keys {
                key_id,
                secret,
                token: var("AWS_SESSION_TOKEN"),
                source: String::from("the environment (AWS_ACCESS_KEY_ID)"),
            }));
        }
        (Some(_), None) => {
            return Err(String::from(
                "S3 credentials: AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not",
            ));
        }
        (None, Some(_)) => {
            return Err(String::from(
                "S3 credentials: AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not",
            ));
        }
        (None, None) => {}
    }
    if var("AWS_SKIP_SIGNATURE").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(settings(Credentials::Anonymous));
    }
    // 2. Web identity.
    if var("AWS_WEB_IDENTITY_TOKEN_FILE").is_some() && var("AWS_ROLE_ARN").is_some() {
        return Ok(settings(Credentials::Provider(
            "AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN",
        )));
    }
    // 3. The profile, in the credentials file, then in the config file.
    let place = |path: &Option<PathBuf>| {
        format!(
            "profile {:?} in {}",
            profile,
            path.as_deref()
                .map(Path::display)
                .map_or(String::new(), |d| d.to_string())
        )
    };
    if let Some(s) = in_cred
        && let Some(c) = keys_in(s, place(&cred_path))?
    {
        return Ok(settings(c));
    }
    if let Some(s) = in_conf
        && let Some(c) = keys_in(s, place(&conf_path))?
    {
        return Ok(settings(c));
    }
    for (s, path) in [(in_cred, &cred_path), (in_conf, &conf_path)] {
        if let Some(s) = s
            && let Some(key) = UNSUPPORTED.iter().find(|k| s.get(k).is_some())
        {
            return Err(format!(
                "S3 credentials: {} gets its keys through {key}, which btrsend does not support: \
                 give the profile aws_access_key_id and aws_secret_access_key, or set \
                 AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
                place(path)
            ));
        }
    }
    // 4. Containers.
    if var("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
        || var("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some()
    {
        return Ok(settings(Credentials::Provider(
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI",
        )));
    }
    // 5. The instance metadata service, when asked for.
    if var(IMDS_ENV).is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        return Ok(settings(Credentials::Provider(
            "the instance metadata service (BTRSEND_S3_INSTANCE_METADATA)",
        )));
    }
    Err(format!(
        "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or \
         aws_access_key_id and aws_secret_access_key in the profile {:?} (AWS_PROFILE) of {}",
        profile,
        shown(&cred_path, "AWS_SHARED_CREDENTIALS_FILE"),
    ))
}

/// Profile settings that get keys in ways btrsend does not follow.
const UNSUPPORTED: &[&str] = &[
    "role_arn",
    "source_profile",
    "credential_source",
    "credential_process",
    "sso_session",
    "sso_start_url",
    "web_identity_token_file",
    "login_session",
];

/// `~/x` with `HOME`, as the AWS tools expand it.
fn expand_home(p: &str, home: Option<&Path>) -> PathBuf {
    match (p.strip_prefix("~/"), home) {
        (Some(rest), Some(h)) => h.join(rest),
        _ => PathBuf::from(p),
    }
}

/// `0`, `90`, `90s`, `2m`, `500ms`.
pub(super) fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    match unit {
        "" | "s" => Some(Duration::from_secs(n)),
        "ms" => Some(Duration::from_millis(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        _ => None,
    }
}

/// One `[section]` of an INI file: its keys (lowercase) and values, the
/// last of a repeated key winning.
#[derive(Debug, Default)]
struct Section {
    name: String,
    entries: Vec<(String, String)>,
}

impl Section {
    fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .rev()
            .find(|(k, v)| k == key && !v.is_empty())
            .map(|(_, v)| v.as_str())
    }
}

/// A parsed INI file (a repeated section's entries are merged into its
/// first occurrence, later ones winning).
#[derive(Debug, Default)]
struct Ini {
    sections: Vec<Section>,
}

impl Ini {
    /// The section `name`.
    fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }
}

/// Read and parse the INI file at `path`; `None` if it does not exist.
fn read_ini(path: &Path) -> Result<Option<Ini>, String> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let mut bytes = Vec::new();
    f.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "{} is larger than 1 MiB: not an AWS credentials or config file",
            path.display()
        ));
    }
    let text =
        String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", path.display()))?;
    Ok(Some(parse_ini(&text)))
}

/// Parse INI text (see the module's documentation for the rules).
fn parse_ini(text: &str) -> Ini {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut ini = Ini::default();
    // The section the lines go to, and whether it has a key an indented
    // line continues.
    let mut current: Option<usize> = None;
    let mut has_key = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        if line.starts_with([' ', '\t']) && has_key {
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix('[') {
            // `[name]`, perhaps followed by a comment.
            if let Some(end) = rest.find(']') {
                let name = rest[..end].split_whitespace().collect::<Vec<_>>().join(" ");
                current = Some(match ini.sections.iter().position(|s| s.name == name) {
                    Some(i) => i,
                    None => {
                        ini.sections.push(Section {
                            name,
                            entries: Vec::new(),
                        });
                        ini.sections.len() - 1
                    }
                });
                has_key = false;
            }
            continue;
        }
        // Keys before any section belong to none.
        let Some(section) = current.and_then(|i| ini.sections.get_mut(i)) else {
            continue;
        };
        let Some(at) = trimmed.find(['=', ':']) else {
            continue;
        };
        let key = trimmed[..at].trim().to_ascii_lowercase();
        let value = strip_comment(trimmed[at + 1..].trim());
        section.entries.push((key, value.to_owned()));
        has_key = true;
    }
    ini
}

/// A value without a comment that follows whitespace.
fn strip_comment(v: &str) -> &str {
    let mut prev_space = false;
    for (i, c) in v.char_indices() {
        if (c == '#' || c == ';') && prev_space {
            return v[..i].trim_end();
        }
        prev_space = c.is_whitespace();
    }
    v
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn keys(s: &Settings) -> (&str, &str, Option<&str>, &str) {
        match &s.credentials {
            Credentials::Keys {
                key_id,
                secret,
                token,
                source,
            } => (key_id, secret, token.as_deref(), source),
            other => panic!("not keys: {other:?}"),
        }
    }

    #[test]
    fn ini_sections_comments_and_nested_blocks() {
        let ini = parse_ini(
            "\u{feff}# comment\nstray = 1\n[default]\naws_access_key_id = AK # note\n\
             AWS_Secret_Access_Key=se#cret\n s3 =\n   endpoint_url = http://nested\n\
             ; another\n[profile  b ]   # c\nregion: eu-west-1\nendpoint_url = http://x:9000/\n\
             [default]\nregion = r2\n",
        );
        let first = ini.section("default").unwrap();
        assert_eq!(first.get("region"), Some("r2"));
        assert_eq!(first.get("aws_access_key_id"), Some("AK"));
        // A `#` without whitespace before it is part of the value.
        assert_eq!(first.get("aws_secret_access_key"), Some("se#cret"));
        assert_eq!(first.get("s3"), None);
        assert_eq!(first.get("endpoint_url"), None, "nested keys are skipped");
        let b = ini.section("profile b").unwrap();
        assert_eq!(b.get("region"), Some("eu-west-1"));
        assert_eq!(b.get("endpoint_url"), Some("http://x:9000/"));
        assert!(ini.section("stray").is_none());
    }

    #[test]
    fn environment_first_then_profiles() {
        let dir = tempfile::tempdir().unwrap();
        let cred = dir.path().join("credentials");
        let conf = dir.path().join("config");
        std::fs::write(
            &cred,
            "[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n\
             [backup]\naws_access_key_id = BK\naws_secret_access_key = bksecret\n\
             aws_session_token = tok\n[half]\naws_access_key_id = H\n",
        )
        .unwrap();
        std::fs::write(
            &conf,
            "[profile backup]\nregion = eu-central-1\nendpoint_url = http://nas:9000\n\
             [profile inconf]\naws_access_key_id = IC\naws_secret_access_key = icsecret\n\
             [profile role]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = default\n\
             [profile regiononly]\nregion = ap-south-1\n",
        )
        .unwrap();
        let c = cred.to_str().unwrap();
        let f = conf.to_str().unwrap();
        let base = [("AWS_SHARED_CREDENTIALS_FILE", c), ("AWS_CONFIG_FILE", f)];
        let with = |extra: &[(&str, &str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            resolve(&env_of(&v), Some(Path::new("/nonexistent")))
        };

        // The environment wins over AWS_PROFILE; region and endpoint still
        // come from the profile's config.
        let s = with(&[
            ("AWS_ACCESS_KEY_ID", "ENV"),
            ("AWS_SECRET_ACCESS_KEY", "envsecret"),
            ("AWS_PROFILE", "backup"),
        ])
        .unwrap();
        assert_eq!(
            keys(&s),
            (
                "ENV",
                "envsecret",
                None,
                "the environment (AWS_ACCESS_KEY_ID)"
            )
        );
        assert_eq!(s.region, "eu-central-1");
        assert_eq!(s.endpoint.as_deref(), Some("http://nas:9000"));
        assert_eq!(s.retry_timeout, DEFAULT_RETRY_TIMEOUT);

        // The default profile, then a named one (its token too, and not
        // AWS_SESSION_TOKEN, which belongs to the environment's keys).
        let s = with(&[]).unwrap();
        assert_eq!(keys(&s).0, "DEF");
        assert_eq!(s.region, "us-east-1");
        assert_eq!(s.endpoint, None);
        let s = with(&[
            ("AWS_PROFILE", "backup"),
            ("AWS_SESSION_TOKEN", "envtoken"),
            ("AWS_REGION", "us-west-2"),
            ("AWS_ENDPOINT_URL", "http://env:1"),
        ])
        .unwrap();
        assert_eq!(keys(&s).0, "BK");
        assert_eq!(keys(&s).2, Some("tok"));
        assert!(
            keys(&s).3.contains("profile \"backup\" in "),
            "{}",
            keys(&s).3
        );
        assert_eq!(s.region, "us-west-2");
        assert_eq!(s.endpoint.as_deref(), Some("http://env:1"));
        // Keys in the config file.
        let s = with(&[("AWS_PROFILE", "inconf")]).unwrap();
        assert_eq!(keys(&s).0, "IC");
        assert!(keys(&s).3.ends_with(f));

        // Errors name what to set, never a value from the files.
        for (extra, wanted) in [
            (
                vec![("AWS_PROFILE", "nope")],
                "the profile \"nope\" (AWS_PROFILE) is neither in",
            ),
            (
                vec![("AWS_PROFILE", "half")],
                "has aws_access_key_id but no",
            ),
            (vec![("AWS_PROFILE", "role")], "through role_arn"),
            (
                vec![("AWS_PROFILE", "regiononly")],
                "no S3 credentials: set AWS_ACCESS_KEY_ID",
            ),
            (
                vec![("AWS_ACCESS_KEY_ID", "X")],
                "AWS_SECRET_ACCESS_KEY is not",
            ),
            (
                vec![(RETRY_ENV, "11m")],
                "BTRSEND_S3_RETRY_TIMEOUT=11m: not a duration",
            ),
        ] {
            let e = with(&extra).unwrap_err();
            assert!(e.contains(wanted), "{extra:?}: {e}");
            for secret in ["defsecret", "bksecret", "tok", "arn:aws"] {
                assert!(!e.contains(secret), "{e}");
            }
        }

        // Nothing at all: one line, about the variables and the file.
        let e = resolve(&env_of(&[]), Some(dir.path())).unwrap_err();
        assert!(
            e.starts_with("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
                && e.contains(".aws/credentials")
                && !e.contains('\n'),
            "{e}"
        );
        // The instance metadata service only when asked for.
        let s = resolve(&env_of(&[(IMDS_ENV, "1")]), None).unwrap();
        assert!(matches!(s.credentials, Credentials::Provider(_)));
        // `~/` in a path is HOME's.
        std::fs::create_dir(dir.path().join(".aws")).unwrap();
        std::fs::copy(&cred, dir.path().join(".aws/creds")).unwrap();
        let s = resolve(
            &env_of(&[("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/creds")]),
            Some(dir.path()),
        )
        .unwrap();
        assert_eq!(keys(&s).0, "DEF");
        assert!(!format!("{:?}", s.credentials).contains("defsecret"));
    }

    #[test]
    fn oversized_files_and_durations() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'#'; (MAX_FILE_BYTES + 1) as usize]).unwrap();
        let e = resolve(
            &env_of(&[("AWS_SHARED_CREDENTIALS_FILE", big.to_str().unwrap())]),
            None,
        )
        .unwrap_err();
        assert!(e.contains("larger than 1 MiB"), "{e}");
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        for bad in ["", "s", "1h", "-1", "1.5s", "99999999999999999999"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }
}
