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

const SHORT_FORM: Block = Block::Example(
    "The short form, btrsend SNAPSHOT... [send options] for btrsend send: an \
     incremental send of a snapshot in a mounted btrfs against the one sent \
     before, received by btrsend on another machine:",
    "btrsend /mnt/snaps/day2 -p /mnt/snaps/day1 | ssh backup btrsend receive /pool",
);

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

const BACKUP_INIT: Block = Block::Example(
    "Make a repository in a directory encrypted for an age key made on \
     another machine (this host gets a write key that stores backups but \
     cannot read them), one in an S3 bucket of a MinIO server encrypted with \
     a passphrase kept in a file (the standard AWS variables give the \
     endpoint and the keys), and an unencrypted one in AWS S3 with the keys \
     of the profile backup in ~/.aws/credentials (its region from \
     ~/.aws/config):",
    "btrsend backup init --repo /backup/home --encryption recipients --recipient age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p\n\
     AWS_ENDPOINT_URL=http://nas:9000 AWS_ACCESS_KEY_ID=backup AWS_SECRET_ACCESS_KEY=secret \\\n\
     \x20   btrsend backup init --repo s3://backups/home --encryption passphrase --password-file /root/.backup-pass\n\
     AWS_PROFILE=backup btrsend backup init --repo s3://example-backups/home --encryption none",
);

const BACKUP_CRON: Block = Block::Example(
    "A crontab line (crontab -e as root) that stores every new snapshot named \
     snaps/home.* of a device each night, incremental where it can, silent \
     on success:",
    "0 3 * * * /usr/local/bin/btrsend backup run --repo /backup/home --full-every-days 30 --device /dev/sdb1 'snaps/home.*'",
);

const BACKUP_SSH: Block = Block::Example(
    "Store snapshots in a repository on another host, reached with the \
     system's ssh (keys, ~/.ssh/config and known hosts apply) and served \
     there by btrsend serve:",
    "btrsend backup init --repo ssh://backup@nas.example/backup/host1 --encryption recipients --recipient age1...\n\
     btrsend backup run --repo ssh://backup@nas.example/backup/host1 --device /dev/sdb1 'snaps/home.*'",
);

const SERVE: Block = Block::Example(
    "On the backup host, in ~backup/.ssh/authorized_keys: the client's key \
     may only add to repositories under /backup/host1, so a client that is \
     broken into cannot delete its backups; pruning runs from the backup \
     host's own cron (btrsend backup forget --repo /backup/host1 ...):",
    "command=\"btrsend serve --append-only --restrict-to-path /backup/host1\",restrict ssh-ed25519 AAAA... root@host1",
);

const BACKUP_NIGHTLY: Block = Block::Example(
    "The whole nightly job in one crontab line: take a read-only snapshot of \
     /mnt/pool/home, store it, keep 7 source snapshots, then prune the \
     repository (never an entry a kept one's chain needs):",
    "0 3 * * * /usr/local/bin/btrsend backup run --repo /backup/home --full-every-days 30 --snapshot /mnt/pool/home --snapshot-dir /mnt/pool/snaps --keep-snapshots 7 && /usr/local/bin/btrsend backup forget --repo /backup/home --keep-daily 7 --keep-weekly 4 --keep-monthly 12",
);

const BACKUP_LIST: Block = Block::Example(
    "The stored streams, and the paths of the full ones with jq:",
    "btrsend backup list --repo /backup/home\n\
     btrsend backup list --repo /backup/home --json | jq -r '.[] | select(.kind == \"full\") | .path'",
);

const BACKUP_VERIFY: Block = Block::Example(
    "Check everything, every stored byte included (exit status 12 names the \
     damage and the snapshots it makes unrestorable):",
    "btrsend backup verify --repo /backup/home --read-data",
);

const BACKUP_RESTORE: Block = Block::Example(
    "Restore a snapshot (its whole chain) into a directory (from a repository \
     encrypted for recipients, with an identity), or into a btrfs through the \
     stock receive:",
    "btrsend backup restore --repo /backup/home --identity ~/age-key.txt snaps/home.2026-11-23 --to /srv/restore\n\
     btrsend backup restore --repo /backup/home snaps/home.2026-11-23 --stdout | btrfs receive /mnt/pool/restored",
);

const BACKUP_IMPORT: Block = Block::Example(
    "Adopt stream files made earlier by btrfs send -f (raw or zstd), dated and \
     grouped for retention:",
    "btrsend backup import --repo /backup/home --origin home --time 2026-11-20T03:00:00Z /old/home.20261120.stream.zst",
);

const BACKUP_FORGET: Block = Block::Example(
    "See what a policy would delete, then apply it:",
    "btrsend backup forget --repo /backup/home --keep-daily 7 --keep-weekly 4 --keep-monthly 12 --dry-run\n\
     btrsend backup forget --repo /backup/home --keep-daily 7 --keep-weekly 4 --keep-monthly 12",
);

