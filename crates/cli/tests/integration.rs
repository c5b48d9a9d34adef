//! The integration tests of this crate, as one test binary: each file below is a module.
//! One binary links once; a binary per file cost CI most of its build time.

/// The plain audit draft the store's tests use.
#[path = "../../store/tests/shared/draft.rs"]
mod shared;

mod consistency;
mod contract_commands;
mod init_third_party;
mod keys;
mod lock_serve;
mod log_checkpoint;
mod log_export;
mod quickstart;
mod reload_commands;
