//! Bearer tokens: [`BearerAuth`] checks the `authorization: Bearer TOKEN`
//! header of a request (REST or Flight) against the tokens a server was
//! configured with. With no tokens configured every request passes. As a
//! tonic interceptor it refuses a call with `Unauthenticated`.

use std::sync::Arc;

use tonic::{Request, Status};

/// The header carrying the token.
pub const AUTHORIZATION: &str = "authorization";

/// See the module docs.
#[derive(Debug, Clone, Default)]
pub struct BearerAuth {
    tokens: Arc<[String]>,
}

/// Equal in time independent of where the strings differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl BearerAuth {
    /// Accepts `tokens` (empty ones are ignored; none: no auth).
    pub fn new(tokens: impl IntoIterator<Item = String>) -> Self {
        let tokens: Vec<String> = tokens
            .into_iter()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .collect();
        Self {
            tokens: tokens.into(),
        }
    }

    /// Whether any token is required.
    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// Whether an `authorization` header value passes.
    pub fn allows(&self, header: Option<&str>) -> bool {
        if !self.enabled() {
            return true;
        }
        let Some(token) = header.and_then(|h| {
            h.strip_prefix("Bearer ")
                .or_else(|| h.strip_prefix("bearer "))
        }) else {
            return false;
        };
        // Every token is compared, so the time does not say which matched.
        self.tokens.iter().fold(false, |ok, t| {
            same(t.as_bytes(), token.trim().as_bytes()) | ok
        })
    }
}

impl tonic::service::Interceptor for BearerAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let header = request
            .metadata()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if self.allows(header) {
            Ok(request)
        } else {
            Err(Status::unauthenticated(
                "a valid bearer token is required (authorization: Bearer TOKEN)",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked() {
        let open = BearerAuth::new(Vec::<String>::new());
        assert!(open.allows(None));
        let auth = BearerAuth::new(["s3cret".to_string(), " other ".to_string(), String::new()]);
        assert!(auth.enabled());
        assert!(auth.allows(Some("Bearer s3cret")));
        assert!(auth.allows(Some("Bearer other")));
        assert!(!auth.allows(Some("Bearer s3cre")));
        assert!(!auth.allows(Some("s3cret")));
        assert!(!auth.allows(Some("Bearer ")));
        assert!(!auth.allows(None));
    }
}
