//! One error type for the console. Each refusal says what was wrong and what to do instead, the
//! same words on the page and in the terminal.

use toolgate_store::StoreError;

/// Why a console action was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("no approval request '{0}'")]
    NotFound(String),
    #[error("'{0}' is not a person with an approver role; only they may approve or reject")]
    NotAnApprover(String),
    #[error("approval request {id} is {status}: it can no longer be approved or rejected")]
    Closed { id: String, status: String },
    #[error(
        "approval request {id} expired at {expires_at}: it fails closed; the call goes back \
         through the gate when the agent retries"
    )]
    Expired { id: String, expires_at: String },
    #[error(
        "the inputs changed after they were shown to you (shown {shown}, now {current}): \
         nothing was approved; reload the item and read it again"
    )]
    InputsChanged { shown: String, current: String },
    #[error("{approver} already approved {id}; a two-person approval needs a different person")]
    SameApprover { id: String, approver: String },
    /// Segregation of duties: the requester, the person behind it, or someone outside the
    /// gate's approvers.
    #[error("refused: {0}")]
    Ineligible(Box<toolgate_core::approvers::Ineligible>),
    #[error(
        "nothing was approved: decided again now, this call would be refused by {rule} ({reason}); \
         reject it with a note instead"
    )]
    WouldBeRefused { rule: String, reason: String },
    /// A bulk approval refused whole: nothing was approved.
    #[error("nothing was approved: {0}")]
    BulkRefused(String),
    #[error("a rejection needs a reason (it is recorded in the audit log and shown to the agent)")]
    ReasonRequired,
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for ConsoleError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { id, .. } => ConsoleError::NotFound(id),
            StoreError::NotAnApprover(p) => ConsoleError::NotAnApprover(p),
            StoreError::ApprovalClosed { id, status } => ConsoleError::Closed { id, status },
            StoreError::ApprovalExpired { id, expires_at } => ConsoleError::Expired {
                id,
                expires_at: crate::fmt::datetime(toolgate_core::Timestamp::from_millis(expires_at)),
            },
            StoreError::Ineligible { why, .. } => ConsoleError::Ineligible(why),
            StoreError::SameApprover { id, approver } => {
                ConsoleError::SameApprover { id, approver }
            }
            other => ConsoleError::Store(other),
        }
    }
}

impl ConsoleError {
    /// True when the request was refused for a reason the person can read and act on (as
    /// opposed to the store failing).
    pub fn is_refusal(&self) -> bool {
        !matches!(self, ConsoleError::Store(_))
    }
}
