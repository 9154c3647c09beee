//! Single-flight: concurrent requests for one key share one computation, so a burst of
//! readers missing the same chunk costs one disk read or one transfer, not one each.

use crate::sync::lock;
use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use tokio::sync::OnceCell;

/// Calls in progress, by key. A finished call is forgotten: the caller keeps its result
/// in a cache of its own if it wants one.
pub struct SingleFlight<K, V> {
    calls: Mutex<HashMap<K, Arc<OnceCell<V>>>>,
}

impl<K, V> Default for SingleFlight<K, V> {
    fn default() -> Self {
        SingleFlight { calls: Mutex::new(HashMap::new()) }
    }
}

impl<K: Eq + Hash + Clone, V: Clone> SingleFlight<K, V> {
    /// Runs `compute` for `key` unless a call for it is already under way, in which case
    /// this waits for that call's value. If the running call fails, one of the waiters
    /// runs its own `compute` in turn (an error is never shared: it may be transient).
    pub async fn run<E, F, Fut>(&self, key: K, compute: F) -> Result<V, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, E>>,
    {
        let cell = lock(&self.calls).entry(key.clone()).or_default().clone();
        let result = cell.get_or_try_init(compute).await.cloned();
        let mut calls = lock(&self.calls);
        if calls.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            calls.remove(&key);
        }
        result
    }

    /// Calls under way, for tests and metrics.
    pub fn in_flight(&self) -> usize {
        lock(&self.calls).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn concurrent_callers_share_one_computation() {
        let flight = Arc::new(SingleFlight::<u32, u64>::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..20)
            .map(|_| {
                let (flight, runs) = (flight.clone(), runs.clone());
                tokio::spawn(async move {
                    flight
                        .run(7, || async {
                            runs.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            Ok::<_, ()>(49)
                        })
                        .await
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap(), Ok(49));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(flight.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_failure_is_not_shared_and_the_next_call_retries() {
        let flight = SingleFlight::<u32, u64>::default();
        assert_eq!(flight.run(1, || async { Err::<u64, _>("down") }).await, Err("down"));
        assert_eq!(flight.run(1, || async { Ok::<_, &str>(5) }).await, Ok(5));
    }
}
