//! Per-version sample metadata: one Parquet file per dataset version.
//!
//! One row per sample. The columns are, in order: `key`; the *user* columns
//! (a `label` from an ImageFolder layout, or whatever a manifest carried);
//! the *sniffed* columns (`format`, `width`, `height`, `channels`); and the
//! *extent* columns (`chunk`, `offset`, `length`, `crc32c`) that locate the
//! object on the device. Rows are in device order, which is what makes a
//! sequential scan a sequence of large contiguous reads.
//!
//! Files are written with row groups of [`ROW_GROUP_ROWS`] rows and column
//! statistics, so that scans can be split by row group across partitions.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

use crate::error::{Result, StorageError};

/// Rows per Parquet row group.
pub const ROW_GROUP_ROWS: usize = 64 * 1024;

/// The sample key column.
pub const KEY: &str = "key";
/// The object bytes column (table only, never stored in metadata).
pub const DATA: &str = "data";
/// Sniffed: container/codec name.
pub const FORMAT: &str = "format";
/// Sniffed: width in pixels.
pub const WIDTH: &str = "width";
/// Sniffed: height in pixels.
pub const HEIGHT: &str = "height";
/// Sniffed: colour channels.
pub const CHANNELS: &str = "channels";
/// Extent: first chunk.
pub const CHUNK: &str = "chunk";
/// Extent: byte offset within the chunk.
pub const OFFSET: &str = "offset";
/// Extent: length in bytes.
pub const LENGTH: &str = "length";
/// Extent: crc32c of the bytes.
pub const CRC32C: &str = "crc32c";

/// Column names a manifest may not use (they are sluice's own).
pub const RESERVED: &[&str] = &[
    DATA, FORMAT, WIDTH, HEIGHT, CHANNELS, CHUNK, OFFSET, LENGTH, CRC32C,
];

/// The sniffed and extent columns, appended after the user columns.
pub fn system_fields() -> Vec<Field> {
    vec![
        Field::new(FORMAT, DataType::Utf8, true),
        Field::new(WIDTH, DataType::UInt32, true),
        Field::new(HEIGHT, DataType::UInt32, true),
        Field::new(CHANNELS, DataType::UInt8, true),
        Field::new(CHUNK, DataType::UInt64, false),
        Field::new(OFFSET, DataType::UInt64, false),
        Field::new(LENGTH, DataType::UInt64, false),
        Field::new(CRC32C, DataType::UInt32, false),
    ]
}

/// The metadata schema for a given set of user columns.
pub fn metadata_schema(user: &[Field]) -> SchemaRef {
    let mut fields = vec![Field::new(KEY, DataType::Utf8, false)];
    fields.extend(user.iter().cloned());
    fields.extend(system_fields());
    Arc::new(Schema::new(fields))
}

/// The table schema: metadata columns followed by `data`.
pub fn table_schema(metadata: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = metadata
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(DATA, DataType::Binary, false));
    Arc::new(Schema::new(fields))
}

/// Writes `batches` to `path` (a temporary name; the caller renames it) and fsyncs it.
pub fn write_metadata(path: &Path, schema: SchemaRef, batches: &[RecordBatch]) -> Result<()> {
    let file = File::create(path).map_err(|e| StorageError::io("create", path, e))?;
    // Keys are unique: a dictionary would only be built to be thrown away.
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_column_dictionary_enabled(ColumnPath::from(KEY), false)
        .build();
    let perr = |source| StorageError::Parquet {
        path: path.to_owned(),
        source,
    };
    let mut writer = ArrowWriter::try_new(file, schema, Some(props)).map_err(perr)?;
    for batch in batches {
        writer.write(batch).map_err(perr)?;
    }
    let file = writer.into_inner().map_err(perr)?;
    file.sync_all()
        .map_err(|e| StorageError::io("sync", path, e))
}
