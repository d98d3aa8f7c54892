//! Issue 29, what a new admin sees: `list` for people (local times, IEC
//! sizes), restore's snapshot selection (`latest`, names, dates, the
//! nearest when nothing matches), what `init`, `verify` and `run` say, the
//! progress of `verify --read-data` and `restore` on a terminal, the JSON
//! summaries, messages that say what to do next (an interrupted receive,
//! an interrupted restore, a full repository disk), and the README's
//! crontab lines run as cron runs them.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use btrsend::testing::{self, LiveBtrfs};
use serde_json::Value;

use crate::common::{btrsend, fixture_dir, ok, unpack};

const FIX: &str = "014-incremental";
/// Central European time as a POSIX rule: the tests need no tz database.
const CET: &str = "CET-1CEST,M3.5.0,M10.5.0/3";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn backup(args: &[&str]) -> Output {
    btrsend().arg("backup").args(args).output().unwrap()
}

/// The fixture's three snapshots stored in a new directory repository.
struct Stored {
    _dir: tempfile::TempDir,
    img: PathBuf,
    repo: PathBuf,
}

impl Stored {
    fn new() -> Stored {
        let dir = tempfile::tempdir().unwrap();
        let img = unpack(dir.path(), FIX, "dev1.img");
        let repo = dir.path().join("repo");
        let s = Stored {
            _dir: dir,
            img,
            repo,
        };
        let said = ok(&backup(&[
            "init",
            "--repo",
            s.repo(),
            "--encryption",
            "none",
        ]));
        assert_eq!(
            said,
            format!("made the empty repository {} (unencrypted)\n", s.repo())
        );
        ok(&backup(&[
            "run",
            "--repo",
            s.repo(),
            "--device",
            s.img.to_str().unwrap(),
            "--frame-bytes",
            "4096",
            "snaps/s*",
        ]));
        s
    }

    fn repo(&self) -> &str {
        self.repo.to_str().unwrap()
    }

    fn entries(&self) -> Vec<Value> {
        let v: Value =
            serde_json::from_str(&ok(&backup(&["list", "--repo", self.repo(), "--json"]))).unwrap();
        v.as_array().unwrap().clone()
    }

    fn restore_stdout(&self, spec: &str) -> Output {
        backup(&["restore", "--repo", self.repo(), "--stdout", spec])
    }
}

/// `n` bytes as the table prints them: IEC units with two decimals, bytes
/// as they are.
fn iec(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.2} {}", UNITS[u])
}

/// `date`'s rendering of an RFC 3339 time in the zone `tz`.
fn date_in(tz: &str, rfc3339: &str) -> String {
    let o = Command::new("date")
        .env("TZ", tz)
        .args(["-d", rfc3339, "+%Y-%m-%d %H:%M:%S %Z"])
        .output()
        .unwrap();
    assert!(o.status.success(), "date: {}", text(&o.stderr));
    text(&o.stdout).trim().to_owned()
}

/// Run `cmd` (a shell command line) with a terminal as its stdout and
/// stderr (`script` from util-linux); what the terminal showed. `None`
/// (skipped loudly, failing in CI) without `script`.
fn on_terminal(test: &str, cmd: &str) -> Option<(Option<i32>, String)> {
    match Command::new("script")
        .args(["-qec", cmd, "/dev/null"])
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) => Some((o.status.code(), text(&o.stdout))),
        Err(e) => {
            testing::skip_or_fail(test, &format!("no script(1): {e}"));
            None
        }
    }
}

#[test]
fn list_is_for_people_and_json_stays_exact() {
    let s = Stored::new();
    let entries = s.entries();
    assert_eq!(entries.len(), 3);
    let table = ok(&btrsend()
        .env("TZ", CET)
        .args(["backup", "list", "--repo", s.repo()])
        .output()
        .unwrap());
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    for (e, line) in entries.iter().zip(&lines[1..]) {
        let time = date_in(CET, e["time"].as_str().unwrap());
        assert!(line.contains(&time), "{time} not in {line}");
        for k in ["stream_bytes", "stored_bytes"] {
            let n = e[k].as_u64().unwrap();
            assert!(n > 1024, "a fixture stream of {n} bytes");
            assert!(line.contains(&iec(n)), "{k} {} not in {line}", iec(n));
        }
        assert!(line.ends_with(e["path"].as_str().unwrap()), "{line}");
    }
    // Columns line up: every row's path starts where the header's does.
    let at = lines[0].find("path").unwrap();
    for l in &lines[1..] {
        assert_eq!(&l[at..at + 6], "snaps/", "{table}");
    }
}

