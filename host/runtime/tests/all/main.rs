//! The plugin runtime's integration tests, one binary: the built-in plugins, chains, the deploy
//! check and the limits, with plugins written in WAT.

// Tests may unwrap: a panic is how they fail.
#![allow(clippy::unwrap_used, missing_docs)]

mod builtins;
mod chain;
mod common;
mod deploy;
mod key_hash;
mod limits;
