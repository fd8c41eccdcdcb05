//! In-process API tests: each test starts the daemon on 127.0.0.1:0 over a temporary data dir
//! and talks real HTTP to it.
#![allow(clippy::unwrap_used, missing_docs)]

mod auth;
mod child_cli;
mod children;
mod cli;
pub mod common;
mod fetch;
mod metrics;
mod produce;
mod shadow;
mod startup;
mod topics;
