//! The integration tests of this crate, as one test binary: each file below is a module.
//! One binary links once; a binary per file cost CI most of its build time.

#[macro_use]
mod common;
mod audit_chain;
mod bank;
mod conflicts;
mod duties;
mod faults;
mod lookups;
mod notify_outbox;
mod plans;
mod previews;
mod sqlite_writers;
mod stepless;
mod suite;
mod tail;
mod versions;
mod window;
