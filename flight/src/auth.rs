//! Bearer tokens: [`BearerAuth`] checks the `authorization: Bearer TOKEN`
//! header of a request (REST or Flight) against the tokens a server was
//! configured with. With no tokens configured every request passes; a
//! token that is given but empty (`--token ""`, `" "`, `","`) is refused
//! rather than read as "no auth". The scheme is matched case-insensitively
//! (RFC 7235). As a tonic interceptor it refuses a call with
//! `Unauthenticated`, and also lets through a Flight `Basic` login whose
//! password is a token, which the handshake exchanges for `Bearer TOKEN`.

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

    /// The token of a Flight handshake's `authorization: Basic` header
    /// (base64 of `user:password`) whose password is an accepted token:
    /// clients that only know username/password logins (Flight SQL's
    /// handshake, ADBC's `username`/`password`) exchange it for the
    /// bearer token. The user name is not checked: tokens name no users.
    pub fn basic_token(&self, header: Option<&str>) -> Option<String> {
        let password = basic_password(header?)?;
        let bearer = format!("Bearer {password}");
        (self.enabled() && self.allows(Some(&bearer))).then_some(password)
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

/// The password of an `authorization: Basic base64(user:password)`
/// header value, trimmed (not checked).
pub fn basic_password(header: &str) -> Option<String> {
    use base64::Engine as _;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    // Padded or not: Go's Flight client sends it unpadded.
    const BASE64: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    let (scheme, encoded) = header.trim().split_once(char::is_whitespace)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = BASE64.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (_, password) = text.split_once(':')?;
    Some(password.trim().to_string())
}

/// The status of a request without a valid token (kind `unauthorized`,
/// as REST's 401 says it).
pub fn unauthenticated() -> Status {
    crate::fault::status_with(
        tonic::Code::Unauthenticated,
        "unauthorized",
        "a valid bearer token is required (authorization: Bearer TOKEN)",
    )
}

impl tonic::service::Interceptor for BearerAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        if !self.enabled() {
            return Ok(request);
        }
        // A client may send more than one (a Flight SQL driver's login
        // beside an empty default): one that passes is enough.
        let passes = request
            .metadata()
            .get_all(AUTHORIZATION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|h| self.allows(Some(h)) || self.basic_token(Some(h)).is_some());
        if passes {
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

    #[test]
    fn a_basic_login_whose_password_is_a_token_gives_that_token() {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let auth = BearerAuth::new(["s3cret".to_string()]).unwrap();
        let good = format!("Basic {}", b64("anyone:s3cret"));
        assert_eq!(auth.basic_token(Some(&good)).as_deref(), Some("s3cret"));
        let unpadded = format!("Basic {}", b64("anyone:s3cret").trim_end_matches('='));
        assert_eq!(auth.basic_token(Some(&unpadded)).as_deref(), Some("s3cret"));
        assert!(!auth.allows(Some(&good)), "REST takes bearer tokens only");
        for bad in [
            format!("Basic {}", b64("anyone:wrong")),
            format!("Basic {}", b64("no-colon")),
            "Basic !!!".to_string(),
            "Bearer s3cret".to_string(),
        ] {
            assert_eq!(auth.basic_token(Some(&bad)), None, "{bad}");
        }
        let open = BearerAuth::new(Vec::<String>::new()).unwrap();
        assert_eq!(open.basic_token(Some(&good)), None);
    }
}
