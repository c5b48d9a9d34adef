//! The integration tests of this crate, as one test binary: each file below is a module.
//! One binary links once; a binary per file cost CI most of its build time.

mod consistency;
mod contract_commands;
mod init_third_party;
mod keys;
mod lock_serve;
mod log_checkpoint;
mod quickstart;
mod reload_commands;