#[test]
fn restore_takes_latest_names_dates_and_names_the_nearest() {
    let s = Stored::new();
    let entries = s.entries();
    let newest = ok(&s.restore_stdout("snaps/s3"));
    let s3 = entries.iter().find(|e| e["path"] == "snaps/s3").unwrap();
    let day = &s3["time"].as_str().unwrap()[..10];
    let hour = &s3["time"].as_str().unwrap()[..13];
    // One origin: latest, a name prefix, the day and the hour of the
    // newest are all the newest.
    for spec in ["latest", "s", "snaps/s", day, hour] {
        assert!(ok(&s.restore_stdout(spec)) == newest, "{spec}");
    }
    assert!(ok(&s.restore_stdout("s2")) == ok(&s.restore_stdout("snaps/s2")));
    // Nothing matches: exit 1, the nearest named.
    let o = s.restore_stdout("s9");
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains("no stored snapshot matches s9; the nearest: snaps/s"),
        "{err}"
    );
    // A second origin (a kernel stream of another fixture, imported):
    // `latest` no longer chooses, and names the newest of each origin.
    let other = fixture_dir("001-basic").join("basic.full.v1.stream.zst");
    if !other.is_file() {
        panic!("fixture stream {} missing", other.display());
    }
    ok(&backup(&[
        "import",
        "--repo",
        s.repo(),
        "--origin",
        "other",
        other.to_str().unwrap(),
    ]));
    let o = s.restore_stdout("latest");
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains("latest matches snapshots of more than one origin")
            && err.contains("snaps/s3 (id 3)")
            && err.contains("basic (id 4)"),
        "{err}"
    );
}

#[test]
fn init_verify_and_run_say_what_they_did() {
    const TEST: &str = "init_verify_and_run_say_what_they_did";
    let s = Stored::new();
    let entries = s.entries();
    let said = ok(&backup(&["verify", "--repo", s.repo()]));
    assert_eq!(
        said,
        format!(
            "verified 3 stored snapshots in {}: the catalog, every chain, and each stream file's size, trailer and first command (--read-data reads every byte); no damage found\n",
            s.repo()
        )
    );
    let raw: u64 = entries
        .iter()
        .map(|e| e["stream_bytes"].as_u64().unwrap())
        .sum();
    let stored: u64 = entries
        .iter()
        .map(|e| e["stored_bytes"].as_u64().unwrap())
        .sum();
    let said = ok(&backup(&["verify", "--repo", s.repo(), "--read-data"]));
    assert_eq!(
        said,
        format!(
            "verified 3 stored snapshots in {}: the catalog, every chain and every byte ({} read); no damage found\n",
            s.repo(),
            iec(stored)
        )
    );
    let v: Value =
        serde_json::from_str(&ok(&backup(&["verify", "--repo", s.repo(), "--json"]))).unwrap();
    for k in ["start", "end", "duration_seconds", "entries"] {
        assert!(!v[k].is_null(), "{k} missing: {v}");
    }
    let bin = env!("CARGO_BIN_EXE_btrsend");
    // On a terminal verify --read-data shows a bar over the streams' exact
    // total, restore too; neither shows an empty one.
    let Some((code, screen)) = on_terminal(
        TEST,
        &format!("TZ=UTC {bin} backup verify --repo {} --read-data", s.repo()),
    ) else {
        return;
    };
    assert_eq!(code, Some(0), "{screen}");
    assert!(screen.contains(&format!("/{}", iec(raw))), "{screen}");
    assert!(!screen.contains("0 B/0 B"), "{screen}");
    let out = s.img.with_file_name("restored");
    let (code, screen) = on_terminal(
        TEST,
        &format!(
            "{bin} backup restore --repo {} --stdout snaps/s3 > {}",
            s.repo(),
            out.display()
        ),
    )
    .unwrap();
    assert_eq!(code, Some(0), "{screen}");
    // Read twice (checked, then written): a bar over twice the chain, which
    // the entries' parent links give.
    let mut chain = 0;
    let mut at = entries.iter().find(|e| e["path"] == "snaps/s3");
    while let Some(e) = at {
        chain += e["stream_bytes"].as_u64().unwrap();
        at = entries.iter().find(|p| p["id"] == e["parent_id"]);
    }
    assert!(screen.contains(&format!("/{}", iec(2 * chain))), "{screen}");
    // A run on a terminal ends with one summary line; all were stored.
    let (code, screen) = on_terminal(
        TEST,
        &format!(
            "{bin} backup run --repo {} --device {} 'snaps/s*'",
            s.repo(),
            s.img.display()
        ),
    )
    .unwrap();
    assert_eq!(code, Some(0), "{screen}");
    assert!(
        screen.contains("btrsend: stored 0 of 3 snapshots: 0 B of stream sent, 0 B stored, in ")
            && screen.contains("; 3 stored before"),
        "{screen}"
    );
    assert!(!screen.contains("0 B/0 B"), "{screen}");
}

