//! toolgate end to end in one process, for the demo, the eval fixtures and benchmarks: the fake
//! upstream MCP servers of an example domain served over loopback HTTP, the gateway in front of
//! them on a free port, and MCP clients holding role credentials. Everything on the wire is real
//! MCP; only the systems behind the gateway are fakes, and they record every delivery.

pub mod demo;
pub mod env;
pub mod eval;
pub mod planner;

pub use env::{Client, Environment};
pub use planner::{
    DeterministicPlanner, ModelApi, ModelConfig, ModelPlanner, Plan, PlannedCall, Planner,
    PlannerConfig, ToolSummary,
};
