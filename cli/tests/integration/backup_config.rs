//! `--config FILE` of `backup run`, `forget`, `verify`, `status` and `list`,
//! and `backup config check`, end to end on the kernel-made fixture image
//! of `014-incremental` (read with `--device`, no root needed): what the
//! jobs store is judged by the kernel's own streams (`restore --stdout`
//! must equal them byte for byte) and the uuids in its dumps; the keys'
//! effects by what each one changes (a full stream where an incremental
//! would be, an entry forgotten, damage found only with read_data, a
//! stale origin); errors by the exact file, line and key; hooks by the
//! environment they record, in order. The S3 variant runs the same job
//! against the test's own S3 server (`repo_store`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::backup_status::{parse_metrics, sample};
use crate::common::{btrsend, fixture_dir, json_lines, keygen, stderr, unpack};
use crate::repo_store::{Backend, Kind};

const FIX: &str = "014-incremental";

/// The kernel's stream `name` of the fixture, decompressed.
fn kernel_stream(name: &str) -> Vec<u8> {
    zstd::decode_all(fs::File::open(fixture_dir(FIX).join(name)).unwrap()).unwrap()
}

/// The snapshot's uuid in the first line of the kernel's dump.
fn kernel_uuid(dump: &str) -> String {
    let text = fs::read_to_string(fixture_dir(FIX).join(dump)).unwrap();
    text.lines()
        .next()
        .unwrap()
        .split_whitespace()
        .find_map(|w| w.strip_prefix("uuid="))
        .unwrap()
        .to_owned()
}

#[track_caller]
fn code(o: &Output, want: i32) {
    assert_eq!(
        o.status.code(),
        Some(want),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&o.stdout),
        stderr(o)
    );
}

/// A test's directory, fixture image, config file and backend.
struct Env {
    dir: tempfile::TempDir,
    img: PathBuf,
    be: Backend,
    config: PathBuf,
}

impl Env {
    fn new(kind: Kind, test: &str) -> Option<Env> {
        let dir = tempfile::tempdir().unwrap();
        let img = unpack(dir.path(), FIX, "dev1.img");
        let be = Backend::new(kind, test, dir.path())?;
        let config = dir.path().join("btrsend.toml");
        fs::create_dir(dir.path().join("home")).unwrap();
        Some(Env {
            dir,
            img,
            be,
            config,
        })
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_owned()
    }

    /// `btrsend backup ARGS`, HOME in the test's directory, no secret
    /// from the environment, pointed at the S3 server if there is one.
    fn cmd(&self) -> Command {
        let mut c = btrsend();
        self.be.apply(&mut c);
        c.env("HOME", self.dir.path().join("home"));
        for v in [
            "XDG_CONFIG_HOME",
            "BTRSEND_PASSWORD",
            "BTRSEND_PASSWORD_FILE",
            "BTRSEND_IDENTITY_FILE",
            "BTRSEND_WRITE_KEY_FILE",
        ] {
            c.env_remove(v);
        }
        c
    }

    fn backup(&self, args: &[&str]) -> Output {
        self.cmd().arg("backup").args(args).output().unwrap()
    }

    /// `backup COMMAND --config FILE ARGS`.
    fn with_config(&self, command: &str, args: &[&str]) -> Output {
        let cfg = self.config.to_str().unwrap();
        let mut all = vec![command, "--config", cfg];
        all.extend_from_slice(args);
        self.backup(&all)
    }

    fn write_config(&self, text: &str) {
        fs::write(&self.config, text).unwrap();
    }

    fn init(&self, repo: &str, extra: &[&str]) {
        let mut args = vec!["init", "--repo", repo];
        if extra.is_empty() {
            args.extend_from_slice(&["--encryption", "none"]);
        }
        args.extend_from_slice(extra);
        code(&self.backup(&args), 0);
    }

