//! The client of a source's store: `object_store`'s, configured by the
//! standard means, retrying within bounds, counted.
//!
//! - **Credentials.** S3 from the environment (`AWS_ACCESS_KEY_ID`,
//!   `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`; `AWS_REGION`;
//!   `AWS_ENDPOINT_URL` for an S3-compatible store; a web identity token;
//!   ECS's container endpoint), else from the AWS profile files
//!   ([`super::profile`]), else EC2's instance metadata. GCS from
//!   `GOOGLE_SERVICE_ACCOUNT` / `GOOGLE_APPLICATION_CREDENTIALS` or the
//!   metadata server; Azure from `AZURE_STORAGE_ACCOUNT_NAME` and a key, a
//!   SAS or a service principal (`AZURE_*`). They are handed to the
//!   client and never logged: sluice shows the URL only.
//! - **Plain HTTP** to an S3-compatible endpoint the operator names with
//!   `http://` (a store on the same rack), or with `AWS_ALLOW_HTTP=true`;
//!   to an HTTP store named by an `http://` URL; to Azurite, Azure's
//!   emulator (`AZURE_STORAGE_USE_EMULATOR`).
//! - **Retries**: `object_store`'s own, on 5xx (S3's `SlowDown`), 429,
//!   408 and transport errors, with exponential backoff from 500 ms up to
//!   10 s a wait (each wait is drawn between 500 ms and the next step, so
//!   ten retries span at least 5 s: from 100 ms, a server restarting
//!   under load once outlasted all ten in 1.7 s), at most [`MAX_RETRIES`] times and [`RETRY_FOR`] in all
//!   per request; each attempt is counted ([`super::tally`]). Requests
//!   time out after 30 s without an answer (`object_store`'s default),
//!   connections after 5 s.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};

use super::address::{ObjectUrl, Scheme};
use super::profile::Profile;
use super::tally::{Counting, Tally};
use crate::error::{Result, StorageError};

/// Attempts after the first, per request.
pub const MAX_RETRIES: usize = 10;
/// How long one request is retried for, at most.
pub const RETRY_FOR: Duration = Duration::from_secs(120);

fn retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(10),
            base: 2.0,
        },
        max_retries: MAX_RETRIES,
        retry_timeout: RETRY_FOR,
    }
}

/// The client of `url`'s store, counting into `tally`. Nothing is sent
/// yet: a wrong credential shows at the first request.
pub(super) fn connect(url: &ObjectUrl, tally: &Arc<Tally>) -> Result<Arc<dyn ObjectStore>> {
    let counting = Counting(Arc::clone(tally));
    let root = url.root();
    let built: object_store::Result<Arc<dyn ObjectStore>> = match url.kind {
        Scheme::S3 => s3(&root)
            .with_retry(retry())
            .with_http_connector(counting)
            .build()
            .map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
        Scheme::Gcs => GoogleCloudStorageBuilder::from_env()
            .with_url(&root)
            .with_retry(retry())
            .with_http_connector(counting)
            .build()
            .map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
        Scheme::Azure => MicrosoftAzureBuilder::from_env()
            .with_url(&root)
            .with_retry(retry())
            .with_http_connector(counting)
            .build()
            .map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
        // An `http://` URL is the operator's word for plain HTTP (the
        // client refuses it unless told).
        Scheme::Http => HttpBuilder::new()
            .with_url(&root)
            .with_client_options(ClientOptions::new().with_allow_http(root.starts_with("http://")))
            .with_retry(retry())
            .with_http_connector(counting)
            .build()
            .map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
    };
    built.map_err(|e| StorageError::BadSource {
        path: url.to_string().into(),
        reason: format!("cannot set up its store's client: {e}"),
    })
}

/// An S3 builder from the environment, completed from the profile files.
fn s3(root: &str) -> AmazonS3Builder {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let mut b = AmazonS3Builder::from_env().with_url(root);
    let profile = Profile::from_files();
    if env("AWS_ACCESS_KEY_ID").is_none()
        && let (Some(id), Some(secret)) = (profile.access_key_id, profile.secret_access_key)
    {
        b = b.with_access_key_id(id).with_secret_access_key(secret);
        if let Some(token) = profile.session_token {
            b = b.with_token(token);
        }
    }
    if env("AWS_REGION")
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .is_none()
        && let Some(region) = profile.region
    {
        b = b.with_region(region);
    }
    let endpoint = env("AWS_ENDPOINT_URL")
        .or_else(|| env("AWS_ENDPOINT"))
        .or(profile.endpoint_url);
    if let Some(endpoint) = endpoint {
        if endpoint.starts_with("http://") {
            b = b.with_allow_http(true);
        }
        b = b.with_endpoint(endpoint);
    }
    b
}
