//! Background work as named workers (the shape of Garage's background workers): each
//! worker does its work in steps, says when it is idle, and waits for more (a timer or
//! a queue). The runner records state, progress and the last error of every worker, so
//! `locus status` and the metrics can show them, and stops them all on shutdown.
//!
//! Cancellation: a step is never interrupted (it is bounded by the RPC deadlines of
//! what it calls); waiting for work is. `Workers::stop` asks every worker to stop after
//! its current step and aborts the ones still running when the grace period ends.

use crate::sync::lock;
use proto::types::{Timestamp, WorkerState, WorkerStatus};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What a step of work came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// More work is ready: run another step at once.
    Busy,
    /// Nothing to do until `wait_for_work` returns.
    Idle,
    /// The worker is finished for good.
    Done,
}

/// A unit of background work. Implementations keep their own progress counters.
pub trait Worker: Send + 'static {
    /// Why a step failed; shown in status and logged.
    type Error: std::fmt::Display + Send;
    /// A stable name for status, metrics and logs.
    fn name(&self) -> String;
    /// Work done so far, in the worker's own words; empty if there is nothing to say.
    fn progress(&self) -> String {
        String::new()
    }
    /// Does one step. A failed step is recorded and followed by `wait_for_work`, so a
    /// failing periodic task retries at its own period instead of spinning.
    fn work(&mut self) -> impl Future<Output = Result<Step, Self::Error>> + Send;
    /// Waits until there may be work again; `Step::Done` ends the worker.
    fn wait_for_work(&mut self) -> impl Future<Output = Step> + Send;
}

/// The workers of one process.
pub struct Workers {
    slots: Mutex<Vec<Arc<Mutex<WorkerStatus>>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    stop: watch::Sender<bool>,
}

impl Default for Workers {
    fn default() -> Self {
        Workers { slots: Mutex::default(), tasks: Mutex::default(), stop: watch::channel(false).0 }
    }
}

impl Workers {
    /// Starts `worker` on the current tokio runtime.
    pub fn spawn<W: Worker>(&self, mut worker: W) {
        let slot = Arc::new(Mutex::new(WorkerStatus {
            name: worker.name(),
            state: WorkerState::Idle,
            progress: String::new(),
            steps: 0,
            errors: 0,
            last_error: None,
        }));
        lock(&self.slots).push(slot.clone());
        let mut stop = self.stop.subscribe();
        let task = tokio::spawn(async move {
            let set = |f: &dyn Fn(&mut WorkerStatus)| f(&mut lock(&slot));
            while !*stop.borrow() {
                set(&|s| s.state = WorkerState::Busy);
                let result = worker.work().await;
                let progress = worker.progress();
                let next = match result {
                    Ok(step) => {
                        set(&|s| {
                            s.steps += 1;
                            s.progress = progress.clone();
                        });
                        step
                    }
                    Err(e) => {
                        let message = e.to_string();
                        tracing::warn!(worker = %worker.name(), "background step failed: {message}");
                        set(&|s| {
                            s.steps += 1;
                            s.errors += 1;
                            s.progress = progress.clone();
                            s.last_error = Some((Timestamp::now(), message.clone()));
                        });
                        Step::Idle
                    }
                };
                match next {
                    Step::Busy => tokio::task::yield_now().await,
                    Step::Done => break,
                    Step::Idle => {
                        set(&|s| s.state = WorkerState::Idle);
                        tokio::select! {
                            step = worker.wait_for_work() => if step == Step::Done { break },
                            _ = stop.changed() => break,
                        }
                    }
                }
            }
            set(&|s| s.state = WorkerState::Stopped);
        });
        lock(&self.tasks).push(task);
    }

    /// The status of every worker, in the order they were started.
    pub fn statuses(&self) -> Vec<WorkerStatus> {
        lock(&self.slots).iter().map(|s| lock(s).clone()).collect()
    }

    /// Asks every worker to stop after its current step and waits up to `grace` for
    /// them; the ones still running then are aborted.
    pub async fn stop(&self, grace: Duration) {
        let _ = self.stop.send(true);
        let tasks: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&self.tasks));
        let deadline = tokio::time::Instant::now() + grace;
        for mut task in tasks {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                task.abort();
            }
        }
        for slot in lock(&self.slots).iter() {
            lock(slot).state = WorkerState::Stopped;
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Sleeps for `period`: the `wait_for_work` of a worker that runs on a timer.
pub async fn every(period: Duration) -> Step {
    tokio::time::sleep(period).await;
    Step::Idle
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Counter {
        left: u32,
        done: u32,
        fail_at: u32,
    }

    impl Worker for Counter {
        type Error = String;
        fn name(&self) -> String {
            "counter".into()
        }
        fn progress(&self) -> String {
            format!("{} done", self.done)
        }
        async fn work(&mut self) -> Result<Step, String> {
            if self.left == 0 {
                return Ok(Step::Idle);
            }
            self.left -= 1;
            self.done += 1;
            if self.done == self.fail_at {
                return Err(format!("step {} failed", self.done));
            }
            Ok(Step::Busy)
        }
        async fn wait_for_work(&mut self) -> Step {
            every(Duration::from_millis(5)).await;
            self.left += 1;
            Step::Idle
        }
    }

    #[tokio::test(start_paused = true)]
    async fn status_tracks_progress_and_errors_and_stop_ends_it() {
        let workers = Workers::default();
        workers.spawn(Counter { left: 10, done: 0, fail_at: 3 });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let s = workers.statuses().remove(0);
        assert_eq!(s.name, "counter");
        assert!(s.steps >= 10, "{s:?}");
        assert_eq!(s.errors, 1);
        assert_eq!(s.last_error.as_ref().map(|e| e.1.as_str()), Some("step 3 failed"));
        assert!(s.progress.ends_with("done"), "{s:?}");
        workers.stop(Duration::from_secs(1)).await;
        let s = workers.statuses().remove(0);
        assert_eq!(s.state, WorkerState::Stopped);
        let steps = s.steps;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(workers.statuses()[0].steps, steps, "a stopped worker ran again");
    }

    struct Stuck;
    impl Worker for Stuck {
        type Error = String;
        fn name(&self) -> String {
            "stuck".into()
        }
        async fn work(&mut self) -> Result<Step, String> {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(Step::Busy)
        }
        async fn wait_for_work(&mut self) -> Step {
            Step::Idle
        }
    }

    #[tokio::test(start_paused = true)]
    async fn stop_aborts_a_step_that_outlives_the_grace_period() {
        let workers = Workers::default();
        workers.spawn(Stuck);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let started = tokio::time::Instant::now();
        workers.stop(Duration::from_secs(2)).await;
        assert!(started.elapsed() <= Duration::from_secs(3));
        assert_eq!(workers.statuses()[0].state, WorkerState::Stopped);
    }
}