    fn list(&self, repo: &str, extra: &[&str]) -> Vec<Value> {
        let mut args = vec!["list", "--repo", repo, "--json"];
        args.extend_from_slice(extra);
        let o = self.backup(&args);
        code(&o, 0);
        serde_json::from_slice::<Value>(&o.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }

    fn restore(&self, repo: &str, snap: &str, extra: &[&str]) -> Vec<u8> {
        let mut args = vec!["restore", "--repo", repo, "--stdout", snap];
        args.extend_from_slice(extra);
        let o = self.backup(&args);
        code(&o, 0);
        o.stdout
    }
}

/// The entries' paths and kinds.
fn kinds(list: &[Value]) -> Vec<(String, String)> {
    list.iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_owned(),
                e["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

/// A job of three destinations in one backend: `inc` (defaults), `full`
/// (full_every = 1, compression_level = 19) and `enc` (a passphrase repo,
/// compression_level = 1, the passphrase from password_file); the run's
/// stored streams are the kernel's, each destination as its keys say.
fn every_run_key(env: Env) {
    let inc = env.be.repo("inc");
    let full = env.be.repo("full");
    let enc = env.be.repo("enc");
    let pass = env.path("pass.txt");
    fs::write(&pass, "correct horse\n").unwrap();
    env.init(&inc.spec, &[]);
    env.init(&full.spec, &[]);
    let o = env
        .cmd()
        .env("BTRSEND_SCRYPT_LOG_N", "10")
        .args([
            "backup",
            "init",
            "--repo",
            &enc.spec,
            "--encryption",
            "passphrase",
        ])
        .args(["--password-file", &pass])
        .output()
        .unwrap();
    code(&o, 0);
    let prom = env.path("run.prom");
    env.write_config(&format!(
        r#"
[run]
metrics_file = "{prom}"

[job.fixture]
device = ["{img}"]
snapshots = ["snaps/s1", "snaps/s2"]

[[job.fixture.destination]]
repo = "{inc}"
retry_lock = "5s"
limit_rate = "100M"

[[job.fixture.destination]]
repo = "{full}"
full_every = 1
full_every_days = 0
compression_level = 19

[[job.fixture.destination]]
repo = "{enc}"
compression_level = 1
password_file = "{pass}"
"#,
        img = env.img.display(),
        inc = inc.spec,
        full = full.spec,
        enc = enc.spec,
    ));
    let o = env.with_config("run", &["--json"]);
    code(&o, 0);
    let lines = json_lines(&String::from_utf8(o.stdout.clone()).unwrap());
    // Every line names its job and destination; the last sums them up.
    let summaries: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message_type"] == "summary")
        .collect();
    assert_eq!(summaries.len(), 3);
    for (s, repo) in summaries.iter().zip([&inc, &full, &enc]) {
        assert_eq!(s["job"], "fixture");
        assert_eq!(s["destination"], repo.spec.as_str());
        assert_eq!(s["stored"], 2, "{s}");
    }
    for l in &lines[..lines.len() - 1] {
        assert_eq!(l["job"], "fixture", "{l}");
    }
    let last = lines.last().unwrap();
    assert_eq!(last["message_type"], "jobs_summary");
    assert_eq!(last["exit_code"], 0);
    assert_eq!(last["jobs"][0]["destinations"].as_array().unwrap().len(), 3);

    // inc: s2 incremental on s1, both the kernel's streams.
    assert_eq!(
        kinds(&env.list(&inc.spec, &[])),
        pairs(&[("snaps/s1", "full"), ("snaps/s2", "incremental")])
    );
    let mut chain = kernel_stream("s1.full.v1.stream.zst");
    chain.extend(kernel_stream("s1--s2.inc.v1.stream.zst"));
    assert!(env.restore(&inc.spec, "snaps/s2", &[]) == chain);
    // full_every = 1: s2 is stored whole, as the kernel's full send of s2.
    let full_list = env.list(&full.spec, &[]);
    assert_eq!(
        kinds(&full_list),
        pairs(&[("snaps/s1", "full"), ("snaps/s2", "full")])
    );
    assert_eq!(full_list[1]["uuid"], kernel_uuid("s2.full.v1.dump"));
    assert!(env.restore(&full.spec, "snaps/s2", &[]) == kernel_stream("s2.full.v1.stream.zst"));
    // The passphrase came from password_file: the repository opens with
    // it, and not without.
    let pf = ["--password-file", pass.as_str()];
    assert_eq!(env.list(&enc.spec, &pf).len(), 2);
    assert!(env.restore(&enc.spec, "snaps/s2", &pf) == chain);
    code(&env.backup(&["list", "--repo", &enc.spec]), 13);
    // compression_level: the same s1 full stream, at 19 smaller than at 3.
    let inc_s1 = env.list(&inc.spec, &[])[0]["stored_bytes"]
        .as_u64()
        .unwrap();
    let full_s1 = full_list[0]["stored_bytes"].as_u64().unwrap();
    assert!(full_s1 < inc_s1, "level 19: {full_s1}, level 3: {inc_s1}");

    // The metrics file: one series per destination, labelled from the file.
    if let Some(s) = parse_metrics("every_run_key", Path::new(&prom)) {
        for repo in [&inc, &full, &enc] {
            let l = [
                ("job", "fixture"),
                ("destination", repo.spec.as_str()),
                ("command", "run"),
            ];
            assert_eq!(sample(&s, "btrsend_last_attempt_exit_status", &l), 0.0);
            sample(&s, "btrsend_last_success_timestamp_seconds", &l);
        }
        let raw = (kernel_stream("s1.full.v1.stream.zst").len()
            + kernel_stream("s1--s2.inc.v1.stream.zst").len()) as f64;
        let l = [("job", "fixture"), ("destination", inc.spec.as_str())];
        assert_eq!(sample(&s, "btrsend_sent_bytes", &l), raw);
    }

    // The command line overrides the file: --full-every 1 makes inc's
    // next stream (s3) full, where the file would make it incremental.
    let o = env.with_config("run", &["--full-every", "1", "snaps/s3"]);
    code(&o, 0);
    let l = env.list(&inc.spec, &[]);
    assert_eq!(l[2]["path"], "snaps/s3");
    assert_eq!(l[2]["kind"], "full");
    assert!(env.restore(&inc.spec, "snaps/s3", &[]) == kernel_stream("s3.full.v1.stream.zst"));
}

mod every_run_key {
    use super::*;
    #[test]
    fn dir() {
        if let Some(env) = Env::new(Kind::Dir, "every_run_key::dir") {
            every_run_key(env);
        }
    }
    #[test]
    fn s3() {
        if let Some(env) = Env::new(Kind::S3, "every_run_key::s3") {
            every_run_key(env);
        }
    }
}

/// forget's keep_* keys per destination, verify's read_data, status's
/// max_age, list, and the command line over each.
#[test]
fn forget_verify_status_list_keys() {
    let env = Env::new(Kind::Dir, "forget_verify_status_list_keys").unwrap();
    let a = env.be.repo("a");
    let b = env.be.repo("b");
    env.init(&a.spec, &[]);
    env.init(&b.spec, &[]);
    env.write_config(&format!(
        r#"
[job.fix]
device = "{img}"
snapshots = "snaps/s*"

[[job.fix.destination]]
repo = "{a}"
full_every = 1
keep_last = 1
max_age = "1h"
read_data = true

[[job.fix.destination]]
repo = "{b}"
full_every = 1
"#,
        img = env.img.display(),
        a = a.spec,
        b = b.spec,
    ));
    code(&env.with_config("run", &[]), 0);
    assert_eq!(env.list(&a.spec, &[]).len(), 3);

    // list: one table per destination, under a header.
    let o = env.with_config("list", &[]);
    code(&o, 0);
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.starts_with(&format!("job fix: {}\n", a.spec)), "{out}");
    assert!(out.contains(&format!("job fix: {}\n", b.spec)), "{out}");
    assert_eq!(out.matches("snaps/s3").count(), 2, "{out}");

    // forget: --keep-last 2 on the command line wins over keep_last = 1
    // (a dry run), then the file's keep_last = 1 keeps s3 alone in a; b,
    // without a policy, is left alone.
    let o = env.with_config("forget", &["--dry-run", "--keep-last", "2", "--json"]);
    code(&o, 0);
    let docs: Vec<Value> = serde_json::Deserializer::from_slice(&o.stdout)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    // The dry run applies --keep-last 2 to both destinations.
    assert_eq!(docs.len(), 3, "{docs:?}");
    for d in &docs[..2] {
        let actions: Vec<&str> = d
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["action"].as_str().unwrap())
            .collect();
        // Newest first: s3, s2 kept, s1 deleted.
        assert_eq!(actions, ["keep", "keep", "delete"]);
    }
    code(&env.with_config("forget", &[]), 0);
    let left = env.list(&a.spec, &[]);
    assert_eq!(kinds(&left), pairs(&[("snaps/s3", "full")]));
    assert_eq!(left[0]["uuid"], kernel_uuid("s3.full.v1.dump"));
    assert_eq!(env.list(&b.spec, &[]).len(), 3);

    // status: the fixture's snapshots are older than an hour: a is stale;
    // b has no max_age. The command line's --max-age wins.
    let o = env.with_config("status", &["--json"]);
    code(&o, 14);
    let docs: Vec<Value> = serde_json::Deserializer::from_slice(&o.stdout)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(docs[0]["destination"], a.spec.as_str());
    assert_eq!(docs[0]["stale"], true);
    assert_eq!(docs[0]["max_age_seconds"], 3600);
    assert_eq!(docs[1]["stale"], false);
    assert_eq!(docs[2]["message_type"], "jobs_summary");
    assert_eq!(docs[2]["exit_code"], 14);
    code(&env.with_config("status", &["--max-age", "1000000h"]), 0);
    // The metrics file: each destination its own exit status and labels.
    let prom = env.path("status.prom");
    code(&env.with_config("status", &["--metrics-file", &prom]), 14);
    if let Some(s) = parse_metrics("forget_verify_status_list_keys", Path::new(&prom)) {
        for (repo, want) in [(&a, 14.0), (&b, 0.0)] {
            let l = [
                ("job", "fix"),
                ("destination", repo.spec.as_str()),
                ("command", "status"),
            ];
            assert_eq!(sample(&s, "btrsend_last_attempt_exit_status", &l), want);
        }
        let origin_stale: Vec<f64> = s
            .iter()
            .filter(|(n, l, _)| n == "btrsend_stale" && l["destination"] == a.spec.as_str())
            .map(|x| x.2)
            .collect();
        assert_eq!(origin_stale, [1.0], "{s:?}");
    }

    // verify: a byte flipped in the middle of a's stream file is found
    // only by reading the data, which read_data = true asks for in a.
    let file = a.files.join(left[0]["file"].as_str().unwrap());
    let mut bytes = fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    fs::write(&file, &bytes).unwrap();
    code(&env.backup(&["verify", "--repo", &a.spec]), 0);
    let o = env.with_config("verify", &[]);
    code(&o, 12);
    let err = stderr(&o);
    assert!(
        err.contains(&format!("job fix, {}: verify found damage", a.spec)),
        "{err}"
    );
    assert!(err.contains("btrsend: error: 1 of 1 jobs failed"), "{err}");
}

/// The hooks' environment and order, a failing `before`, `--job`, and
/// exit statuses across jobs and destinations.
#[test]
fn hooks_jobs_and_exit_statuses() {
    let env = Env::new(Kind::Dir, "hooks_jobs_and_exit_statuses").unwrap();
    let good = env.be.repo("good");
    let missing = env.be.repo("missing");
    env.init(&good.spec, &[]);
    let log = env.path("hooks.log");
    // Each hook appends its name and the variables it was given.
    let rec = format!(
        "echo \"== $BTRSEND_HOOK\" >> {log}; env | grep ^BTRSEND_ | grep -v ^BTRSEND_HOOK= | sort >> {log}"
    );
    env.write_config(&format!(
        r#"
[job.ok]
device = "{img}"
snapshots = "snaps/s1"
before = '{rec}'
after = '{rec}'
on_error = '{rec}'
[[job.ok.destination]]
repo = "{good}"

[job.half]
device = "{img}"
snapshots = "snaps/s1"
after = '{rec}; echo "after-says-hi $(printf %s "$BTRSEND_DESTINATIONS" | tr "\n" ,)"'
on_error = '{rec}'
[[job.half.destination]]
repo = "{missing}"
[[job.half.destination]]
repo = "{good}"

[job.blocked]
device = "{img}"
snapshots = "snaps/s2"
before = '{rec}; exit 7'
after = '{rec}'
on_error = '{rec}'
[[job.blocked.destination]]
repo = "{good}"
"#,
        img = env.img.display(),
        good = good.spec,
        missing = missing.spec,
    ));
    // --job ok: that job alone, its hooks before and after, no on_error.
    let o = env.with_config("run", &["--job", "ok"]);
    code(&o, 0);
    let text = fs::read_to_string(&log).unwrap();
    let cfg = env.config.to_str().unwrap();
    assert_eq!(
        text,
        format!(
            "== before\nBTRSEND_COMMAND=run\nBTRSEND_CONFIG={cfg}\nBTRSEND_DESTINATIONS={g}\nBTRSEND_JOB=ok\n\
             == after\nBTRSEND_COMMAND=run\nBTRSEND_CONFIG={cfg}\nBTRSEND_DESTINATION=\nBTRSEND_DESTINATIONS={g}\nBTRSEND_ERROR=\nBTRSEND_EXIT_STATUS=0\nBTRSEND_FAILED_DESTINATIONS=\nBTRSEND_JOB=ok\nBTRSEND_RESULT=success\n",
            g = good.spec
        )
    );
    assert_eq!(
        kinds(&env.list(&good.spec, &[])),
        pairs(&[("snaps/s1", "full")])
    );
    fs::remove_file(&log).unwrap();

    // --job half --job blocked: half's missing repository fails (10), its
    // other destination succeeds (s1 already stored); blocked's before
    // fails, so s2 is not stored. Exit 3; after runs before on_error.
    let o = env.with_config("run", &["--job", "half", "--job", "blocked", "--json"]);
    code(&o, 3);
    assert_eq!(
        kinds(&env.list(&good.spec, &[])),
        pairs(&[("snaps/s1", "full")])
    );
    let out = String::from_utf8(o.stdout.clone()).unwrap();
    // The hook's standard output went to standard error: stdout is JSON.
    let lines = json_lines(&out);
    // BTRSEND_DESTINATIONS: one repository per line.
    assert!(
        stderr(&o).contains(&format!("after-says-hi {},{}\n", missing.spec, good.spec)),
        "{}",
        stderr(&o)
    );
    let sum = lines.last().unwrap();
    assert_eq!(sum["message_type"], "jobs_summary");
    assert_eq!(sum["exit_code"], 3);
    let jobs = sum["jobs"].as_array().unwrap();
    assert_eq!(jobs[0]["job"], "half");
    assert_eq!(jobs[0]["exit_code"], 3);
    assert_eq!(jobs[0]["destinations"][0]["exit_code"], 10);
    let e = jobs[0]["destinations"][0]["error"].as_str().unwrap();
    assert!(e.contains("repository unreachable"), "{e}");
    assert_eq!(jobs[0]["destinations"][1]["exit_code"], 0);
    assert_eq!(jobs[1]["job"], "blocked");
    assert_eq!(jobs[1]["exit_code"], 1);
    assert_eq!(jobs[1]["hook_failed"], true);
    let text = fs::read_to_string(&log).unwrap();
    let hooks: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("== "))
        .map(|h| (h, ""))
        .collect();
    assert_eq!(
        hooks.iter().map(|h| h.0).collect::<Vec<_>>(),
        ["after", "on_error", "before", "after", "on_error"]
    );
    let half_on_error = text.split("== ").nth(2).unwrap();
    assert!(half_on_error.contains("BTRSEND_JOB=half\n"), "{text}");
    assert!(half_on_error.contains("BTRSEND_RESULT=failure\n"), "{text}");
    assert!(half_on_error.contains("BTRSEND_EXIT_STATUS=3\n"), "{text}");
    assert!(
        half_on_error.contains(&format!("BTRSEND_DESTINATION={}\n", missing.spec)),
        "{text}"
    );
    assert!(
        half_on_error.contains(&format!("BTRSEND_FAILED_DESTINATIONS={}\n", missing.spec)),
        "{text}"
    );
    let blocked_after = text.split("== ").nth(4).unwrap();
    assert!(blocked_after.contains("BTRSEND_JOB=blocked\n"), "{text}");
    assert!(blocked_after.contains("BTRSEND_RESULT=failure\n"), "{text}");
    assert!(
        blocked_after.contains("BTRSEND_ERROR=the before command failed (exit status: 7)\n"),
        "{text}"
    );

