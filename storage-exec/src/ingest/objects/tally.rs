//! [`Tally`]: what an ingest asked of an object store, counted where the
//! requests leave.
//!
//! `object_store` retries a request itself (bounded, with backoff: see
//! `super::connect`) and says nothing of it to its caller. To report the
//! retries, every HTTP request goes through [`Counted`], which wraps the
//! client `object_store` would have used and counts each attempt and
//! each attempt that failed in a way `object_store` retries: a 5xx (S3's
//! `SlowDown` is a 503), a 429 or a 408, or a transport error (refused,
//! reset, timed out). An ingest that commits has had every such attempt
//! retried; one that fails names its last.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};

/// Requests and failed attempts of one source's store.
#[derive(Debug, Default)]
pub struct Tally {
    requests: AtomicU64,
    failed: AtomicU64,
}

/// A [`Tally`] as reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Counts {
    /// HTTP requests sent (every attempt).
    pub requests: u64,
    /// Attempts that failed and were retried (or, in a failed ingest,
    /// gave up): 5xx, 429, 408 or a transport error.
    pub retries: u64,
    /// Objects taken from what a failed earlier run of the ingest kept
    /// (`ingest::resume`): no request was sent for them.
    pub resumed: u64,
    /// Their bytes.
    pub resumed_bytes: u64,
}

impl Tally {
    /// Counts a fetch tried again whole by `super::fetch` (a body cut
    /// off, a connection reset mid-answer).
    pub(super) fn body_failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn counts(&self) -> Counts {
        Counts {
            requests: self.requests.load(Ordering::Relaxed),
            retries: self.failed.load(Ordering::Relaxed),
            resumed: 0,
            resumed_bytes: 0,
        }
    }
}

/// The connector that counts into a [`Tally`].
#[derive(Debug)]
pub(super) struct Counting(pub Arc<Tally>);

impl HttpConnector for Counting {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Counted {
            inner,
            tally: Arc::clone(&self.0),
        }))
    }
}

#[derive(Debug)]
struct Counted {
    inner: HttpClient,
    tally: Arc<Tally>,
}

#[async_trait]
impl HttpService for Counted {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        self.tally.requests.fetch_add(1, Ordering::Relaxed);
        let out = self.inner.execute(req).await;
        let failed = match &out {
            Ok(r) => {
                let s = r.status();
                s.is_server_error() || s.as_u16() == 429 || s.as_u16() == 408
            }
            Err(_) => true,
        };
        if failed {
            self.tally.failed.fetch_add(1, Ordering::Relaxed);
        }
        out
    }
}
