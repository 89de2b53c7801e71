//! [`Caller`]: the address a REST request came from, where the server
//! knows it (it serves with connect info), so that a trainer is sent to
//! the compute node beside it.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;

/// The caller's IP address (`None`: not known, as in a server built
/// without connect info).
#[derive(Debug, Clone, Copy)]
pub struct Caller(pub Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0.ip()),
        ))
    }
}
