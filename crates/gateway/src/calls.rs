//! Runs governed calls for the MCP handlers. The store's `governed_call` future is not `Send`
//! today (core's `CallRequest` holds a `&dyn Fn` without `Sync` across an await), while rmcp
//! needs `Send` handler futures, so calls run on a few dedicated threads, each with its own
//! single-threaded runtime, and the handler awaits the answer over a channel. When the store's
//! future becomes `Send`, this module can call the executor directly.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{mpsc, oneshot};
use toolgate_store::{CallResult, DirectCall, Executor, StoreError};

type Job = (
    Executor,
    DirectCall,
    oneshot::Sender<Result<CallResult, StoreError>>,
);

/// A pool of call threads. Each call brings the executor it is decided by (the registry
/// version current when it arrived), so a reload never changes a call already under way.
pub struct CallPool {
    senders: Vec<mpsc::UnboundedSender<Job>>,
    next: AtomicUsize,
}

impl CallPool {
    /// Starts `threads` call threads (at least one).
    pub fn start(threads: usize) -> Arc<CallPool> {
        let mut senders = Vec::new();
        for i in 0..threads.max(1) {
            let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
            std::thread::Builder::new()
                .name(format!("toolgate-calls-{i}"))
                .spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("a call thread's runtime starts");
                    let local = tokio::task::LocalSet::new();
                    local.block_on(&rt, async move {
                        while let Some((ex, call, reply)) = rx.recv().await {
                            tokio::task::spawn_local(async move {
                                let _ = reply.send(ex.governed_call(call).await);
                            });
                        }
                    });
                    // Let calls still running finish before the thread ends.
                    rt.block_on(local);
                })
                .expect("a call thread starts");
            senders.push(tx);
        }
        Arc::new(CallPool {
            senders,
            next: AtomicUsize::new(0),
        })
    }

    /// One governed call, decided by `executor`.
    pub async fn governed_call(
        &self,
        executor: Executor,
        call: DirectCall,
    ) -> Result<CallResult, StoreError> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.senders.len();
        let (tx, rx) = oneshot::channel();
        self.senders[i]
            .send((executor, call, tx))
            .map_err(|_| StoreError::WriterGone)?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }
}
