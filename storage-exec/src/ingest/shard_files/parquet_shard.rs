//! Parquet files with the image bytes inside: the Hugging Face Hub's
//! layout, an `image` column of struct `{bytes, path}` beside label and
//! text columns, in shards of a few hundred MB.
//!
//! A Parquet file is a shard when it has no top-level `path` column (one
//! that has is a manifest of files, `super::super::source`) and has an
//! **object column**: the first of [`OBJECT_COLUMNS`] that is binary, or
//! a struct with a binary `bytes` field. Of each row:
//!
//! - the object is that column's value. It is not read at enumeration
//!   (the column is left out of the projection); the sample records its
//!   row group and row ([`Origin::Cell`]), and the loader decodes the
//!   object column of that row group once, for every row of it
//!   ([`RowGroups`], which keeps the last two: memory is bounded by two
//!   row groups' objects, never by the file);
//! - the key is the struct's `path` when it has one, else `shard/row`;
//! - every other column is a metadata value ([`super::columns`]), a
//!   struct's fields flattened (`image_path`).
//!
//! The same files in an object store are read by `crate::ingest::objects`
//! with these helpers, through the `parquet` crate's async reader.
//!
//! Compression is whatever the build's `parquet` reads (Snappy and Zstd,
//! the Hub's two, both tried); a file in another codec is refused, named,
//! by the reader's own error.

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Schema};
use arrow::util::display::array_value_to_string;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderBuilder, ParquetRecordBatchReaderBuilder};
use parquet::schema::types::SchemaDescriptor;

use super::Sample;
use super::columns::{SourceOf, Value, column_name};
use crate::ingest::confine::Confinement;
use crate::ingest::entries::Origin;

/// Columns that hold the object, in the order they are looked for.
pub const OBJECT_COLUMNS: &[&str] = &[
    "image", "img", "jpg", "jpeg", "png", "webp", "data", "bytes",
];

/// Where a file's objects are: the top-level column, and whether it is a
/// struct (with `bytes`, and maybe `path`) or the bytes themselves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ObjectColumn {
    name: String,
    is_struct: bool,
}

/// The object column of `schema`, if it has one.
pub(crate) fn object_column(schema: &Schema) -> Option<ObjectColumn> {
    let binary = |t: &DataType| {
        matches!(
            t,
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView
        )
    };
    OBJECT_COLUMNS.iter().find_map(|n| {
        let f = schema.field_with_name(n).ok()?;
        match f.data_type() {
            t if binary(t) => Some(ObjectColumn {
                name: f.name().clone(),
                is_struct: false,
            }),
            DataType::Struct(fields)
                if fields
                    .iter()
                    .any(|c| c.name() == "bytes" && binary(c.data_type())) =>
            {
                Some(ObjectColumn {
                    name: f.name().clone(),
                    is_struct: true,
                })
            }
            _ => None,
        }
    })
}

/// Whether a Parquet file is a shard of objects (not a manifest).
pub fn is_object_file(path: &Path) -> bool {
    File::open(path)
        .ok()
        .and_then(|f| ParquetRecordBatchReaderBuilder::try_new(f).ok())
        .is_some_and(|b| {
            b.schema().field_with_name("path").is_err() && object_column(b.schema()).is_some()
        })
}

/// The leaves of the object's bytes (`object.bytes`, or `object`).
pub(crate) fn bytes_leaves(parquet: &SchemaDescriptor, object: &ObjectColumn) -> Vec<usize> {
    let want = if object.is_struct {
        format!("{}.bytes", object.name)
    } else {
        object.name.clone()
    };
    (0..parquet.num_columns())
        .filter(|&i| parquet.column(i).path().string() == want)
        .collect()
}

/// What enumerating a file reads (sync or async, `builder`): its object
/// column, a projection of every column but the objects' bytes, and each
/// row group's rows; or why the file holds no objects.
pub(crate) fn listing<T>(
    builder: &ArrowReaderBuilder<T>,
) -> Result<(ObjectColumn, ProjectionMask, Vec<u64>), String> {
    let Some(object) = object_column(builder.schema()) else {
        return Err(format!(
            "no object column (looked for {} as binary, or a struct with binary `bytes`)",
            OBJECT_COLUMNS.join(", ")
        ));
    };
    let skip = bytes_leaves(builder.parquet_schema(), &object);
    let keep: Vec<usize> = (0..builder.parquet_schema().num_columns())
        .filter(|i| !skip.contains(i))
        .collect();
    let rows_per_group = builder
        .metadata()
        .row_groups()
        .iter()
        .map(|g| g.num_rows() as u64)
        .collect();
    let mask = ProjectionMask::leaves(builder.parquet_schema(), keep);
    Ok((object, mask, rows_per_group))
}

