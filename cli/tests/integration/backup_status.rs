//! `btrsend backup status` end to end, on directory repositories filled by
//! `backup import` of kernel streams (no root needed): exit statuses for
//! fresh, stale and empty repositories, several origins, an encrypted
//! repository read with its write key alone, the `--json` keys, and
//! hostile origin names; and the `--metrics-file` of status, run, forget
//! and verify, read back by the Prometheus client library's own parser
//! (python3-prometheus-client). Expected times are the ones the test gave to
//! `import`, sizes those of the stream files on disk.

use std::fs;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use serde_json::Value;

use crate::common::{btrsend, fixture_dir, ok, stderr, unpack};

/// `btrsend backup ARGS…` with HOME at `home` (where `init` keeps a write
/// key) and no secret from the environment.
fn backup(home: &Path, args: &[&str]) -> Output {
    let mut c = btrsend();
    c.arg("backup").args(args).env("HOME", home);
    for v in [
        "XDG_CONFIG_HOME",
        "BTRSEND_PASSWORD",
        "BTRSEND_PASSWORD_FILE",
        "BTRSEND_IDENTITY_FILE",
        "BTRSEND_WRITE_KEY_FILE",
    ] {
        c.env_remove(v);
    }
    c.output().unwrap()
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

struct Repo {
    dir: tempfile::TempDir,
    spec: String,
}

impl Repo {
    fn new() -> Repo {
        let dir = tempfile::tempdir().unwrap();
        let spec = dir.path().join("repo").to_str().unwrap().to_owned();
        let r = Repo { dir, spec };
        ok(&r.backup(&["init", "--repo", &r.spec, "--encryption", "none"]));
        r
    }

    fn home(&self) -> std::path::PathBuf {
        let h = self.dir.path().join("home");
        fs::create_dir_all(&h).unwrap();
        h
    }

    fn backup(&self, args: &[&str]) -> Output {
        backup(&self.home(), args)
    }

    fn import(&self, time: &str, origin: &str, fixture: &str, file: &str) {
        let path = fixture_dir(fixture).join(file);
        ok(&self.backup(&[
            "import",
            "--repo",
            &self.spec,
            "--time",
            time,
            "--origin",
            origin,
            path.to_str().unwrap(),
        ]));
    }

    fn status(&self, extra: &[&str]) -> Output {
        let mut args = vec!["status", "--repo", self.spec.as_str()];
        args.extend(extra);
        self.backup(&args)
    }

    fn status_json(&self, extra: &[&str], want: i32) -> Value {
        let mut args = vec!["--json"];
        args.extend(extra);
        let o = self.status(&args);
        code(&o, want);
        serde_json::from_slice(&o.stdout).unwrap()
    }

    /// The sizes of the stream files on disk.
    fn stream_sizes(&self) -> Vec<u64> {
        let mut v: Vec<u64> = fs::read_dir(Path::new(&self.spec).join("streams"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .collect();
        v.sort_unstable();
        v
    }
}

/// Now, to the second, in RFC 3339 UTC.
fn now() -> jiff::Timestamp {
    jiff::Timestamp::from_second(jiff::Timestamp::now().as_second()).unwrap()
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    k.sort_unstable();
    k
}

#[test]
fn status_several_origins_fresh_and_stale() {
    let r = Repo::new();
    let fresh = now();
    let old = "2024-06-01T10:00:00Z";
    r.import(
        "2025-01-01T10:00:00Z",
        "home",
        "014-incremental",
        "s1.full.v1.stream.zst",
    );
    r.import(
        &fresh.to_string(),
        "home",
        "014-incremental",
        "s1--s2.inc.v1.stream.zst",
    );
    r.import(old, "other", "015-clone-sources", "a1.full.v1.stream.zst");
    let sizes = r.stream_sizes();
    assert_eq!(sizes.len(), 3);

    // "other" is two years old: stale for a day's limit.
    let v = r.status_json(&["--max-age", "24h"], 14);
    assert_eq!(
        keys(&v),
        [
            "checked_at",
            "entries",
            "generation",
            "max_age_seconds",
            "origins",
            "repository",
            "stale",
            "stored_bytes"
        ]
    );
    assert_eq!(v["repository"], r.spec.as_str());
    assert_eq!(v["entries"], 3);
    assert_eq!(v["stale"], true);
    assert_eq!(v["max_age_seconds"], 86400);
    assert_eq!(v["stored_bytes"], sizes.iter().sum::<u64>());
    let checked: jiff::Timestamp = v["checked_at"].as_str().unwrap().parse().unwrap();
    let origins = v["origins"].as_array().unwrap();
    assert_eq!(origins.len(), 2);
    let (home, other) = (&origins[0], &origins[1]);
    assert_eq!(
        keys(home),
        [
            "age_seconds",
            "chain_length",
            "entries",
            "healthy",
            "newest",
            "origin",
            "problem",
            "stale",
            "stored_bytes"
        ]
    );
    assert_eq!(
        keys(&home["newest"]),
        ["id", "kind", "path", "stored_at", "time", "uuid"]
    );
    assert_eq!(home["origin"], "home");
    assert_eq!(home["entries"], 2);
    assert_eq!(home["newest"]["path"], "s2");
    assert_eq!(home["newest"]["kind"], "incremental");
    assert_eq!(home["newest"]["time"], fresh.to_string());
    assert_eq!(home["chain_length"], 2);
    assert_eq!(home["healthy"], true);
    assert_eq!(home["problem"], Value::Null);
    assert_eq!(home["stale"], false);
    let age = checked.as_second() - fresh.as_second();
    assert_eq!(home["age_seconds"], age);
    assert_eq!(other["origin"], "other");
    assert_eq!(other["newest"]["path"], "a1");
    assert_eq!(other["chain_length"], 1);
    assert_eq!(other["stale"], true);
    let old_t: jiff::Timestamp = old.parse().unwrap();
    assert_eq!(
        other["age_seconds"],
        checked.as_second() - old_t.as_second()
    );
    // Sizes: the two origins' together are every file's.
    let per_origin =
        home["stored_bytes"].as_u64().unwrap() + other["stored_bytes"].as_u64().unwrap();
    assert_eq!(per_origin, sizes.iter().sum::<u64>());
    assert!(sizes.contains(&other["stored_bytes"].as_u64().unwrap()));

    // For cron: stale is one line per stale origin on stderr, nothing on
    // stdout.
    let o = r.status(&["--max-age", "24h"]);
    code(&o, 14);
    assert!(o.stdout.is_empty());
    let err = stderr(&o);
    assert!(err.contains("stale: origin other"), "{err}");
    assert!(!err.contains("origin home"), "{err}");
    // A limit beyond both ages, and none at all: exit 0, silent.
    let o = r.status(&["--max-age", "100000h"]);
    code(&o, 0);
    assert!(o.stdout.is_empty() && o.stderr.is_empty(), "{}", stderr(&o));
    code(&r.status(&[]), 0);
    let v = r.status_json(&[], 0);
    assert_eq!(v["max_age_seconds"], Value::Null);
    assert_eq!(v["stale"], false);
}

#[test]
fn status_goes_stale_with_time() {
    let r = Repo::new();
    r.import(
        &now().to_string(),
        "home",
        "014-incremental",
        "s1.full.v1.stream.zst",
    );
    code(&r.status(&["--max-age", "1h"]), 0);
    std::thread::sleep(Duration::from_millis(2100));
    let o = r.status(&["--max-age", "1s"]);
    code(&o, 14);
    assert!(stderr(&o).contains("stale: origin home"), "{}", stderr(&o));
    code(&r.status(&["--max-age", "1h"]), 0);
}

#[test]
fn status_of_an_empty_repository() {
    let r = Repo::new();
    // Nothing stored: nothing to be stale without a limit, stale with one.
    code(&r.status(&[]), 0);
    let o = r.status(&["--max-age", "24h"]);
    code(&o, 14);
    assert!(stderr(&o).contains("no backup stored"), "{}", stderr(&o));
    let v = r.status_json(&["--max-age", "24h"], 14);
    assert_eq!(v["origins"], Value::Array(Vec::new()));
    assert_eq!(
        (v["entries"].as_u64(), v["stale"].as_bool()),
        (Some(0), Some(true))
    );
    // A repository that is not one: exit 10, as for the other commands.
    let missing = r.dir.path().join("nothing");
    let o = backup(
        &r.home(),
        &[
            "status",
            "--repo",
            missing.to_str().unwrap(),
            "--max-age",
            "1h",
        ],
    );
    code(&o, 10);
}

#[test]
fn status_escapes_hostile_origins() {
    let r = Repo::new();
    let origin = "evil\u{1b}]0;owned\u{7}\n\"x\\";
    r.import(
        "2024-06-01T10:00:00Z",
        origin,
        "014-incremental",
        "s1.full.v1.stream.zst",
    );
    let o = r.status(&["--max-age", "1h"]);
    code(&o, 14);
    let err = stderr(&o);
    assert!(!err.chars().any(|c| c.is_control() && c != '\n'), "{err:?}");
    assert_eq!(err.lines().count(), 2, "{err:?}");
    assert!(err.contains("evil\\x1b]0;owned\\x07\\n\"x\\"), "{err:?}");
    // JSON keeps the exact name.
    let v = r.status_json(&[], 0);
    assert_eq!(v["origins"][0]["origin"], origin);
}

#[test]
fn status_of_an_encrypted_repository_with_the_write_key_alone() {
    const TEST: &str = "status_of_an_encrypted_repository_with_the_write_key_alone";
    let dir = tempfile::tempdir().unwrap();
    let id = dir.path().join("id.txt");
    let Ok(kg) = std::process::Command::new("age-keygen")
        .arg("-o")
        .arg(&id)
        .output()
    else {
        btrsend::testing::skip_or_fail(TEST, "needs age-keygen (apt-get install age)");
        return;
    };
    assert!(kg.status.success(), "{}", stderr(&kg));
    let recipient = fs::read_to_string(&id)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("# public key: ").map(str::to_owned))
        .unwrap();
    let home = dir.path().join("home");
    fs::create_dir(&home).unwrap();
    let repo = dir.path().join("repo");
    let repo = repo.to_str().unwrap();
    ok(&backup(
        &home,
        &[
            "init",
            "--repo",
            repo,
            "--encryption",
            "recipients",
            "--recipient",
            &recipient,
        ],
    ));
    let t = now();
    let stream = fixture_dir("014-incremental").join("s1.full.v1.stream.zst");
    ok(&backup(
        &home,
        &[
            "import",
            "--repo",
            repo,
            "--time",
            &t.to_string(),
            "--origin",
            "home",
            stream.to_str().unwrap(),
        ],
    ));
    // The write key under HOME reads the catalog.
    let o = backup(
        &home,
        &["status", "--repo", repo, "--max-age", "1h", "--json"],
    );
    code(&o, 0);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["origins"][0]["newest"]["time"], t.to_string());
    assert_eq!(v["origins"][0]["healthy"], true);
    // Without any key: exit 13, as list.
    let empty = dir.path().join("empty-home");
    fs::create_dir(&empty).unwrap();
    code(&backup(&empty, &["status", "--repo", repo]), 13);
}

/// Python's parser prints the samples as JSON lines:
/// `[name, {labels}, value]`.
const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
for fam in text_string_to_metric_families(open(sys.argv[1], encoding="utf-8").read()):
    assert fam.type == "gauge", fam
    for s in fam.samples:
        print(json.dumps([s.name, s.labels, s.value]))
"#;

/// The samples of a metrics file as the Prometheus client library parses
/// it, or `None` (said loudly) when it is not installed.
pub(crate) fn parse_metrics(test: &str, file: &Path) -> Option<Vec<(String, Value, f64)>> {
    // The first python3 that has it: the one on PATH (which may be a
    // pyenv of its own), else the system's, where apt installs it.
    let Some(python) = ["python3", "/usr/bin/python3"].into_iter().find(|p| {
        std::process::Command::new(p)
            .args(["-c", "import prometheus_client.parser"])
            .output()
            .is_ok_and(|o| o.status.success())
    }) else {
        btrsend::testing::skip_or_fail(
            test,
            "needs python3 with prometheus_client (apt-get install python3-prometheus-client)",
        );
        return None;
    };
    let o = std::process::Command::new(python)
        .args(["-c", PARSE])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "the parser refused {}: {}",
        file.display(),
        stderr(&o)
    );
    Some(
        String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                (
                    v[0].as_str().unwrap().to_owned(),
                    v[1].clone(),
                    v[2].as_f64().unwrap(),
                )
            })
            .collect(),
    )
}

