//! `narad`, the command line of the Narad fan-out host: `narad serve` runs the daemon
//! ([`narad_host`]), every other command is a client of a daemon's HTTP API or runs on its
//! own (`demo`, `bench`, `plugin test`).
//!
//! - [`cli`]: the commands, one module each, and the human output they print;
//! - [`allocator`]: the daemon's malloc settings, set at start;
//! - [`bench`](mod@bench): `narad bench`, end-to-end measurements of produce and fan-out
//!   against raw write + `fdatasync` loops in the same run.
//!
//! The daemon library knows nothing of this crate: everything here goes through what
//! `narad_host` exposes.

// Tests may unwrap: a panic there is a test failure with its location.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod allocator;
pub mod bench;
pub mod cli;
