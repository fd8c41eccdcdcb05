//! End-to-end tests for the `narad` binary live in `tests/all/`.
