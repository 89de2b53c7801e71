//! Upload passes: how a trainer writes its stripes of a cluster checkpoint
//! straight to the storage nodes, which take only nodes' calls.
//!
//! ```text
//!  coordinator ── checkpoint.begin {name, pass: true} ──► storage node: upload u, pass P (random),
//!                                                        keeps only P's BLAKE3 hash, on u
//!  trainer ◄── {upload, direct: {nodes: [{url, upload: u, pass: P}, …]}} ── coordinator
//!  trainer ── DoPut {checkpoint_upload: u, offset}, x-sluice-upload-pass: P ──► storage node
//!               PassGate: a DoPut carrying a pass skips the node-token check, marked UploadPass(P);
//!               the node's put takes it only for a checkpoint part of u, and only if P hashes to u's
//! ```
//!
//! A pass is like an S3 presigned URL: it lets its holder write one
//! upload's pieces on one node, and nothing else: no action, no read, no
//! other upload, and it dies with the upload (commit, abort, idle
//! timeout). Every other call to the node still needs a node token
//! ([`crate::Auth`]). A pass travels only in the coordinator's answer to
//! the trainer that began the upload (over the trainer's own link, TLS
//! where the cluster has it) and in that trainer's puts; it is never
//! logged. A storage node that requires a client certificate of the
//! cluster's CA offers no pass (a trainer has no such certificate), and
//! its checkpoints go through the coordinator.
//!
//! The gate lets one more kind of call past the token check: a `DoGet`
//! that carries a read pass ([`crate::read_pass`]), marked [`ReadPass`]
//! for the service to check against the range it asks for.

use std::convert::Infallible;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;
use tonic::service::interceptor::InterceptedService;

use crate::auth::Auth;
use crate::read_pass::{READ_PASS_HEADER, ReadPass};

/// The header a pass travels in.
pub const PASS_HEADER: &str = "x-sluice-upload-pass";

/// The one call an upload pass may make.
const DO_PUT: &str = "/arrow.flight.protocol.FlightService/DoPut";
/// The one call a read pass may make.
const DO_GET: &str = "/arrow.flight.protocol.FlightService/DoGet";

/// A pass as a call presented it: set by [`PassGate`] in the request's
/// extensions of a `DoPut` it let through without a token, and checked
/// against the upload by the service.
#[derive(Debug, Clone)]
pub struct UploadPass(pub String);

/// What a node keeps of a pass it gave: its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassHash(blake3::Hash);

impl PassHash {
    /// A new pass (the secret, to hand out once) and its hash (to keep);
    /// `None` where the OS gives no randomness (a guessable pass is worse
    /// than none: the upload then goes through the coordinator).
    pub fn issue() -> Option<(String, Self)> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).ok()?;
        let text: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        let hash = Self(blake3::hash(text.as_bytes()));
        Some((text, hash))
    }

    /// Whether `pass` is the one this hash was issued for (compared in
    /// constant time, as `blake3::Hash`'s equality is).
    pub fn admits(&self, pass: &UploadPass) -> bool {
        blake3::hash(pass.0.as_bytes()) == self.0
    }
}

/// A service behind [`Auth`], except for a `DoPut` that carries an upload
/// pass and a `DoGet` that carries a read pass: those reach the service
/// unauthenticated, marked with their [`UploadPass`] or [`ReadPass`], for
/// the service to check against the upload or the version they name.
#[derive(Debug, Clone)]
pub struct PassGate<S> {
    checked: InterceptedService<S, Auth>,
    bare: S,
}

impl<S: Clone> PassGate<S> {
    /// `service` behind `auth`, passes let through to `DoPut` and `DoGet`.
    pub fn new(service: S, auth: Auth) -> Self {
        Self {
            checked: InterceptedService::new(service.clone(), auth),
            bare: service,
        }
    }
}

/// Marks `req` with the pass it carries ([`UploadPass`] or [`ReadPass`]),
/// if it is a `DoPut` with an upload pass or a `DoGet` with a read pass
/// (no other call may use one); whether it did.
fn mark_pass(req: &mut http::Request<Body>) -> bool {
    match req.uri().path() {
        DO_PUT => mark(req, PASS_HEADER, UploadPass),
        DO_GET => mark(req, READ_PASS_HEADER, ReadPass),
        _ => false,
    }
}

