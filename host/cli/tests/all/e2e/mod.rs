//! End-to-end tests of the real `narad` binary: each test starts daemons on free loopback
//! ports in temporary data directories, drives them over HTTP and the CLI, and kills them
//! with SIGKILL where the promise is about a crash.

mod child_writes;
mod cli;
mod cluster;
mod cluster_failures;
mod cluster_groups;
mod crash_produce;
mod dead_letter;
mod demo;
mod disk_damage;
mod disk_full;
mod etcd_security;
mod fanout;
mod file_modes;
mod harness;
mod http_limits;
mod http_users;
mod kafka;
mod kafka_admin;
mod kafka_bounds;
mod kafka_groups;
mod metastore_crash;
mod metastore_loss;
mod plugin_limits;
mod plugin_text;
mod quickstart;
mod remote;
mod sasl;
mod shadow;
mod tls;
mod torn_tail;
