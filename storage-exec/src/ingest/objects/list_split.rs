//! Listing a large prefix in parallel: [`list_under`].
//!
//! A store lists a page of keys a request (1,000 on S3 and GCS), one
//! request after the other, so a prefix of millions of keys takes minutes
//! to list that way. Where the keys under a prefix sit in "directories"
//! (ImageFolder's classes, a layout's `000/`, `001/` …), each directory
//! can be listed on its own, several at once, as rclone and s5cmd do.
//!
//! [`list_under`] reads the plain listing up to [`FIRST_PAGE`] keys. When
//! it ends there, that is the listing. When every key so far lies in a
//! directory below the prefix, the prefix is split: one listing with a
//! delimiter names its directories and the objects beside them, then each
//! directory is listed whole, [`LISTS_AT_ONCE`] at a time (a prefix of one
//! directory is split at that directory instead). Otherwise (a flat
//! prefix) the plain listing goes on from where it is. Either way every
//! object under the prefix is listed once; the order is the store's within
//! a directory only (the caller sorts). The delimiter listing is held
//! whole by `object_store`: the directories and the objects beside them,
//! which a prefix whose first page lies in directories has few of.

use std::sync::Arc;

use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStore};

/// Keys read from the plain listing before deciding to split: S3's page.
pub(super) const FIRST_PAGE: usize = 1000;
/// Directories listed at once.
pub(super) const LISTS_AT_ONCE: usize = 8;

type Listing = BoxStream<'static, object_store::Result<ObjectMeta>>;

/// Every object under `prefix` (see the module docs).
pub(super) fn list_under(store: Arc<dyn ObjectStore>, prefix: ObjectPath) -> Listing {
    stream::once(decide(store, prefix)).flatten().boxed()
}

/// The listing of `prefix`: the plain one, or split by directory.
async fn decide(store: Arc<dyn ObjectStore>, prefix: ObjectPath) -> Listing {
    let mut plain = store.list(Some(&prefix));
    let mut first = Vec::with_capacity(FIRST_PAGE);
    while first.len() < FIRST_PAGE {
        match plain.next().await {
            Some(Ok(meta)) => first.push(meta),
            Some(Err(e)) => return stream::iter([Err(e)]).boxed(),
            // The whole listing.
            None => return stream::iter(first.into_iter().map(Ok)).boxed(),
        }
    }
    let depth = prefix.parts().count();
    let in_directories = first.iter().all(|m| m.location.parts().count() > depth + 1);
    if !in_directories {
        return stream::iter(first.into_iter().map(Ok)).chain(plain).boxed();
    }
    drop(plain);
    let top = match store.list_with_delimiter(Some(&prefix)).await {
        Ok(top) => top,
        Err(e) => return stream::iter([Err(e)]).boxed(),
    };
    let beside = stream::iter(top.objects.into_iter().map(Ok));
    match <[ObjectPath; 1]>::try_from(top.common_prefixes) {
        Ok([one]) => beside.chain(list_under(store, one)).boxed(),
        Err(dirs) => {
            tracing::info!("listing {prefix} by its {} directories", dirs.len());
            let below = stream::iter(dirs)
                .map(move |dir| store.list(Some(&dir)))
                .flatten_unordered(LISTS_AT_ONCE);
            beside.chain(below).boxed()
        }
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, PutPayload};

    use super::*;

    async fn keys(store: &Arc<dyn ObjectStore>, prefix: &str) -> Vec<String> {
        let mut got: Vec<String> = list_under(Arc::clone(store), ObjectPath::from(prefix))
            .map(|m| m.unwrap().location.to_string())
            .collect()
            .await;
        got.sort();
        got
    }

    /// Every object is listed once, whether the prefix is small, flat,
    /// in directories (with objects beside them), or one directory deep.
    #[tokio::test]
    async fn every_object_is_listed_once_however_the_prefix_is_laid_out() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut want = std::collections::BTreeMap::<&str, Vec<String>>::new();
        let mut put = |prefix: &'static str, key: String| {
            want.entry(prefix).or_default().push(key);
        };
        for i in 0..3 {
            put("small", format!("small/{i}.jpg"));
        }
        for i in 0..2500 {
            put("flat", format!("flat/{i:05}.npy"));
        }
        for i in 0..2500 {
            put("dirs", format!("dirs/{:02}/{i:05}.npy", i / 100));
        }
        put("dirs", "dirs/zz-beside.txt".into());
        for i in 0..1500 {
            put("deep", format!("deep/only/{:02}/{i:05}.npy", i / 300));
        }
        for (_, list) in want.iter_mut() {
            list.sort();
            for key in list.iter() {
                store
                    .put(
                        &ObjectPath::from(key.as_str()),
                        PutPayload::from_static(b"x"),
                    )
                    .await
                    .unwrap();
            }
        }
        for (prefix, list) in &want {
            assert_eq!(&keys(&store, prefix).await, list, "{prefix}");
        }
    }
}
