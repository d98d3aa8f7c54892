//! `btrsend completions SHELL` prints a script that names every subcommand.

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
