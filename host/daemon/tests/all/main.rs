//! The daemon library's integration tests, one binary: [`fanout_cursor`], one cursor against a
//! real store on a fault-injecting file system. The tests that drive the daemon over HTTP, the
//! CLI and the real binary are the command line's (`host/cli/tests/all`).

// Tests may unwrap: a panic is how they fail.
#![allow(clippy::unwrap_used, missing_docs)]

mod fanout_cursor;
