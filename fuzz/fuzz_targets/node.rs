//! Fuzz tree-block validation: `Node::new` on arbitrary bytes against
//! arbitrary expectations must accept or return an error, never panic; an
//! accepted block's accessors (keys, items, pointers, search) must not
//! panic either.
//!
//! The first 48 input bytes choose the expectation and the geometry; the
//! rest is the block. Flags can stamp the expected address, fsid,
//! generation and level into the header and reseal the checksum, so the
//! fuzzer gets past the first checks to the item layout.
#![no_main]

use btrsend::csum::CsumType;
use btrsend::tree::key::Key;
use btrsend::tree::check::{BlockCheck, BlockExpect};
use btrsend::tree::node::Node;
use btrsend::types::{Generation, Logical, TreeId, Uuid};
use libfuzzer_sys::fuzz_target;

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        x.copy_from_slice(s);
    }
    u64::from_le_bytes(x)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 48 {
        return;
    }
    let (head, body) = data.split_at(48);
    let nodesize: usize = [4096, 8192, 16384, 65536][usize::from(head[0] % 4)];
    let csum_type = [
        CsumType::Crc32c,
        CsumType::Xxhash64,
        CsumType::Sha256,
        CsumType::Blake2b,
    ][usize::from(head[1] % 4)];
    let flags = head[2];
    let fsid = Uuid([0x42; 16]);
    let chunk_uuid = Uuid([0x24; 16]);
    let check = BlockCheck {
        nodesize: u32::try_from(nodesize).unwrap(),
        sectorsize: 4096,
        csum_type,
        metadata_uuid: fsid,
        chunk_tree_uuid: (flags & 4 != 0).then_some(chunk_uuid),
        super_generation: Generation(u64_at(head, 16)),
        mixed_groups: flags & 8 != 0,
        skinny_metadata: flags & 16 != 0,
    };
    let tree = match head[3] % 6 {
        0 => 1,
        1 => 2,
        2 => 3,
        3 => 5,
        4 => 256 + u64::from(head[4]),
        _ => u64_at(head, 8),
    };
    let expect = BlockExpect {
        logical: Logical(u64_at(head, 16) & !4095),
        tree: TreeId(tree),
        generation: Generation(u64_at(head, 24) % 64),
        level: head[5] % 9,
        first_key: (flags & 8 != 0)
            .then(|| Key::new(u64_at(head, 32) % 512, head[6], u64_at(head, 40) % 512)),
    };
    // The raw input as a block (usually the wrong size).
    let _ = Node::new(body, &check, &expect);
    let mut block = vec![0u8; nodesize];
    let n = body.len().min(nodesize);
    block[..n].copy_from_slice(&body[..n]);
    if flags & 1 != 0 {
        // Header fields as expected: reach the item checks.
        block[0x20..0x30].copy_from_slice(&fsid.0);
        block[0x30..0x38].copy_from_slice(&expect.logical.get().to_le_bytes());
        block[0x40..0x50].copy_from_slice(&chunk_uuid.0);
        block[0x50..0x58].copy_from_slice(&expect.generation.get().to_le_bytes());
        block[0x58..0x60].copy_from_slice(&tree.to_le_bytes());
        block[0x64] = expect.level;
    }
    if flags & 2 != 0 {
        let c = csum_type.compute(&block[0x20..]);
        block[..c.as_bytes().len()].copy_from_slice(c.as_bytes());
    }
    if let Ok(node) = Node::new(&block, &check, &expect) {
        let mut last = None;
        for i in 0..node.nritems() + 1 {
            let key = node.key(i);
            let _ = node.item(i);
            let _ = node.ptr(i);
            if let Some(k) = key {
                assert!(Some(k) > last, "keys strictly increase");
                assert_eq!(node.search(&k), Ok(i));
                last = Some(k);
            }
        }
        let _ = node.search(&Key::MIN);
        let _ = node.search(&Key::MAX);
    }
});
