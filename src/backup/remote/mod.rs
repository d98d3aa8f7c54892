//! Repositories and received-subvolume targets on another host: the
//! protocol that `btrsend serve` speaks on stdin/stdout, and the store
//! (or target) a client speaks it through.
//!
//! [`proto`] is the wire format (frames, messages, the handshake and the
//! checks each side applies to what the other sends), [`server`] the far
//! end's loop over a directory store, [`client`] the near end's
//! [`Store`](crate::backup::Store), and [`spec`] the `ssh://` address and
//! the ssh command line that reaches the far end, which [`ssh`] starts.
//! [`target`] is the far end of a target directory (the `Target*`
//! requests), whose near end is [`client::RemoteTarget`].

pub mod client;
pub mod proto;
pub mod server;
pub mod spec;
pub mod ssh;
pub mod target;
