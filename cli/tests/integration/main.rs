//! The `btrsend` binary's end-to-end tests: one test binary, one module per
//! subcommand or area (as `tests/integration/` is for the core library).
//! Cargo sets `CARGO_BIN_EXE_btrsend` only for the tested package's own
//! tests, which is why they live here and not in the root `tests/`.
//!
//! Run one area with a module filter, e.g.
//! `cargo test --release -p btrsend-cli --test integration send::`;
//! `BTRSEND_UPDATE_MAN=1 cargo test --release -p btrsend-cli --test integration man::`
//! regenerates `man/`.

mod backup;
mod backup_against;
mod backup_browse;
mod backup_btrbk;
mod backup_config;
mod backup_copy;
mod backup_crypt;
mod backup_dry_run;
mod backup_feedback;
mod backup_forget;
mod backup_hostile;
mod backup_mount;
mod backup_plan;
mod backup_query;
mod backup_resume;
mod backup_s3;
mod backup_series;
mod backup_snapshot;
mod backup_ssh;
mod backup_status;
mod backup_synthesize;
mod backup_target;
mod common;
mod completions;
mod degraded;
mod dump;
mod errors;
mod limit_rate;
mod list;
mod man;
mod manifest_devices;
mod pipe;
mod readme;
mod receive;
mod repo_store;
mod resume;
mod s3_proxy;
mod send;
mod send_device_mounted;
mod send_incremental;
mod send_mounted;
mod send_output;
mod send_several;
mod short_form;