/// Marks `req` with `make` of its `header`'s text, where that is not blank.
fn mark<P: Clone + Send + Sync + 'static>(
    req: &mut http::Request<Body>,
    header: &str,
    make: fn(String) -> P,
) -> bool {
    let pass = req.headers().get(header).and_then(|v| v.to_str().ok());
    let Some(pass) = pass.map(str::trim).filter(|p| !p.is_empty()) else {
        return false;
    };
    let pass = make(pass.to_string());
    req.extensions_mut().insert(pass);
    true
}

impl<S> Service<http::Request<Body>> for PassGate<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Both sides are the same tonic service, which is always ready.
        self.checked.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        if mark_pass(&mut req) {
            let mut bare = self.bare.clone();
            return Box::pin(async move { bare.call(req).await });
        }
        let fut = self.checked.call(req);
        Box::pin(async move {
            let res = fut.await?;
            Ok(res.map(Body::new))
        })
    }
}

impl<S: NamedService> NamedService for PassGate<S> {
    const NAME: &'static str = S::NAME;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(path: &str, pass: Option<&str>) -> http::Request<Body> {
        let mut b = http::Request::builder().uri(format!("http://node{path}"));
        if let Some(p) = pass {
            b = b.header(PASS_HEADER, p);
        }
        b.body(Body::empty()).unwrap()
    }

    #[test]
    fn a_pass_admits_itself_only() {
        let (secret, hash) = PassHash::issue().unwrap();
        let (other, _) = PassHash::issue().unwrap();
        assert_eq!(secret.len(), 64);
        assert_ne!(secret, other);
        assert!(hash.admits(&UploadPass(secret)));
        assert!(!hash.admits(&UploadPass(other)));
        assert!(!hash.admits(&UploadPass(String::new())));
    }

    fn request_with(path: &str, header: &str, pass: &str) -> http::Request<Body> {
        http::Request::builder()
            .uri(format!("http://node{path}"))
            .header(header, pass)
            .body(Body::empty())
            .unwrap()
    }

    /// The pass `req` was marked with by the gate: the kind and its text.
    fn marked(mut req: http::Request<Body>) -> Option<(&'static str, String)> {
        let carried = mark_pass(&mut req);
        let ext = req.extensions();
        let got = match (ext.get::<UploadPass>(), ext.get::<ReadPass>()) {
            (Some(p), None) => Some(("upload", p.0.clone())),
            (None, Some(p)) => Some(("read", p.0.clone())),
            (None, None) => None,
            (Some(_), Some(_)) => panic!("marked with both passes"),
        };
        assert_eq!(carried, got.is_some());
        got
    }

    #[test]
    fn only_a_put_carries_an_upload_pass_and_a_get_a_read_pass_past_the_token_check() {
        let upload = Some(("upload", "abc".to_string()));
        assert_eq!(marked(request(DO_PUT, Some("abc"))), upload);
        assert!(marked(request(DO_PUT, Some(" "))).is_none());
        assert!(marked(request(DO_PUT, None)).is_none());
        let read = Some(("read", "abc".to_string()));
        assert_eq!(marked(request_with(DO_GET, READ_PASS_HEADER, "abc")), read);
        // Each pass in the other call's header is no pass.
        assert!(marked(request_with(DO_GET, PASS_HEADER, "abc")).is_none());
        assert!(marked(request_with(DO_PUT, READ_PASS_HEADER, "abc")).is_none());
        for other in [
            "/arrow.flight.protocol.FlightService/DoAction",
            "/arrow.flight.protocol.FlightService/DoExchange",
            "/arrow.flight.protocol.FlightService/Handshake",
            "/sluice.worker.Worker/Run",
        ] {
            assert!(marked(request(other, Some("abc"))).is_none(), "{other}");
            let read = request_with(other, READ_PASS_HEADER, "abc");
            assert!(marked(read).is_none(), "{other}");
        }
    }
}
