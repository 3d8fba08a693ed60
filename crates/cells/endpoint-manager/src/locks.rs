//! One lock per (container id, interface): concurrent requests for the same pod interface
//! run one after the other, requests for different ones in parallel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// The runtime's key of an endpoint: (container id, interface name).
type Key = (String, String);
type LockMap = HashMap<Key, Arc<AsyncMutex<()>>>;

/// The locks, created on demand and dropped when nobody holds or waits for them.
#[derive(Debug, Default)]
pub struct KeyLocks {
    locks: Mutex<LockMap>,
}

/// Holds the lock of one key; releasing it forgets the key when nobody else wants it.
#[derive(Debug)]
pub struct KeyGuard<'a> {
    owner: &'a KeyLocks,
    key: Key,
    guard: Option<OwnedMutexGuard<()>>,
}

impl KeyLocks {
    /// Waits for and takes the lock of `key`.
    pub async fn lock(&self, key: Key) -> KeyGuard<'_> {
        let lock = self
            .map()
            .entry(key.clone())
            .or_insert_with(|| Arc::new(AsyncMutex::new(())))
            .clone();
        let guard = lock.lock_owned().await;
        KeyGuard {
            owner: self,
            key,
            guard: Some(guard),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, LockMap> {
        self.locks.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let mut map = self.owner.map();
        // Only the map holds it now: nobody waits, so the entry can go.
        if map
            .get(&self.key)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn locks_are_per_key_and_forgotten() {
        let locks = KeyLocks::default();
        let a = locks.lock(("c".into(), "eth0".into())).await;
        let b = locks.lock(("c".into(), "eth1".into())).await;
        assert_eq!(locks.map().len(), 2);
        drop((a, b));
        assert!(locks.map().is_empty());
    }
}
