//! The idempotency ledger: one row per key, with the first call's input hash, whether it
//! settled and with what, and the step that holds it.