const BACKUP_STATUS: Block = Block::Example(
    "Alert when a backup is older than a day and a bit (exit status 14, one \
     line per stale origin on standard error, nothing otherwise), and leave \
     metrics for node_exporter's textfile collector:",
    "0 9 * * * /usr/local/bin/btrsend backup status --repo /backup/home --max-age 26h\n\
     btrsend backup status --repo /backup/home --max-age 26h --metrics-file /var/lib/prometheus/node-exporter/btrsend-status.prom",
);

const BACKUP_CONFIG: Block = Block::Example(
    "Check the config file, then run every job of it (each destination in \
     turn), and only the job home; then apply each destination's retention \
     policy, and alert when a destination's newest backup is older than its \
     max_age:",
    "btrsend backup config check --config /etc/btrsend/btrsend.toml\n\
     btrsend backup run --config /etc/btrsend/btrsend.toml\n\
     btrsend backup run --config /etc/btrsend/btrsend.toml --job home\n\
     btrsend backup forget --config /etc/btrsend/btrsend.toml\n\
     btrsend backup status --config /etc/btrsend/btrsend.toml",
);

const BACKUP_DRY_RUN: Block = Block::Example(
    "See what tonight's run would store: each stream's exact size, the total, \
     the free space of the repository and the time it takes at the limit:",
    "btrsend backup run --repo /backup/home --device /dev/sdb1 --dry-run --limit-rate 10M 'snaps/home.*'",
);

const BACKUP_COMPARE: Block = Block::Example(
    "After a copy, check that the two repositories agree, from their catalogs \
     alone (exit status 12 when they do not):",
    "btrsend backup verify --compare /backup/home s3://offsite/home",
);

const BACKUP_COPY: Block = Block::Example(
    "Copy to S3 what it lacks of the local repository (read with an identity, \
     written with the S3 repository's own write key), at 5 MiB/s, then check:",
    "btrsend backup copy --from /backup/home --to s3://offsite/home --from-identity /root/age-key.txt --limit-rate 5M\n\
     btrsend backup verify --compare /backup/home s3://offsite/home",
);

/// The extra sections of the page named `page` (`btrsend`, `btrsend-send`, …).
pub fn extra_sections(page: &str) -> Vec<Section> {
    let examples = match page {
        "btrsend" => vec![SHORT_FORM, FULL_SEND, INCREMENTAL_SSH, RECEIVE, CRON],
        "btrsend-send" => vec![FULL_SEND, INCREMENTAL_SSH, SEVERAL, CRON],
        "btrsend-receive" => vec![RECEIVE, INCREMENTAL_SSH],
        "btrsend-dump" => vec![DUMP],
        "btrsend-list" => vec![LIST],
        "btrsend-manifest" => vec![MANIFEST],
        "btrsend-completions" => vec![COMPLETIONS],
        "btrsend-backup" => vec![BACKUP_INIT, BACKUP_CRON, BACKUP_NIGHTLY, BACKUP_RESTORE],
        "btrsend-backup-init" => vec![BACKUP_INIT, BACKUP_SSH],
        "btrsend-backup-run" => vec![
            BACKUP_CRON,
            BACKUP_NIGHTLY,
            BACKUP_SSH,
            BACKUP_CONFIG,
            BACKUP_DRY_RUN,
        ],
        "btrsend-serve" => vec![SERVE, BACKUP_SSH],
        "btrsend-backup-list" => vec![BACKUP_LIST],
        "btrsend-backup-verify" => vec![BACKUP_VERIFY, BACKUP_COMPARE],
        "btrsend-backup-copy" => vec![BACKUP_COPY],
        "btrsend-backup-restore" => vec![BACKUP_RESTORE],
        "btrsend-backup-import" => vec![BACKUP_IMPORT],
        "btrsend-backup-forget" => vec![BACKUP_FORGET, BACKUP_NIGHTLY],
        "btrsend-backup-status" => vec![BACKUP_STATUS],
        "btrsend-backup-config" | "btrsend-backup-config-check" => vec![BACKUP_CONFIG],
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
        "btrsend-backup(1)",
        "btrsend-serve(1)",
    ]
    .into_iter()
    .filter(|p| p.strip_suffix("(1)") != Some(page))
    .collect();
    if page.starts_with("btrsend-backup") {
        if page != "btrsend-backup-config" {
            see_also.push("btrsend-backup-config(1)");
        }
        see_also.push("btrsend-repository(5)");
    }
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
    fn the_main_page_has_the_five_examples() {
        let s = extra_sections("btrsend");
        let titles: Vec<_> = s.iter().map(|s| s.title).collect();
        assert_eq!(titles, ["EXAMPLES", "EXIT STATUS", "SEE ALSO"]);
        assert_eq!(s[0].blocks.len(), 5);
        assert_eq!(s[0].blocks[0], SHORT_FORM, "the short form comes first");
        let Block::Text(see) = &s[2].blocks[0] else {
            panic!("SEE ALSO is text")
        };
        assert!(see.contains("btrfs-send(8)") && !see.contains("btrsend(1)"));
    }
}
