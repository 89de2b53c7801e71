//! The shape every sluice Flight stream has, on both ends: Arrow batches in
//! messages of at most [`MAX_FLIGHT_DATA`] bytes, optionally paced by a
//! [`TokenBucket`], then one message without Arrow data whose app metadata
//! is a [`FragmentReport`] (JSON). Storage nodes and compute nodes send
//! this; their clients read it back with [`read_reported`].
//!
//! A panic while a stream's batches are made (a built-in function fed an
//! input it cannot handle) would end the stream as if it were complete, or
//! reach the client as CANCELLED: [`guard_panics`] turns it into an error
//! that names it, so a query fails instead of losing rows.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow_flight::FlightData;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use bytes::Bytes;
use datafusion::error::DataFusionError;
use futures::{Stream, StreamExt, TryStreamExt, stream};
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

use crate::credential::{Credential, FlightClient};
use crate::throttle::TokenBucket;
use crate::{MAX_FLIGHT_DATA, MAX_MESSAGE};
use sluice_base::CallError;
use sluice_planner::fragment::FragmentReport;

/// A stream of Flight messages as a service answers it.
pub type FlightStream = Pin<Box<dyn Stream<Item = Result<FlightData, Status>> + Send>>;

/// `batches`, with a panic while polling them turned into one error
/// (naming `what` and the panic's message) that ends the stream.
pub fn guard_panics<S>(
    batches: S,
    what: &'static str,
) -> impl Stream<Item = Result<RecordBatch, DataFusionError>> + Send + 'static
where
    S: Stream<Item = Result<RecordBatch, DataFusionError>> + Send + 'static,
{
    std::panic::AssertUnwindSafe(batches)
        .catch_unwind()
        .map(move |item| match item {
            Ok(item) => item,
            Err(panic) => Err(DataFusionError::Execution(format!(
                "{what}: a function panicked ({}); the query was stopped rather than \
                 returning part of its rows",
                sluice_udfs::udf::panic_message(&panic)
            ))),
        })
}

/// Encodes `batches` of `schema` (errors mapped by `status`), paces them
/// by `link`, and ends with the report `report(rows, bytes)` builds once
/// they are sent. The schema goes first, so an empty result is a valid
/// stream of no rows.
pub fn send_reported<S>(
    schema: SchemaRef,
    batches: S,
    status: fn(&DataFusionError) -> Status,
    link: Option<Arc<TokenBucket>>,
    report: impl FnOnce(u64, u64) -> FragmentReport + Send + 'static,
) -> FlightStream
where
    S: Stream<Item = Result<RecordBatch, DataFusionError>> + Send + 'static,
{
    let rows = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let (counted_rows, counted_bytes) = (Arc::clone(&rows), Arc::clone(&bytes));
    let batches = guard_panics(batches, "query")
        .inspect_ok(move |b| {
            counted_rows.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
        })
        .map_err(move |e| FlightError::Tonic(Box::new(status(&e))));
    let data = FlightDataEncoderBuilder::new()
        .with_max_flight_data_size(MAX_FLIGHT_DATA)
        .with_schema(schema)
        .build(batches)
        .map_err(|e| match e {
            FlightError::Tonic(s) => *s,
            other => CallError::encoding(other.to_string()),
        })
        .and_then(move |d| {
            let n = d.data_body.len() + d.data_header.len();
            counted_bytes.fetch_add(n as u64, Ordering::Relaxed);
            let wait = link.as_ref().map_or(Duration::ZERO, |l| l.reserve(n));
            async move {
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                Ok(d)
            }
        });
    let last = stream::once(async move {
        let r = report(rows.load(Ordering::Relaxed), bytes.load(Ordering::Relaxed));
        let json = serde_json::to_vec(&r).map_err(|e| CallError::encoding(e.to_string()))?;
        Ok(FlightData::new().with_app_metadata(Bytes::from(json)))
    });
    Box::pin(data.chain(last))
}

/// The Arrow messages of a stream [`send_reported`] produced, handing its
/// report to `on_report`.
pub fn read_reported<S>(
    raw: S,
    on_report: impl Fn(FragmentReport) + Send + Sync + 'static,
) -> impl Stream<Item = Result<FlightData, FlightError>> + Send
where
    S: Stream<Item = Result<FlightData, Status>> + Send,
{
    raw.map_err(|s| FlightError::Tonic(Box::new(s)))
        .try_filter(move |d| {
            let arrow = !d.data_header.is_empty();
            if !arrow && let Ok(r) = serde_json::from_slice(&d.app_metadata) {
                on_report(r);
            }
            futures::future::ready(arrow)
        })
}

/// A lazily connecting Flight client of `url` (`host:port` means
/// `http://host:port`; `grpc+tls://` and `https://` are dialled with the
/// credential's TLS) with sluice's message limits, presenting
/// `credential` on every call, the URL it uses, and the connection under
/// it (a clone shares it: every other service of the node, such as the
/// engine's worker, is reached over the same one).
pub fn connect(
    url: &str,
    credential: Credential,
) -> Result<(String, FlightClient, Channel), String> {
    let (url, endpoint) = dial(url, &credential)?;
    let channel = endpoint.connect_lazy();
    let client = FlightServiceClient::with_interceptor(channel.clone(), credential)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    Ok((url, client, channel))
}

/// The URL a node at `url` is dialled at, and the endpoint that dials it
/// with `credential`'s TLS.
fn dial(url: &str, credential: &Credential) -> Result<(String, Endpoint), String> {
    let url = crate::tls::dial_url(url);
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| format!("bad URL {url}: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    if crate::tls::is_tls(&url) {
        let tls = credential
            .tls()
            .ok_or_else(|| format!("{url}: a TLS location needs the cluster's CA (--tls-ca)"))?
            .tonic_client()?;
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| format!("{url}: {e}"))?;
    }
    Ok((url, endpoint))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int32Array;
    use arrow::datatypes::{DataType, Field, Schema};

    fn batch(n: i32) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int32Array::from(vec![n]))]).unwrap()
    }

    #[tokio::test]
    async fn a_panic_while_batches_are_made_is_an_error_not_an_end() {
        let mut n = 0;
        let panicking = stream::poll_fn(move |_| {
            n += 1;
            if n == 3 {
                panic!("offsets must be monotonically increasing");
            }
            std::task::Poll::Ready(Some(Ok(batch(n))))
        });
        let items: Vec<_> = guard_panics(panicking, "storage fragment").collect().await;
        assert_eq!(items.len(), 3, "two batches, then the error, then the end");
        assert!(items[0].is_ok() && items[1].is_ok());
        let err = items[2].as_ref().unwrap_err().to_string();
        assert!(err.contains("storage fragment"), "{err}");
        assert!(err.contains("monotonically increasing"), "{err}");
    }
}
