//! Trees: validated views of tree blocks, keys, and key-order walking.
//!
//! Stage 3 of the data flow (device → chunk map → **tree** → fs model):
//! this module knows B-tree blocks but nothing of inodes or subvolumes.

pub mod buf;
pub mod check;
pub mod key;
pub mod node;
pub mod walk;
