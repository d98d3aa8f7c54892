//! Encrypted, authenticated repositories (format 2).
//!
//! (Design and threat model: see `btrsend-repository(5)`.)

pub mod agefile;
