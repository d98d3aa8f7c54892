//! Encrypted, authenticated repositories (format 2): the keys
//! ([`keys`]), stream objects as age files ([`agefile`]) and small sealed
//! objects ([`seal`]).
//!
//! Design and threat model: btrsend-repository(5).

pub mod agefile;
pub mod keyring;
pub mod keys;
pub mod repo;
pub mod seal;
pub mod store;
pub mod unfinished;

/// Fill `buf` from the system's random source.
///
/// # Errors
///
/// The source failed.
pub(crate) fn random(buf: &mut [u8]) -> Result<(), String> {
    getrandom::fill(buf).map_err(|e| format!("the system's random source failed: {e}"))
}

/// A passphrase (zeroized when dropped), as the key functions take it.
pub use age::secrecy::SecretString;

/// Keep secrets out of core dumps: this process dumps no core from now on
/// (its soft limit set to 0; the hard limit stays, so a child may raise
/// its own). Called once secrets are in memory.
pub fn no_core_dumps() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let now = getrlimit(Resource::Core);
    // Best effort: a refusal leaves the limit as it was.
    let _ = setrlimit(
        Resource::Core,
        Rlimit {
            current: Some(0),
            maximum: now.maximum,
        },
    );
}
