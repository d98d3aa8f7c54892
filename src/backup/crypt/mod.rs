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
