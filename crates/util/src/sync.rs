//! The lock policy of Locus: a lock poisoned by a panicking thread is taken anyway.
//!
//! Every structure guarded by a `std` lock here (tables, caches, queues) is updated
//! in single statements that leave it valid, and the panic itself is logged by the
//! panic hook; refusing every later request with a second panic would turn one bug
//! into a dead service. So all code takes locks through these helpers.

use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, recovering the guard if an earlier holder panicked.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Read-locks `l`, recovering the guard if an earlier holder panicked.
pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

/// Write-locks `l`, recovering the guard if an earlier holder panicked.
pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// Locks `m` if nobody holds it, recovering the guard if an earlier holder panicked:
/// `None` only while another holder has it. (`Mutex::try_lock` reports a poisoned lock
/// as an error, which a caller taking errors for "busy" would wait on forever.)
pub fn try_lock<T: ?Sized>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Waits on `c`, giving up `guard` meanwhile; recovers the guard if a holder panicked.
pub fn wait<'a, T>(c: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    c.wait(guard).unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_still_usable() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
        // `try_lock` too: std reports the poisoned lock as an error, not as free.
        assert!(m.try_lock().is_err());
        let held = try_lock(&m).expect("a poisoned lock nobody holds is free");
        assert_eq!(*held, 2);
        assert!(try_lock(&m).is_none(), "held");
    }

    #[test]
    fn a_wait_on_a_poisoned_lock_still_returns_its_guard() {
        let pair = std::sync::Arc::new((Mutex::new(false), Condvar::new()));
        let p = pair.clone();
        let _ = std::thread::spawn(move || {
            let _g = p.0.lock().unwrap();
            panic!("poison it");
        })
        .join();
        // Held before the notifier starts, so it can only set the flag once `wait` lets go.
        let mut ready = lock(&pair.0);
        let p = pair.clone();
        let notifier = std::thread::spawn(move || {
            *lock(&p.0) = true;
            p.1.notify_all();
        });
        while !*ready {
            ready = wait(&pair.1, ready);
        }
        drop(ready);
        notifier.join().unwrap();
    }
}