/// Appends the samples of the Parquet `file` to `out`.
pub(crate) fn samples(path: &Path, shard: &str, file: File, out: &mut Vec<Sample>) {
    let broken = |reason: String| {
        Sample::refused(
            format!("{shard}@0"),
            reason,
            SourceOf {
                shard: shard.to_owned(),
                index: 0,
                offset: 0,
            },
        )
    };
    let builder = match ParquetRecordBatchReaderBuilder::try_new(file) {
        Ok(b) => b,
        Err(e) => return out.push(broken(format!("not a Parquet file sluice can read: {e}"))),
    };
    let (object, mask, rows_per_group) = match listing(&builder) {
        Ok(plan) => plan,
        Err(why) => return out.push(broken(why)),
    };
    let reader = match builder.with_projection(mask).build() {
        Ok(r) => r,
        Err(e) => return out.push(broken(format!("cannot read the file: {e}"))),
    };
    let mut place = Place::new(rows_per_group);
    for batch in reader {
        let batch = match batch {
            Ok(b) => b,
            Err(e) => {
                let at = place.row;
                return out.push(broken(format!(
                    "cannot read rows from {at} on: {e}; the rest of the file is not read"
                )));
            }
        };
        rows(path, shard, &object, &batch, &mut place, out);
    }
}

/// Which row group and row the next row is.
pub(crate) struct Place {
    rows_per_group: Vec<u64>,
    group: usize,
    in_group: u64,
    row: u64,
}

impl Place {
    pub(crate) fn new(rows_per_group: Vec<u64>) -> Self {
        Self {
            rows_per_group,
            group: 0,
            in_group: 0,
            row: 0,
        }
    }

    /// The current row's (row group, row in it), then steps on.
    fn next(&mut self) -> (usize, u64) {
        while self.group < self.rows_per_group.len()
            && self.in_group >= self.rows_per_group[self.group]
        {
            self.group += 1;
            self.in_group = 0;
        }
        let here = (self.group, self.in_group);
        self.in_group += 1;
        self.row += 1;
        here
    }
}

/// The samples of one batch of rows (the object column without its bytes).
pub(crate) fn rows(
    path: &Path,
    shard: &str,
    object: &ObjectColumn,
    batch: &RecordBatch,
    place: &mut Place,
    out: &mut Vec<Sample>,
) {
    // Every column but the object's bytes, a struct flattened.
    let mut columns: Vec<(String, ArrayRef)> = Vec::new();
    let mut key_column = None;
    for (field, array) in batch.schema().fields().iter().zip(batch.columns()) {
        match array.as_struct_opt() {
            Some(s) => {
                for (child, values) in s.fields().iter().zip(s.columns()) {
                    let name = format!("{}_{}", field.name(), child.name());
                    if field.name() == &object.name && child.name() == "path" {
                        key_column = Some(Arc::clone(values));
                    }
                    columns.push((column_name(&name), Arc::clone(values)));
                }
            }
            None => columns.push((column_name(field.name()), Arc::clone(array))),
        }
    }
    for i in 0..batch.num_rows() {
        let (row_group, row) = place.next();
        let index = place.row - 1;
        let key = key_column
            .as_ref()
            .filter(|k| k.is_valid(i))
            .and_then(|k| array_value_to_string(k, i).ok())
            .filter(|k| !k.is_empty())
            .unwrap_or_else(|| format!("{shard}/{index}"));
        let values = columns
            .iter()
            .filter(|(_, a)| a.is_valid(i))
            .filter_map(|(name, a)| value(a, i).map(|v| (name.clone(), v)))
            .collect();
        out.push(Sample {
            key,
            origin: Origin::Cell {
                path: path.to_owned(),
                row_group,
                row,
            },
            values,
            source: SourceOf {
                shard: shard.to_owned(),
                index,
                offset: row_group as u64,
            },
        });
    }
}