    // Every job failing alike: their status (10: the repository missing).
    env.write_config(&format!(
        "[job.x]\ndevice = \"{}\"\nsnapshots = \"snaps/s1\"\n[[job.x.destination]]\nrepo = \"{}\"\n",
        env.img.display(),
        missing.spec
    ));
    let o = env.with_config("run", &[]);
    code(&o, 10);
    let err = stderr(&o);
    assert!(
        err.starts_with(&format!("btrsend: error: job x, {}: ", missing.spec)),
        "{err}"
    );
    assert!(
        err.ends_with(&format!("btrsend: error: 1 of 1 jobs failed ({cfg})\n")),
        "{err}"
    );
    // A --job the file does not have: a usage error naming those it has.
    let o = env.with_config("run", &["--job", "nope"]);
    code(&o, 2);
    assert_eq!(
        stderr(&o),
        format!("btrsend: error: {cfg}: no job nope (jobs: x)\n")
    );
}

/// Errors name the file, line and key; `config check` exit statuses; the
/// default file; --repo and --config exclude each other.
#[test]
fn errors_and_config_check() {
    let env = Env::new(Kind::Dir, "errors_and_config_check").unwrap();
    let cfg = env.config.to_str().unwrap().to_owned();
    let repo = env.path("repo");
    env.init(&repo, &[]);
    let check = |extra: &[&str]| {
        let mut args = vec!["config", "check", "--config", cfg.as_str()];
        args.extend_from_slice(extra);
        env.backup(&args)
    };
    let base = format!(
        "[job.home]\ndevice = \"{}\"\nsnapshots = [\"snaps/s1\"]\n\n[[job.home.destination]]\nrepo = \"{repo}\"\n",
        env.img.display()
    );
    for (extra, want) in [
        (
            "keep_daly = 7\n",
            "7:1: keep_daly: unknown field `keep_daly`, expected one of",
        ),
        (
            "password = \"hunter2\"\n",
            "7:12: password: a secret written inline is refused: use password_file or password_command",
        ),
        ("keep_within = \"forever\"\n", "7:15: keep_within: "),
        (
            "password_file = \"/nonexistent/pass\"\n",
            "7:17: password_file: cannot read /nonexistent/pass: No such file or directory",
        ),
    ] {
        env.write_config(&format!("{base}{extra}"));
        let o = check(&[]);
        code(&o, 2);
        let err = stderr(&o);
        let head = format!("btrsend: error: {cfg}:{want}");
        assert!(err.starts_with(&head), "{err}\nwant: {head}");
        assert!(!err.contains("hunter2"), "{err}");
        // run refuses the file alike, before doing anything (but for the
        // missing password file, which only run's opening finds).
        if !extra.starts_with("password_file") {
            let o = env.with_config("run", &[]);
            code(&o, 2);
            assert!(stderr(&o).starts_with(&head), "{}", stderr(&o));
        }
    }
    assert!(env.list(&repo, &[]).is_empty());

    // A good file: exit 0 and its summary.
    env.write_config(&format!("{base}keep_daily = 7\n"));
    let o = check(&[]);
    code(&o, 0);
    assert_eq!(
        String::from_utf8(o.stdout).unwrap(),
        format!(
            "job home\n  device: {}\n  snapshots: snaps/s1\n  destination {repo}: retention policy\n{cfg}: 1 job, no error\n",
            env.img.display()
        )
    );
    code(&check(&["--quiet"]), 0);
    // An ssh:// repository: check only parses it (it starts no ssh); the
    // commands run the destination's ssh_command.
    let marker = env.path("ssh-ran");
    let fake_ssh = env.path("fake-ssh");
    fs::write(&fake_ssh, format!("#!/bin/sh\ntouch {marker}\nexit 255\n")).unwrap();
    fs::set_permissions(&fake_ssh, fs::Permissions::from_mode(0o755)).unwrap();
    let ssh_dest = format!(
        "[job.home]\ndevice = \"{}\"\nsnapshots = [\"snaps/s1\"]\n\n[[job.home.destination]]\n\
         repo = \"ssh://backup@nas.invalid/srv/home\"\nssh_command = \"{fake_ssh}\"\n",
        env.img.display()
    );
    env.write_config(&ssh_dest);
    code(&check(&["--quiet"]), 0);
    assert!(!Path::new(&marker).exists(), "config check started ssh");
    let o = env.with_config("list", &[]);
    assert!(Path::new(&marker).exists(), "{}", stderr(&o));
    code(&o, 10);
    env.write_config(&ssh_dest.replace("nas.invalid/srv/home", "nas.invalid"));
    let o = check(&[]);
    code(&o, 2);
    assert!(
        stderr(&o).contains("repo: repository \"ssh://backup@nas.invalid\": no path"),
        "{}",
        stderr(&o)
    );
    env.write_config(&format!("{base}keep_daily = 7\n"));
    // An unreadable file: 1.
    let o = env.backup(&["config", "check", "--config", "/nonexistent/b.toml"]);
    code(&o, 1);
    assert!(stderr(&o).contains("cannot read the config file /nonexistent/b.toml"));

    // The default file (BTRSEND_CONFIG stands for /etc/btrsend/btrsend.toml)
    // is read without --repo, and not with it.
    let o = env
        .cmd()
        .env("BTRSEND_CONFIG", &cfg)
        .args(["backup", "run", "--json"])
        .output()
        .unwrap();
    code(&o, 0);
    let lines = json_lines(&String::from_utf8(o.stdout).unwrap());
    assert_eq!(lines.last().unwrap()["config"], cfg.as_str());
    let o = env
        .cmd()
        .env("BTRSEND_CONFIG", &cfg)
        .args(["backup", "list", "--repo", &repo])
        .output()
        .unwrap();
    code(&o, 0);
    assert!(!String::from_utf8(o.stdout).unwrap().contains("job home"));
    let o = env.backup(&["list", "--repo", &repo, "--config", &cfg]);
    code(&o, 2);
    assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
}

