//! Issue 15: the README's quick start works as written. Its one set-up line
//! is taken from README.md: `cargo build --release` must build the binary
//! (the workspace's default members include the `btrsend-cli` package, as
//! `cargo metadata` reports them), and the commands after the build — unpack
//! the shipped demo image, send its snapshot straight from the image, dump
//! the stream — are run as written, with only `./target/release/btrsend`
//! and `/tmp/demo*` pointed at this build and a temporary directory. The
//! test command is the one `.ci/run` runs.

use std::path::Path;
use std::process::Command;

use crate::common::btrsend;

fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ has a parent")
}

fn readme() -> String {
    std::fs::read_to_string(repo_root().join("README.md")).unwrap()
}

/// The indented command line of the quick start (the one that builds).
fn quick_start_line(readme: &str) -> String {
    let section = readme
        .split("## Quick start on a fresh machine")
        .nth(1)
        .expect("a quick-start section");
    section
        .lines()
        .find(|l| l.starts_with("    ") && l.contains("cargo build --release"))
        .expect("a set-up command with cargo build --release")
        .trim()
        .to_owned()
}

#[test]
fn quick_start_builds_the_binary_and_its_commands_run() {
    let readme = readme();
    let line = quick_start_line(&readme);
    let steps: Vec<&str> = line.split(" && ").collect();
    let build = steps
        .iter()
        .position(|s| *s == "cargo build --release")
        .expect("cargo build --release is a step of its own");
    assert!(
        steps[..build].iter().any(|s| s.contains("apt-get install")
            && s.contains("btrfs-progs")
            && s.contains("zstd")
            && s.contains("gcc")),
        "the packages are installed first: {line}"
    );
    assert!(
        readme.contains("Rust 1.90 or later") && readme.contains("rustup"),
        "the toolchain is named"
    );

    // `cargo build --release` in the workspace root builds the default
    // members: the binary's package must be one.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cli_id = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "btrsend-cli")
        .map(|p| p["id"].clone())
        .expect("the btrsend-cli package");
    let defaults = meta["workspace_default_members"]
        .as_array()
        .expect("cargo reports the default members");
    assert!(
        defaults.contains(&cli_id),
        "cargo build --release would not build the binary: default members {defaults:?}"
    );

    // The commands after the build, as written.
    let tmp = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_btrsend");
    let rest = steps[build + 1..]
        .join(" && ")
        .replace("./target/release/btrsend", bin)
        .replace("/tmp/demo", &tmp.path().join("demo").display().to_string());
    assert!(rest.contains(" send --device "), "{rest}");
    let out = Command::new("sh")
        .arg("-c")
        .arg(&rest)
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{rest}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump = String::from_utf8(out.stdout).unwrap();
    assert!(dump.starts_with("subvol "), "{dump}");
    assert!(dump.lines().count() > 5, "{dump}");

    // Installing: the binary, the man pages, the completions.
    for needle in [
        "cargo install --locked --path cli --root /usr/local",
        "man/*.1",
        "btrsend completions bash",
    ] {
        assert!(readme.contains(needle), "README lacks {needle:?}");
    }
    assert!(repo_root().join("man/btrsend.1").is_file());

    // The test command of the README is the one CI runs.
    let ci = std::fs::read_to_string(repo_root().join(".ci/run")).unwrap();
    let test_cmd = "cargo test --workspace --release";
    assert!(readme.contains(&format!("\n    {test_cmd}\n")));
    assert!(ci.contains(&format!("\n{test_cmd}\n")));
    // And `btrsend` is what this build made (the README's binary name).
    assert!(
        btrsend()
            .arg("--version")
            .output()
            .unwrap()
            .status
            .success()
    );
}
