//! The integration tests of this crate, as one test binary: each file below is a module.
//! One binary links once; a binary per file cost CI most of its build time.

mod audit;
mod lockfile;
mod mutations;
mod registry_diff;
mod rug_pull;
mod third_party;
