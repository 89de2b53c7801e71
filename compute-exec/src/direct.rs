//! [`DirectJobStreams`]: `DoGet` for job tickets answered in gRPC frames
//! written by [`sluice_flight::frames`], in front of the compute node's
//! tonic Flight service.
//!
//! A trainer's `DoGet(JobTicket)` is the hot path of the node: every byte
//! of every tensor goes through it. tonic would encode each `FlightData`
//! with prost, copying the Arrow body into a frame buffer; here the body
//! goes to HTTP/2 as the batch's own buffers. Everything else — queries,
//! checkpoint reads, the other RPCs, and a request this layer does not
//! read itself (a compressed one) — goes to the tonic service unchanged,
//! with its interceptors. The bearer token is checked here as the tonic
//! service checks it, before the request's body is read, and the job's
//! dataset against the token's grant.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow_flight::Ticket;
use arrow_flight::flight_service_server::FlightServiceServer;
use bytes::{Buf, Bytes};
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Full, Limited};
use prost::Message;
use sluice_access::Auth;
use sluice_access::auth::{AUTHORIZATION, forbidden, unauthenticated};
use sluice_flight::frames;
use tonic::body::Body;
use tonic::server::NamedService;
use tower_service::Service;

use crate::job::Jobs;
use crate::trainer;
use sluice_base::CallError;

/// The path of Flight's `DoGet`.
const DO_GET: &str = "/arrow.flight.protocol.FlightService/DoGet";
/// Largest `DoGet` request read here: what tonic would take (a SQL ticket
/// passed on to it can be long).
const MAX_TICKET: usize = sluice_flight::MAX_MESSAGE;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct DirectJobStreams<S> {
    inner: S,
    jobs: Arc<Jobs>,
    auth: Auth,
}

impl<S> DirectJobStreams<S> {
    /// Answers job tickets for `jobs` in front of `inner`, checking `auth`.
    pub fn new(inner: S, jobs: Arc<Jobs>, auth: Auth) -> Self {
        Self { inner, jobs, auth }
    }
}

impl<S> NamedService for DirectJobStreams<S> {
    const NAME: &'static str = <FlightServiceServer<crate::QueryService> as NamedService>::NAME;
}

/// The ticket of an uncompressed, single-message gRPC request body (a
/// `DoGet` request as it arrives; public for the fuzz targets).
pub fn ticket_of(body: &[u8]) -> Option<Bytes> {
    let (&flag, rest) = body.split_first()?;
    if flag != 0 || rest.len() < 4 {
        return None;
    }
    let len = u32::from_be_bytes(rest[..4].try_into().ok()?) as usize;
    let msg = &rest[4..];
    if msg.len() != len {
        return None;
    }
    Ticket::decode(msg).ok().map(|t| t.ticket)
}

impl<S, B> Service<http::Request<Body>> for DirectJobStreams<S>
where
    S: Service<http::Request<Body>, Response = http::Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        // The clone that was made ready serves this call (tower's rule).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if req.uri().path() != DO_GET {
            return Box::pin(async move { Ok(inner.call(req).await?.map(Body::new)) });
        }
        let (jobs, auth) = (Arc::clone(&self.jobs), self.auth.clone());
        Box::pin(async move {
            let headers = req.headers().get_all(AUTHORIZATION);
            let who = match auth.authenticate_any(headers.iter().filter_map(|v| v.to_str().ok())) {
                Ok(who) => who,
                Err(unknown) => {
                    auth.audit().refused(
                        unknown.who(),
                        None,
                        "Flight DoGet",
                        "no valid bearer token",
                    );
                    return Ok(unauthenticated().into_http());
                }
            };
            let (parts, body) = req.into_parts();
            let bytes = match Limited::new(body, MAX_TICKET).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    let s = CallError::bad_request(format!("cannot read the DoGet request: {e}"));
                    return Ok(s.into_http());
                }
            };
            let job =
                ticket_of(bytes.chunk()).and_then(|t| match sluice_flight::Ticket::parse(&t) {
                    Ok(sluice_flight::Ticket::Job(job)) => Some(job),
                    _ => None,
                });
            let Some(ticket) = job else {
                // The interceptor behind checks the token again.
                let req = http::Request::from_parts(parts, Body::new(Full::new(bytes)));
                return Ok(inner.call(req).await?.map(Body::new));
            };
            // Found (adopted from the coordinator, on a compute node)
            // before its dataset is checked.
            if let Ok(job) = jobs.find(&ticket.job).await
                && let Err(why) = job.may_be_read_by(&who)
            {
                auth.audit()
                    .refused(who.name(), None, "Flight DoGet of a job", &why);
                return Ok(forbidden(&why).into_http());
            }
            Ok(match trainer::messages(&jobs, ticket).await {
                Ok(messages) => frames::response(messages),
                Err(s) => s.into_http(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_body_yields_its_ticket_only_when_whole_and_plain() {
        let t = Ticket::new(r#"{"job":"j1"}"#).encode_to_vec();
        let mut body = vec![0u8];
        body.extend((t.len() as u32).to_be_bytes());
        body.extend(&t);
        assert_eq!(ticket_of(&body).unwrap(), r#"{"job":"j1"}"#.as_bytes());
        let mut compressed = body.clone();
        compressed[0] = 1;
        assert!(ticket_of(&compressed).is_none());
        assert!(ticket_of(&body[..body.len() - 1]).is_none());
        assert!(ticket_of(&[]).is_none());
    }
}
