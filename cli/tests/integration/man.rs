//! The committed man pages in `man/` must equal what clap_mangen makes from the
//! clap definition, followed by the EXAMPLES, EXIT STATUS and SEE ALSO
//! sections of `btrsend_cli::man`. `BTRSEND_UPDATE_MAN=1 cargo test --release -p btrsend-cli --test integration man::`
//! rewrites them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use btrsend_cli::args::Cli;
use btrsend_cli::man::{Block, extra_sections};
use clap::CommandFactory;
use roff::{Roff, bold, roman};

/// Every page of `cmd` and its visible subcommands, by file name (as
/// `clap_mangen::generate_to` names them), each followed by its extra sections.
fn render_pages(cmd: clap::Command) -> BTreeMap<String, Vec<u8>> {
    fn walk(cmd: clap::Command, pages: &mut BTreeMap<String, Vec<u8>>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
            walk(sub, pages);
        }
        // The main page's `--help` epilogue is the exit status table, which
        // the man page has in its own EXIT STATUS section.
        let page_cmd = if cmd.get_name() == "btrsend" {
            cmd.clone().after_long_help(None::<&str>)
        } else {
            cmd.clone()
        };
        let man = clap_mangen::Man::new(page_cmd);
        let mut body = Vec::new();
        man.render(&mut body).expect("render man page");
        // clap_mangen calls the `--help` epilogue EXTRA; ours are details.
        let mut body = String::from_utf8(body)
            .expect("utf-8 man page")
            .replace(".SH EXTRA\n", ".SH DETAILS\n")
            .into_bytes();
        let page = man
            .get_filename()
            .strip_suffix(".1")
            .expect("section 1")
            .to_owned();
        let mut roff = Roff::new();
        for section in extra_sections(&page) {
            roff.control("SH", [section.title]);
            for block in section.blocks {
                match block {
                    Block::Text(t) => {
                        roff.control("PP", []).text([roman(t)]);
                    }
                    Block::Example(what, command) => {
                        roff.control("PP", []).text([roman(what)]);
                        roff.control("RS", ["4"]).control("nf", []);
                        roff.text([bold(command)]);
                        roff.control("fi", []).control("RE", []);
                    }
                    Block::Verbatim(t) => {
                        roff.control("PP", []).control("nf", []);
                        // Flush left: the table's `--help` indent is not
                        // kept by roff on every line alike.
                        for line in t.lines() {
                            roff.text([roman(line.strip_prefix("  ").unwrap_or(line))]);
                        }
                        roff.control("fi", []);
                    }
                }
            }
        }
        body.extend_from_slice(roff.to_roff().as_bytes());
        pages.insert(format!("{page}.1"), body);
    }
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut pages = BTreeMap::new();
    walk(cmd, &mut pages);
    pages
}

fn man_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../man")
}

fn read_pages(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut pages = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("read man dir") {
        let entry = entry.expect("read man dir entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".1") {
            pages.insert(name, std::fs::read(entry.path()).expect("read man page"));
        }
    }
    pages
}

#[test]
fn man_pages_are_current() {
    let generated = render_pages(Cli::command());
    assert!(
        generated.contains_key("btrsend.1"),
        "no btrsend.1 generated"
    );
    assert!(
        generated.contains_key("btrsend-dump.1"),
        "no btrsend-dump.1 generated"
    );
    for (name, body) in &generated {
        let text = String::from_utf8_lossy(body);
        for section in ["EXIT STATUS", "SEE ALSO"] {
            assert!(
                text.contains(&format!(".SH \"{section}\""))
                    || text.contains(&format!(".SH {section}")),
                "{name} has no {section} section"
            );
        }
    }
    let main = String::from_utf8_lossy(&generated["btrsend.1"]).replace("\\-", "-");
    for needle in [
        "btrsend SNAPSHOT... [send options]",
        "btrsend /mnt/snaps/day2 -p /mnt/snaps/day1 | ssh backup btrsend receive /pool",
        "EXAMPLES",
        "ssh backup btrfs receive",
        "30 2 * * *",
        "btrsend receive -f",
    ] {
        assert!(main.contains(needle), "btrsend.1 lacks {needle:?}");
    }

    let dir = man_dir();
    if std::env::var_os("BTRSEND_UPDATE_MAN").is_some() {
        std::fs::create_dir_all(&dir).expect("create man dir");
        for name in read_pages(&dir).keys() {
            std::fs::remove_file(dir.join(name)).expect("remove stale man page");
        }
        for (name, body) in &generated {
            std::fs::write(dir.join(name), body).expect("write man page");
        }
        return;
    }
    let committed = read_pages(&dir);
    let gen_names: Vec<_> = generated.keys().collect();
    let com_names: Vec<_> = committed.keys().collect();
    assert_eq!(
        gen_names, com_names,
        "man/ has other pages than the clap definition makes; run BTRSEND_UPDATE_MAN=1 cargo test --release -p btrsend-cli --test integration man::"
    );
    for (name, body) in &generated {
        assert!(
            committed.get(name) == Some(body),
            "man/{name} is out of date; run BTRSEND_UPDATE_MAN=1 cargo test --release -p btrsend-cli --test integration man::"
        );
    }
}
