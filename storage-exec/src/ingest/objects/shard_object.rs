//! [`ShardObject`]: one shard file of a listing in a store, as the
//! listing found it and the shard readers (`super::shards`,
//! `super::parquet_shards`) take it.

use std::sync::Arc;

use object_store::path::Path as ObjectPath;

use crate::ingest::shard_files::ShardKind;

/// One shard file of a listing: its name under the prefix, where it is,
/// its size, version stamp (`super::stamp`) and kind.
pub(super) struct ShardObject {
    pub name: String,
    pub location: ObjectPath,
    pub size: u64,
    pub stamp: Option<Arc<str>>,
    pub kind: ShardKind,
}
