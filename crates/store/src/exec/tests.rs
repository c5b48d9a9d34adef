use std::borrow::Cow;
use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

/// A database error carrying only a SQLSTATE.
#[derive(Debug)]
struct Sqlstate(&'static str);

impl std::fmt::Display for Sqlstate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SQLSTATE {}", self.0)
    }
}

impl std::error::Error for Sqlstate {}

impl sqlx::error::DatabaseError for Sqlstate {
    fn message(&self) -> &str {
        "test"
    }
    fn code(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self.0))
    }
    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }
    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }
    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }
    fn kind(&self) -> sqlx::error::ErrorKind {
        sqlx::error::ErrorKind::Other
    }
}

fn db_error(code: &'static str) -> StoreError {
    StoreError::Db(sqlx::Error::Database(Box::new(Sqlstate(code))))
}

#[test]
fn deadlocks_and_serialization_failures_are_conflicts() {
    assert!(db_error("40P01").is_conflict());
    assert!(db_error("40001").is_conflict());
    assert!(!db_error("23505").is_conflict());
    assert!(!StoreError::WriterGone.is_conflict());
}

#[tokio::test]
async fn a_conflict_is_tried_again_a_bounded_number_of_times() {
    // Two deadlocks, then the transaction goes through.
    let tries = AtomicU32::new(0);
    let r = retry_conflicts(|| async {
        match tries.fetch_add(1, Ordering::SeqCst) {
            0 | 1 => Err(db_error("40P01")),
            n => Ok(n),
        }
    })
    .await;
    assert_eq!(r.unwrap(), 2);
    assert_eq!(tries.load(Ordering::SeqCst), 3);

    // Always aborted: given up after five tries, with the conflict.
    let tries = AtomicU32::new(0);
    let r: Result<()> = retry_conflicts(|| async {
        tries.fetch_add(1, Ordering::SeqCst);
        Err(db_error("40001"))
    })
    .await;
    assert!(r.unwrap_err().is_conflict());
    assert_eq!(tries.load(Ordering::SeqCst), 5);

    // Any other error is not tried again.
    let tries = AtomicU32::new(0);
    let r: Result<()> = retry_conflicts(|| async {
        tries.fetch_add(1, Ordering::SeqCst);
        Err(db_error("23505"))
    })
    .await;
    assert!(r.is_err());
    assert_eq!(tries.load(Ordering::SeqCst), 1);
}