/// The value of `name` whose labels include every pair of `labels`; it
/// must be the only one.
#[track_caller]
pub(crate) fn sample(samples: &[(String, Value, f64)], name: &str, labels: &[(&str, &str)]) -> f64 {
    let hits: Vec<f64> = samples
        .iter()
        .filter(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l[*k] == *v))
        .map(|s| s.2)
        .collect();
    assert_eq!(hits.len(), 1, "{name} {labels:?} in {samples:?}");
    hits[0]
}

#[test]
fn status_metrics_file_parses_with_hostile_names() {
    const TEST: &str = "status_metrics_file_parses_with_hostile_names";
    let r = Repo::new();
    let evil = "ev\"il\\o}\nrigin{x=\"1\"} 7\n# TYPE";
    let fresh = now();
    let old = "2024-06-01T10:00:00Z";
    r.import(
        &fresh.to_string(),
        "home",
        "014-incremental",
        "s1.full.v1.stream.zst",
    );
    r.import(old, evil, "015-clone-sources", "a1.full.v1.stream.zst");
    let sizes = r.stream_sizes();
    let prom = r.dir.path().join("btrsend-status.prom");
    let started = now().as_second();
    let o = r.status(&["--max-age", "24h", "--metrics-file", prom.to_str().unwrap()]);
    code(&o, 14);
    let ended = now().as_second() + 1;
    // Nothing but the file is left in its directory.
    let names: Vec<_> = fs::read_dir(r.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains("prom"))
        .collect();
    assert_eq!(names, ["btrsend-status.prom"]);
    let Some(s) = parse_metrics(TEST, &prom) else {
        return;
    };
    let base = [
        ("job", ""),
        ("destination", r.spec.as_str()),
        ("command", "status"),
    ];
    for (n, l, _) in &s {
        assert!(n.starts_with("btrsend_"), "{n}");
        for (k, v) in base {
            assert_eq!(l[k], v, "{n} {l}");
        }
    }
    assert_eq!(sample(&s, "btrsend_last_attempt_exit_status", &base), 14.0);
    let attempt = sample(&s, "btrsend_last_attempt_timestamp_seconds", &base);
    assert!(
        (started as f64..=ended as f64).contains(&attempt.floor()),
        "{attempt}"
    );
    assert!(
        !s.iter()
            .any(|(n, _, _)| n == "btrsend_last_success_timestamp_seconds"),
        "never succeeded"
    );
    assert_eq!(
        sample(&s, "btrsend_repository_size_bytes", &base),
        sizes.iter().sum::<u64>() as f64
    );
    let o_evil = [("origin", evil)];
    let o_home = [("origin", "home")];
    assert_eq!(sample(&s, "btrsend_snapshots_kept", &o_evil), 1.0);
    assert_eq!(sample(&s, "btrsend_snapshots_kept", &o_home), 1.0);
    assert_eq!(sample(&s, "btrsend_stale", &o_evil), 1.0);
    assert_eq!(sample(&s, "btrsend_stale", &o_home), 0.0);
    assert_eq!(sample(&s, "btrsend_chain_healthy", &o_evil), 1.0);
    let old_t: jiff::Timestamp = old.parse().unwrap();
    assert_eq!(
        sample(&s, "btrsend_newest_snapshot_timestamp_seconds", &o_evil),
        old_t.as_second() as f64
    );
    assert_eq!(
        sample(&s, "btrsend_newest_snapshot_timestamp_seconds", &o_home),
        fresh.as_second() as f64
    );
    let a = sample(&s, "btrsend_snapshots_kept_bytes", &o_evil)
        + sample(&s, "btrsend_snapshots_kept_bytes", &o_home);
    assert_eq!(a, sizes.iter().sum::<u64>() as f64);

    // A success records its time; a failure after it keeps that time.
    let o = r.status(&[
        "--max-age",
        "100000h",
        "--metrics-file",
        prom.to_str().unwrap(),
    ]);
    code(&o, 0);
    let s = parse_metrics(TEST, &prom).unwrap();
    let success = sample(&s, "btrsend_last_success_timestamp_seconds", &base);
    assert!(success >= attempt, "{success} {attempt}");
    code(
        &r.status(&["--max-age", "1s", "--metrics-file", prom.to_str().unwrap()]),
        14,
    );
    let s = parse_metrics(TEST, &prom).unwrap();
    assert_eq!(
        sample(&s, "btrsend_last_success_timestamp_seconds", &base),
        success
    );
    assert_eq!(sample(&s, "btrsend_last_attempt_exit_status", &base), 14.0);
}

