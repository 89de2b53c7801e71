//! Bearer tokens: [`BearerAuth`] checks the `authorization: Bearer TOKEN`
//! header of a request (REST or Flight) against the tokens a server was
//! configured with. With no tokens configured every request passes; a
//! token that is given but empty (`--token ""`, `" "`, `","`) is refused
//! rather than read as "no auth". The scheme is matched case-insensitively
//! (RFC 7235). As a tonic interceptor it refuses a call with
//! `Unauthenticated`.

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
    /// Accepts `tokens` (none: no auth). A token that is empty once
    /// trimmed is an error: it would silently turn auth off.
    pub fn new(tokens: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let tokens: Vec<String> = tokens.into_iter().map(|t| t.trim().to_string()).collect();
        if tokens.iter().any(String::is_empty) {
            return Err(
                "an empty bearer token was given (--token / SLUICE_TOKEN): give real tokens, \
                 or leave the option out to serve without auth"
                    .into(),
            );
        }
        Ok(Self {
            tokens: tokens.into(),
        })
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
            let (scheme, token) = h.trim().split_once(char::is_whitespace)?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        }) else {
            return false;
        };
        // Every token is compared, so the time does not say which matched.
        self.tokens.iter().fold(false, |ok, t| {
            same(t.as_bytes(), token.trim().as_bytes()) | ok
        })
    }
}

/// The status of a request without a valid token.
pub fn unauthenticated() -> Status {
    Status::unauthenticated("a valid bearer token is required (authorization: Bearer TOKEN)")
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
            Err(unauthenticated())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked() {
        let open = BearerAuth::new(Vec::<String>::new()).unwrap();
        assert!(open.allows(None));
        for empty in [
            vec![String::new()],
            vec![" ".into()],
            vec!["a".into(), "".into()],
        ] {
            assert!(BearerAuth::new(empty).is_err());
        }
        let auth = BearerAuth::new(["s3cret".to_string(), " other ".to_string()]).unwrap();
        assert!(auth.enabled());
        assert!(auth.allows(Some("Bearer s3cret")));
        assert!(auth.allows(Some("BEARER s3cret")));
        assert!(auth.allows(Some("bEaReR  s3cret")));
        assert!(!auth.allows(Some("Basic s3cret")));
        assert!(auth.allows(Some("Bearer other")));
        assert!(!auth.allows(Some("Bearer s3cre")));
        assert!(!auth.allows(Some("s3cret")));
        assert!(!auth.allows(Some("Bearer ")));
        assert!(!auth.allows(None));
    }
}
