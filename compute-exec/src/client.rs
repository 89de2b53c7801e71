//! [`QueryClient`]: a typed client of a compute node's [`QueryService`](crate::QueryService).

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow_flight::Action;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use futures::StreamExt;
use sluice_flight::stream::{connect, read_reported};
use sluice_flight::{Credential, FlightClient, Tls};
use sluice_planner::Explanation;
use sluice_planner::fragment::FragmentReport;

use sluice_flight::ticket::{QueryTicket, Ticket};

use crate::service::EXPLAIN;

/// An error from a compute node, with its message.
#[derive(Debug, thiserror::Error)]
#[error("{node}: {message}")]
pub struct QueryError {
    /// The node's URL.
    pub node: String,
    /// Its status code.
    pub code: tonic::Code,
    /// Its message.
    pub message: String,
}

/// A query's result.
#[derive(Debug)]
pub struct QueryResult {
    /// Its schema.
    pub schema: SchemaRef,
    /// Its batches.
    pub batches: Vec<RecordBatch>,
    /// Bad samples met.
    pub report: FragmentReport,
}

/// A client of one compute node.
#[derive(Debug, Clone)]
pub struct QueryClient {
    node: String,
    inner: FlightClient,
    token: Option<String>,
}

impl QueryClient {
    /// A client of the node at `url` (a `grpc+tls://` one checked against
    /// `tls`'s CA).
    pub fn new(url: &str, tls: Option<Arc<Tls>>) -> Result<Self, QueryError> {
        let credential = Credential::default().with_tls(tls);
        let (node, inner, _) = connect(url, credential).map_err(|message| QueryError {
            node: url.to_string(),
            code: tonic::Code::InvalidArgument,
            message,
        })?;
        Ok(Self {
            node,
            inner,
            token: None,
        })
    }

    /// The same client, sending `token` as a bearer token.
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        if let Some(v) = self
            .token
            .as_ref()
            .and_then(|t| format!("Bearer {t}").parse().ok())
        {
            r.metadata_mut().insert(sluice_access::AUTHORIZATION, v);
        }
        r
    }

    fn err(&self, s: &tonic::Status) -> QueryError {
        QueryError {
            node: self.node.clone(),
            code: s.code(),
            message: s.message().to_string(),
        }
    }

    /// Runs a query and collects its result.
    pub async fn query(&self, ticket: &QueryTicket) -> Result<QueryResult, QueryError> {
        let body = Ticket::Query(ticket.clone()).to_bytes();
        let report = Arc::new(std::sync::Mutex::new(FragmentReport::default()));
        let seen = Arc::clone(&report);
        let raw = self
            .inner
            .clone()
            .do_get(self.request(arrow_flight::Ticket {
                ticket: body.into(),
            }))
            .await
            .map_err(|s| self.err(&s))?
            .into_inner();
        let stream = read_reported(raw, move |r| {
            *seen.lock().unwrap_or_else(|e| e.into_inner()) = r;
        });
        let mut decoder = FlightDataDecoder::new(stream);
        let mut schema: Option<SchemaRef> = None;
        let mut batches = Vec::new();
        while let Some(d) = decoder.next().await {
            let d = d.map_err(|e| match e {
                FlightError::Tonic(s) => self.err(&s),
                other => QueryError {
                    node: self.node.clone(),
                    code: tonic::Code::Internal,
                    message: other.to_string(),
                },
            })?;
            match d.payload {
                DecodedPayload::Schema(s) => schema = Some(s),
                DecodedPayload::RecordBatch(b) => batches.push(b),
                DecodedPayload::None => {}
            }
        }
        let schema = schema
            .or_else(|| batches.first().map(|b| b.schema()))
            .unwrap_or_else(|| Arc::new(arrow::datatypes::Schema::empty()));
        let report = report.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Ok(QueryResult {
            schema,
            batches,
            report,
        })
    }

    /// The placement of a query.
    pub async fn explain(&self, ticket: &QueryTicket) -> Result<Explanation, QueryError> {
        let body = serde_json::to_vec(ticket).map_err(|e| QueryError {
            node: self.node.clone(),
            code: tonic::Code::Internal,
            message: e.to_string(),
        })?;
        let mut replies = self
            .inner
            .clone()
            .do_action(self.request(Action {
                r#type: EXPLAIN.into(),
                body: body.into(),
            }))
            .await
            .map_err(|s| self.err(&s))?
            .into_inner();
        let reply = replies
            .message()
            .await
            .map_err(|s| self.err(&s))?
            .ok_or_else(|| QueryError {
                node: self.node.clone(),
                code: tonic::Code::Internal,
                message: "no explanation sent".into(),
            })?;
        serde_json::from_slice(&reply.body).map_err(|e| QueryError {
            node: self.node.clone(),
            code: tonic::Code::Internal,
            message: format!("bad explanation: {e}"),
        })
    }
}
