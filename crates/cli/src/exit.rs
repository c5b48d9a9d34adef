//! How `toolgate` exits: one code for each kind of answer. The enum lives in the gateway crate
//! (`toolgate_gateway::exit`), so the worker process, which exits there, uses the same codes:
//! one source of exit codes for every process `toolgate` runs.

pub use toolgate_gateway::Exit;
