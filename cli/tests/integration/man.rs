//! The committed man pages in `man/` must equal what clap_mangen makes from the
//! clap definition. `BTRSEND_UPDATE_MAN=1 cargo test --release -p btrsend-cli --test integration man::`
//! rewrites them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use btrsend_cli::args::Cli;
use clap::CommandFactory;

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
    let tmp = tempfile::tempdir().expect("tempdir");
    clap_mangen::generate_to(Cli::command(), tmp.path()).expect("generate man pages");
    let generated = read_pages(tmp.path());
    assert!(
        generated.contains_key("btrsend.1"),
        "no btrsend.1 generated"
    );
    assert!(
        generated.contains_key("btrsend-dump.1"),
        "no btrsend-dump.1 generated"
    );

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
