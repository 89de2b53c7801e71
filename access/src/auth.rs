//! [`Auth`]: the bearer check of every REST route and Flight call.
//!
//! A call carries `authorization: Bearer TOKEN`; [`Auth::authenticate`]
//! hashes the token and finds its [`Grant`] among the tokens the server
//! accepts: those of its tokens file ([`crate::TokenFile`], read again by
//! [`Auth::reload`] on SIGHUP) and those given on the command line
//! (every scope). With neither, the server is open and every caller is
//! [`Grant::everyone`]. A token that is given but empty (`--token ""`) is
//! refused at start rather than read as "no auth". The scheme is matched
//! case-insensitively (RFC 7235).
//!
//! As a tonic interceptor, `Auth` refuses a call without a known token
//! with `Unauthenticated`, and puts the caller's [`Principal`] in the
//! request's extensions for the service to ask about datasets and
//! checkpoints. It also lets through a Flight `Basic` login whose password
//! is a token, which the handshake exchanges for `Bearer TOKEN` (Flight
//! SQL drivers and ADBC log in with a user name and a password).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tonic::{Request, Status};

use crate::audit::Audit;
use crate::grant::{Grant, Principal, Scope};
use crate::tokens::{TokenFile, hash};

/// The header carrying the token.
pub const AUTHORIZATION: &str = "authorization";

/// See the module docs.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    tokens: Arc<RwLock<Tokens>>,
    file: Option<PathBuf>,
    audit: Audit,
    /// A scope every call must hold (a storage node's service: `node`).
    need: Option<Scope>,
}

#[derive(Debug, Default)]
struct Tokens {
    /// Hash of the secret → its grant: the file's and the command line's.
    by_hash: HashMap<String, Principal>,
    /// The command line's, kept across reloads.
    given: HashMap<String, Principal>,
}

/// Why a call has no principal (who the audit log says called).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unknown {
    /// It carried no bearer token.
    NoToken,
    /// It carried one the server does not know.
    UnknownToken,
}

impl Unknown {
    /// As the audit log writes it.
    pub fn who(self) -> &'static str {
        match self {
            Self::NoToken => "no token",
            Self::UnknownToken => "unknown token",
        }
    }
}

