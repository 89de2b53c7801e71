//! [`Gathered`]: a batch of rows picked from other batches, encoded as an
//! IPC message without being made first.
//!
//! A job's rows come back from storage in whatever order its partitions
//! produce them and leave for the trainer in the epoch's order. Making that
//! batch (arrow's `interleave`) copies every value once, and writing it
//! into a shared-memory slot or a socket copies it again. A [`Gathered`]
//! batch is only the list of rows — (source batch, row) — and
//! [`Gathered::encode`] lays out the record-batch message those rows would
//! make, with body pieces that borrow the source batches' buffers: a run
//! of rows that lie next to each other in one source is one piece. Each
//! value is then copied once, by whoever consumes the body — into the
//! slot, or by the kernel into the socket. What the format makes anew is
//! small: offsets rebased for the gathered rows, validity and boolean
//! bitmaps, padding, and values under [`SHARE_MIN`] bytes (copied next to
//! their neighbours rather than sent as pieces of their own).
//!
//! Types [`crate::slices`] cannot lay out are interleaved and encoded the
//! usual way, with the same bytes on the wire.
//!
//! A column may be *finished* ([`Gathered::finished`]): computed from the
//! sources' column of the same place by a [`Finish`] as the body is
//! written (a computed piece), so the stage that makes it writes its
//! values once, where they are read.

use std::sync::Arc;

use arrow::array::{Array, ArrayData, ArrayRef, FixedSizeListArray, RecordBatch, make_array};
use arrow::buffer::{BooleanBuffer, Buffer, MutableBuffer, NullBuffer};
use arrow::compute::interleave;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::error::ArrowError;
use arrow::ipc;
use bytes::Bytes;

use crate::body::{Body, bitmap, node_and_validity, nulls_in, runs, write};
use crate::finish::{Finish, Finished, Run, fixed_row_bytes, write_runs};
use crate::slices::{SlicedMessage, encode_copied, header, supported};

/// Values shorter than this are copied into the body rather than shared.
pub const SHARE_MIN: usize = 4096;

/// The record-batch message of `batch`, its body the batch's own buffers
/// (see [`crate::slices`]): the batch's rows in order, one run.
pub fn encode_batch(batch: &RecordBatch) -> Result<SlicedMessage, arrow::error::ArrowError> {
    let fields = batch.schema_ref().fields();
    if !fields.iter().all(|f| supported(f.data_type())) {
        return encode_copied(batch);
    }
    // The batch's rows, in order: one run, every buffer shared.
    Gathered::whole(batch).encode_sharing(0)
}

/// Each column's finish, if it has one (see [`Gathered::finished`]).
pub type Finishes = Arc<[Option<Arc<dyn Finish>>]>;

/// Rows of `sources`, in order: see the module docs.
#[derive(Debug, Clone)]
pub struct Gathered {
    schema: SchemaRef,
    finishes: Option<Finishes>,
    sources: Arc<Vec<RecordBatch>>,
    rows: Arc<[(usize, usize)]>,
    start: usize,
    len: usize,
}

impl Gathered {
    /// The rows `rows` ((source, row) pairs) of `sources`, whose columns
    /// are `schema`'s.
    pub fn new(
        schema: SchemaRef,
        sources: Vec<RecordBatch>,
        rows: Vec<(usize, usize)>,
    ) -> Result<Self, ArrowError> {
        Self::finished(schema, None, sources, rows)
    }

    /// [`Gathered::new`], where column `c` of `schema` is computed by
    /// `finishes[c]` (when it has one) from the sources' column `c`, as
    /// the body is written.
    pub fn finished(
        schema: SchemaRef,
        finishes: Option<Finishes>,
        sources: Vec<RecordBatch>,
        rows: Vec<(usize, usize)>,
    ) -> Result<Self, ArrowError> {
        if let Some(f) = &finishes {
            check_finishes(&schema, f)?;
        }
        for s in &sources {
            let fields = s.schema_ref().fields();
            let same = fields.len() == schema.fields().len()
                && fields
                    .iter()
                    .zip(schema.fields())
                    .enumerate()
                    .all(|(c, (a, b))| finish_of(finishes.as_ref(), c).is_some() || a == b);
            if !same {
                return Err(ArrowError::SchemaError(
                    "a gathered batch's sources must have its columns".into(),
                ));
            }
        }
        if let Some(&(b, r)) = rows
            .iter()
            .find(|&&(b, r)| sources.get(b).is_none_or(|s| r >= s.num_rows()))
        {
            return Err(ArrowError::InvalidArgumentError(format!(
                "row {r} of source {b} is not among {} sources",
                sources.len()
            )));
        }
        let len = rows.len();
        Ok(Self {
            schema,
            finishes,
            sources: Arc::new(sources),
            rows: rows.into(),
            start: 0,
            len,
        })
    }

