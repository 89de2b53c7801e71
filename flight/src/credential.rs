//! [`Credential`]: what a node presents on every call it makes to another
//! node — its bearer token (a tonic interceptor on the client side) and,
//! on a cluster with TLS, its certificate and the CA it checks the other
//! node against ([`Tls`]) — and [`FlightClient`], a Flight client that
//! presents it.
//!
//! A node's credential is a token of scope `node` from the cluster's
//! tokens file (`sluice_access`): a storage node given the tokens file
//! refuses calls without one. `None` presents nothing (a cluster without
//! tokens).

use std::sync::Arc;

use arrow_flight::flight_service_client::FlightServiceClient;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::tls::Tls;

/// A Flight client that presents a [`Credential`] on every call.
pub type FlightClient = FlightServiceClient<InterceptedService<Channel, Credential>>;

/// See the module docs.
#[derive(Debug, Clone, Default)]
pub struct Credential {
    bearer: Option<AsciiMetadataValue>,
    tls: Option<Arc<Tls>>,
}

impl Credential {
    /// `authorization: Bearer TOKEN` on every call (`None`: nothing).
    pub fn bearer(token: Option<&str>) -> Result<Self, String> {
        token
            .map(|t| {
                format!("Bearer {}", t.trim())
                    .parse::<AsciiMetadataValue>()
                    .map_err(|_| "a token must be one line of visible characters".to_string())
            })
            .transpose()
            .map(|bearer| Self { bearer, tls: None })
    }

    /// The same, with TLS on `grpc+tls://` and `https://` links.
    pub fn with_tls(mut self, tls: Option<Arc<Tls>>) -> Self {
        self.tls = tls;
        self
    }

    /// The `authorization` value it presents, if any.
    pub fn bearer_value(&self) -> Option<&AsciiMetadataValue> {
        self.bearer.as_ref()
    }

    /// The TLS it speaks, if any.
    pub fn tls(&self) -> Option<&Tls> {
        self.tls.as_deref()
    }
}

impl tonic::service::Interceptor for Credential {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.bearer {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    #[test]
    fn a_credential_is_a_bearer_header_on_every_call() {
        let mut c = Credential::bearer(Some("slc_ab")).unwrap();
        let r = c.call(Request::new(())).unwrap();
        assert_eq!(r.metadata().get("authorization").unwrap(), "Bearer slc_ab");
        let mut none = Credential::bearer(None).unwrap();
        assert!(none.call(Request::new(())).unwrap().metadata().is_empty());
        assert!(Credential::bearer(Some("a\nb")).is_err());
    }
}
