//! End-to-end tests of the real `narad` binary: each test starts daemons on free loopback
//! ports in temporary data directories, drives them over HTTP and the CLI, and kills them
//! with SIGKILL where the promise is about a crash.

mod crash_produce;
mod demo;
mod fanout;
mod harness;
