//! The integration tests of this crate, as one test binary: each file below is a module.
//! One binary links once; a binary per file cost CI most of its build time.

#[macro_use]
mod common;
mod actions;
mod browser;
mod duties;
mod hardening;
mod http;
mod metrics;
mod report;
mod sessions;
