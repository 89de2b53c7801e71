//! [`ObjectUrl`]: where in an object store a source lies, and
//! [`UrlAllow`]: the URL prefixes a server lets ingest read.
//!
//! A source URL names a store and a prefix in it: `s3://bucket/prefix`,
//! `gs://bucket/prefix`, `az://container/prefix` (also `abfs://`,
//! `azure://`), or `http(s)://host/path` for a read-only store that lists
//! (WebDAV). Its text never carries a secret: a URL with a user or a
//! password in it, or with a query string (a presigned URL's signature),
//! is refused, so that what the catalog, the logs and the errors show is
//! safe to show.
//!
//! An allow list is checked before any request is sent: the URL's scheme
//! and bucket must be an allowed prefix's, and its path must lie beneath
//! the prefix's path, segment by segment (`s3://b/train` admits
//! `s3://b/train/x`, never `s3://b/training`). A `..` or `.` segment is
//! refused outright: object keys are not paths, and a store may resolve
//! them as one.

use std::fmt;

use crate::error::{Result, StorageError};

/// The kind of store a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Amazon S3 or an S3-compatible store (`s3://`, `s3a://`).
    S3,
    /// Google Cloud Storage (`gs://`).
    Gcs,
    /// Azure Blob Storage (`az://`, `abfs://`, `azure://`).
    Azure,
    /// A plain HTTP(S) store that lists (`http://`, `https://`).
    Http,
}

/// A prefix (or one object) in an object store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectUrl {
    /// The scheme as written (`s3`, `gs`, `https`, ...).
    pub scheme: String,
    /// The kind of store.
    pub kind: Scheme,
    /// The bucket or container; for HTTP, the host and port.
    pub bucket: String,
    /// The key prefix, without a leading or trailing `/` (may be empty).
    pub prefix: String,
}

impl ObjectUrl {
    /// Whether `arg` is meant as a URL (it has a scheme sluice reads);
    /// anything else is a local path.
    pub fn is_url(arg: &str) -> bool {
        arg.split_once("://")
            .is_some_and(|(scheme, _)| scheme_kind(scheme).is_some())
    }

    /// Parses a source URL; the error says what is wrong with it.
    pub fn parse(arg: &str) -> Result<Self> {
        let bad = |reason: &str| StorageError::BadSource {
            path: shown(arg).into(),
            reason: reason.to_owned(),
        };
        let (scheme, rest) = arg
            .split_once("://")
            .ok_or_else(|| bad("not a URL (expected s3://, gs://, az:// or http(s)://)"))?;
        let scheme = scheme.to_ascii_lowercase();
        let kind = scheme_kind(&scheme).ok_or_else(|| {
            bad("unknown scheme (expected s3://, gs://, az://, abfs:// or http(s)://)")
        })?;
        if rest.contains(['?', '#']) {
            return Err(bad(
                "a source URL carries no query or fragment (a presigned URL's signature \
                 would be stored and shown); give credentials through the environment",
            ));
        }
        let (bucket, path) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.contains('@') {
            return Err(bad(
                "a source URL carries no user or password; give credentials through \
                 the environment",
            ));
        }
        if bucket.is_empty() {
            return Err(bad("the URL names no bucket"));
        }
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        if segments.iter().any(|s| *s == "." || *s == "..") {
            return Err(bad("a '.' or '..' segment (object keys are not paths)"));
        }
        Ok(Self {
            scheme,
            kind,
            bucket: bucket.to_owned(),
            prefix: segments.join("/"),
        })
    }

    /// The URL of the store's root (`s3://bucket`), what `object_store`
    /// and DataFusion register a store under.
    pub fn root(&self) -> String {
        format!("{}://{}", self.scheme, self.bucket)
    }

    /// The URL of `key` in this store.
    pub fn of_key(&self, key: &str) -> String {
        format!("{}/{key}", self.root())
    }

    /// This URL with `rel` (a relative key, `/`-separated) below it.
    pub fn join(&self, rel: &str) -> Result<Self> {
        Self::parse(&format!("{self}/{rel}"))
    }

    /// Whether `other` is this prefix or lies beneath it.
    pub fn contains(&self, other: &ObjectUrl) -> bool {
        self.kind == other.kind
            && self.bucket == other.bucket
            && (self.prefix.is_empty()
                || other.prefix == self.prefix
                || other
                    .prefix
                    .strip_prefix(&self.prefix)
                    .is_some_and(|rest| rest.starts_with('/')))
    }
}

