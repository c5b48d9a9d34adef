//! The ledgers the governed call reads and writes, each behind functions named for what they
//! do to it: [`runs`] (what a run did so far), [`steps`], [`keys`] (idempotency), [`budgets`],
//! [`approvals`]. The executor's phases call these and never write SQL themselves; where
//! SQLite and PostgreSQL need different statements, the difference is one `match` on the
//! backend inside the ledger function, not a branch in a business rule.

pub(crate) mod approvals;
pub(crate) mod budgets;
pub(crate) mod keys;
pub(crate) mod outbox;
pub(crate) mod runs;
pub(crate) mod sessions;
pub(crate) mod steps;
pub(crate) mod windows;
