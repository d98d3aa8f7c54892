//! The man pages' sections that clap does not make: EXAMPLES, EXIT STATUS
//! and SEE ALSO, as plain data. The man-page test renders them (roff) after
//! clap_mangen's sections and compares the result with the committed `man/`.

use crate::exit::EXIT_STATUS;

/// One block of a section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// A paragraph of running text.
    Text(String),
    /// An example: what it does, then the command line(s), shown verbatim.
    Example(&'static str, &'static str),
    /// Verbatim lines (a table).
    Verbatim(&'static str),
}

/// A section of a man page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// The heading, e.g. `EXAMPLES`.
    pub title: &'static str,
    /// Its blocks in order.
    pub blocks: Vec<Block>,
}

const FULL_SEND: Block = Block::Example(
    "A full send of the read-only snapshot snaps/daily, read straight from the \
     device of an unmounted filesystem (or an image file), into a file:",
    "btrsend send --device /dev/sdb -f /backup/daily.stream snaps/daily",
);

const INCREMENTAL_SSH: Block = Block::Example(
    "An incremental send of a snapshot in a mounted btrfs against the one sent \
     the night before, received on another machine by the stock btrfs receive:",
    "btrsend send -p /mnt/snaps/2026-11-23 /mnt/snaps/2026-11-24 | ssh backup btrfs receive /srv/backup",
);

const RECEIVE: Block = Block::Example(
    "Receive a stream into a directory on any filesystem (an incremental stream \
     needs its parent received there before):",
    "btrsend receive -f /backup/daily.stream /srv/restore",
);

const CRON: Block = Block::Example(
    "A nightly cron line (/etc/cron.d/btrsend): silent when it works, so cron \
     mails only failures:",
    "30 2 * * * root btrsend send -p /mnt/snaps/prev -f /backup/nightly.stream /mnt/snaps/last",
);

const SEVERAL: Block = Block::Example(
    "Several snapshots in one go, one stream each, concatenated as btrfs send \
     A B writes them; with -c each one sent is a clone source of the next:",
    "btrsend send -c /mnt/snaps/a -f /backup/ab.stream /mnt/snaps/a /mnt/snaps/b",
);

const DUMP: Block = Block::Example(
    "Print what a stream does, as btrfs receive --dump prints it:",
    "btrsend dump -f /backup/daily.stream | less",
);

const LIST: Block = Block::Example(
    "The read-only snapshots of an unmounted filesystem, oldest first, with jq:",
    "btrsend list --device /dev/sdb --json | jq -r 'map(select(.readonly)) | sort_by(.otime) | .[].path'",
);

const MANIFEST: Block = Block::Example(
    "Check a round trip: the manifest of the snapshot read from the device \
     equals the manifest of its received copy:",
    "diff <(btrsend manifest --device /dev/sdb snaps/daily) <(btrsend manifest /srv/restore/daily)",
);

const COMPLETIONS: Block = Block::Example(
    "Install the bash completions:",
    "btrsend completions bash > /usr/share/bash-completion/completions/btrsend",
);

/// The extra sections of the page named `page` (`btrsend`, `btrsend-send`, …).
pub fn extra_sections(page: &str) -> Vec<Section> {
    let examples = match page {
        "btrsend" => vec![FULL_SEND, INCREMENTAL_SSH, RECEIVE, CRON],
        "btrsend-send" => vec![FULL_SEND, INCREMENTAL_SSH, SEVERAL, CRON],
        "btrsend-receive" => vec![RECEIVE, INCREMENTAL_SSH],
        "btrsend-dump" => vec![DUMP],
        "btrsend-list" => vec![LIST],
        "btrsend-manifest" => vec![MANIFEST],
        "btrsend-completions" => vec![COMPLETIONS],
        _ => Vec::new(),
    };
    let mut see_also: Vec<&str> = [
        "btrsend(1)",
        "btrsend-send(1)",
        "btrsend-receive(1)",
        "btrsend-dump(1)",
        "btrsend-list(1)",
        "btrsend-manifest(1)",
        "btrsend-completions(1)",
    ]
    .into_iter()
    .filter(|p| p.strip_suffix("(1)") != Some(page))
    .collect();
    see_also.extend(["btrfs-send(8)", "btrfs-receive(8)", "btrfs-subvolume(8)"]);
    let see_also = see_also.join(", ");
    let mut sections = Vec::new();
    if !examples.is_empty() {
        sections.push(Section {
            title: "EXAMPLES",
            blocks: examples,
        });
    }
    sections.push(Section {
        title: "EXIT STATUS",
        blocks: vec![Block::Verbatim(EXIT_STATUS)],
    });
    sections.push(Section {
        title: "SEE ALSO",
        blocks: vec![Block::Text(see_also)],
    });
    sections
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_main_page_has_the_four_examples() {
        let s = extra_sections("btrsend");
        let titles: Vec<_> = s.iter().map(|s| s.title).collect();
        assert_eq!(titles, ["EXAMPLES", "EXIT STATUS", "SEE ALSO"]);
        assert_eq!(s[0].blocks.len(), 4);
        let Block::Text(see) = &s[2].blocks[0] else {
            panic!("SEE ALSO is text")
        };
        assert!(see.contains("btrfs-send(8)") && !see.contains("btrsend(1)"));
    }
}
