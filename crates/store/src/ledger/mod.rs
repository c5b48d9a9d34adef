//! The store's tables, each behind functions named for what they do to it: [`runs`] (who owns a
//! run, what it did so far), [`steps`], [`keys`] (idempotency), [`budgets`] and [`windows`],
//! [`approvals`], [`plans`] (and their reviews), [`previews`], the notification [`outbox`] and the
//! console's [`sessions`]; [`settle`] applies a call's settlement across them. Rows are read
//! into structs by column name. Where SQLite and PostgreSQL need different statements, the
//! difference is one branch on the backend inside the ledger function, never in a business rule.
//! The audit chain keeps its own module ([`crate::audit`]).

pub(crate) mod approvals;
pub(crate) mod budgets;
pub(crate) mod keys;
pub(crate) mod outbox;
pub(crate) mod plans;
pub(crate) mod previews;
pub(crate) mod runs;
pub(crate) mod sessions;
pub(crate) mod settle;
pub(crate) mod steps;
pub(crate) mod windows;
