//! Narad's embedded partition log (work in progress).
