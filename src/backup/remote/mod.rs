//! Repositories on another host: the protocol that `btrsend serve` speaks
//! on stdin/stdout (issue 33, part A).
//!
//! [`proto`] is the wire format (frames, messages, the handshake and the
//! checks each side applies to what the other sends), [`server`] the far
//! end's loop over a directory store.

pub mod proto;
pub mod server;
