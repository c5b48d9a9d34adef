//! The integration tests of this crate, as one test binary: each file below is a module.
//! One binary links once; a binary per file cost CI most of its build time.

mod approvers;
mod policy_table;
mod versions_and_shadow;