#[test]
fn run_json_summary_has_times_totals_and_the_repository_size() {
    let dir = tempfile::tempdir().unwrap();
    let img = unpack(dir.path(), FIX, "dev1.img");
    let repo = dir.path().join("repo");
    let repo = repo.to_str().unwrap();
    ok(&backup(&["init", "--repo", repo, "--encryption", "none"]));
    let out = ok(&backup(&[
        "run",
        "--repo",
        repo,
        "--device",
        img.to_str().unwrap(),
        "--json",
        "snaps/s1",
        "snaps/s2",
    ]));
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let sum = lines.last().unwrap();
    assert_eq!(sum["message_type"], "summary");
    let stored: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message_type"] == "stored")
        .collect();
    assert_eq!(stored.len(), 2);
    let total = |k: &str| stored.iter().map(|l| l[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum["stream_bytes"], total("stream_bytes"));
    assert_eq!(sum["sent_bytes"], total("stream_bytes"));
    assert_eq!(sum["stored_bytes"], total("stored_bytes"));
    // The repository's size: what the files of its entries hold on disk.
    let on_disk: u64 = fs::read_dir(Path::new(repo).join("streams"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert_eq!(sum["repository_bytes"], on_disk);
    let start: jiff::Timestamp = sum["start"].as_str().unwrap().parse().unwrap();
    let end: jiff::Timestamp = sum["end"].as_str().unwrap().parse().unwrap();
    let secs = sum["duration_seconds"].as_f64().unwrap();
    assert!(start <= end && secs >= 0.0, "{sum}");
    assert!(
        (end.duration_since(start).as_secs_f64() - secs).abs() < 1.0,
        "{sum}"
    );
}

/// A kernel-made btrfs with `home` holding `mib` MiB of random data and its
/// read-only snapshot `snaps/home.2026-11-20T030000Z`.
fn live_home(mib: usize) -> (LiveBtrfs, PathBuf) {
    let live = LiveBtrfs::with_options(1 << 30, &[], "").expect("scratch btrfs");
    let mnt = live.path().to_owned();
    let st = Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(mnt.join("home"))
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    fs::create_dir(mnt.join("snaps")).unwrap();
    let mut rng = btrsend::testing::workload::Rng::new(29);
    crate::common::write_random(&mnt.join("home/data"), mib << 20, &mut rng);
    fs::write(mnt.join("home/note"), "hello\n").unwrap();
    let snap = mnt.join("snaps/home.2026-11-20T030000Z");
    let st = Command::new("btrfs")
        .args(["subvolume", "snapshot", "-r"])
        .arg(mnt.join("home"))
        .arg(&snap)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    assert!(Command::new("sync").status().unwrap().success());
    (live, snap)
}

#[test]
fn a_full_repository_disk_names_the_file_and_the_byte() {
    const TEST: &str = "a_full_repository_disk_names_the_file_and_the_byte";
    if !testing::require_live(TEST) {
        return;
    }
    let (live, _snap) = live_home(24);
    let small = live.scratch_dir().join("small");
    fs::create_dir(&small).unwrap();
    let mount = |opts: &str| {
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "tmpfs"])
            .arg(&small)
            .status()
            .unwrap();
        assert!(st.success());
    };
    mount("size=2m");
    let _umount = Defer(|| {
        let _ = Command::new("umount").arg(&small).status();
    });
    let repo = small.join("repo");
    let repo = repo.to_str().unwrap();
    ok(&backup(&["init", "--repo", repo, "--encryption", "none"]));
    let img = live.image().to_str().unwrap();
    // Past the check of free space before the run (a disk that another
    // writer fills during the run is the same case).
    let o = backup(&[
        "run",
        "--repo",
        repo,
        "--device",
        img,
        "--json",
        "--no-space-check",
        "snaps/home.*",
    ]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}{err}", text(&o.stdout));
    let tmp: Vec<PathBuf> = fs::read_dir(small.join("repo/tmp"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(tmp.len(), 1, "{tmp:?}");
    let size = fs::metadata(&tmp[0]).unwrap().len();
    let name = tmp[0].file_name().unwrap().to_str().unwrap();
    assert!(
        err.contains(&format!(
            "{repo}/tmp/{name} at byte {size} (the stream file streams/"
        )) && err.contains("No space left on device"),
        "{err}"
    );
    // With room again the next run continues the file and completes.
    mount("remount,size=64m");
    ok(&backup(&[
        "run",
        "--repo",
        repo,
        "--device",
        img,
        "snaps/home.*",
    ]));
    ok(&backup(&["verify", "--repo", repo, "--read-data"]));
}

/// Runs a closure when dropped (an unmount, whatever the test's outcome).
struct Defer<F: FnMut()>(F);

impl<F: FnMut()> Drop for Defer<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

#[test]
fn an_interrupted_receive_or_restore_says_how_to_go_on() {
    const TEST: &str = "an_interrupted_receive_or_restore_says_how_to_go_on";
    if !testing::require_live(TEST) {
        return;
    }
    let (live, _snap) = live_home(6);
    let img = live.image().to_str().unwrap();
    let scratch = live.scratch_dir();
    let stream = scratch.join("full.stream");
    ok(&btrsend()
        .args(["send", "--device", img, "-f"])
        .arg(&stream)
        .arg("snaps/home.2026-11-20T030000Z")
        .output()
        .unwrap());
    let bytes = fs::read(&stream).unwrap();
    let cut = scratch.join("cut.stream");
    fs::write(&cut, &bytes[..bytes.len() * 3 / 4]).unwrap();
    // Cut before its first checkpoint (the default interval is 48 MiB):
    // receiving again starts over.
    let into = scratch.join("a");
    fs::create_dir(&into).unwrap();
    let receive = |dir: &Path, extra: &[&str]| {
        btrsend()
            .args(["receive", "--directories", "-f"])
            .arg(&cut)
            .args(extra)
            .arg(dir)
            .output()
            .unwrap()
    };
    let o = receive(&into, &[]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    let name = into.join("home.2026-11-20T030000Z");
    assert!(
        err.contains(&format!(
            "; {} is incomplete, with no resume point yet: receiving the whole stream again starts it over",
            name.display()
        )),
        "{err}"
    );
    // Past a checkpoint (one every MiB): --resume-token is the way on.
    let into = scratch.join("b");
    fs::create_dir(&into).unwrap();
    let o = receive(&into, &["--checkpoint-interval", "1"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    let name = into.join("home.2026-11-20T030000Z");
    assert!(
        err.contains(&format!(
            "; {0} is incomplete and can be continued: `btrsend receive --resume-token {0}` prints a token for `btrsend send --resume TOKEN`",
            name.display()
        )),
        "{err}"
    );
    ok(&btrsend()
        .args(["receive", "--resume-token"])
        .arg(&name)
        .output()
        .unwrap());

    // A restore interrupted (SIGINT) in the middle says what it left.
    let repo = scratch.join("repo");
    let repo = repo.to_str().unwrap();
    ok(&backup(&["init", "--repo", repo, "--encryption", "none"]));
    ok(&backup(&[
        "run",
        "--repo",
        repo,
        "--device",
        img,
        "--frame-bytes",
        "65536",
        "snaps/home.*",
    ]));
    let to = scratch.join("restored");
    fs::create_dir(&to).unwrap();
    let child = btrsend()
        .args(["backup", "restore", "--repo", repo, "latest", "--to"])
        .arg(&to)
        .env("BTRSEND_TEST_PAUSE_AT", (1u64 << 20).to_string())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let left = to.join("home.2026-11-20T030000Z");
    let t = std::time::Instant::now();
    while !left.join("note").exists() && !left.join("data").exists() {
        assert!(t.elapsed().as_secs() < 60, "the restore never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // It pauses once 1 MiB of stream is read: wait until it says so.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "btrsend: interrupted: the restore left {} incomplete: remove it",
            left.display()
        )),
        "{err}"
    );
}

#[test]
fn the_readme_crontab_lines_run_under_crons_environment() {
    const TEST: &str = "the_readme_crontab_lines_run_under_crons_environment";
    if !testing::require_live(TEST) {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    let lines: Vec<&str> = readme
        .lines()
        .filter_map(|l| l.trim().strip_prefix("0 3 * * * "))
        .collect();
    assert!(lines.len() >= 3, "{lines:?}");
    // One install location, the one the systemd unit runs.
    assert!(readme.contains("cargo install --locked --path cli --root /usr/local"));
    let unit = fs::read_to_string(root.join("contrib/btrsend-backup.service")).unwrap();
    assert!(
        unit.lines()
            .filter(|l| l.starts_with("ExecStart="))
            .all(|l| l.starts_with("ExecStart=/usr/local/bin/btrsend ")),
        "{unit}"
    );
    let (live, _snap) = live_home(1);
    let mnt = live.path();
    // Changed since its snapshot: the job that takes snapshots takes one.
    fs::write(mnt.join("home/changed"), "after the snapshot\n").unwrap();
    let repo = live.scratch_dir().join("repo");
    let home = live.scratch_dir().join("home");
    fs::create_dir(&home).unwrap();
    // The repository as the README makes it: encrypted for an age key made
    // elsewhere; init leaves the write key under HOME, where the cron
    // lines' run and forget find it.
    let key = live.scratch_dir().join("age-key.txt");
    let made = Command::new("age-keygen")
        .arg("-o")
        .arg(&key)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", text(&made.stderr));
    let recipient = Command::new("age-keygen")
        .arg("-y")
        .arg(&key)
        .output()
        .unwrap();
    let recipient = String::from_utf8(recipient.stdout).unwrap();
    let init = readme
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("btrsend backup init "))
        .unwrap()
        .replace("/backup/home", repo.to_str().unwrap())
        .replace("AGE_PUBKEY", recipient.trim());
    assert!(init.contains("--encryption recipients"), "{init}");
    let o = Command::new("/bin/sh")
        .arg("-c")
        .arg(init.replacen("btrsend", env!("CARGO_BIN_EXE_btrsend"), 1))
        .env("HOME", &home)
        .env_remove("XDG_CONFIG_HOME")
        .output()
        .unwrap();
    assert!(o.status.success(), "{init}: {}", text(&o.stderr));
    for line in lines {
        assert!(
            line.starts_with("/usr/local/bin/btrsend "),
            "cron's PATH has no /usr/local/bin: name the binary in full: {line}"
        );
        // The documented line with this test's binary, device, mount and
        // repository in place of the README's.
        let line = line
            .replace("/usr/local/bin/btrsend", env!("CARGO_BIN_EXE_btrsend"))
            .replace("/backup/home", repo.to_str().unwrap())
            .replace("/dev/sdb1", live.image().to_str().unwrap())
            .replace("/mnt/pool", mnt.to_str().unwrap());
        // What cron gives a job: /bin/sh and no more environment than this.
        let o = Command::new("/usr/bin/env")
            .arg("-i")
            .arg("PATH=/usr/bin:/bin")
            .arg("SHELL=/bin/sh")
            .arg("LOGNAME=root")
            .arg(format!("HOME={}", home.display()))
            .args(["/bin/sh", "-c", &line])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(o.status.success(), "{line}: {}", text(&o.stderr));
        assert!(
            o.stdout.is_empty() && o.stderr.is_empty(),
            "{line}: cron would mail {}{}",
            text(&o.stdout),
            text(&o.stderr)
        );
        assert!(Command::new("sync").status().unwrap().success());
    }
    let v: Value = serde_json::from_str(&ok(&backup(&[
        "list",
        "--repo",
        repo.to_str().unwrap(),
        "--identity",
        key.to_str().unwrap(),
        "--json",
    ])))
    .unwrap();
    assert!(
        v.as_array().unwrap().len() >= 2,
        "the device's snapshot and the one the job took: {v}"
    );
    // What the job stored restores with the identity, as the README says.
    ok(&backup(&[
        "verify",
        "--read-data",
        "--repo",
        repo.to_str().unwrap(),
        "--identity",
        key.to_str().unwrap(),
    ]));
}
