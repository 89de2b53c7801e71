//! Who may call which route: [`authorize`], the middleware in front of
//! every route, and [`need`], the scope each route needs.
//!
//! ```text
//!  route                              scope        and, in the handler
//!  GET  /healthz, the dashboard files  none
//!  GET  /v1/info, /metrics             any token
//!  GET  /v1/jobs[/{id}[/explain]]      read         the job's dataset
//!  POST /v1/jobs, DELETE /v1/jobs/{id} read         the job's dataset
//!  GET  /v1/datasets[/{name}]          read         listed: only its datasets
//!  POST /v1/datasets                   ingest       the dataset's name
//!  GET/DELETE /v1/checkpoints          read         the name or prefix
//!  GET  /v1/nodes                      read
//!  DELETE /v1/nodes/{kind}/{id}        admin
//!  POST /v1/nodes/{compute,storage}    node         the node's own location
//!  POST /v1/jobs/{id}/progress         node         the ranks routed to it
//!  GET  /v1/jobs/{id}/record           node
//! ```
//!
//! The token is checked before the request's body is read: a caller
//! without one is answered 401 at once, whatever it sends. A token
//! without the route's scope is answered 403 and written to the audit
//! log; so is one whose scope fits but whose datasets or checkpoints do
//! not (the handlers call [`refuse`]). The caller's [`Principal`] is left
//! in the request's extensions for the handlers.

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sluice_access::{Principal, Scope};

use super::AppState;
use super::dashboard;
use super::error::{ApiError, Kind};

/// What a route needs of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing: open to all.
    Nothing,
    /// A valid token, of any scope.
    AnyToken,
    /// A token holding this scope.
    Scope(Scope),
}

/// What `method path` needs (see the module docs).
pub fn need(method: &Method, path: &str) -> Need {
    if path == "/healthz" || dashboard::PATHS.contains(&path) {
        return Need::Nothing;
    }
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    match (method, parts.as_slice()) {
        (_, ["", "v1", "info"] | ["", "metrics"] | ["", "openapi.json"]) => Need::AnyToken,
        (&Method::POST, ["", "v1", "nodes", "compute" | "storage"]) => Need::Scope(Scope::Node),
        (&Method::POST, ["", "v1", "jobs", _, "progress"]) => Need::Scope(Scope::Node),
        (_, ["", "v1", "jobs", _, "record"]) => Need::Scope(Scope::Node),
        (&Method::DELETE, ["", "v1", "nodes", ..]) => Need::Scope(Scope::Admin),
        (&Method::POST, ["", "v1", "nodes", "storage", _, "drain"]) => Need::Scope(Scope::Admin),
        (_, ["", "v1", "rebalance"]) => Need::Scope(Scope::Admin),
        (_, ["", "v1", "scrub"]) => Need::Scope(Scope::Admin),
        (&Method::POST, ["", "v1", "datasets"]) => Need::Scope(Scope::Ingest),
        _ => Need::Scope(Scope::Read),
    }
}

/// The middleware: the caller's token, checked against the route's need,
/// before anything else of the request is read.
pub async fn authorize(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
    let need = need(req.method(), req.uri().path());
    if need == Need::Nothing {
        return next.run(req).await;
    }
    let header = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let what = format!("{} {}", req.method(), req.uri().path());
    let from = req
        .extensions()
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip().to_string());
    let who = match s.auth.authenticate(header) {
        Ok(who) => who,
        Err(unknown) => {
            s.auth
                .audit()
                .refused(unknown.who(), from, &what, "no valid bearer token");
            let mut r = ApiError::new(
                Kind::Unauthorized,
                "a valid bearer token is required (authorization: Bearer TOKEN)",
            )
            .into_response();
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            return r;
        }
    };
    if let Need::Scope(scope) = need
        && !who.has(scope)
    {
        let why = format!(
            "token {:?} lacks the {} scope this route needs",
            who.name(),
            scope.name()
        );
        s.auth.audit().refused(who.name(), from, &what, &why);
        return ApiError::new(Kind::Forbidden, why).into_response();
    }
    req.extensions_mut().insert(who);
    next.run(req).await
}

/// A refusal of `what` to `who`, written to the audit log: the 403 to
/// answer.
pub fn refuse(s: &AppState, who: &Principal, what: &str, why: String) -> ApiError {
    s.auth.audit().refused(who.name(), None, what, &why);
    ApiError::new(Kind::Forbidden, why)
}

/// `Ok` when `allowed`, else [`refuse`].
pub fn check(
    s: &AppState,
    who: &Principal,
    what: &str,
    allowed: Result<(), String>,
) -> Result<(), ApiError> {
    allowed.map_err(|why| refuse(s, who, what, why))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_route_needs_its_scope() {
        let get = Method::GET;
        let post = Method::POST;
        let delete = Method::DELETE;
        for (m, path, want) in [
            (&get, "/healthz", Need::Nothing),
            (&get, "/", Need::Nothing),
            (&get, "/v1/info", Need::AnyToken),
            (&get, "/metrics", Need::AnyToken),
            (&get, "/v1/jobs", Need::Scope(Scope::Read)),
            (&post, "/v1/jobs", Need::Scope(Scope::Read)),
            (&get, "/v1/jobs/j-1", Need::Scope(Scope::Read)),
            (&delete, "/v1/jobs/j-1", Need::Scope(Scope::Read)),
            (&get, "/v1/jobs/j-1/explain", Need::Scope(Scope::Read)),
            (&get, "/v1/jobs/j-1/record", Need::Scope(Scope::Node)),
            (&post, "/v1/jobs/j-1/progress", Need::Scope(Scope::Node)),
            (&get, "/v1/datasets", Need::Scope(Scope::Read)),
            (&post, "/v1/datasets", Need::Scope(Scope::Ingest)),
            (&get, "/v1/datasets/pets", Need::Scope(Scope::Read)),
            (&get, "/v1/checkpoints", Need::Scope(Scope::Read)),
            (&delete, "/v1/checkpoints", Need::Scope(Scope::Read)),
            (&get, "/v1/nodes", Need::Scope(Scope::Read)),
            (&post, "/v1/nodes/compute", Need::Scope(Scope::Node)),
            (&post, "/v1/nodes/storage/", Need::Scope(Scope::Node)),
            (&delete, "/v1/nodes/storage/ab12", Need::Scope(Scope::Admin)),
            (&post, "/v1/scrub", Need::Scope(Scope::Admin)),
            (
                &post,
                "/v1/nodes/storage/ab12/drain",
                Need::Scope(Scope::Admin),
            ),
            (&post, "/v1/rebalance", Need::Scope(Scope::Admin)),
            (&get, "/v1/no-such-route", Need::Scope(Scope::Read)),
        ] {
            assert_eq!(need(m, path), want, "{m} {path}");
        }
    }
}
