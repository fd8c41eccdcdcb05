//! What narad processes and their clients say to each other, as types: the lowest layer, so
//! the API, the transports between nodes and clusters, and the CLI share one definition of
//! every body without importing each other.

pub mod api;
