//! The Narad fan-out host (work in progress).
