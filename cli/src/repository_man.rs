//! The text of `btrsend-repository(5)`: the repository layout, the catalog
//! and the stream-file trailer, so that backups can be read without
//! btrsend. A test renders it to `man/btrsend-repository.5` (roff) and
//! keeps the committed page current (`BTRSEND_UPDATE_MAN=1`).

/// Title line: name, section, one-line description.
pub const NAME: (&str, &str, &str) = (
    "btrsend-repository",
    "5",
    "layout of a btrsend backup repository",
);

/// Sections: heading, then paragraphs; a paragraph starting with two
/// spaces is shown as it is (preformatted).
pub const SECTIONS: &[(&str, &[&str])] = &[
    (
        "DESCRIPTION",
        &[
            "A btrsend backup repository (made by btrsend backup init) is a directory (here, or on another host over ssh: see ON ANOTHER HOST), or the objects under s3://BUCKET[/PREFIX] in an S3-compatible object store, holding btrfs send streams as zstd files, a catalog that lists them, and a config object. An unencrypted repository (format 1, init --encryption none) is plain JSON and zstd: a backup can be read and restored with zstd(1) and btrfs-receive(8) alone (for S3, fetch the objects first, e.g. with aws s3 cp). An encrypted one (format 2, see ENCRYPTION) is the same with every stream file an age(1) file and every catalog sealed: it is restored with age(1), zstd(1) and btrfs-receive(8).",
        ],
    ),
    (
        "LAYOUT",
        &[
            "  config                              repository format\n  catalog/NNNNNNNNNNNNNNNN.json       the catalog, one object per generation\n  streams/UUID-CTRANSID-RANDOM.btrs.zst   one stored send stream each\n  lock                                flock(2) target (directories)\n  locks/KIND-HOST-PID-RANDOM.json     lock objects (S3)\n  tmp/                                unfinished uploads (partial stream files; markers of multipart uploads in S3)\n  index/kHEX                          a pack of pages of the browsing index (see INDEX)\n  index/pHEX                          a page of its own (indexes made before packs)\n  index/rNAME.json                    the index root of the stream streams/NAME.btrs.zst",
            "In S3 these are the keys below PREFIX/. A stream object is written by a multipart upload and appears only when the upload completes. Before its first part, the upload's id is recorded in a marker object tmp/NAME.RANDOM.upload ({\"key\",\"upload_id\"}), deleted when the upload completes or is aborted. An upload that fails in import is aborted at once (its parts deleted). Parts of 8 MiB and more end at frame ends; as they are stored, the marker is rewritten with the parts stored so far, in order (\"parts\": each one's id and size; the id is the part's ETag, or, as uploads carry SHA-256 checksums, an XML PartMetadata element with the ETag and the checksum the server returned, which completing the upload needs), and with the state after the last of them (\"state\", JSON: the stream's snapshot uuid and ctransid, its parent's, the protocol, the command count, the resume shape chain, the stored and raw lengths, the frame table so far and the raw stream's BLAKE3 state as chaining values of its 16 KiB-aligned subtrees plus the bytes of the last partial block). The upload of a run that fails or is killed stays: the next run that stores the same snapshot with the same parent continues it (it checks that the server still has the upload with a one-byte part where the next part goes, sends the stream again and checks its bytes up to the recorded point against the recorded BLAKE3 state, uploads the remaining parts with the next part numbers and completes the upload with all of them), so the stored object is byte for byte what an uninterrupted run stores, save the compressed bytes of later frames. A marker of another snapshot or parent, one with no recorded part, or one whose upload the server no longer has, is aborted and removed with a notice, and the stream sent again; import and forget abort the uploads of snapshots that are stored, keep the others. Only an upload killed between its creation and its marker (one request, before any part is sent) is left to the bucket's lifecycle rule (AbortIncompleteMultipartUpload), if one is set; it holds no data.",
            "In a directory, a stream file is written as tmp/UUID-CTRANSID-RANDOM.btrs.zst.PID.RANDOM and linked to its name under streams/ when complete. A run that stops before (killed, a full disk, a read error) leaves it there: a partial stream file, whole zstd frames as in STREAM FILES without the trailer, perhaps followed by a torn frame. The next run that stores the same snapshot continues it: it reads the frames in order, decompresses each and decodes its commands (checking zstd's content checksum and each command's CRC-32C), keeps the frames up to the first one that is cut, damaged, or holds the END command, checks that the stream is of the same snapshot (SUBVOL or SNAPSHOT: uuid and ctransid) and parent (SNAPSHOT's clone uuid and ctransid) as the one it stores, then sends the whole stream again and checks that its bytes up to where the kept frames end have the BLAKE3 of what those frames hold (the kept part's file data is read again from the source, never stored again), cuts the file after the kept frames, and appends the rest of the stream, then the trailer over all the frames. The raw stream is the same as that of an uninterrupted run; the frame boundaries and compressed bytes may differ. A partial file that does not match (another snapshot or parent, other options, a changed layout, or a file this host did not write) is removed with a notice and the stream sent again. run removes the partial files of snapshots it does not store (stored already, gone from the source, changed, or not selected); import and forget keep those whose snapshot is not stored. A partial file is never listed or restored; verify notes it. Other files in tmp/ (the temporary files of catalog generations) are removed by the next run, import or forget. An S3 repository continues an unfinished multipart upload instead, from the state its marker recorded (see above).",
            "config is {\"format\":\"btrsend-repository\",\"version\":1,\"id\":HEX,\"created\":RFC3339}; an encrypted repository's is version 2 and adds \"encryption\" (passphrase or recipients) and \"mac\" (see ENCRYPTION). This page describes versions 1 and 2.",
        ],
    ),
    (
        "CATALOG",
        &[
            "The current catalog is the catalog/*.json file with the highest number (its generation, 16 decimal digits). A change writes the next generation with a create-if-absent operation (link(2) of a flushed file; in S3 a PUT with If-None-Match: *), so a catalog is replaced atomically; the three newest generations are kept. In S3 a HEAD precedes the PUT. Safety does not rest on the server enforcing If-None-Match (some, like the s3s-fs test server, check it without atomicity): only the holder of the exclusive lock writes catalogs and stream files, and lock objects need no conditional write (see Locks).",
            "  {\"format\":\"btrsend-catalog\",\"version\":1,\"generation\":G,\"next_id\":N,\n   \"entries\":[ENTRY,...]}",
            "Each ENTRY describes one stored stream: id (unique, never reused), path (the snapshot's path from the top level of its filesystem, or the stream's subvolume name for imports), uuid and ctransid (as the stream's SUBVOL or SNAPSHOT command carries them), parent_uuid, parent_ctransid and parent_id (the base of an incremental stream; null for a full one), kind (full or incremental), time (RFC 3339: the snapshot's creation time, or the time given to import), origin (the UUID of the subvolume the snapshot was taken of, or the --origin of import), file (the stream file's key), stream_bytes (raw stream length), stored_bytes (file length), stream_blake3 (BLAKE3 of the raw stream, hex), commands, proto, stored_at.",
            "To restore an entry, follow parent_id to the full stream, then receive the chain's files in order, full stream first:",
            "  zstd -dc REPO/streams/FULL.btrs.zst | btrfs receive DIR\n  zstd -dc REPO/streams/NEXT.btrs.zst | btrfs receive DIR",
            "Only files the catalog names belong to the repository: a file written by an interrupted run is not listed, is reported by verify and is removed (or, a partial stream file or an unfinished upload, continued) by the next run.",
        ],
    ),
    (
        "STREAM FILES",
        &[
            "A stream file is a sequence of ordinary zstd frames (each with its content size and checksum) followed by a trailer. The frames decompress, in order, to the raw btrfs send stream; each frame holds whole send-stream commands (the first also the 17-byte stream header), about 4 MiB of raw stream each.",
            "The trailer is a zstd skippable frame, which zstd -d ignores:",
            "  4 bytes   magic 0x184D2A5E, little-endian\n  4 bytes   length L of the rest, little-endian (L = J + 16)\n  J bytes   the trailer JSON\n  8 bytes   J, little-endian\n  8 bytes   \"BTRSTRL1\"",
            "A reader finds the trailer from the last 16 bytes of the file. The trailer JSON is {\"format\":\"btrsend-stream\",\"version\":1, \"stream_bytes\", \"stream_blake3\", \"commands\", \"proto\", \"uuid\", \"ctransid\", \"parent_uuid\", \"parent_ctransid\", \"frames\":[{\"offset\",\"len\",\"raw_len\",\"blake3\"},...]}: for each frame its offset and length in the file, its decompressed length, and the BLAKE3 of its stored (compressed) bytes. The frames cover the file from offset 0 to the trailer without gaps.",
        ],
    ),
    (
        "LOCKS",
        &[
            "Locks: a directory is locked with flock(2) on its lock file (exclusive for run, import and forget, shared for verify --read-data and restore; list, verify without --read-data and forget --dry-run take none: they read one catalog generation, which a writer never changes, only replaces). In S3 each holder writes a lock object locks/KIND-HOST-PID-RANDOM.json ({\"kind\",\"host\",\"pid\",\"time\"}) under a name of its own, then lists the others; it writes a fresh one every 5 minutes before removing the old one, so one of its objects is always there. An exclusive lock conflicts with every other lock object; two processes that lock at the same moment both see each other and both back off. A lock object whose process is gone (same host, no such PID) or that was not renewed for 15 minutes is stale: it is removed with a notice.",
        ],
    ),
    (
        "CHECKS",
        &[
            "btrsend backup verify checks the catalog, the presence and size of every file, every trailer against its entry (snapshot, parent, length, BLAKE3, protocol, command count), and every stream's own first command (SUBVOL or SNAPSHOT: its uuid and ctransid, and for an incremental stream its parent's) against its entry and the entry its parent_id names; with --read-data also every frame's BLAKE3, every command's CRC-32C and every stream's BLAKE3. btrsend backup restore --stdout reads the chain twice: every frame's BLAKE3 and every stream's BLAKE3 are checked before it writes anything. restore --to reads each file once: every frame's BLAKE3 is checked before the frame is decompressed and applied, and every stream's BLAKE3 before its last frame, which holds the END command that finishes a received subvolume; so a damaged stream never ends as a finished subvolume, and on damage the receive stops and the subvolumes this restore made (the chain's earlier ones too) are deleted again: DIR is left as it was.",
        ],
    ),
    (
        "ENCRYPTION",
        &[
            "A repository made with init --encryption passphrase or --encryption recipients is format 2. Its layout is that of format 1 plus keys/, with the same names; what differs is inside the objects. Format 1 repositories keep working, read and write, unchanged.",
            "  config                     plain JSON with \"encryption\" and \"mac\"\n  keys/pass-RANDOM.age       passphrase mode: one per passphrase\n  keys/recipients.age        recipients mode\n  catalog/N.json             sealed (see below), not JSON\n  streams/NAME.btrs.zst      an age file whose plaintext is the stream file\n  tmp/NAME.btrs.zst.key      the sealed record of an unfinished upload (a directory)\n  tmp/, lock, locks/         as in format 1 (lock objects stay plain)",
            "Keys. init draws a random 32-byte write key. Every symmetric key is derived from it with BLAKE3's key derivation (blake3::derive_key, one context string per purpose): the key that seals catalogs, the key of the binding stanzas, the key of the config's MAC. Stream files are encrypted for age X25519 recipients. In passphrase mode init also makes an age identity for the repository (its recipient is the only one) and stores the write key, the recipient and the identity, as JSON ({\"format\":\"btrsend-key\",\"version\":1,\"repository\",\"write_key\",\"recipients\",\"identity\",\"created\"}), in keys/pass-RANDOM.age: an age file encrypted with the passphrase (age's scrypt recipient; its work factor, about a second of work when made, is in the file's header; BTRSEND_SCRYPT_LOG_N overrides it, for tests). Each passphrase is one such object, so adding or removing one re-encrypts nothing else. In recipients mode the recipients are the user's (age-keygen -y), init writes the write key, the recipients, the repository's id and location to a file on the host that runs it ({\"format\":\"btrsend-write-key\",...}, mode 0600, by default ~/.config/btrsend/keys/ID.json, which run and import look up by the repository's id; never in the repository), and stores the same minus the location, encrypted for the recipients, as keys/recipients.age, so that an identity opens the catalog.",
            "Stream files. Each is an age file (age-encryption.org/v1) whose plaintext is exactly the format 1 stream file (zstd frames and trailer), so age -d then zstd -d gives the raw stream. Its header wraps the file key for each recipient and carries one more stanza, btrsend-bind, whose body is the keyed BLAKE3, under the binding key, of the repository's id, the object's key (streams/NAME.btrs.zst) and the file key. Other age implementations skip it. A reader refuses an object whose stanza does not match before it decrypts anything: an object moved to another name, copied from another repository, or made by someone who knows only the public recipients. The payload is age's: 64 KiB chunks sealed with ChaCha20-Poly1305 under a key derived from the file key and a random nonce, the last chunk flagged, so a changed, cut or reordered chunk does not open. btrsend seals the payload itself (with the same construction: ring's ChaCha20-Poly1305, RustCrypto's hkdf) so that it can read any range of a stream file and continue an unfinished one; the tests check its files against the age command both ways. The catalog's stored_bytes is the age file's size.",
            "Catalogs. A catalog generation is \"btrsend-sealed-1\\n\", a 24-byte random nonce, then the catalog's JSON sealed with XChaCha20-Poly1305 under the catalog key, with the repository's id and the object's key (catalog/N.json) as associated data: a generation copied under another generation's name, or from another repository, does not open.",
            "Config. \"mac\" is the keyed BLAKE3 (hex), under a key derived from the write key, of format, id, created and encryption. A config whose MAC does not match is refused; a format 1 config where the host holds keys for the repository (a passphrase, identity or write key given, or a write-key file for its id or location under ~/.config/btrsend/keys/) is refused as a downgrade.",
            "Unfinished uploads. An interrupted run's upload is continued as in format 1, by a host that may hold only the write key, which cannot unwrap a file key. So before a stream file's first byte, its record is written: the object's key, the header's length and BLAKE3, and the payload key, as JSON sealed like a catalog under the name tmp/NAME.btrs.zst.key. In a directory the record is that file, and the partial file tmp/NAME.btrs.zst.PID.RANDOM holds the header and the chunks sealed so far; the next run reads its whole chunks back with the record's key (a chunk that does not authenticate ends what is kept, as a torn frame does), cuts the file at the chunk where the kept frames end, and seals on from there, the bytes of that chunk it keeps sealed again with what follows. In S3 the record is the marker's \"state\" (hex), with the writer's place at the end of each part: the chunks sealed, the plaintext of the chunk being filled (up to 64 KiB) and the format 1 state. The continued object is bound to the name the upload began with, and is an age file like any other. The record goes when the object is complete (one left by a kill just then lists as an empty unfinished upload, which the next run removes); a record or partial file that does not open, or whose header is not the one its record names, is removed with a notice and the stream sent again.",
            "Restoring without btrsend: with an identity of a recipient, receive the chain's files in order (the order is in the catalog, which age does not open: use btrsend backup list if you can, else receive the full stream, whose first command is SUBVOL, then the others; btrfs receive refuses one whose parent is not there yet):",
            "  age -d -i KEY REPO/streams/FULL.btrs.zst | zstd -d | btrfs receive DIR\n  age -d -i KEY REPO/streams/NEXT.btrs.zst | zstd -d | btrfs receive DIR",
            "In passphrase mode the identity is in the key object: age -d REPO/keys/pass-RANDOM.age asks for the passphrase and prints the JSON whose \"identity\" field is an age identity; put that line in a file and use it as KEY above.",
            "What shows: the number, sizes and times of the objects (so the number and rough sizes of stored streams and catalogs), the repository's id and when it was made, its mode, and, in S3, what the markers of unfinished uploads record about parts (numbers, sizes, checksums of ciphertext). Not the snapshots' names, paths, uuids or times, nor any file name or content, nor the catalog.",
        ],
    ),
    (
        "THREAT MODEL",
        &[
            "Someone who can read the repository (the storage provider, a stolen disk, a leaked S3 key) but holds no secret learns what ENCRYPTION says shows, and nothing else.",
            "Someone who can write to it but holds no secret can delete objects, roll the repository back to an older state by deleting the newest catalog generations (btrsend keeps the three newest; verify sees an older catalog as valid), and make it unusable; btrsend then refuses what does not authenticate, naming the object, and restores nothing from it: a changed or cut stream file or catalog, two stream files swapped, an object or catalog copied from another repository made with the same passphrase or recipients, an older catalog under a newer name, a stream file made by someone who knows the public recipients, a changed config. verify exits with 12 for these (a changed config stops every command with exit status 13). In recipients mode, an identity holder who opens the repository without its write key (on a host other than the one that backs up) takes the write key from keys/recipients.age, which someone who knows the public recipients could replace together with every catalog and stream file (a whole forged repository): to rule that out, give that host the write-key file too (--write-key); btrsend then refuses a repository whose keys/recipients.age holds another write key.",
            "Someone who holds the write key of the host that backs up (recipients mode: the host taken over) can read the catalogs (snapshot names, paths, uuids, times and sizes: what list shows), store new streams and catalogs, and delete; it can read what an unfinished upload holds (its record has the payload key: the host was writing it), and it cannot read any stored stream, file name or content: stream files open only with an identity, which that host never holds. What it stores later is its own; what was stored before stays readable and authentic for the identity holders.",
            "Someone who holds a passphrase or an identity can read and write everything. A removed passphrase's key object is deleted from the repository, but anyone who copied it before can still open it with that passphrase: change the passphrase when it is compromised, knowing that the keys it opened stay the same.",
            "Secrets are never printed, logged or put in JSON output or error messages; btrsend keeps them in memory that is zeroed when freed where the libraries allow it.",
        ],
    ),
    (
        "SHARED STORAGE",
        &[
            "A repository often lives where others can write: a NAS share, a USB disk, a bucket whose keys other hosts hold. Everything btrsend reads from it (catalogs, trailers, stream files, partial files, markers, lock objects) is treated as hostile input. What someone who can write to the repository can and cannot do to a host that runs btrsend against it:",
            "It cannot make btrsend read, write or delete anything outside the repository, or outside the target of a restore. Every key is checked before use (one or two names of letters, digits, '.', '_' and '-', none starting with '.'; a stream file's key is streams/NAME.btrs.zst), and a catalog holding any other key is refused whole. In a directory, each object is opened relative to the repository's directory with O_NOFOLLOW on each component: a symlink, '..' or absolute name leads nowhere. Objects are read only when they are regular files (a FIFO or device is refused, never waited on). The lock file and partial stream files are written only when they are regular files with one link (a hard link to a file elsewhere is refused), and the lock file only when owned by the user running btrsend or the repository's owner; it is never cut.",
            "It cannot make forget delete a stream that a kept entry needs. Each catalog is checked when it is loaded: ids in order, each incremental entry's parent an earlier entry with the very uuid and ctransid the entry records, every stream file named once. Before it deletes anything, forget checks every entry against its stream file's trailer and the stream's own first command, and refuses to delete anything when one does not agree. It never deletes a file a remaining entry names.",
            "It cannot make run store anything but the stream it sends: a partial stream file is continued only when the send, made again from the source, produces the very bytes it holds.",
            "It cannot make btrsend print terminal control sequences: catalog strings and paths are shown with control characters escaped (\\xNN) in every human-readable output; JSON output escapes them as JSON does.",
            "It can delete or damage what is stored (verify finds it, restore refuses it). In an unencrypted repository (format 1), which has no keys, it can also replace the streams and catalog with others that agree with each other (verify checks that such a repository is consistent, not who wrote it) and read everything stored: keep its directory mode 0700 (btrsend makes its directories 0700 and its files 0600, whatever the umask, and verify warns when others can read the repository). An encrypted repository (format 2) refuses what its keys did not make and shows nothing of what it stores: see THREAT MODEL.",
        ],
    ),
    (
        "ON ANOTHER HOST",
        &[
            "A directory repository on another host is reached as ssh://[USER@]HOST[:PORT]/PATH: btrsend runs ssh (or the command in --ssh-command or BTRSEND_SSH) with the command btrsend serve (the program in --remote-path or BTRSEND_REMOTE_PATH) on HOST, and speaks this protocol, version 1, over its standard input and output. The repository's layout on HOST is the one above; nothing about it changes.",
            "A frame is the length of a JSON header (4 bytes, little-endian, at most 1 MiB), the length of a payload (4 bytes, at most 8 MiB), the header, then the payload's bytes. A request header has \"op\": hello {protocol, version, path}, get {key, range: [start, end] or null}, put_if_absent {key} (the payload is the object), list {prefix}, delete {key}, multipart {key} then write frames (payloads, no reply) then complete or abort, continue_upload {tmp, key, keep} (continue the partial file tmp/... kept up to keep bytes), init_root, lock {exclusive, wait_ms}, unlock. A reply has \"reply\": hello {protocol, version, append_only, exists}, ok, data {len, more} (the payload, and more frames of payload that follow), stored {stored}, listing {objects: [[key, size]...], done} (a long listing comes in parts), not_found, exists, refused {why}, failed {why}, lock_held {holder}. Unknown fields are refused. The path travels in hello, so a forced command in authorized_keys (command=\"btrsend serve --append-only --restrict-to-path DIR\") fixes the server's options whatever the client asks; a client of another protocol version is refused in the handshake.",
            "Neither side trusts the other. The server checks every key against the rules in SHARED STORAGE, resolves the repository's path (symlinks included) and refuses one outside every --restrict-to-path DIR, and serves it as btrsend serves a local directory (relative opens, O_NOFOLLOW). The client checks every reply: its kind, a data reply's length against what was asked, a listing's keys and prefix; after a reply that fails a check the connection is not used again. What it reads is then checked as everything read from a repository is (frame hashes, trailers, the catalog, and in format 2 the keys): a far end that returns wrong bytes is found as damage, never restored. Text from the far end reaches a terminal with its control characters replaced.",
            "The lock of a repository on another host is the lock file of its directory, taken by the server for the client (lock) and held until unlock or the end of the connection: a client and a process on HOST that uses the directory itself exclude each other as two local processes do.",
            "With --append-only the server refuses delete (but of unfinished uploads in tmp/), an upload or put to a key that exists, and a catalog generation at or below the newest stored one; a catalog in the clear must also keep every entry of the newest stored one unchanged. It cannot read a sealed catalog (format 2): a client holding the write key can store a newer generation that lists fewer entries, but not remove the streams or the older generations, so the backups stay on HOST and the owner of HOST can go back to an older generation. btrsend backup forget through an append-only server is refused; run it on HOST against the directory.",
        ],
    ),
    (
        "INDEX",
        &[
            "backup run and backup import index each stream as they store it (from the bytes the stream file is written from, on a thread of its own; run --no-index skips it), and btrsend backup index builds, for every entry that has none, the browsing index that backup ls, backup dump and backup mount read: what the entry's snapshot holds (directories, names, inodes with their type, mode, owner, size, times and link count, symlink targets, device numbers, xattrs) and, for each range of each file, where its bytes are in the repository's streams. It is made by applying the entry's stream to the index of its parent entry (or of nothing, for a full stream) with the receiver's rules, so file data is never copied: a range points into the stream that wrote it (the stream's object key, a byte offset in the raw stream, a length, and for compressed data sent encoded its compression and sizes), including ranges the parent's streams or a CLONE supplied. Reading one file reads the pages on its path and the frames that hold its data.",
            "The index is a copy-on-write B+tree. Each node is a page, named by the 64-digit BLAKE3 of its bytes (HEX), keyed with 32 zero bytes in format 1 and with a key derived from the write key in format 2 (so names reveal nothing of the contents). An entry's index shares every page its stream did not change with its parent's. The pages one flush of the tree writes (about every 4096 changed nodes, and at the end) are stored together as a pack, index/kHEX: the stored pages one after the other, each zstd of its bytes (in format 2 each then sealed on its own, bound to the name index/pHEX of its page, so one page is read with one ranged read), where HEX is the keyed BLAKE3 of the string \"btrsend index pack\" and a NUL, then each page's name and stored length (8 bytes, little-endian), in order: an index built again from the same stream on the same parent is made of the same packs. A page is a kind byte (1: leaf, 3: internal), a count, then per entry a length-prefixed key and, in a leaf, a length-prefixed value, in an internal node the child's 32-byte name and where it is: 0 (a page of its own), 1 then a pack's 32-byte name, an offset and a length (a range of that pack), or 2 then an offset and a length (a range of the pack this page is in) (lengths, counts, offsets as LEB128). Keys are a kind byte and big-endian numbers: 01 INODE (the inode record), 02 DIR NAME (the child's inode number), 03 INODE NAME (an xattr's value), 04 INODE OFFSET (a data range). Inode numbers are the index's own (the root is 256). index/rNAME.json is {\"tree\": the root page's name, \"at\": {\"pack\", \"offset\", \"len\"} where it is, \"next_ino\", \"sources\": the stream object keys the ranges point into}. Indexes made before packs (their roots have no \"at\") keep each page as an object of its own, index/pHEX (zstd of its bytes; internal pages of kind 2 name their children alone); they are read as they are, and what is indexed on them refers to their pages.",
            "Everything read from the index is checked: a page must match its name and parse (lengths, key order), a root may name only streams of the catalog's entries, a path is resolved name by name from the root with the receiver's path rules; a damaged or missing page is an error naming it, never an answer. An index is recorded (its root written) just before its entry goes into the catalog, and only for the snapshot that entry names (a root whose entry never made it is swept by forget); an indexing that fails never fails the run or import that stores the stream: it is reported, and the entry is left without an index. Packs are stored before their root is written. forget deletes the roots of the entries it deletes and then every pack (and page of its own) of which no kept root reaches a page (mark and sweep: the internal pages of every kept index are read, leaves are known from their parents; a pack stays whole while any page of it is in use); when a kept index cannot be walked, forget deletes no page and says why. A forget that deletes no entry and finds no root to sweep walks no index (pages an interrupted run left go with the next forget that deletes). verify notes the entries that have no index and reports a root that does not parse or names a missing page; with --read-data it reads every page and builds each index again from its stream (on its parent's index), which must give the same root (for an index made before packs, the same records). backup index reads every page of every index first, deletes the roots and the packs holding damaged pages of damaged indexes and builds them again, parents first (the packs come back as they were, with the pages other indexes share from them). In format 2 roots are sealed like catalogs (with their object key as associated data) and pages in packs as said above; the write key opens them, so a host that holds only the write key can read the names and attributes of what it indexed, though no file contents.",
        ],
    ),
    (
        "SEE ALSO",
        &[
            "btrsend-backup(1), btrsend-serve(1), age(1), age-keygen(1), zstd(1), btrfs-receive(8), ssh(1), sshd(8)",
        ],
    ),
];

/// The page as roff.
pub fn render() -> String {
    let esc = |s: &str| {
        s.replace('\\', "\\\\")
            .replace('-', "\\-")
            .lines()
            .map(|l| {
                if l.starts_with('.') || l.starts_with('\'') {
                    format!("\\&{l}")
                } else {
                    l.to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (name, section, what) = NAME;
    let mut out = format!(
        ".TH {name} {section}\n.SH NAME\n{} \\- {}\n",
        esc(name),
        esc(what)
    );
    for (head, paras) in SECTIONS {
        out.push_str(&format!(".SH \"{head}\"\n"));
        for p in *paras {
            if p.starts_with("  ") {
                out.push_str(&format!(".PP\n.nf\n{}\n.fi\n", esc(&body_lines(p))));
            } else {
                out.push_str(&format!(".PP\n{}\n", esc(p)));
            }
        }
    }
    out
}

/// A preformatted paragraph's lines without their two-space indent.
fn body_lines(p: &str) -> String {
    p.lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}
