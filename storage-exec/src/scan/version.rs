//! [`DatasetVersion`]: one dataset version opened for reading: its
//! catalog record, its schemas and its metadata file's Parquet footer,
//! shared by the table, the scan and a job's takes.

use std::fs::File;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};

use crate::catalog::VersionRecord;
use crate::error::{Result, StorageError};
use crate::metadata::{CHUNK, CRC32C, KEY, LENGTH, OFFSET, table_schema};
use crate::store::Store;

/// An open dataset version: its record, schemas and Parquet footer.
#[derive(Debug)]
pub struct DatasetVersion {
    /// The store holding it.
    pub store: Arc<Store>,
    /// The catalog record.
    pub record: VersionRecord,
    /// Schema of the metadata file.
    pub metadata_schema: SchemaRef,
    /// Schema of the table (metadata + `data`).
    pub table_schema: SchemaRef,
    /// The metadata file's footer, read once.
    pub parquet: ArrowReaderMetadata,
    /// The metadata file.
    pub metadata_path: std::path::PathBuf,
}

impl DatasetVersion {
    /// Opens `dataset` at `version` (latest when `None`).
    pub fn open(store: Arc<Store>, dataset: &str, version: Option<u64>) -> Result<Arc<Self>> {
        let record = store.catalog().version(dataset, version)?;
        let path = store.metadata_path(&record.metadata_file);
        let file = File::open(&path).map_err(|e| StorageError::io("open metadata", &path, e))?;
        let parquet =
            ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).map_err(|source| {
                StorageError::Parquet {
                    path: path.clone(),
                    source,
                }
            })?;
        let metadata_schema = Arc::clone(parquet.schema());
        let table_schema = table_schema(&metadata_schema);
        Ok(Arc::new(Self {
            store,
            record,
            metadata_schema,
            table_schema,
            parquet,
            metadata_path: path,
        }))
    }

    /// Index of `data` in the table schema (always last).
    pub fn data_index(&self) -> usize {
        self.table_schema.fields().len() - 1
    }

    /// Metadata columns a scan that projects `data` must also read.
    pub fn extent_columns(&self) -> Vec<usize> {
        [KEY, CHUNK, OFFSET, LENGTH, CRC32C]
            .iter()
            .filter_map(|n| self.metadata_schema.index_of(n).ok())
            .collect()
    }
}
