//! `btrsend serve`: the far end of an `ssh://` repository, speaking the
//! protocol of `btrsend::backup::remote` on standard input and output.

use std::io::{BufReader, BufWriter, IsTerminal as _};
use std::path::PathBuf;

use btrsend::backup::remote::server::{self, ServeOptions};
use clap::Args;

/// Arguments of `btrsend serve`.
#[derive(Debug, Args)]
#[command(after_long_help = AFTER)]
pub struct ServeArgs {
    /// Refuse to delete, overwrite or cut anything stored, and to store a
    /// catalog that drops or changes an entry (a catalog in the clear; an
    /// encrypted one must have a newer generation): new streams and new
    /// catalog generations only. For an authorized_keys forced command,
    /// so that a client whose key is stolen cannot destroy its backups.
    /// btrsend backup forget through such a server is refused: prune on
    /// the server itself or with another key. A target (--target) served
    /// so receives new subvolumes and refuses to delete any.
    #[arg(long)]
    pub append_only: bool,
    /// Serve only repositories and targets inside DIR (after symlinks are resolved);
    /// give it again for more directories. Without it any path the
    /// ssh user can reach is served.
    #[arg(long = "restrict-to-path", value_name = "DIR")]
    pub restrict_to_path: Vec<PathBuf>,
}

const AFTER: &str = "\
btrsend serve is not run by hand: btrsend backup ... --repo ssh://[USER@]HOST[:PORT]/PATH starts it on \
HOST through ssh and speaks to it on its standard input and output; so does backup run, list or \
forget --target ssh://[USER@]HOST[:PORT]/DIR, for which it receives snapshots into DIR as btrsend \
receive does (a read-only subvolume with its received UUID each), lists and deletes them \
(--append-only: receives, and removes what an interrupted receive left, but deletes nothing \
received completely). The repository's path travels \
inside the protocol, not on the command line, so a forced command in ~/.ssh/authorized_keys on HOST \
fixes the options and still serves every path it allows (see EXAMPLES in btrsend-serve(1)).

Each connection holds the repository's lock for the client while the client asks for it (the lock \
file of a directory repository, as a local btrsend takes it), so a run over ssh and a forget on \
the server never overlap. Messages go to standard error, which ssh carries to the client.";

/// Serve one connection on standard input and output.
pub fn run(args: &ServeArgs) -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(anyhow::Error::new(crate::exit::UsageError(String::from(
            "btrsend serve speaks to a btrsend client over ssh, not to a terminal: \
             use --repo ssh://HOST/PATH on the client",
        ))));
    }
    let options = ServeOptions {
        append_only: args.append_only,
        restrict_to: args.restrict_to_path.clone(),
    };
    server::widen_stdio_pipes();
    let mut input = BufReader::with_capacity(1 << 20, stdin.lock());
    let mut output = BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    server::serve(&mut input, &mut output, &options)
        .map_err(|e| anyhow::anyhow!("serve: the connection ended: {e}"))
}
