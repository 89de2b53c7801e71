//! [`ParquetObject`]: a Parquet object in a store as the `parquet` crate's
//! [`AsyncFileReader`]: its footer read by one ranged GET at its known
//! size, then the column chunks asked for, coalesced by `object_store`'s
//! `get_ranges`. Every request goes through the source's client, so it is
//! counted and retried as any other of the ingest (`super::connect`).

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};

/// See the module docs.
#[derive(Debug, Clone)]
pub(super) struct ParquetObject {
    store: Arc<dyn ObjectStore>,
    location: ObjectPath,
    size: u64,
}

impl ParquetObject {
    /// The object at `location` of `store`, `size` bytes long.
    pub(super) fn new(store: Arc<dyn ObjectStore>, location: ObjectPath, size: u64) -> Self {
        Self {
            store,
            location,
            size,
        }
    }
}

/// A store's error as the reader's: kept whole, so that the caller tells
/// a store's failure from a file's (`super::parquet_shards`).
fn external(e: object_store::Error) -> ParquetError {
    ParquetError::External(Box::new(e))
}

impl AsyncFileReader for ParquetObject {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, Result<Bytes>> {
        async move {
            self.store
                .get_range(&self.location, range)
                .await
                .map_err(external)
        }
        .boxed()
    }

    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, Result<Vec<Bytes>>> {
        async move {
            self.store
                .get_ranges(&self.location, &ranges)
                .await
                .map_err(external)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, Result<Arc<ParquetMetaData>>> {
        async move {
            let size = self.size;
            let metadata = ParquetMetaDataReader::new()
                .with_arrow_reader_options(options)
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}
