//! Issue 29 ("an admin's first week"), its S3 items, through the CLI
//! against the real test server (`s3s-fs`): credentials from the AWS
//! tools' profile files, one clear line for no credentials, a wrong key, a
//! wrong secret and a missing bucket, a retry policy that survives a
//! network blip, and checksum headers on every upload (what buckets with
//! Object Lock require; `s3s-fs` has no Object Lock, so the requests are
//! checked as they pass through a recording proxy, and the server checks
//! each PUT's checksum against its body).
//!
//! Every command runs with a cleared environment (plus `HOME` in the
//! test's directory), so no `AWS_*` variable or `~/.aws` of the machine
//! that runs the tests takes part.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{stderr, unpack};
use crate::repo_store::S3Server;
use crate::s3_proxy::Proxy;

const FIX: &str = "014-incremental";

/// A test's S3 server, its directory and an empty home directory.
struct S3 {
    dir: tempfile::TempDir,
    server: S3Server,
    home: PathBuf,
}

impl S3 {
    fn new(test: &str) -> Option<S3> {
        let dir = tempfile::tempdir().unwrap();
        let server = S3Server::start(test, &dir.path().join("s3"))?;
        let home = dir.path().join("home");
        std::fs::create_dir(&home).unwrap();
        Some(S3 { dir, server, home })
    }

    /// `btrsend` with nothing of this machine's environment: `HOME` is the
    /// test's, and no `AWS_*` variable is set.
    fn bare(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_btrsend"));
        c.env_clear()
            .env("TZ", "UTC")
            .env("HOME", &self.home)
            .stdin(Stdio::null());
        c
    }

    /// `btrsend` with the server's endpoint and region but no keys.
    fn no_keys(&self) -> Command {
        let mut c = self.bare();
        c.env("AWS_ENDPOINT_URL", self.endpoint())
            .env("AWS_REGION", "us-east-1");
        c
    }

    /// `btrsend` with the server's keys in the environment, through
    /// `endpoint`.
    fn keyed(&self, endpoint: &str) -> Command {
        let (id, secret) = S3Server::keys();
        let mut c = self.no_keys();
        c.env("AWS_ENDPOINT_URL", endpoint)
            .env("AWS_ACCESS_KEY_ID", id)
            .env("AWS_SECRET_ACCESS_KEY", secret);
        c
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.server.port())
    }

    fn repo(name: &str) -> String {
        format!("s3://{}/{name}", S3Server::bucket())
    }

    /// Where the repository `name`'s objects lie as files.
    fn files(&self, name: &str) -> PathBuf {
        self.dir
            .path()
            .join("s3")
            .join(S3Server::bucket())
            .join(name)
    }
}

fn run(c: &mut Command) -> Output {
    c.output().expect("run btrsend")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        stderr(out)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// The one line a failed command printed, which must start with `start`,
/// with exit status `code`; it never holds XML from the server, nor the
/// secret key.
fn one_line_error(out: &Output, code: i32, start: &str) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with(start), "{err}");
    assert!(!err.contains('<'), "no XML: {err}");
    assert!(!err.contains(S3Server::keys().1), "no secret: {err}");
    err
}

#[test]
fn issue_29_s3_credentials_come_from_the_aws_profile_files() {
    let Some(t) = S3::new("issue_29_s3_credentials_come_from_the_aws_profile_files") else {
        return;
    };
    let (id, secret) = S3Server::keys();
    let repo = S3::repo("a");

    // ~/.aws/credentials, profile default.
    std::fs::create_dir(t.home.join(".aws")).unwrap();
    std::fs::write(
        t.home.join(".aws/credentials"),
        format!("# made by aws configure\n[default]\naws_access_key_id = {id}\naws_secret_access_key = {secret}\n"),
    )
    .unwrap();
    ok(&run(t.no_keys().args([
        "backup",
        "init",
        "--repo",
        &repo,
        "--encryption",
        "none",
    ])));
    assert!(t.files("a").join("config").is_file());

    // AWS_PROFILE in files named by AWS_SHARED_CREDENTIALS_FILE and
    // AWS_CONFIG_FILE; the endpoint and region come from the config
    // profile (no AWS_ENDPOINT_URL, no AWS_REGION). Its default profile has
    // keys the server does not know: they are not used.
    let creds = t.dir.path().join("creds");
    let conf = t.dir.path().join("conf");
    std::fs::write(
        &creds,
        format!(
            "[default]\naws_access_key_id = NOBODY\naws_secret_access_key = nothing\n\n\
             [nightly]\naws_access_key_id = {id}\naws_secret_access_key = {secret}\n"
        ),
    )
    .unwrap();
    std::fs::write(
        &conf,
        format!(
            "[profile nightly]\nregion = us-east-1\nendpoint_url = {}\n",
            t.endpoint()
        ),
    )
    .unwrap();
    let with_files = |c: &mut Command| {
        c.env("AWS_SHARED_CREDENTIALS_FILE", &creds)
            .env("AWS_CONFIG_FILE", &conf);
    };
    let mut c = t.bare();
    with_files(&mut c);
    c.env("AWS_PROFILE", "nightly")
        .args(["backup", "list", "--repo", &repo, "--json"]);
    assert_eq!(ok(&run(&mut c)).trim(), "[]");

    // The environment's keys come first (as for the AWS tools), even with
    // AWS_PROFILE set.
    let mut c = t.bare();
    with_files(&mut c);
    c.env("AWS_PROFILE", "nightly")
        .env("AWS_ACCESS_KEY_ID", "NOBODY")
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .args(["backup", "list", "--repo", &repo]);
    let err = one_line_error(&run(&mut c), 1, "btrsend: error: s3://btrsend-test/a: ");
    assert!(
        err.contains("does not know the access key id (NotSignedUp) from the environment"),
        "{err}"
    );

    // A profile that is in neither file.
    let mut c = t.bare();
    with_files(&mut c);
    c.env("AWS_PROFILE", "nigthly")
        .args(["backup", "list", "--repo", &repo]);
    let err = one_line_error(&run(&mut c), 1, "btrsend: error: s3://btrsend-test/a: ");
    assert!(
        err.contains("the profile \"nigthly\" (AWS_PROFILE) is neither in")
            && err.contains(creds.to_str().unwrap()),
        "{err}"
    );
}

