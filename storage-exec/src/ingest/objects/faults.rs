//! A store's errors: what they say, with the store's own code
//! ([`store_error`]), and whose fault they are ([`objects_fault`]: the
//! object's, which is that sample's, or the store's, which fails the
//! ingest after [`BODY_TRIES`] tries of the whole read).

use futures::StreamExt;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;

/// Attempts at one object (or one shard's read), whole.
pub const BODY_TRIES: u32 = 3;

/// What an `object_store` error says, with the store's own code when its
/// answer had one (`NoSuchBucket`, `AccessDenied`, `ExpiredToken`,
/// `SlowDown`).
pub(super) fn store_error(e: &object_store::Error) -> String {
    let text = e.to_string();
    let tag = |name: &str| {
        let open = format!("<{name}>");
        let close = format!("</{name}>");
        let start = text.find(&open)? + open.len();
        let end = text[start..].find(&close)? + start;
        Some(text[start..end].to_owned())
    };
    match (tag("Code"), tag("Message")) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code,
        // No XML body: the error as `object_store` words it (the method,
        // the URL, the status; never a credential).
        _ => text,
    }
}

/// What a failed HEAD of `location` says. A HEAD's answer has no body,
/// so where it named no code of the store's (a missing bucket is a bare
/// 404, or 400 on some stores) the key is listed once as a prefix, whose
/// answer does name it (`NoSuchBucket`); otherwise the HEAD's own words.
pub(super) async fn head_error(
    store: &dyn ObjectStore,
    location: &ObjectPath,
    e: &object_store::Error,
) -> String {
    let said = store_error(e);
    if said != e.to_string() {
        return said;
    }
    match store.list(Some(location)).next().await {
        Some(Err(listed)) if store_error(&listed) != listed.to_string() => store_error(&listed),
        _ => said,
    }
}

/// Whether `e` is the object's own fault, not the store's.
pub(super) fn objects_fault(e: &object_store::Error) -> bool {
    match e {
        object_store::Error::NotFound { .. } => !store_error(e).contains("NoSuchBucket"),
        object_store::Error::PermissionDenied { .. } => true,
        _ => false,
    }
}