impl fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "{}", self.root())
        } else {
            write!(f, "{}/{}", self.root(), self.prefix)
        }
    }
}

fn scheme_kind(scheme: &str) -> Option<Scheme> {
    match scheme.to_ascii_lowercase().as_str() {
        "s3" | "s3a" => Some(Scheme::S3),
        "gs" => Some(Scheme::Gcs),
        "az" | "abfs" | "abfss" | "azure" => Some(Scheme::Azure),
        "http" | "https" => Some(Scheme::Http),
        _ => None,
    }
}

/// `arg` as it may be shown: cut at its query (a signature) and without
/// a user or password.
fn shown(arg: &str) -> String {
    let cut = arg.split(['?', '#']).next().unwrap_or(arg);
    match cut.split_once("://") {
        Some((scheme, rest)) => {
            let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
            let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
            format!("{scheme}://{host}/{path}")
        }
        None => cut.to_owned(),
    }
}

/// The URL prefixes ingest may read (`--ingest-url-allow`).
#[derive(Debug, Clone, Default)]
pub struct UrlAllow {
    prefixes: Vec<ObjectUrl>,
}

impl UrlAllow {
    /// The allow list of `prefixes` (each a source URL).
    pub fn new(prefixes: &[String]) -> Result<Self> {
        Ok(Self {
            prefixes: prefixes
                .iter()
                .map(|p| ObjectUrl::parse(p))
                .collect::<Result<_>>()?,
        })
    }

    /// Whether nothing is allowed (ingest from object stores is off).
    pub fn is_empty(&self) -> bool {
        self.prefixes.is_empty()
    }

    /// `url` parsed, when it lies beneath an allowed prefix; refused
    /// otherwise, naming the prefixes, before any request is sent.
    pub fn admit(&self, url: &str) -> Result<ObjectUrl> {
        let parsed = ObjectUrl::parse(url)?;
        if self.prefixes.iter().any(|p| p.contains(&parsed)) {
            return Ok(parsed);
        }
        Err(StorageError::OutsideRoots {
            path: parsed.to_string().into(),
            roots: if self.prefixes.is_empty() {
                "none: start the server with --ingest-url-allow URL".into()
            } else {
                self.prefixes
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_store_and_prefix() {
        let u = ObjectUrl::parse("s3://bucket/train/images/").unwrap();
        assert_eq!((u.kind, u.bucket.as_str()), (Scheme::S3, "bucket"));
        assert_eq!(u.prefix, "train/images");
        assert_eq!(u.to_string(), "s3://bucket/train/images");
        assert_eq!(
            u.of_key("train/images/a.jpg"),
            "s3://bucket/train/images/a.jpg"
        );
        assert_eq!(ObjectUrl::parse("gs://b").unwrap().prefix, "");
        assert!(ObjectUrl::is_url("az://c/p") && ObjectUrl::is_url("https://h/p"));
        assert!(!ObjectUrl::is_url("/data/pets") && !ObjectUrl::is_url("ftp://h/p"));
    }

    #[test]
    fn secrets_and_dot_segments_are_refused_and_never_echoed() {
        for (url, why) in [
            ("https://h/p?X-Amz-Signature=abc", "query"),
            ("s3://key:secret@bucket/p", "no user or password"),
            ("s3://bucket/a/../b", "'..'"),
            ("s3:///p", "no bucket"),
            ("ftp://h/p", "unknown scheme"),
        ] {
            let e = ObjectUrl::parse(url).unwrap_err().to_string();
            assert!(e.contains(why), "{url}: {e}");
            assert!(!e.contains("abc") && !e.contains("secret"), "{e}");
        }
    }

    #[test]
    fn the_allow_list_admits_beneath_a_prefix_segment_by_segment() {
        let allow = UrlAllow::new(&["s3://data/train".into(), "gs://open".into()]).unwrap();
        assert!(allow.admit("s3://data/train").is_ok());
        assert!(allow.admit("s3://data/train/cats/a.jpg").is_ok());
        assert!(allow.admit("gs://open/anything").is_ok());
        for refused in [
            "s3://data/training",
            "s3://data",
            "s3://other/train",
            "gs://opened",
        ] {
            let e = allow.admit(refused).unwrap_err();
            assert!(matches!(e, StorageError::OutsideRoots { .. }), "{refused}");
            assert!(e.to_string().contains("s3://data/train"), "{e}");
        }
        let off = UrlAllow::default().admit("s3://data/train").unwrap_err();
        assert!(off.to_string().contains("--ingest-url-allow"), "{off}");
    }
}
