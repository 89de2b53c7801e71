//! [`PendingIngests`]: a storage node's prepared ingest parts, waiting for
//! their coordinator's word (see `sluice_flight::ingest`).
//!
//! Each part is held under the coordinator's transaction id until it is
//! committed or dropped, or until its time to live passes with no word (its
//! coordinator died): then it is dropped, which frees its chunks and its
//! metadata file and lets the next ingest take the store's lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::Prepared;
use crate::error::{Result, StorageError};

/// See the module docs.
#[derive(Debug)]
pub struct PendingIngests {
    parts: Arc<Mutex<HashMap<String, Prepared>>>,
    ttl: Duration,
}

impl PendingIngests {
    /// None held; each part dropped `ttl` after it is held.
    pub fn new(ttl: Duration) -> Self {
        Self {
            parts: Arc::new(Mutex::new(HashMap::new())),
            ttl,
        }
    }

    /// Holds `part` under `txn`, on a timer that drops it after the time
    /// to live (the timer runs on the current tokio runtime). A `txn`
    /// already held is refused: the part is dropped at once.
    pub fn hold(&self, txn: &str, part: Prepared) -> Result<()> {
        {
            let mut parts = self.parts.lock().unwrap_or_else(|e| e.into_inner());
            if parts.contains_key(txn) {
                return Err(StorageError::BadSource {
                    path: txn.into(),
                    reason: "this ingest id is already prepared here".into(),
                });
            }
            parts.insert(txn.to_string(), part);
        }
        let weak: Weak<Mutex<HashMap<String, Prepared>>> = Arc::downgrade(&self.parts);
        let (txn, ttl) = (txn.to_string(), self.ttl);
        sluice_base::task::detach(async move {
            tokio::time::sleep(ttl).await;
            let Some(parts) = weak.upgrade() else { return };
            let expired = parts.lock().unwrap_or_else(|e| e.into_inner()).remove(&txn);
            if let Some(p) = expired {
                tracing::warn!(
                    "ingest {txn}: no word from its coordinator in {} s; dropping {p:?}",
                    ttl.as_secs()
                );
            }
        });
        Ok(())
    }

    /// The part held under `txn`, no longer held.
    pub fn take(&self, txn: &str) -> Option<Prepared> {
        self.parts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(txn)
    }

    /// How many parts are held.
    pub fn len(&self) -> usize {
        self.parts.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