impl Auth {
    /// Accepts `given` tokens (every scope) and those of the tokens file
    /// at `file`; refusals are written to `audit`. Neither: no auth.
    pub fn new(
        given: impl IntoIterator<Item = String>,
        file: Option<&Path>,
        audit: Audit,
    ) -> Result<Self, String> {
        let given: Vec<String> = given.into_iter().map(|t| t.trim().to_string()).collect();
        if given.iter().any(String::is_empty) {
            return Err(
                "an empty bearer token was given (--token / SLUICE_TOKEN): give real tokens, \
                 or leave the option out to serve without auth"
                    .into(),
            );
        }
        let given: HashMap<String, Principal> = given
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let name = format!("command-line token {}", i + 1);
                (hash(t), Arc::new(Grant::everything(name)))
            })
            .collect();
        let auth = Self {
            tokens: Arc::new(RwLock::new(Tokens {
                by_hash: given.clone(),
                given,
            })),
            file: file.map(Path::to_path_buf),
            audit,
            need: None,
        };
        auth.reload()?;
        Ok(auth)
    }

    /// The same check, refusing (`PermissionDenied`) every call whose
    /// token lacks `scope`: a storage node's service takes only nodes.
    pub fn requiring(mut self, scope: Scope) -> Self {
        self.need = Some(scope);
        self
    }

    /// Reads the tokens file again (SIGHUP): how many tokens are accepted
    /// now. A file that cannot be read leaves the tokens as they were.
    pub fn reload(&self) -> Result<usize, String> {
        let Some(path) = &self.file else {
            return Ok(self.read().by_hash.len());
        };
        let file = TokenFile::read(path)?;
        let mut tokens = self.tokens.write().unwrap_or_else(|e| e.into_inner());
        let mut by_hash = tokens.given.clone();
        for (h, grant) in file.grants() {
            by_hash.insert(h, Arc::new(grant));
        }
        tokens.by_hash = by_hash;
        Ok(tokens.by_hash.len())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Tokens> {
        self.tokens.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether any token is required.
    pub fn enabled(&self) -> bool {
        self.file.is_some() || !self.read().given.is_empty()
    }

    /// Where refusals are written.
    pub fn audit(&self) -> &Audit {
        &self.audit
    }

    /// The caller of an `authorization` header value.
    pub fn authenticate(&self, header: Option<&str>) -> Result<Principal, Unknown> {
        if !self.enabled() {
            return Ok(Grant::everyone());
        }
        let token = header
            .and_then(|h| {
                let (scheme, token) = h.trim().split_once(char::is_whitespace)?;
                scheme
                    .eq_ignore_ascii_case("bearer")
                    .then_some(token.trim())
            })
            .filter(|t| !t.is_empty())
            .ok_or(Unknown::NoToken)?;
        self.principal(token).ok_or(Unknown::UnknownToken)
    }

    fn principal(&self, token: &str) -> Option<Principal> {
        self.read().by_hash.get(&hash(token)).cloned()
    }

    /// The caller of any of a call's `authorization` values: a bearer
    /// token, or a `Basic` login whose password is a token (a client may
    /// send more than one: a Flight SQL driver's login beside an empty
    /// default).
    pub fn authenticate_any<'a>(
        &self,
        headers: impl IntoIterator<Item = &'a str>,
    ) -> Result<Principal, Unknown> {
        let mut why = Unknown::NoToken;
        for h in headers {
            match self.authenticate(Some(h)) {
                Ok(p) => return Ok(p),
                Err(Unknown::UnknownToken) => why = Unknown::UnknownToken,
                Err(Unknown::NoToken) => {}
            }
            if let Some(p) = self.basic_token(Some(h)).and_then(|t| self.principal(&t)) {
                return Ok(p);
            }
        }
        if !self.enabled() {
            return Ok(Grant::everyone());
        }
        Err(why)
    }

    /// The token of a Flight handshake's `authorization: Basic` header
    /// (base64 of `user:password`) whose password is an accepted token.
    /// The user name is not checked: the token names its holder.
    pub fn basic_token(&self, header: Option<&str>) -> Option<String> {
        let password = basic_password(header?)?;
        (self.enabled() && self.principal(&password).is_some()).then_some(password)
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

/// The status of a call without a valid token (kind `unauthorized`, as
/// REST's 401 says it).
pub fn unauthenticated() -> Status {
    sluice_base::fault::status_with(
        tonic::Code::Unauthenticated,
        "unauthorized",
        "a valid bearer token is required (authorization: Bearer TOKEN)",
    )
}

/// The status of a call its token does not allow (kind `forbidden`, as
/// REST's 403 says it).
pub fn forbidden(why: &str) -> Status {
    sluice_base::fault::status_with(tonic::Code::PermissionDenied, "forbidden", why)
}

/// The caller of a Flight request, as the interceptor left it (the open
/// server's when none did).
pub fn principal_of<T>(request: &Request<T>) -> Principal {
    request
        .extensions()
        .get::<Principal>()
        .cloned()
        .unwrap_or_else(Grant::everyone)
}

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let headers: Vec<&str> = request
            .metadata()
            .get_all(AUTHORIZATION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        match self.authenticate_any(headers) {
            Ok(p) => {
                if let Some(scope) = self.need
                    && !p.has(scope)
                {
                    let why = format!("token {:?} lacks the {} scope", p.name(), scope.name());
                    let from = request.remote_addr().map(|a| a.ip().to_string());
                    self.audit.refused(p.name(), from, "Flight call", &why);
                    return Err(forbidden(&why));
                }
                request.extensions_mut().insert(p);
                Ok(request)
            }
            Err(who) => {
                let from = request.remote_addr().map(|a| a.ip().to_string());
                self.audit
                    .refused(who.who(), from, "Flight call", "no valid bearer token");
                Err(unauthenticated())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::{TokenEntry, new_secret};

    #[test]
    fn tokens_are_checked() {
        let open = Auth::new(Vec::<String>::new(), None, Audit::default()).unwrap();
        assert!(!open.enabled());
        assert_eq!(open.authenticate(None).unwrap().name(), "anyone");
        for empty in [
            vec![String::new()],
            vec![" ".into()],
            vec!["a".into(), "".into()],
        ] {
            assert!(Auth::new(empty, None, Audit::default()).is_err());
        }
        let auth = Auth::new(
            ["s3cret".to_string(), " other ".to_string()],
            None,
            Audit::default(),
        )
        .unwrap();
        assert!(auth.enabled());
        let ok = |h: &str| auth.authenticate(Some(h)).is_ok();
        assert!(ok("Bearer s3cret") && ok("BEARER s3cret") && ok("bEaReR  s3cret"));
        assert!(ok("Bearer other"));
        for bad in ["Basic s3cret", "Bearer s3cre", "s3cret", "Bearer "] {
            assert!(!ok(bad), "{bad}");
        }
        assert_eq!(auth.authenticate(None), Err(Unknown::NoToken));
        assert_eq!(
            auth.authenticate(Some("Bearer nope")),
            Err(Unknown::UnknownToken)
        );
        assert!(
            auth.authenticate(Some("Bearer s3cret"))
                .unwrap()
                .has(Scope::Node)
        );
    }

    #[test]
    fn a_service_that_takes_only_nodes_refuses_a_user() {
        use tonic::service::Interceptor;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.yaml");
        let (user, node) = (new_secret().unwrap(), new_secret().unwrap());
        let entry = |name: &str, secret: &str, scope| TokenEntry {
            name: name.into(),
            hash: hash(secret),
            scopes: vec![scope],
            datasets: vec!["*".into()],
            checkpoints: vec![String::new()],
        };
        TokenFile {
            tokens: vec![
                entry("u", &user, Scope::Admin),
                entry("n", &node, Scope::Node),
            ],
        }
        .write(&path)
        .unwrap();
        let mut auth = Auth::new(Vec::<String>::new(), Some(&path), Audit::default())
            .unwrap()
            .requiring(Scope::Node);
        let call = |auth: &mut Auth, token: Option<&str>| {
            let mut r = Request::new(());
            if let Some(t) = token {
                r.metadata_mut()
                    .insert(AUTHORIZATION, format!("Bearer {t}").parse().unwrap());
            }
            auth.call(r).map(|_| ()).map_err(|s| s.code())
        };
        assert_eq!(call(&mut auth, Some(&node)), Ok(()));
        assert_eq!(
            call(&mut auth, Some(&user)),
            Err(tonic::Code::PermissionDenied)
        );
        assert_eq!(call(&mut auth, None), Err(tonic::Code::Unauthenticated));
    }

    #[test]
    fn a_basic_login_whose_password_is_a_token_gives_that_token() {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let auth = Auth::new(["s3cret".to_string()], None, Audit::default()).unwrap();
        let good = format!("Basic {}", b64("anyone:s3cret"));
        assert_eq!(auth.basic_token(Some(&good)).as_deref(), Some("s3cret"));
        let unpadded = format!("Basic {}", b64("anyone:s3cret").trim_end_matches('='));
        assert_eq!(auth.basic_token(Some(&unpadded)).as_deref(), Some("s3cret"));
        assert!(
            auth.authenticate(Some(&good)).is_err(),
            "REST takes bearer tokens only"
        );
        assert!(
            auth.authenticate_any([good.as_str()]).is_ok(),
            "Flight takes the login"
        );
        for bad in [
            format!("Basic {}", b64("anyone:wrong")),
            format!("Basic {}", b64("no-colon")),
            "Basic !!!".to_string(),
            "Bearer s3cret".to_string(),
        ] {
            assert_eq!(auth.basic_token(Some(&bad)), None, "{bad}");
        }
        let open = Auth::default();
        assert_eq!(open.basic_token(Some(&good)), None);
    }

    #[test]
    fn a_tokens_file_is_read_again_and_a_broken_one_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.yaml");
        let (alice, bob) = (new_secret().unwrap(), new_secret().unwrap());
        let entry = |name: &str, secret: &str, scope| TokenEntry {
            name: name.into(),
            hash: hash(secret),
            scopes: vec![scope],
            datasets: vec!["pets".into()],
            checkpoints: vec![format!("{name}/")],
        };
        let mut file = TokenFile {
            tokens: vec![entry("alice", &alice, Scope::Read)],
        };
        file.write(&path).unwrap();
        let auth = Auth::new(["root".to_string()], Some(&path), Audit::default()).unwrap();
        let bearer = |s: &str| format!("Bearer {s}");
        let a = auth.authenticate(Some(&bearer(&alice))).unwrap();
        assert_eq!(a.name(), "alice");
        assert!(a.may_read("pets") && !a.may_read("cats") && !a.has(Scope::Ingest));
        assert!(auth.authenticate(Some(&bearer(&bob))).is_err());
        file.tokens = vec![entry("bob", &bob, Scope::Ingest)];
        file.write(&path).unwrap();
        assert_eq!(auth.reload(), Ok(2), "bob and the command line's");
        assert!(
            auth.authenticate(Some(&bearer(&alice))).is_err(),
            "alice was taken out"
        );
        assert!(
            auth.authenticate(Some(&bearer(&bob)))
                .unwrap()
                .may_ingest("pets")
        );
        assert!(auth.authenticate(Some("Bearer root")).is_ok());
        std::fs::write(&path, "tokens: [").unwrap();
        assert!(auth.reload().is_err());
        assert!(
            auth.authenticate(Some(&bearer(&bob))).is_ok(),
            "a broken file keeps the tokens the server had"
        );
    }
}
