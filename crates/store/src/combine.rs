//! Batches done by whichever caller finds none under way. The group commit and the reservation
//! batch both gather the calls that arrive together into one transaction. A task of their own
//! did the gathering before: every call handed its work to it and was woken with the answer,
//! two thread hand-offs per call that, measured, cost a lone call more than its commit did.
//!
//! Here a caller queues its job and tries to take the lead. The caller that gets it takes every
//! job queued (its own among them, and whatever queued while the last batch ran), does them as
//! one batch, and answers each; the others wait for their answer or for the lead, whichever
//! comes first. A call alone therefore commits in its own task, with no hand-off at all, and
//! under load the batches form as they did: what queues while one batch commits is the next.
//!
//! Two rules keep every job answered exactly once:
//! - jobs leave the queue only under the lead, and the leader answers all it took before it
//!   gives the lead up (the lead's guard is dropped after the answers are sent);
//! - a submission runs to its end even if its caller goes away (its client hung up, a timeout
//!   dropped its future): the rest of it is then finished in a task of its own ([`RunToEnd`]),
//!   so no one else's answer depends on a leader's future staying alive, and a job queued by a
//!   caller that left is still done (by a later leader, or by that caller's own task).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::oneshot::error::TryRecvError;
use tokio::sync::{OwnedMutexGuard, oneshot};

/// Jobs of type `J`, done in batches of at most `max` by whichever caller holds the lead,
/// with `S` the state only the leader may touch (the chain head the group commit last wrote).
pub(crate) struct Combiner<J, S> {
    queue: Mutex<Vec<J>>,
    lead: Arc<tokio::sync::Mutex<S>>,
    max: usize,
    /// The last batch held more than one job: calls are arriving together.
    together: AtomicBool,
}

impl<J: Send + 'static, S: Send + 'static> Combiner<J, S> {
    pub(crate) fn new(max: usize, state: S) -> Self {
        Combiner {
            queue: Mutex::new(Vec::new()),
            lead: Arc::new(tokio::sync::Mutex::new(state)),
            max: max.max(1),
            together: AtomicBool::new(false),
        }
    }

    /// With the lead, before taking the jobs: while calls arrive together (the last batch held
    /// more than one), the calls about to queue are given a few turns of the scheduler to do
    /// so, as long as each turn brings one; a call alone is not kept waiting for company.
    async fn gather(&self) {
        if !self.together.load(Ordering::Relaxed) {
            return;
        }
        let queued = || self.queue.lock().expect("combiner queue").len();
        let mut seen = queued();
        let mut idle_turns = 0;
        while idle_turns < 3 && seen < self.max {
            tokio::task::yield_now().await;
            let now = queued();
            if now > seen {
                seen = now;
                idle_turns = 0;
            } else {
                idle_turns += 1;
            }
        }
    }

    /// Waits until no batch is under way and holds the leader's state: for closing it.
    pub(crate) async fn state(&self) -> tokio::sync::MutexGuard<'_, S> {
        self.lead.lock().await
    }

    /// Queues `job` (whose answer comes on `answer`) and waits for its answer, leading a batch
    /// with `run` when no one else is. `run` must answer every job it is given. `None`: the
    /// job was dropped unanswered (the batch that held it panicked). Runs to its end if
    /// dropped (see the module docs).
    pub(crate) async fn submit<T, F, Fut>(
        self: Arc<Self>,
        job: J,
        answer: oneshot::Receiver<T>,
        run: F,
    ) -> Option<T>
    where
        T: Send + 'static,
        F: Fn(OwnedMutexGuard<S>, Vec<J>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        RunToEnd::new(async move { self.lead_or_wait(job, answer, run).await })
            .await
            .ok()
            .flatten()
    }

    async fn lead_or_wait<T, F, Fut>(
        &self,
        job: J,
        mut answer: oneshot::Receiver<T>,
        run: F,
    ) -> Option<T>
    where
        F: Fn(OwnedMutexGuard<S>, Vec<J>) -> Fut,
        Fut: Future<Output = ()>,
    {
        self.queue.lock().expect("combiner queue").push(job);
        loop {
            let lead = tokio::select! {
                biased;
                a = &mut answer => return a.ok(),
                lead = self.lead.clone().lock_owned() => lead,
            };
            match answer.try_recv() {
                Ok(a) => return Some(a),
                Err(TryRecvError::Closed) => return None,
                Err(TryRecvError::Empty) => {}
            }
            self.gather().await;
            let jobs: Vec<J> = {
                let mut queue = self.queue.lock().expect("combiner queue");
                let n = queue.len().min(self.max);
                queue.drain(..n).collect()
            };
            self.together.store(jobs.len() > 1, Ordering::Relaxed);
            if jobs.is_empty() {
                // Taken by a batch that lost its lead without answering: it panicked, and its
                // jobs are being dropped.
                drop(lead);
                return answer.await.ok();
            }
            // A panic here drops the jobs, which answers each of them (`None`).
            run(lead, jobs).await;
        }
    }
}

/// A future run in its caller's task that, if the caller drops it before it is done, goes on
/// to its end in a task of its own. Spawning it up front gives the same guarantee at the price
/// of a task hand-off, which another worker thread is woken to take. A panic in it is its
/// answer ([`Panicked`]), as a spawned task's would be.
pub struct RunToEnd<F: Future<Output: Send> + Send + 'static> {
    fut: Option<Pin<Box<F>>>,
}

/// A [`RunToEnd`] future that panicked instead of answering.
#[derive(Debug)]
pub struct Panicked;

