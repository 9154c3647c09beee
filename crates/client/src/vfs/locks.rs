//! fcntl byte-range locks, held by meta per session and lock owner.

use super::{FileHandle, Result, Vfs};
use proto::error::ErrorCode;
use proto::meta::*;
use std::time::Duration;

impl Vfs {
    pub async fn getlk(&self, lock: LockRange) -> Result<Option<LockRange>> {
        self.meta.call(GetLock { session: self.meta.session(), lock }).await
    }

    /// Sets or clears a byte-range lock; with `wait`, retries until it is granted.
    pub async fn setlk(&self, fh: FileHandle, lock: LockRange, wait: bool) -> Result<()> {
        let handle = self.handle(fh)?;
        if lock.kind != LockKind::Unlock {
            handle.file.inner.lock().await.lock_owners.insert(lock.owner);
        }
        let mut backoff = Duration::from_millis(5);
        loop {
            match self.meta.call(SetLock { session: self.meta.session(), lock }).await {
                Err(e) if wait && e.code == ErrorCode::WouldBlock => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
                other => return other,
            }
        }
    }
}