/// A repository encrypted for an age recipient: run with the write_key
/// the file names, verify with its identity (identity_file); neither
/// works without.
#[test]
fn write_key_and_identity_keys() {
    let env = Env::new(Kind::Dir, "write_key_and_identity_keys").unwrap();
    let (id, recipient) = keygen(env.dir.path(), "id.txt");
    let repo = env.path("repo");
    let wk = env.path("wk.json");
    env.init(
        &repo,
        &[
            "--encryption",
            "recipients",
            "--recipient",
            &recipient,
            "--write-key",
            &wk,
        ],
    );
    env.write_config(&format!(
        "[job.e]\ndevice = \"{}\"\nsnapshots = \"snaps/s1\"\n[[job.e.destination]]\nrepo = \"{repo}\"\nwrite_key = \"{wk}\"\nidentity_file = \"{}\"\nread_data = true\n",
        env.img.display(),
        id.display()
    ));
    code(
        &env.backup(&[
            "run",
            "--repo",
            &repo,
            "--device",
            env.img.to_str().unwrap(),
            "snaps/s1",
        ]),
        13,
    );
    code(&env.with_config("run", &[]), 0);
    code(&env.with_config("verify", &[]), 0);
    let s1 = env.restore(&repo, "snaps/s1", &["--identity", id.to_str().unwrap()]);
    assert!(s1 == kernel_stream("s1.full.v1.stream.zst"));
    code(
        &env.backup(&["verify", "--repo", &repo, "--read-data", "--write-key", &wk]),
        13,
    );
}

