//! The IPC body of gathered rows (`crate::gather`), laid out a buffer at a
//! time: runs of rows of one source shared as pieces of that source's
//! buffers, small values copied next to their neighbours, offsets
//! rebased, validity and boolean bitmaps made anew, each buffer padded to
//! the format's alignment, and a finished column computed where it is
//! written.

use arrow::array::ArrayData;
use arrow::buffer::{BooleanBuffer, Buffer};
use arrow::datatypes::DataType;
use arrow::ipc;
use bytes::Bytes;

use crate::finish::{Finished, Run};
use crate::piece::Piece;
use crate::slices::{ALIGN, PADDING, bytes_of};

pub(crate) fn runs(rows: &[(usize, usize)]) -> Vec<Run> {
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
pub(crate) struct Body {
    pub(crate) pieces: Vec<Piece>,
    pub(crate) small: Vec<u8>,
    pub(crate) buffers: Vec<ipc::Buffer>,
    pub(crate) nodes: Vec<ipc::FieldNode>,
    pub(crate) len: usize,
    pub(crate) started: usize,
    /// Values shorter than this are copied, not shared.
    pub(crate) share_min: usize,
}

impl Body {
    pub(crate) fn begin(&mut self) {
        self.started = self.len;
    }

    pub(crate) fn copy(&mut self, b: &[u8]) {
        self.small.extend_from_slice(b);
        self.len += b.len();
    }

    /// `len` bytes of `buf` from `offset`, shared when they are many.
    pub(crate) fn share(&mut self, buf: &Buffer, offset: usize, len: usize) {
        if len < self.share_min {
            self.copy(&buf.as_slice()[offset..offset + len]);
            return;
        }
        self.flush();
        self.pieces
            .push(Piece::Bytes(bytes_of(buf.slice_with_length(offset, len))));
        self.len += len;
    }

    /// The bytes `finished` makes, where the body goes.
    pub(crate) fn computed(&mut self, finished: Finished) {
        let len = finished.len();
        if len == 0 {
            return;
        }
        self.flush();
        self.pieces.push(Piece::Computed(finished));
        self.len += len;
    }

    pub(crate) fn flush(&mut self) {
        if !self.small.is_empty() {
            self.pieces
                .push(Piece::Bytes(Bytes::from(std::mem::take(&mut self.small))));
        }
    }

    /// Ends the buffer begun last, padding it to [`ALIGN`].
    pub(crate) fn end(&mut self) {
        let n = self.len - self.started;
        self.buffers
            .push(ipc::Buffer::new(self.started as i64, n as i64));
        let pad = n.next_multiple_of(ALIGN) - n;
        self.copy(&PADDING[..pad]);
    }

    /// A buffer made here.
    pub(crate) fn owned(&mut self, b: &[u8]) {
        self.begin();
        self.copy(b);
        self.end();
    }
}

/// Nulls among `len` rows of `d` from `start`.
pub(crate) fn nulls_in(d: &ArrayData, start: usize, len: usize) -> usize {
    d.nulls()
        .map_or(0, |n| len - n.inner().slice(start, len).count_set_bits())
}

/// A bitmap of the runs' bits, `bits(d)` giving each source's (logical) bits.
pub(crate) fn bitmap(
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
pub(crate) fn offsets<W>(datas: &[ArrayData], runs: &[Run], body: &mut Body) -> Vec<(usize, usize)>
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

/// The field node of `n` rows, the runs of `datas`, and their validity
/// bitmap (empty when none is NULL).
pub(crate) fn node_and_validity(datas: &[ArrayData], runs: &[Run], n: usize, body: &mut Body) {
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
}

/// Lays out `n` rows of type `dt`, the runs of `datas`, as the IPC
/// format orders them.
pub(crate) fn write(dt: &DataType, datas: &[ArrayData], runs: &[Run], n: usize, body: &mut Body) {
    if *dt == DataType::Null {
        body.nodes.push(ipc::FieldNode::new(n as i64, n as i64));
        return;
    }
    node_and_validity(datas, runs, n, body);
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