/// Row `i` of `a` as a metadata value.
fn value(a: &ArrayRef, i: usize) -> Option<Value> {
    use arrow::datatypes::*;
    let v = match a.data_type() {
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
            let c = arrow::compute::cast(&a.slice(i, 1), &DataType::Int64).ok()?;
            Value::Int(c.as_primitive::<Int64Type>().value(0))
        }
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 => {
            let c = arrow::compute::cast(&a.slice(i, 1), &DataType::Int64).ok()?;
            Value::Int(c.as_primitive::<Int64Type>().value(0))
        }
        DataType::Float16 | DataType::Float32 | DataType::Float64 => {
            let c = arrow::compute::cast(&a.slice(i, 1), &DataType::Float64).ok()?;
            Value::Float(c.as_primitive::<Float64Type>().value(0))
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            Value::Text(array_value_to_string(a, i).ok()?)
        }
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => return None,
        _ => Value::Json(array_value_to_string(a, i).ok()?),
    };
    Some(v)
}

/// The object columns of the row groups loaded last (see the module
/// docs): each decoded once for all of its rows.
#[derive(Debug, Default)]
pub(crate) struct RowGroups {
    kept: Mutex<VecDeque<((PathBuf, usize), ArrayRef)>>,
}

impl RowGroups {
    /// Row groups kept.
    const KEEP: usize = 2;

    /// The object of `row` of row group `group` of `path`.
    pub(crate) fn object(
        &self,
        path: &Path,
        group: usize,
        row: u64,
        confine: Option<&Confinement>,
    ) -> Result<Vec<u8>, String> {
        let column = self.column(path, group, confine)?;
        row_object(&column, group, row)
    }

    fn column(
        &self,
        path: &Path,
        group: usize,
        confine: Option<&Confinement>,
    ) -> Result<ArrayRef, String> {
        let key = (path.to_owned(), group);
        let lock = || self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, c)) = lock().iter().find(|(k, _)| *k == key) {
            return Ok(Arc::clone(c));
        }
        let column = read_group(path, group, confine)?;
        let mut kept = lock();
        kept.push_back((key, Arc::clone(&column)));
        while kept.len() > Self::KEEP {
            kept.pop_front();
        }
        Ok(column)
    }
}

/// The object column (its bytes) of row group `group` of `path`.
fn read_group(
    path: &Path,
    group: usize,
    confine: Option<&Confinement>,
) -> Result<ArrayRef, String> {
    let file = match confine {
        Some(c) => c.open(path)?,
        None => File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?,
    };
    let fail = |e: &dyn std::fmt::Display| format!("{}: row group {group}: {e}", path.display());
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| fail(&e))?;
    let object = object_column(builder.schema()).ok_or_else(|| fail(&"no object column"))?;
    let mask = ProjectionMask::leaves(
        builder.parquet_schema(),
        bytes_leaves(builder.parquet_schema(), &object),
    );
    let reader = builder
        .with_row_groups(vec![group])
        .with_projection(mask)
        .with_batch_size(1 << 16)
        .build()
        .map_err(|e| fail(&e))?;
    let mut batches = Vec::new();
    for batch in reader {
        batches.push(batch.map_err(|e| fail(&e))?);
    }
    object_bytes(&batches).map_err(|e| fail(&e))
}

/// The objects' bytes of a row group's `batches` (read with the
/// [`bytes_leaves`] projection), as one binary column.
pub(crate) fn object_bytes(batches: &[RecordBatch]) -> Result<ArrayRef, String> {
    let mut parts = Vec::with_capacity(batches.len());
    for batch in batches {
        let c = Arc::clone(batch.column(0));
        parts.push(match c.as_struct_opt() {
            Some(s) => Arc::clone(s.column_by_name("bytes").ok_or("no bytes field")?),
            None => c,
        });
    }
    let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
    match refs.len() {
        0 => Err("the row group has no rows".into()),
        1 => Ok(Arc::clone(&parts[0])),
        _ => arrow::compute::concat(&refs).map_err(|e| e.to_string()),
    }
}

/// The object of `row` of row group `group`'s bytes `column`
/// ([`object_bytes`]).
pub(crate) fn row_object(column: &ArrayRef, group: usize, row: u64) -> Result<Vec<u8>, String> {
    let row = row as usize;
    if row >= column.len() || column.is_null(row) {
        return Err(format!("row {row} of row group {group} has no object"));
    }
    let bytes = match column.data_type() {
        DataType::Binary => column.as_binary::<i32>().value(row),
        DataType::LargeBinary => column.as_binary::<i64>().value(row),
        DataType::BinaryView => column.as_binary_view().value(row),
        t => return Err(format!("the object column is {t}, not binary")),
    };
    Ok(bytes.to_vec())
}