impl std::fmt::Display for Panicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the task panicked")
    }
}

impl<F: Future<Output: Send> + Send + 'static> RunToEnd<F> {
    pub fn new(fut: F) -> Self {
        RunToEnd {
            fut: Some(Box::pin(fut)),
        }
    }
}

impl<F: Future<Output: Send> + Send + 'static> Future for RunToEnd<F> {
    type Output = Result<F::Output, Panicked>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(fut) = self.fut.as_mut() else {
            panic!("RunToEnd polled after it answered");
        };
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(out)) => {
                self.fut = None;
                Poll::Ready(Ok(out))
            }
            Err(_) => {
                self.fut = None;
                Poll::Ready(Err(Panicked))
            }
        }
    }
}

impl<F: Future<Output: Send> + Send + 'static> Drop for RunToEnd<F> {
    fn drop(&mut self) {
        if let Some(fut) = self.fut.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(fut);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A job: its number, and where its answer goes.
    type Job = (u32, oneshot::Sender<Vec<u32>>);

    /// Answers every job of a batch with the whole batch's numbers, after `pause`, and notes
    /// the batch in `seen`.
    fn batch(
        seen: Arc<Mutex<Vec<Vec<u32>>>>,
        pause: Duration,
    ) -> impl Fn(OwnedMutexGuard<()>, Vec<Job>) -> Pin<Box<dyn Future<Output = ()> + Send>>
    + Send
    + 'static {
        move |lead, jobs| {
            let seen = seen.clone();
            Box::pin(async move {
                tokio::time::sleep(pause).await;
                let numbers: Vec<u32> = jobs.iter().map(|j| j.0).collect();
                seen.lock().unwrap().push(numbers.clone());
                for (_, answer) in jobs {
                    let _ = answer.send(numbers.clone());
                }
                drop(lead);
            })
        }
    }

    fn submit(
        combiner: &Arc<Combiner<Job, ()>>,
        n: u32,
        seen: &Arc<Mutex<Vec<Vec<u32>>>>,
        pause: Duration,
    ) -> impl Future<Output = Option<Vec<u32>>> + use<> {
        let (tx, rx) = oneshot::channel();
        combiner
            .clone()
            .submit((n, tx), rx, batch(seen.clone(), pause))
    }

    #[tokio::test]
    async fn a_lone_job_is_its_own_batch_and_jobs_queued_meanwhile_are_the_next() {
        let combiner = Arc::new(Combiner::new(64, ()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let pause = Duration::from_millis(50);
        let first = tokio::spawn(submit(&combiner, 1, &seen, pause));
        tokio::time::sleep(Duration::from_millis(10)).await;
        let later: Vec<_> = (2..=4)
            .map(|n| tokio::spawn(submit(&combiner, n, &seen, pause)))
            .collect();
        assert_eq!(first.await.unwrap(), Some(vec![1]));
        for l in later {
            assert_eq!(l.await.unwrap(), Some(vec![2, 3, 4]));
        }
        assert_eq!(*seen.lock().unwrap(), vec![vec![1], vec![2, 3, 4]]);
    }

    #[tokio::test]
    async fn a_batch_whose_leader_goes_away_still_answers_the_others() {
        let combiner = Arc::new(Combiner::new(64, ()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let pause = Duration::from_millis(50);
        // The first leads a batch of one; the second and third queue, and the second leads
        // their batch, then is dropped while it sleeps in it.
        let first = tokio::spawn(submit(&combiner, 1, &seen, pause));
        tokio::time::sleep(Duration::from_millis(10)).await;
        let leader = tokio::spawn(submit(&combiner, 2, &seen, pause));
        tokio::time::sleep(Duration::from_millis(5)).await;
        let follower = tokio::spawn(submit(&combiner, 3, &seen, pause));
        assert_eq!(first.await.unwrap(), Some(vec![1]));
        tokio::time::sleep(Duration::from_millis(10)).await;
        leader.abort();
        assert!(leader.await.unwrap_err().is_cancelled());
        assert_eq!(follower.await.unwrap(), Some(vec![2, 3]));
        assert_eq!(*seen.lock().unwrap(), vec![vec![1], vec![2, 3]]);
    }

    #[tokio::test]
    async fn a_job_whose_caller_left_before_it_led_is_still_done() {
        let combiner = Arc::new(Combiner::new(64, ()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let pause = Duration::from_millis(30);
        let first = tokio::spawn(submit(&combiner, 1, &seen, pause));
        tokio::time::sleep(Duration::from_millis(5)).await;
        // Queued behind the first, then its caller goes away before anyone takes it.
        let gone = tokio::spawn(submit(&combiner, 2, &seen, pause));
        tokio::time::sleep(Duration::from_millis(5)).await;
        gone.abort();
        assert_eq!(first.await.unwrap(), Some(vec![1]));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(*seen.lock().unwrap(), vec![vec![1], vec![2]]);
    }

    #[tokio::test]
    async fn a_batch_that_panics_answers_its_jobs_none_and_the_next_runs() {
        let combiner: Arc<Combiner<Job, ()>> = Arc::new(Combiner::new(64, ()));
        let (tx, rx) = oneshot::channel();
        let panicking = |_lead: OwnedMutexGuard<()>, _jobs: Vec<Job>| async move {
            panic!("a batch that fails");
        };
        assert_eq!(combiner.clone().submit((1, tx), rx, panicking).await, None);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let next = submit(&combiner, 2, &seen, Duration::ZERO).await;
        assert_eq!(next, Some(vec![2]));
    }
}
