//! `btrsend completions SHELL` prints a script that names every subcommand
//! and completes them as the first word (issue 36 reads a first word that is
//! not a subcommand as `send`'s snapshot, without changing what completes).

use std::process::Command;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_btrsend"))
        .args(args)
        .output()
        .expect("run btrsend")
}

#[test]
fn bash_completions_name_the_subcommands() {
    let out = run(&["completions", "bash"]);
    assert!(out.status.success(), "exit {:?}", out.status);
    let text = String::from_utf8(out.stdout).expect("utf-8 script");
    assert!(
        text.contains("_btrsend()"),
        "no completion function in:\n{text}"
    );
    for sub in ["dump", "receive", "manifest", "list", "completions"] {
        assert!(
            text.contains(sub),
            "subcommand {sub} missing from bash completions"
        );
    }
}

#[test]
fn every_shell_gets_a_script() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = run(&["completions", shell]);
        assert!(out.status.success(), "{shell}: exit {:?}", out.status);
        assert!(out.stdout.len() > 100, "{shell}: script too short");
    }
}

#[test]
fn unknown_shell_is_a_usage_error() {
    let out = run(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "clap usage errors exit 2");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tcsh"),
        "stderr does not name the bad value: {err}"
    );
}

#[test]
fn no_subcommand_is_a_usage_error() {
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(2));
}

/// Issue 15: options with a fixed set of values complete to those values,
/// options that take numbers or names do not offer file names, and paths
/// complete as paths (a directory for receive's DIR).
#[test]
fn completions_offer_values_not_file_names() {
    let bash = String::from_utf8(run(&["completions", "bash"]).stdout).unwrap();
    let proto = bash
        .split("--proto)")
        .nth(1)
        .and_then(|rest| rest.split(";;").next())
        .expect("a --proto case in the bash script");
    assert!(
        proto.contains(r#"compgen -W "0 1 2 3""#),
        "--proto does not complete 0-3:\n{proto}"
    );
    let zsh = String::from_utf8(run(&["completions", "zsh"]).stdout).unwrap();
    for line in zsh.lines() {
        let line = line.trim();
        if line.starts_with("'--proto=") {
            assert!(line.ends_with(":N:(0 1 2 3)' \\"), "{line}");
        }
        if line.starts_with("'--threads=") && !line.contains("Reader threads") {
            assert!(
                line.ends_with(":N:' \\"),
                "no file names for --threads: {line}"
            );
        }
        if line.starts_with("'::dir -- The directory to receive into") {
            assert!(
                line.contains("_files -/"),
                "DIR completes directories: {line}"
            );
        }
    }
    assert!(zsh.contains("'::dir -- The directory to receive into"));
    let fish = String::from_utf8(run(&["completions", "fish"]).stdout).unwrap();
    let fish_proto = fish
        .lines()
        .find(|l| l.contains("-l proto"))
        .expect("fish --proto");
    assert!(
        fish_proto.contains(r#"-r -f -a "0\t"#),
        "fish --proto: values, no files: {fish_proto}"
    );
}

/// Issue 36: the first word still completes to the subcommands (the short
/// form adds no top-level argument to complete instead).
#[test]
fn the_first_word_completes_to_the_subcommands() {
    let bash = String::from_utf8(run(&["completions", "bash"]).stdout).unwrap();
    let top = bash
        .split("        btrsend)")
        .nth(1)
        .and_then(|rest| rest.lines().find(|l| l.trim_start().starts_with("opts=")))
        .expect("the top-level case of the bash script");
    let words: Vec<&str> = top
        .trim()
        .trim_start_matches("opts=\"")
        .trim_end_matches('"')
        .split(' ')
        .collect();
    for sub in [
        "backup",
        "dump",
        "list",
        "send",
        "receive",
        "manifest",
        "completions",
        "help",
    ] {
        assert!(words.contains(&sub), "{sub} not offered first: {top}");
    }
    assert!(!words.iter().any(|w| w.contains("SNAPSHOT")), "{top}");
    let fish = String::from_utf8(run(&["completions", "fish"]).stdout).unwrap();
    for sub in ["send", "receive", "list"] {
        assert!(
            fish.contains(&format!("__fish_btrsend_needs_command\" -f -a \"{sub}\"")),
            "fish: {sub}"
        );
    }
}