#[test]
fn run_forget_verify_metrics_files() {
    const TEST: &str = "run_forget_verify_metrics_files";
    let r = Repo::new();
    let img = unpack(r.dir.path(), "014-incremental", "dev1.img");
    let prom = r.dir.path().join("m.prom");
    let m = prom.to_str().unwrap();
    let o = r.backup(&[
        "run",
        "--repo",
        &r.spec,
        "--device",
        img.to_str().unwrap(),
        "--metrics-file",
        m,
        "snaps/s1",
        "snaps/s2",
    ]);
    code(&o, 0);
    let sizes = r.stream_sizes();
    assert_eq!(sizes.len(), 2);
    let Some(s) = parse_metrics(TEST, &prom) else {
        return;
    };
    let run = [("command", "run"), ("destination", r.spec.as_str())];
    assert_eq!(sample(&s, "btrsend_last_attempt_exit_status", &run), 0.0);
    sample(&s, "btrsend_last_success_timestamp_seconds", &run);
    assert_eq!(
        sample(&s, "btrsend_repository_size_bytes", &run),
        sizes.iter().sum::<u64>() as f64
    );
    // Both snapshots are of one origin: the subvolume they were taken of.
    let origins: Vec<&Value> = s
        .iter()
        .filter(|(n, _, _)| n == "btrsend_streams_stored")
        .map(|(_, l, _)| &l["origin"])
        .collect();
    assert_eq!(origins.len(), 1, "{s:?}");
    let origin = origins[0].as_str().unwrap().to_owned();
    let o = [("origin", origin.as_str())];
    assert_eq!(sample(&s, "btrsend_streams_stored", &o), 2.0);
    assert_eq!(
        sample(&s, "btrsend_stored_bytes", &o),
        sizes.iter().sum::<u64>() as f64
    );
    assert_eq!(sample(&s, "btrsend_snapshots_kept", &o), 2.0);
    // The raw streams the kernel made of these snapshots.
    let raw: u64 = ["s1.full.v1.stream.zst", "s1--s2.inc.v1.stream.zst"]
        .iter()
        .map(|f| {
            zstd::decode_all(fs::File::open(fixture_dir("014-incremental").join(f)).unwrap())
                .unwrap()
                .len() as u64
        })
        .sum();
    assert_eq!(sample(&s, "btrsend_sent_bytes", &[]), raw as f64);

    // verify: no damage, then a missing stream file.
    code(
        &r.backup(&["verify", "--repo", &r.spec, "--metrics-file", m]),
        0,
    );
    let s = parse_metrics(TEST, &prom).unwrap();
    let verify = [("command", "verify")];
    assert_eq!(sample(&s, "btrsend_verify_problems", &verify), 0.0);
    assert_eq!(sample(&s, "btrsend_last_attempt_exit_status", &verify), 0.0);
    let success = sample(&s, "btrsend_last_success_timestamp_seconds", &verify);

    // forget: keep the last one; the chain keeps both (no synthetic full
    // stream). (Its own file: a
    // file holds one command's series, and verify's failure below keeps
    // the success time its file held.)
    let forget_prom = r.dir.path().join("forget.prom");
    let fm = forget_prom.to_str().unwrap();
    code(
        &r.backup(&[
            "forget",
            "--repo",
            &r.spec,
            "--no-synthesize",
            "--keep-last",
            "1",
            "--metrics-file",
            fm,
        ]),
        0,
    );
    let s = parse_metrics(TEST, &forget_prom).unwrap();
    let forget = [("command", "forget"), ("origin", origin.as_str())];
    assert_eq!(sample(&s, "btrsend_snapshots_deleted", &forget), 0.0);
    assert_eq!(sample(&s, "btrsend_snapshots_kept", &forget), 2.0);

    let stream_dir = Path::new(&r.spec).join("streams");
    let first = fs::read_dir(&stream_dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    fs::remove_file(first).unwrap();
    code(
        &r.backup(&["verify", "--repo", &r.spec, "--metrics-file", m]),
        12,
    );
    let s = parse_metrics(TEST, &prom).unwrap();
    assert_eq!(sample(&s, "btrsend_verify_problems", &verify), 1.0);
    assert_eq!(
        sample(&s, "btrsend_last_attempt_exit_status", &verify),
        12.0
    );
    assert_eq!(
        sample(&s, "btrsend_last_success_timestamp_seconds", &verify),
        success
    );
}
