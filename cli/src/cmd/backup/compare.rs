//! `btrsend backup verify --compare R1 R2`: whether two repositories
//! agree, from their catalogs alone; the comparison is the core's
//! ([`btrsend::backup::compare`]), this module renders it and maps a
//! disagreement to exit status 12.

use std::io::Write;

use btrsend::backup::{self, EntryRef, Repository};

use super::secrets::{self, FromKeyArgs, KeyArgs};
use crate::exit::{Exit, ExitWith};
use crate::text::printable;

/// Open the repository `spec` with the `--from-*` secrets (`copy --from`,
/// the first of `verify --compare`), its reads and writes at most `rate`
/// bytes per second.
pub(super) fn open_from(
    spec: &str,
    keys: &FromKeyArgs,
    rate: Option<u64>,
) -> anyhow::Result<Repository> {
    let name = printable(spec).into_owned();
    let ask = move || secrets::prompt(&format!("Passphrase of {name}"), false);
    open_spec(spec, keys.secrets(&ask)?, rate)
}

/// Open the repository `spec` with the ordinary secrets (`copy --to`, the
/// second of `verify --compare`).
pub(super) fn open_to(spec: &str, keys: &KeyArgs, rate: Option<u64>) -> anyhow::Result<Repository> {
    let name = printable(spec).into_owned();
    let ask = move || secrets::prompt(&format!("Passphrase of {name}"), false);
    open_spec(spec, keys.secrets(&ask)?, rate)
}

fn open_spec(
    spec: &str,
    secrets: backup::crypt::repo::Secrets<'_>,
    rate: Option<u64>,
) -> anyhow::Result<Repository> {
    let mut store = backup::store_for(spec)?;
    if let Some(rate) = rate {
        let limit = std::sync::Arc::new(btrsend::rate::RateLimit::new(rate));
        store = std::sync::Arc::new(backup::store::LimitedStore::new(store, limit));
    }
    Ok(Repository::open_with(store, &secrets)?)
}

fn named(e: &EntryRef) -> String {
    format!(
        "entry {} ({}, {} ctransid {})",
        e.id,
        printable(&e.path),
        e.uuid,
        e.ctransid
    )
}

/// Compare `first` and `second`; print what differs.
pub(super) fn run(
    first: &str,
    second: &str,
    from: &FromKeyArgs,
    to: &KeyArgs,
    json: bool,
) -> anyhow::Result<()> {
    let a = open_from(first, from, None)?;
    let b = open_to(second, to, None)?;
    let rep = backup::compare(&a, &b)?;
    let (na, nb) = (a.store().name(), b.store().name());
    if json {
        let mut v = serde_json::to_value(&rep)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("first".into(), na.into());
            o.insert("second".into(), nb.into());
            o.insert("agree".into(), rep.disagree.is_empty().into());
        }
        writeln!(
            crate::exit::stdout(),
            "{}",
            serde_json::to_string_pretty(&v)?
        )?;
    } else {
        for d in &rep.disagree {
            eprintln!(
                "btrsend: damage: {} of {} and entry {} of {} disagree: {}",
                named(&d.first),
                printable(na),
                d.second_id,
                printable(nb),
                printable(&d.differences.join("; "))
            );
        }
        for d in &rep.other_stream {
            writeln!(
                crate::exit::stdout(),
                "another stream: {} of {} and entry {} of {} store the snapshot as different streams, one of them a synthetic full stream (not damage): {}",
                named(&d.first),
                printable(na),
                d.second_id,
                printable(nb),
                printable(&d.differences.join("; "))
            )?;
        }
        for e in &rep.only_in_first {
            writeln!(
                crate::exit::stdout(),
                "only in {}: {}",
                printable(na),
                named(e)
            )?;
        }
        for e in &rep.only_in_second {
            writeln!(
                crate::exit::stdout(),
                "only in {}: {}",
                printable(nb),
                named(e)
            )?;
        }
    }
    if rep.disagree.is_empty() {
        if !json {
            writeln!(
                crate::exit::stdout(),
                "{} and {} agree on the {} stored snapshots they share ({} only in the first, {} only in the second; catalogs compared, no stream read)",
                printable(na),
                printable(nb),
                rep.shared,
                rep.only_in_first.len(),
                rep.only_in_second.len()
            )?;
        }
        Ok(())
    } else {
        let msg = format!(
            "{na} and {nb} disagree on {} of the {} stored snapshots they share",
            rep.disagree.len(),
            rep.shared
        );
        Err(anyhow::Error::new(ExitWith::new(Exit::Damage, msg)))
    }
}
