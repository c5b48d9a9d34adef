//! The integration tests of this crate, as one test binary: each file below is a module.
//! One binary links once; a binary per file cost CI most of its build time.

#[macro_use]
mod common;
mod approvals_browser;
mod auth;
mod clients;
mod console;
mod destinations;
mod gateway;
mod hostile;
mod jwks_https;
mod keep_alive;
mod keys;
mod lean;
mod notify;
mod otlp;
mod passthrough;
mod pinning;
mod plans;
mod preview;
mod principals;
mod progress;
mod reload;
mod serve_worker;
mod stdio;
mod stdio_lean;
mod third_party_pinned;
mod unmodified;
mod upstream_errors;
mod upstream_hop;
