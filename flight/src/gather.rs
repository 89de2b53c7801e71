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

use std::sync::Arc;

use arrow::array::{ArrayData, RecordBatch};
use arrow::buffer::{BooleanBuffer, Buffer};
use arrow::compute::interleave_record_batch;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::error::ArrowError;
use arrow::ipc;
use bytes::Bytes;

use crate::slices::{ALIGN, PADDING, SlicedMessage, bytes_of, encode_copied, header, supported};

/// Values shorter than this are copied into the body rather than shared.
pub const SHARE_MIN: usize = 4096;

/// Rows of `sources`, in order: see the module docs.
#[derive(Debug, Clone)]
pub struct Gathered {
    schema: SchemaRef,
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
        for s in &sources {
            if s.schema_ref().fields() != schema.fields() {
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
        let refs: Vec<&RecordBatch> = self.sources.iter().collect();
        let b = interleave_record_batch(&refs, self.rows())?;
        RecordBatch::try_new(Arc::clone(&self.schema), b.columns().to_vec())
    }

    /// The record-batch message of these rows; see the module docs.
    pub fn encode(&self) -> Result<SlicedMessage, ArrowError> {
        self.encode_sharing(SHARE_MIN)
    }

    /// [`Gathered::encode`], sharing values of `share_min` bytes or more.
    pub(crate) fn encode_sharing(&self, share_min: usize) -> Result<SlicedMessage, ArrowError> {
        if !self
            .schema
            .fields()
            .iter()
            .all(|f| supported(f.data_type()))
        {
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
            write(field.data_type(), &datas, &runs, self.len, &mut body);
        }
        body.flush();
        Ok(SlicedMessage {
            header: header(self.len, &body.nodes, &body.buffers, body.len),
            body: body.pieces,
            app_metadata: Bytes::new(),
        })
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

/// `(source, first row, rows)`: consecutive rows of one source as one run.
type Run = (usize, usize, usize);

fn runs(rows: &[(usize, usize)]) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for &(b, r) in rows {
        match out.last_mut() {
            Some((lb, lr, ln)) if *lb == b && *lr + *ln == r => *ln += 1,
            _ => out.push((b, r, 1)),
        }
    }
    out
}

/// The body being laid out: shared pieces, small bytes gathered into one
/// piece between them, and the buffers' places.
#[derive(Default)]
struct Body {
    pieces: Vec<Bytes>,
    small: Vec<u8>,
    buffers: Vec<ipc::Buffer>,
    nodes: Vec<ipc::FieldNode>,
    len: usize,
    started: usize,
    /// Values shorter than this are copied, not shared.
    share_min: usize,
}

impl Body {
    fn begin(&mut self) {
        self.started = self.len;
    }

    fn copy(&mut self, b: &[u8]) {
        self.small.extend_from_slice(b);
        self.len += b.len();
    }

    /// `len` bytes of `buf` from `offset`, shared when they are many.
    fn share(&mut self, buf: &Buffer, offset: usize, len: usize) {
        if len < self.share_min {
            self.copy(&buf.as_slice()[offset..offset + len]);
            return;
        }
        self.flush();
        self.pieces
            .push(bytes_of(buf.slice_with_length(offset, len)));
        self.len += len;
    }

    fn flush(&mut self) {
        if !self.small.is_empty() {
            self.pieces
                .push(Bytes::from(std::mem::take(&mut self.small)));
        }
    }

    /// Ends the buffer begun last, padding it to [`ALIGN`].
    fn end(&mut self) {
        let n = self.len - self.started;
        self.buffers
            .push(ipc::Buffer::new(self.started as i64, n as i64));
        let pad = n.next_multiple_of(ALIGN) - n;
        self.copy(&PADDING[..pad]);
    }

    /// A buffer made here.
    fn owned(&mut self, b: &[u8]) {
        self.begin();
        self.copy(b);
        self.end();
    }
}

/// Nulls among `len` rows of `d` from `start`.
fn nulls_in(d: &ArrayData, start: usize, len: usize) -> usize {
    d.nulls()
        .map_or(0, |n| len - n.inner().slice(start, len).count_set_bits())
}

/// A bitmap of the runs' bits, `bits(d)` giving each source's (logical) bits.
fn bitmap(
    datas: &[ArrayData],
    runs: &[Run],
    n: usize,
    bits: impl Fn(&ArrayData) -> Option<BooleanBuffer>,
) -> Vec<u8> {
    let mut b = arrow::array::BooleanBufferBuilder::new(n);
    for &(s, start, len) in runs {
        match bits(&datas[s]) {
            Some(bits) => b.append_buffer(&bits.slice(start, len)),
            None => b.append_n(len, true),
        }
    }
    b.finish().inner().as_slice().to_vec()
}

/// Rebased offsets (of `W`) of the runs, and each run's range of values.
fn offsets<W>(datas: &[ArrayData], runs: &[Run], body: &mut Body) -> Vec<(usize, usize)>
where
    W: arrow::datatypes::ArrowNativeType + std::ops::Sub<Output = W> + std::ops::Add<Output = W>,
{
    let mut out: Vec<W> = Vec::with_capacity(runs.iter().map(|r| r.2).sum::<usize>() + 1);
    let mut ranges = Vec::with_capacity(runs.len());
    let mut acc = W::usize_as(0);
    out.push(acc);
    for &(s, start, len) in runs {
        let d = &datas[s];
        let all: &[W] = d.buffers()[0].typed_data();
        let window = &all[d.offset() + start..=d.offset() + start + len];
        let first = window[0];
        for &o in &window[1..] {
            out.push(acc + (o - first));
        }
        acc = acc + (window[len] - first);
        ranges.push((first.as_usize(), window[len].as_usize()));
    }
    body.owned(Buffer::from_vec(out).as_slice());
    ranges
}

/// Lays out `n` rows of type `dt`, the runs of `datas`, as the IPC
/// format orders them.
fn write(dt: &DataType, datas: &[ArrayData], runs: &[Run], n: usize, body: &mut Body) {
    if *dt == DataType::Null {
        body.nodes.push(ipc::FieldNode::new(n as i64, n as i64));
        return;
    }
    let null_count: usize = runs
        .iter()
        .map(|&(s, a, l)| nulls_in(&datas[s], a, l))
        .sum();
    body.nodes
        .push(ipc::FieldNode::new(n as i64, null_count as i64));
    if null_count > 0 {
        body.owned(&bitmap(datas, runs, n, |d| {
            d.nulls().map(|n| n.inner().clone())
        }));
    } else {
        body.owned(&[]);
    }
    match dt {
        DataType::Boolean => {
            let values = bitmap(datas, runs, n, |d| {
                Some(BooleanBuffer::new(
                    d.buffers()[0].clone(),
                    d.offset(),
                    d.len(),
                ))
            });
            body.owned(&values);
        }
        DataType::Utf8 | DataType::Binary | DataType::LargeUtf8 | DataType::LargeBinary => {
            let ranges = if matches!(dt, DataType::LargeUtf8 | DataType::LargeBinary) {
                offsets::<i64>(datas, runs, body)
            } else {
                offsets::<i32>(datas, runs, body)
            };
            body.begin();
            for (&(s, _, _), (a, b)) in runs.iter().zip(ranges) {
                body.share(&datas[s].buffers()[1], a, b - a);
            }
            body.end();
        }
        DataType::List(f) | DataType::LargeList(f) => {
            let ranges = if matches!(dt, DataType::LargeList(_)) {
                offsets::<i64>(datas, runs, body)
            } else {
                offsets::<i32>(datas, runs, body)
            };
            let children: Vec<ArrayData> =
                datas.iter().map(|d| d.child_data()[0].clone()).collect();
            let child_runs: Vec<Run> = runs
                .iter()
                .zip(ranges)
                .filter(|(_, (a, b))| b > a)
                .map(|(&(s, _, _), (a, b))| (s, a, b - a))
                .collect();
            let total = child_runs.iter().map(|r| r.2).sum();
            write(f.data_type(), &children, &child_runs, total, body);
        }
        DataType::FixedSizeList(f, k) => {
            let k = *k as usize;
            let children: Vec<ArrayData> =
                datas.iter().map(|d| d.child_data()[0].clone()).collect();
            let child_runs: Vec<Run> = runs
                .iter()
                .map(|&(s, a, l)| (s, (datas[s].offset() + a) * k, l * k))
                .collect();
            write(f.data_type(), &children, &child_runs, n * k, body);
        }
        DataType::Struct(fields) => {
            // A struct's children are aligned with its view (arrow slices
            // them with it), as `slices` assumes too.
            for (i, f) in fields.iter().enumerate() {
                let children: Vec<ArrayData> =
                    datas.iter().map(|d| d.child_data()[i].clone()).collect();
                write(f.data_type(), &children, runs, n, body);
            }
        }
        t => {
            // Primitive or fixed-size binary (checked by `supported`).
            let w = match t {
                DataType::FixedSizeBinary(w) => *w as usize,
                t => t.primitive_width().unwrap_or(0),
            };
            body.begin();
            for &(s, a, l) in runs {
                let d = &datas[s];
                body.share(&d.buffers()[0], (d.offset() + a) * w, l * w);
            }
            body.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slices::tests::{batch, decode};

    /// Sources cut from the test batch at odd places, and rows that visit
    /// them in a scrambled order (runs of one and of several rows).
    fn gathered() -> (Gathered, Vec<RecordBatch>) {
        let b = batch();
        let sources = vec![
            b.slice(0, 12),
            b.slice(12, 20),
            b.slice(5, 31),
            b.slice(32, 5),
        ];
        let mut rows = Vec::new();
        for i in 0..40usize {
            let s = (i * 7) % sources.len();
            let r = (i * 5 + i / 3) % sources[s].num_rows();
            rows.push((s, r));
            if i % 6 == 0 && r + 1 < sources[s].num_rows() {
                rows.push((s, r + 1));
            }
        }
        (
            Gathered::new(b.schema(), sources.clone(), rows).unwrap(),
            sources,
        )
    }

    #[test]
    fn the_message_reads_back_as_the_interleaved_rows() {
        let (g, _) = gathered();
        let want = g.to_batch().unwrap();
        assert_eq!(decode(&g.encode().unwrap(), g.schema()), want);
        for (start, len) in [(0, 1), (3, 17), (g.num_rows() - 2, 2), (4, 0)] {
            let s = g.slice(start, len);
            assert_eq!(
                decode(&s.encode().unwrap(), g.schema()),
                want.slice(start, len),
                "slice {start}+{len}"
            );
        }
        let empty = Gathered::empty(g.schema().clone());
        assert_eq!(decode(&empty.encode().unwrap(), g.schema()).num_rows(), 0);
    }

    #[test]
    fn split_messages_cover_the_rows_in_order() {
        let (g, _) = gathered();
        let want = g.to_batch().unwrap();
        let parts = g.encode_split(64).unwrap();
        assert!(parts.len() > 1);
        let got: Vec<RecordBatch> = parts.iter().map(|m| decode(m, g.schema())).collect();
        assert_eq!(
            arrow::compute::concat_batches(g.schema(), &got).unwrap(),
            want
        );
    }

    #[test]
    fn large_values_are_shared_not_copied() {
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new("v", DataType::Float32, false),
        ]));
        let values = arrow::array::Float32Array::from_iter_values((0..8192).map(|i| i as f32));
        let source = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(values)]).unwrap();
        let buffer = source.column(0).to_data().buffers()[0].clone();
        // Rows 4096.. then 0..4096: two runs of 16 KiB, each a piece.
        let rows = (4096..8192).chain(0..4096).map(|r| (0, r)).collect();
        let g = Gathered::new(schema, vec![source], rows).unwrap();
        let m = g.encode().unwrap();
        let at = |off: usize| buffer.as_ptr() as usize + off;
        assert!(m.body.iter().any(|p| p.as_ptr() as usize == at(4096 * 4)));
        assert!(m.body.iter().any(|p| p.as_ptr() as usize == at(0)));
        let got = decode(&m, g.schema());
        assert_eq!(got, g.to_batch().unwrap());
    }

    #[test]
    fn rows_outside_the_sources_are_refused() {
        let (g, sources) = gathered();
        assert!(Gathered::new(g.schema().clone(), sources.clone(), vec![(9, 0)]).is_err());
        assert!(Gathered::new(g.schema().clone(), sources, vec![(0, 12)]).is_err());
    }
}
