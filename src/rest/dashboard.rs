//! The dashboard: three static files compiled into the binary and served
//! at `/` — a page that reads the REST API (no API of its own) with the
//! token the user types. The files hold no data, so they are the only
//! routes besides `/healthz` served without a token; every figure the page
//! shows comes from a REST call that needs one.

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

const INDEX: &str = include_str!("../dashboard/index.html");
const SCRIPT: &str = include_str!("../dashboard/app.js");
const STYLE: &str = include_str!("../dashboard/app.css");

/// The paths of the dashboard's files.
pub const PATHS: [&str; 3] = ["/", "/ui/app.js", "/ui/app.css"];

/// Only this server's own files and REST calls, nothing inline or remote.
const POLICY: &str = "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; \
                      frame-ancestors 'none'";

fn file(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

/// The dashboard's routes.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            PATHS[0],
            get(|| async { file("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            PATHS[1],
            get(|| async { file("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            PATHS[2],
            get(|| async { file("text/css; charset=utf-8", STYLE) }),
        )
}
