//! The storage engine's integration tests, one binary: the log, the store, the cursor file,
//! retention, transfers, and crash and fault tests on the fault-injecting file system.

// Tests may unwrap: a panic is how they fail.
#![allow(clippy::unwrap_used, missing_docs)]

mod commit_time;
mod common;
mod cursor_file;
mod device_full;
mod disk_damage;
mod faults;
mod group_commit;
mod long_poll;
mod producer_stamps;
mod recovery;
mod retention;
mod slab_reads;
mod store_basics;
mod transfer;
