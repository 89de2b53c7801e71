//! A version's metadata as its ingest goes: a row for each accepted
//! object (its key, the columns its probe found, its extent and crc32c),
//! and at the end the source's own columns taken for those rows, in one
//! batch of the version's schema.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringBuilder, UInt32Builder, UInt64Builder};
use arrow::compute::take;
use arrow::datatypes::{Field, SchemaRef};
use sluice_udfs::probe::Probe;

use super::writer::Extent;
use crate::error::Result;
use crate::metadata::{ProbedColumns, metadata_schema};

/// The rows of the objects accepted so far.
#[derive(Default)]
pub(super) struct Rows {
    keys: StringBuilder,
    probed: ProbedColumns,
    chunks: UInt64Builder,
    offsets: UInt64Builder,
    lengths: UInt64Builder,
    crcs: UInt32Builder,
    /// The source's row of each, for its own columns.
    accepted: Vec<u64>,
    /// Their bytes.
    pub(super) bytes: u64,
}

/// A version's metadata: its schema, its one batch, and the names of the
/// columns the source gave.
pub(super) struct Metadata {
    pub(super) schema: SchemaRef,
    pub(super) batch: RecordBatch,
    pub(super) columns: Vec<String>,
}

impl Rows {
    /// Adds the object of source row `row`, written at `extent`.
    pub(super) fn push(&mut self, row: u64, key: &str, probed: &Probe, extent: &Extent, crc: u32) {
        self.keys.append_value(key);
        self.probed.append(probed);
        self.chunks.append_value(extent.chunk);
        self.offsets.append_value(extent.offset);
        self.lengths.append_value(extent.length);
        self.crcs.append_value(crc);
        self.accepted.push(row);
        self.bytes += extent.length;
    }

    /// Whether no object was accepted.
    pub(super) fn is_empty(&self) -> bool {
        self.accepted.is_empty()
    }

    /// The metadata: key, the source's columns (`user_fields`, whose
    /// values for every source row are `user_columns`) for the accepted
    /// rows, the probed columns, then the system columns.
    pub(super) fn finish(
        mut self,
        user_fields: &[Field],
        user_columns: &[ArrayRef],
    ) -> Result<Metadata> {
        let schema = metadata_schema(user_fields);
        let columns = user_fields.iter().map(|f| f.name().clone()).collect();
        let indices = arrow::array::UInt64Array::from(std::mem::take(&mut self.accepted));
        let mut arrays: Vec<ArrayRef> = vec![Arc::new(self.keys.finish())];
        for col in user_columns {
            arrays.push(take(col.as_ref(), &indices, None)?);
        }
        arrays.extend(self.probed.finish());
        arrays.push(Arc::new(self.chunks.finish()));
        arrays.push(Arc::new(self.offsets.finish()));
        arrays.push(Arc::new(self.lengths.finish()));
        arrays.push(Arc::new(self.crcs.finish()));
        let batch = RecordBatch::try_new(Arc::clone(&schema), arrays)?;
        Ok(Metadata {
            schema,
            batch,
            columns,
        })
    }
}
