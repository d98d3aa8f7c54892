//! The core library's integration tests: one binary, one module per area.

mod backup_plan;
mod common;
mod corruption;
mod dump_model;
mod estimate;
mod extent_tree;
mod fs_model;
mod list;
mod live;
mod manifest;
mod progress;
mod raid56;
mod readahead;
mod reader;
mod receive;
mod receive_errors;
mod receive_lanes;
mod receive_subvol;
mod send;
mod send_clone;
mod send_continue;
mod send_incremental;
mod send_live;
mod send_pipeline;
mod send_random;
mod tree_checker;
