//! `narad`: the fan-out host daemon and CLI.
fn main() {}