#[test]
fn issue_29_s3_without_credentials_says_what_to_set_at_once() {
    let Some(t) = S3::new("issue_29_s3_without_credentials_says_what_to_set_at_once") else {
        return;
    };
    // Through a recording proxy: no request may be made.
    let proxy = Proxy::start(t.server.port());
    let started = Instant::now();
    let out = run(t
        .bare()
        .env(
            "AWS_ENDPOINT_URL",
            format!("http://127.0.0.1:{}", proxy.port()),
        )
        .args([
            "backup",
            "init",
            "--repo",
            &S3::repo("a"),
            "--encryption",
            "none",
        ]));
    let err = one_line_error(
        &out,
        1,
        "btrsend: error: s3://btrsend-test/a: no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or ",
    );
    assert!(
        err.contains(&format!("{}/.aws/credentials", t.home.display()))
            && err.contains("AWS_PROFILE"),
        "{err}"
    );
    assert!(!err.contains("169.254"), "{err}");
    // Not the instance metadata service's wait (seconds per attempt): the
    // bound is loose, the point is that nothing is waited for.
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(proxy.requests().is_empty(), "{:?}", proxy.requests());
}

#[test]
fn issue_29_s3_wrong_key_wrong_secret_and_missing_bucket_are_one_clear_line() {
    let Some(t) =
        S3::new("issue_29_s3_wrong_key_wrong_secret_and_missing_bucket_are_one_clear_line")
    else {
        return;
    };
    let (id, secret) = S3Server::keys();
    let repo = S3::repo("a");
    ok(&run(t.keyed(&t.endpoint()).args([
        "backup",
        "init",
        "--repo",
        &repo,
        "--encryption",
        "none",
    ])));

    // A key id the server does not know: exit 1, not "unreachable" (10).
    let out = run(t
        .no_keys()
        .env("AWS_ACCESS_KEY_ID", "AKIAUNKNOWN")
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .args(["backup", "list", "--repo", &repo]));
    let err = one_line_error(&out, 1, "btrsend: error: s3://btrsend-test/a: ");
    // (s3s-fs says NotSignedUp where AWS says InvalidAccessKeyId.)
    assert!(
        err.contains(
            "the S3 server does not know the access key id (NotSignedUp) from the environment"
        ),
        "{err}"
    );
    assert!(!err.contains("unreachable"), "{err}");

    // The right key id with a wrong secret.
    let out = run(t
        .no_keys()
        .env("AWS_ACCESS_KEY_ID", id)
        .env("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        .args(["backup", "list", "--repo", &repo]));
    let err = one_line_error(&out, 1, "btrsend: error: s3://btrsend-test/a: ");
    assert!(
        err.contains("SignatureDoesNotMatch")
            && err.contains("the secret access key from the environment"),
        "{err}"
    );
    assert!(!err.contains("not-the-secret"), "{err}");

    // A bucket that does not exist: the repository is missing (exit 10),
    // for init as for list.
    for sub in [&["init", "--encryption", "none"][..], &["list"]] {
        let out = run(t
            .keyed(&t.endpoint())
            .arg("backup")
            .args(sub)
            .args(["--repo", "s3://no-such-bucket/a"]));
        let err = one_line_error(&out, 10, "btrsend: error: s3://no-such-bucket/a: ");
        assert!(
            err.contains("bucket \"no-such-bucket\" does not exist: create it first"),
            "{err}"
        );
    }
    // A bucket name S3 refuses.
    let out = run(t
        .keyed(&t.endpoint())
        .args(["backup", "list", "--repo", "s3://ab/a"]));
    let err = one_line_error(&out, 1, "btrsend: error: s3://ab/a: ");
    assert!(err.contains("\"ab\" is not a valid bucket name"), "{err}");
}

#[test]
fn issue_29_s3_requests_are_retried_through_a_network_blip() {
    let Some(mut t) = S3::new("issue_29_s3_requests_are_retried_through_a_network_blip") else {
        return;
    };
    let img = unpack(t.dir.path(), FIX, "dev1.img");
    let img = img.to_str().unwrap();
    let repo = S3::repo("a");
    let proxy = Proxy::start(t.server.port());
    let via_proxy = format!("http://127.0.0.1:{}", proxy.port());
    ok(&run(t.keyed(&via_proxy).args([
        "backup",
        "init",
        "--repo",
        &repo,
        "--encryption",
        "none",
    ])));

    // The network goes away for 3 seconds when the first part of the first
    // stream is sent (every connection dropped, new ones refused): the run
    // retries and completes with the default policy.
    proxy.blip_at("PUT", "partNumber=", Duration::from_secs(3));
    let out = run(t.keyed(&via_proxy).args([
        "backup", "run", "--repo", &repo, "--device", img, "snaps/s1", "snaps/s2", "snaps/s3",
    ]));
    ok(&out);
    let (start, end) = proxy.blipped().expect("the blip happened");
    assert_eq!(end - start, Duration::from_secs(3));
    assert!(proxy.requests_after_blip() > 0);
    let list = ok(&run(t
        .keyed(&t.endpoint())
        .args(["backup", "list", "--repo", &repo, "--json"])));
    let entries: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(entries.as_array().unwrap().len(), 3, "{list}");
    ok(&run(t.keyed(&t.endpoint()).args([
        "backup",
        "verify",
        "--repo",
        &repo,
        "--read-data",
    ])));

    // The server itself stops and comes back 3 seconds later.
    t.server.stop();
    let child = t
        .keyed(&t.endpoint())
        .args(["backup", "list", "--repo", &repo, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    t.server.start_again();
    let out = child.wait_with_output().unwrap();
    assert_eq!(ok(&out), list);

    // With a short retry timeout a server that stays away is unreachable:
    // exit 10, with where and for how long.
    t.server.stop();
    let started = Instant::now();
    let out = run(t
        .keyed(&t.endpoint())
        .env("BTRSEND_S3_RETRY_TIMEOUT", "2s")
        .args(["backup", "list", "--repo", &repo]));
    assert!(started.elapsed() >= Duration::from_secs(2));
    let err = one_line_error(
        &out,
        10,
        "btrsend: error: s3://btrsend-test/a: repository unreachable: ",
    );
    assert!(
        err.contains(&format!("cannot reach {}: ", t.endpoint()))
            && err.contains("retried for 2s; BTRSEND_S3_RETRY_TIMEOUT sets how long"),
        "{err}"
    );
    // A retry timeout that is no duration is refused.
    let out = run(t
        .keyed(&t.endpoint())
        .env("BTRSEND_S3_RETRY_TIMEOUT", "soon")
        .args(["backup", "list", "--repo", &repo]));
    let err = one_line_error(&out, 1, "btrsend: error: s3://btrsend-test/a: ");
    assert!(
        err.contains("BTRSEND_S3_RETRY_TIMEOUT=soon: not a duration"),
        "{err}"
    );
}

#[test]
fn issue_29_s3_every_upload_carries_its_sha256_checksum() {
    let Some(t) = S3::new("issue_29_s3_every_upload_carries_its_sha256_checksum") else {
        return;
    };
    let img = unpack(t.dir.path(), FIX, "dev1.img");
    let repo = S3::repo("a");
    let proxy = Proxy::start(t.server.port());
    let via_proxy = format!("http://127.0.0.1:{}", proxy.port());
    ok(&run(t.keyed(&via_proxy).args([
        "backup",
        "init",
        "--repo",
        &repo,
        "--encryption",
        "none",
    ])));
    ok(&run(t.keyed(&via_proxy).args([
        "backup",
        "run",
        "--repo",
        &repo,
        "--device",
        img.to_str().unwrap(),
        "snaps/s1",
        "snaps/s2",
        "snaps/s3",
    ])));
    let requests = proxy.requests();
    let (mut objects, mut parts, mut uploads) = (0, 0, 0);
    for r in &requests {
        match r.method.as_str() {
            // PutObject and UploadPart: the body's SHA-256, as S3 with
            // Object Lock requires (or Content-MD5, which object_store
            // does not send).
            "PUT" => {
                assert_eq!(
                    r.header("x-amz-checksum-sha256"),
                    r.body_sha256.as_deref(),
                    "{} {}: {:?}",
                    r.method,
                    r.target,
                    r.headers
                );
                if r.target.contains("partNumber=") {
                    parts += 1;
                } else {
                    objects += 1;
                }
            }
            // CreateMultipartUpload declares the algorithm of its parts.
            "POST" if r.target.contains("?uploads") => {
                assert_eq!(r.header("x-amz-checksum-algorithm"), Some("SHA256"));
                uploads += 1;
            }
            _ => {}
        }
    }
    // config, catalogs, lock objects, markers; a stream each.
    assert!(objects >= 5, "{objects} objects: {requests:#?}");
    assert_eq!(uploads, 3, "{requests:#?}");
    assert!(parts >= 3, "{parts} parts");
    assert!(
        Path::new(&t.files("a")).join("config").is_file(),
        "the server took the checksummed PUTs"
    );
}