/// Wait for the next second: snapshot names carry the time to the second.
fn next_second() {
    let now = jiff::Timestamp::now();
    let ns = 1_000_000_000 - i64::from(now.subsec_nanosecond());
    std::thread::sleep(std::time::Duration::from_nanos(ns as u64 + 1_000_000));
}

/// The job's snapshot, snapshot_dir and keep_snapshots keys on a
/// loop-mounted btrfs (root): two nights, each taking a read-only snapshot
/// (as `btrfs subvolume show` says), storing it, and keeping the newest
/// one alone; the stored chain restores to the manifest of the kernel
/// mount's snapshot.
#[test]
fn snapshot_keys_on_a_live_btrfs() {
    const TEST: &str = "snapshot_keys_on_a_live_btrfs";
    if !btrsend::testing::require_live(TEST) {
        return;
    }
    let live = btrsend::testing::LiveBtrfs::with_options(1 << 30, &[], "").expect("scratch btrfs");
    let mnt = live.path();
    let sub = mnt.join("home");
    crate::common::sh(
        Command::new("btrfs")
            .args(["-q", "subvolume", "create"])
            .arg(&sub),
    );
    let snaps = mnt.join("snaps");
    fs::create_dir(&snaps).unwrap();
    let env = Env::new(Kind::Dir, TEST).unwrap();
    let repo = env.path("repo");
    env.init(&repo, &[]);
    env.write_config(&format!(
        "[job.live]\nsnapshot = \"{}\"\nsnapshot_dir = \"{}\"\nkeep_snapshots = 1\n[[job.live.destination]]\nrepo = \"{repo}\"\n",
        sub.display(),
        snaps.display()
    ));
    for night in 0..2 {
        crate::backup_forget::change(&sub, night);
        next_second();
        code(&env.with_config("run", &[]), 0);
    }
    let left: Vec<PathBuf> = fs::read_dir(&snaps)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.ends_with(btrsend::backup::holds::HOLDS_DIR))
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    let snap = &left[0];
    assert_eq!(crate::common::subvolume_show(snap, "Flags"), "readonly");
    let list = env.list(&repo, &[]);
    assert_eq!(list.len(), 2);
    let name = snap.file_name().unwrap().to_str().unwrap();
    assert_eq!(list[1]["path"], format!("snaps/{name}"));
    assert_eq!(list[1]["kind"], "incremental");
    let to = env.dir.path().join("restored");
    fs::create_dir(&to).unwrap();
    code(
        &env.backup(&[
            "restore",
            "--repo",
            &repo,
            &format!("snaps/{name}"),
            "--to",
            to.to_str().unwrap(),
        ]),
        0,
    );
    let opts = btrsend::manifest::Options::default();
    assert_eq!(
        btrsend::manifest::manifest(&to.join(name), opts).unwrap(),
        btrsend::manifest::manifest(snap, opts).unwrap()
    );
}