    /// All rows of `batch`, in order.
    pub fn whole(batch: &RecordBatch) -> Self {
        let rows: Vec<(usize, usize)> = (0..batch.num_rows()).map(|r| (0, r)).collect();
        Self {
            schema: batch.schema(),
            finishes: None,
            sources: Arc::new(vec![batch.clone()]),
            len: rows.len(),
            rows: rows.into(),
            start: 0,
        }
    }

    /// An empty batch of `schema`.
    pub fn empty(schema: SchemaRef) -> Self {
        Self {
            schema,
            finishes: None,
            sources: Arc::new(Vec::new()),
            rows: Arc::new([]),
            start: 0,
            len: 0,
        }
    }

    /// Rows.
    pub fn num_rows(&self) -> usize {
        self.len
    }

    /// Columns.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// `len` rows from `start` (sharing everything).
    pub fn slice(&self, start: usize, len: usize) -> Self {
        assert!(start + len <= self.len, "a slice past the gathered rows");
        Self {
            start: self.start + start,
            len,
            ..self.clone()
        }
    }

    fn rows(&self) -> &[(usize, usize)] {
        &self.rows[self.start..self.start + self.len]
    }

    /// The batch itself (each value copied once).
    pub fn to_batch(&self) -> Result<RecordBatch, ArrowError> {
        if self.len == 0 {
            return Ok(RecordBatch::new_empty(Arc::clone(&self.schema)));
        }
        let runs = runs(self.rows());
        let mut columns = Vec::with_capacity(self.schema.fields().len());
        for (c, field) in self.schema.fields().iter().enumerate() {
            let sources: Vec<ArrayRef> = self
                .sources
                .iter()
                .map(|s| Arc::clone(s.column(c)))
                .collect();
            columns.push(match finish_of(self.finishes.as_ref(), c) {
                None => {
                    let arrays: Vec<&dyn Array> = sources.iter().map(|a| a.as_ref()).collect();
                    interleave(&arrays, self.rows())?
                }
                Some(f) => {
                    finished_column(field.data_type(), f.as_ref(), &sources, &runs, self.len)?
                }
            });
        }
        RecordBatch::try_new(Arc::clone(&self.schema), columns)
    }

    /// The record-batch message of these rows; see the module docs.
    pub fn encode(&self) -> Result<SlicedMessage, ArrowError> {
        self.encode_sharing(SHARE_MIN)
    }

    /// [`Gathered::encode`], sharing values of `share_min` bytes or more.
    pub(crate) fn encode_sharing(&self, share_min: usize) -> Result<SlicedMessage, ArrowError> {
        if !self.schema.fields().iter().enumerate().all(|(c, f)| {
            finish_of(self.finishes.as_ref(), c).is_some() || supported(f.data_type())
        }) {
            return encode_copied(&self.to_batch()?);
        }
        let runs = runs(self.rows());
        let mut body = Body {
            share_min,
            ..Body::default()
        };
        for (c, field) in self.schema.fields().iter().enumerate() {
            let datas: Vec<ArrayData> =
                self.sources.iter().map(|s| s.column(c).to_data()).collect();
            match finish_of(self.finishes.as_ref(), c) {
                None => write(field.data_type(), &datas, &runs, self.len, &mut body),
                Some(f) => self.write_finished(c, f, &datas, &runs, &mut body),
            }
        }
        body.flush();
        Ok(SlicedMessage {
            header: header(self.len, &body.nodes, &body.buffers, body.len),
            body: body.pieces,
            app_metadata: Bytes::new(),
        })
    }

