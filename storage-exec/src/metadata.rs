//! Per-version sample metadata: one Parquet file per dataset version.
//!
//! One row per sample. The columns are, in order: `key`; the *user* columns
//! (a `label` from an ImageFolder layout, or whatever a manifest carried);
//! the *probed* columns (`format`, `codec`, `width`, `height`, `channels`,
//! `frames`, `duration`, `dtype`, `shape`: whichever the object's header
//! gives, NULL otherwise); and the
//! *extent* columns (`chunk`, `offset`, `length`, `crc32c`) that locate the
//! object on the device. Rows are in device order, which is what makes a
//! sequential scan a sequence of large contiguous reads.
//!
//! Files are written with row groups of [`ROW_GROUP_ROWS`] rows and column
//! statistics, so that scans can be split by row group across partitions.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, Float64Builder, ListBuilder, StringBuilder, UInt8Builder, UInt32Builder,
    UInt64Builder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;
use sluice_udfs::probe::Probe;

use crate::error::{Result, StorageError};

/// Rows per Parquet row group.
pub const ROW_GROUP_ROWS: usize = 64 * 1024;

/// The sample key column.
pub const KEY: &str = "key";
/// The object bytes column (table only, never stored in metadata).
pub const DATA: &str = sluice_planner::pipeline::DATA_COLUMN;
/// Sniffed: container/codec name.
pub const FORMAT: &str = "format";
/// Sniffed: width in pixels.
pub const WIDTH: &str = "width";
/// Sniffed: height in pixels.
pub const HEIGHT: &str = "height";
/// Sniffed: colour channels.
pub const CHANNELS: &str = "channels";
/// Probed: video codec.
pub const CODEC: &str = "codec";
/// Probed: video frames.
pub const FRAMES: &str = "frames";
/// Probed: video duration in seconds.
pub const DURATION: &str = "duration";
/// Probed: array element type.
pub const DTYPE: &str = "dtype";
/// Probed: array shape.
pub const SHAPE: &str = "shape";
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
    DATA, FORMAT, CODEC, WIDTH, HEIGHT, CHANNELS, FRAMES, DURATION, DTYPE, SHAPE, CHUNK, OFFSET,
    LENGTH, CRC32C,
];

/// The probed and extent columns, appended after the user columns.
pub fn system_fields() -> Vec<Field> {
    vec![
        Field::new(FORMAT, DataType::Utf8, true),
        Field::new(CODEC, DataType::Utf8, true),
        Field::new(WIDTH, DataType::UInt32, true),
        Field::new(HEIGHT, DataType::UInt32, true),
        Field::new(CHANNELS, DataType::UInt8, true),
        Field::new(FRAMES, DataType::UInt64, true),
        Field::new(DURATION, DataType::Float64, true),
        Field::new(DTYPE, DataType::Utf8, true),
        Field::new(
            SHAPE,
            DataType::List(Arc::new(Field::new_list_field(DataType::UInt32, true))),
            true,
        ),
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

/// Builds the probed columns, one row per accepted object.
#[derive(Debug, Default)]
pub struct ProbedColumns {
    format: StringBuilder,
    codec: StringBuilder,
    width: UInt32Builder,
    height: UInt32Builder,
    channels: UInt8Builder,
    frames: UInt64Builder,
    duration: Float64Builder,
    dtype: StringBuilder,
    shape: ListBuilder<UInt32Builder>,
}

impl ProbedColumns {
    /// Appends one object's facts.
    pub fn append(&mut self, p: &Probe) {
        self.format.append_value(&p.format);
        self.codec.append_option(p.codec.as_deref());
        self.width.append_option(p.width);
        self.height.append_option(p.height);
        self.channels.append_option(p.channels);
        self.frames.append_option(p.frames);
        self.duration.append_option(p.duration);
        self.dtype.append_option(p.dtype.as_deref());
        match &p.shape {
            Some(s) => {
                self.shape.values().append_slice(s);
                self.shape.append(true);
            }
            None => self.shape.append(false),
        }
    }

    /// The columns, in [`system_fields`] order.
    pub fn finish(mut self) -> Vec<ArrayRef> {
        vec![
            Arc::new(self.format.finish()),
            Arc::new(self.codec.finish()),
            Arc::new(self.width.finish()),
            Arc::new(self.height.finish()),
            Arc::new(self.channels.finish()),
            Arc::new(self.frames.finish()),
            Arc::new(self.duration.finish()),
            Arc::new(self.dtype.finish()),
            Arc::new(self.shape.finish()),
        ]
    }
}
