//! The approver's page. A gate is only a control while the person at it reads what they
//! approve, so the page is built to be worked through daily without rubber-stamping: a queue
//! sorted by risk, like calls grouped with their differences marked, one item showing exactly
//! what will be sent and what changed since the last approved call of the same kind (a new
//! IBAN shouts), and approvals bound to the inputs the person saw. The surface numbers (each
//! gate's rejection rate r and break-even ratio 1/r) say which gates earn their keep.
//!
//! Mount it in the gateway's HTTP app:
//!
//! ```ignore
//! let console = ConsoleState::new(executor, ConsoleOptions { base: "/approvals".into(), ..Default::default() });
//! app = app.nest("/approvals", toolgate_console::router(console.clone()))
//!          .merge(toolgate_console::metrics_router(console));
//! ```

pub mod actions;
pub mod auth;
pub mod bulk;
pub mod error;
pub mod facts;
pub mod fmt;
pub mod headers;
pub mod item;
pub mod mask;
pub mod metrics;
mod pages;
pub mod peer;
pub mod queue;
pub mod report;
mod svg;
pub mod throttle;
mod web;

pub use error::ConsoleError;
pub use metrics::{MetricsOptions, ScrapeToken, ScrapeTokenError};
pub use throttle::SignInLimits;
pub use web::{ConsoleOptions, ConsoleState, LiveExecutor, metrics_router, router};