/// A job with a repository and a received-subvolume target (a directory
/// here: received as directories with records unless it is on btrfs as
/// root): `run --config` fills both, the target's copies have the
/// kernel's manifests; list, status and forget reach the target, verify
/// skips it; keys only a repository takes are refused at the target.
#[test]
fn a_target_destination() {
    let env = Env::new(Kind::Dir, "a_target_destination").unwrap();
    let repo = env.path("repo");
    let target = env.path("target");
    fs::create_dir(&target).unwrap();
    env.init(&repo, &[]);
    let base = format!(
        "[job.j]\ndevice = \"{}\"\nsnapshots = [\"snaps/s1\", \"snaps/s2\"]\n\
         [[job.j.destination]]\nrepo = \"{repo}\"\n\
         [[job.j.destination]]\ntarget = \"{target}\"\nkeep_last = 1\nmax_age = \"1h\"\n",
        env.img.display()
    );
    env.write_config(&base);
    let o = env.with_config("run", &["--json"]);
    code(&o, 0);
    let lines = json_lines(&String::from_utf8(o.stdout).unwrap());
    let received: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message_type"] == "received")
        .collect();
    assert_eq!(received.len(), 2, "{lines:?}");
    assert!(received.iter().all(|l| l["destination"] == target.as_str()));
    assert_eq!(received[1]["kind"], "incremental", "{lines:?}");
    assert_eq!(kinds(&env.list(&repo, &[])).len(), 2);
    for s in ["s1", "s2"] {
        let want = fs::read_to_string(fixture_dir(FIX).join(format!("{s}.manifest"))).unwrap();
        let got = btrsend::manifest::manifest(
            &Path::new(&target).join(s),
            btrsend::manifest::Options::default(),
        )
        .unwrap();
        let (want, got) = (
            btrsend::manifest::strip_holes(&want),
            btrsend::manifest::strip_holes(&got),
        );
        assert!(
            btrsend::manifest::diff(&want, &got, 20).is_none(),
            "{s}: {}",
            btrsend::manifest::diff(&want, &got, 20).unwrap_or_default()
        );
    }
    let o = env.with_config("status", &["--json"]);
    code(&o, 0);
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(
        text.contains(&format!("\"target\": \"{target}\"")),
        "{text}"
    );
    let o = env.with_config("list", &["--json"]);
    code(&o, 0);
    let o = env.with_config("verify", &[]);
    code(&o, 0);
    let o = env.with_config("forget", &["--json"]);
    code(&o, 0);
    let names: Vec<String> = fs::read_dir(&target)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert_eq!(names, ["s2"], "the target after forget --keep-last 1");
    // A key only a repository takes, and a destination with both.
    for (extra, want) in [
        (
            "compression_level = 5\n",
            "compression_level applies to a repository, not to a target",
        ),
        (
            &format!("repo = \"{repo}\"\n")[..],
            "a destination has either repo or target",
        ),
    ] {
        env.write_config(&format!("{base}{extra}"));
        let o = env.with_config("run", &[]);
        code(&o, 2);
        assert!(stderr(&o).contains(want), "{}", stderr(&o));
    }
}