    /// Lays out finished column `c` (a fixed-size list, see
    /// [`crate::finish`]): the sources' nulls, and its values as one
    /// computed piece that `f` writes where the body goes.
    fn write_finished(
        &self,
        c: usize,
        f: &Arc<dyn Finish>,
        datas: &[ArrayData],
        runs: &[Run],
        body: &mut Body,
    ) {
        let n = self.len;
        let k = match self.schema.field(c).data_type() {
            DataType::FixedSizeList(_, k) => *k as usize,
            _ => unreachable!("a finished column is a fixed-size list (checked when made)"),
        };
        node_and_validity(datas, runs, n, body);
        body.nodes.push(ipc::FieldNode::new((n * k) as i64, 0));
        body.owned(&[]);
        let columns: Vec<ArrayRef> = self
            .sources
            .iter()
            .map(|s| Arc::clone(s.column(c)))
            .collect();
        body.begin();
        body.computed(Finished::new(Arc::clone(f), columns, runs.to_vec()));
        body.end();
    }

    /// The messages of these rows, cut by rows so that each body stays
    /// under `max_body` bytes where rows allow (a single row larger than
    /// that is a message of its own).
    pub fn encode_split(&self, max_body: usize) -> Result<Vec<SlicedMessage>, ArrowError> {
        let whole = self.encode()?;
        let size = whole.body_len().max(1);
        if size <= max_body || self.len <= 1 {
            return Ok(vec![whole]);
        }
        let pieces = size.div_ceil(max_body.max(1)).clamp(1, self.len);
        let per = self.len.div_ceil(pieces);
        (0..self.len)
            .step_by(per)
            .map(|start| self.slice(start, per.min(self.len - start)).encode())
            .collect()
    }
}

/// The finish of column `c`, if it has one.
fn finish_of(finishes: Option<&Finishes>, c: usize) -> Option<&Arc<dyn Finish>> {
    finishes.and_then(|f| f.get(c)).and_then(Option::as_ref)
}

/// Checks that `finishes` has one entry per column of `schema` and that
/// each finished column is a fixed-size list of the finish's row size.
fn check_finishes(schema: &SchemaRef, finishes: &Finishes) -> Result<(), ArrowError> {
    if finishes.len() != schema.fields().len() {
        return Err(ArrowError::SchemaError(format!(
            "{} finishes for {} columns",
            finishes.len(),
            schema.fields().len()
        )));
    }
    for (field, f) in schema.fields().iter().zip(finishes.iter()) {
        if let Some(f) = f
            && fixed_row_bytes(field.data_type()) != Some(f.row_bytes())
        {
            return Err(ArrowError::SchemaError(format!(
                "column {} of type {} cannot be finished in rows of {} bytes",
                field.name(),
                field.data_type(),
                f.row_bytes()
            )));
        }
    }
    Ok(())
}

/// The finished column of type `dt` of the runs of `sources`, made.
fn finished_column(
    dt: &DataType,
    f: &dyn Finish,
    sources: &[ArrayRef],
    runs: &[Run],
    n: usize,
) -> Result<ArrayRef, ArrowError> {
    let DataType::FixedSizeList(item, k) = dt else {
        unreachable!("a finished column is a fixed-size list (checked when made)");
    };
    let row = f.row_bytes();
    let mut values = MutableBuffer::from_len_zeroed(n * row);
    write_runs(f, sources, runs, values.as_slice_mut());
    let values = make_array(
        ArrayData::builder(item.data_type().clone())
            .len(n * *k as usize)
            .add_buffer(values.into())
            .build()?,
    );
    let datas: Vec<ArrayData> = sources.iter().map(|a| a.to_data()).collect();
    let nulls = runs
        .iter()
        .any(|&(s, a, l)| nulls_in(&datas[s], a, l) > 0)
        .then(|| {
            NullBuffer::new(BooleanBuffer::new(
                Buffer::from(bitmap(&datas, runs, n, |d| {
                    d.nulls().map(|n| n.inner().clone())
                })),
                0,
                n,
            ))
        });
    Ok(Arc::new(FixedSizeListArray::try_new(
        Arc::clone(item),
        *k,
        values,
        nulls,
    )?))
}

#[cfg(test)]
mod tests;