/// limit_rate and retry_lock given in the file take effect. limit_rate
/// "1K" is 1024 bytes per second (the README: K as curl reads it): a dry
/// run says so for that destination alone, and that the job's streams (the
/// kernel's own s1 and s1→s2, whose lengths are the raw total) take their
/// length over 1024 seconds at it. retry_lock: with both destinations'
/// locks held, the one with retry_lock = "30s" waits until its lock is
/// released two seconds later and stores the job; the one without fails
/// at once with exit status 11 (lock held); the run's status is 3.
#[test]
fn limit_rate_and_retry_lock_keys_take_effect() {
    let env = Env::new(Kind::Dir, "limit_rate_retry_lock").unwrap();
    let (a, b) = (env.be.repo("a"), env.be.repo("b"));
    env.init(&a.spec, &[]);
    env.init(&b.spec, &[]);
    let config = |a_keys: &str| {
        format!(
            "[job.fixture]\ndevice = [\"{img}\"]\nsnapshots = [\"snaps/s1\", \"snaps/s2\"]\n\
             [[job.fixture.destination]]\nrepo = \"{a}\"\n{a_keys}\n\
             [[job.fixture.destination]]\nrepo = \"{b}\"\n",
            img = env.img.display(),
            a = a.spec,
            b = b.spec,
        )
    };
    env.write_config(&config("limit_rate = \"1K\""));
    let o = env.with_config("run", &["--dry-run", "--json"]);
    code(&o, 0);
    let lines = json_lines(&String::from_utf8(o.stdout).unwrap());
    let totals: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message_type"] == "dry_run_total")
        .collect();
    assert_eq!(totals.len(), 2, "{lines:?}");
    let raw = (kernel_stream("s1.full.v1.stream.zst").len()
        + kernel_stream("s1--s2.inc.v1.stream.zst").len()) as u64;
    assert_eq!(totals[0]["destination"], a.spec.as_str());
    assert_eq!(totals[0]["stream_bytes"], raw);
    assert_eq!(totals[0]["limit_rate"], 1024);
    assert_eq!(totals[0]["seconds_at_limit_rate"], raw.div_ceil(1024));
    assert_eq!(totals[1]["destination"], b.spec.as_str());
    assert!(totals[1]["limit_rate"].is_null(), "{}", totals[1]);
    assert!(totals[1]["seconds_at_limit_rate"].is_null());

    env.write_config(&config("retry_lock = \"30s\""));
    let hold = |r: &crate::repo_store::TestRepo| {
        let f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(r.files.join("lock"))
            .unwrap();
        f.lock().unwrap();
        f
    };
    let (lock_a, _lock_b) = (hold(&a), hold(&b));
    let start = std::time::Instant::now();
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(2));
        drop(lock_a);
    });
    let o = env.with_config("run", &["--json"]);
    release.join().unwrap();
    code(&o, 3);
    assert!(start.elapsed() >= std::time::Duration::from_secs(2));
    let lines = json_lines(&String::from_utf8(o.stdout).unwrap());
    let dests = &lines.last().unwrap()["jobs"][0]["destinations"];
    assert_eq!(dests[0]["exit_code"], 0, "{lines:?}");
    assert_eq!(dests[1]["exit_code"], 11, "{lines:?}");
    assert_eq!(env.list(&a.spec, &[]).len(), 2);
    assert!(env.list(&b.spec, &[]).is_empty());
}
