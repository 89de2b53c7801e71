//! [`Rebatcher`]: puts the rows of a job's windows back in the epoch's
//! order and cuts them into batches of `batch_size`, copying nothing: a
//! batch is a [`Gathered`] list of (window batch, row), which the reader's
//! encoding lays out straight from the windows' buffers (each value is
//! copied once, into the trainer's slot or the socket). A batch holds only
//! the window batches its rows lie in, and each window's hold (its
//! reservation in the node's window budget): a window's memory is counted
//! until the last batch with a row of it is gone, as long as it lives.
//!
//! A window's rows arrive in whatever order the storage nodes and
//! partitions produce them; each carries its slot (its position in the
//! window) in a `UInt32` column. A slot with no row (a sample skipped by
//! the error policy) is passed over; the batch after it still resumes
//! right.

use std::sync::Arc;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::SchemaRef;
use arrow::datatypes::UInt32Type;
use sluice_flight::gather::Gathered;

use super::error::JobError;
use super::run::{Delivery, Hold};

fn internal(e: impl std::fmt::Display) -> JobError {
    JobError::Internal(e.to_string())
}

/// See the module docs.
#[derive(Debug)]
pub struct Rebatcher {
    schema: SchemaRef,
    batch_size: usize,
    /// Each window batch with its window's hold (the same for all of a
    /// window's batches).
    sources: Vec<(RecordBatch, Hold)>,
    rows: Vec<(usize, usize)>,
    positions: Vec<u64>,
    next_from: u64,
}

impl Rebatcher {
    /// Batches of `batch_size` rows of `schema`, from position `from`.
    pub fn new(schema: SchemaRef, batch_size: usize, from: u64) -> Self {
        Self {
            schema,
            batch_size: batch_size.max(1),
            sources: Vec::new(),
            rows: Vec::new(),
            positions: Vec::new(),
            next_from: from,
        }
    }

    /// Adds a window: `batches` (with each row's slot in `slot_column`)
    /// holding the samples at positions `start..start + count`, slot `i`
    /// at `start + i`, and `hold`, kept while any of its rows is. Returns
    /// the slots that had no row.
    pub fn add(
        &mut self,
        batches: &[RecordBatch],
        slot_column: &str,
        start: u64,
        count: usize,
        hold: Hold,
    ) -> Result<Vec<u32>, JobError> {
        let base = self.sources.len();
        let mut at: Vec<Option<(usize, usize)>> = vec![None; count];
        for (b, batch) in batches.iter().enumerate() {
            let col = batch
                .column_by_name(slot_column)
                .and_then(|c| c.as_primitive_opt::<UInt32Type>())
                .ok_or_else(|| internal("a window without its (UInt32) slot column"))?;
            for (r, slot) in col.iter().enumerate() {
                let Some(slot) = slot else { continue };
                let Some(cell) = at.get_mut(slot as usize) else {
                    return Err(internal(format!(
                        "a row with slot {slot} in a window of {count}"
                    )));
                };
                if cell.is_some() {
                    return Err(internal(format!(
                        "two rows for slot {slot}: the sample was read twice"
                    )));
                }
                *cell = Some((base + b, r));
            }
            let columns =
                self.schema
                    .fields()
                    .iter()
                    .map(|f| {
                        batch.column_by_name(f.name()).cloned().ok_or_else(|| {
                            internal(format!("a window without column {}", f.name()))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
            let source =
                RecordBatch::try_new(Arc::clone(&self.schema), columns).map_err(internal)?;
            self.sources.push((source, Arc::clone(&hold)));
        }
        let mut missing = Vec::new();
        for (i, cell) in at.into_iter().enumerate() {
            match cell {
                Some(row) => {
                    self.rows.push(row);
                    self.positions.push(start + i as u64);
                }
                None => missing.push(i as u32),
            }
        }
        Ok(missing)
    }

    /// The next full batch, if there are enough rows; `last` holds back a
    /// final full batch so that [`Rebatcher::finish`] can end the range.
    pub fn next(&mut self, last: bool) -> Result<Option<Delivery>, JobError> {
        let n = self.batch_size;
        if self.rows.len() < n || (last && self.rows.len() == n) {
            return Ok(None);
        }
        let next_offset = self.positions[n - 1] + 1;
        let cut = self.cut(n, next_offset)?;
        Ok(Some(cut))
    }

    /// The rows left, as the range's last batch ending at `to` (none when
    /// nothing is left to say).
    pub fn finish(&mut self, to: u64) -> Result<Option<Delivery>, JobError> {
        if self.rows.is_empty() && self.next_from >= to {
            return Ok(None);
        }
        self.cut(self.rows.len(), to).map(Some)
    }

    fn cut(&mut self, n: usize, next_offset: u64) -> Result<Delivery, JobError> {
        // Only the sources these rows lie in, and their windows' holds.
        let mut at = vec![usize::MAX; self.sources.len()];
        let (mut sources, mut holds) = (Vec::new(), Vec::<Hold>::new());
        let mut rows = Vec::with_capacity(n);
        for &(b, r) in &self.rows[..n] {
            if at[b] == usize::MAX {
                let (source, hold) = &self.sources[b];
                at[b] = sources.len();
                sources.push(source.clone());
                if !holds.iter().any(|h| Arc::ptr_eq(h, hold)) {
                    holds.push(Arc::clone(hold));
                }
            }
            rows.push((at[b], r));
        }
        let rows = if n == 0 {
            Gathered::empty(Arc::clone(&self.schema))
        } else {
            Gathered::new(Arc::clone(&self.schema), sources, rows).map_err(internal)?
        };
        self.rows.drain(..n);
        self.positions.drain(..n);
        let from = self.next_from;
        self.next_from = next_offset;
        self.compact();
        Ok(Delivery {
            rows,
            _holds: holds,
            from,
            next_offset,
            bad: None,
        })
    }

    /// Drops the window batches no pending row refers to.
    fn compact(&mut self) {
        if self.rows.is_empty() {
            self.sources.clear();
            return;
        }
        let mut used = vec![false; self.sources.len()];
        for &(b, _) in &self.rows {
            used[b] = true;
        }
        if used.iter().all(|&u| u) {
            return;
        }
        let mut remap = vec![0; self.sources.len()];
        let mut kept = Vec::new();
        for (i, s) in std::mem::take(&mut self.sources).into_iter().enumerate() {
            if used[i] {
                remap[i] = kept.len();
                kept.push(s);
            }
        }
        self.sources = kept;
        for r in &mut self.rows {
            r.0 = remap[r.0];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int32Array, UInt32Array};
    use arrow::datatypes::{DataType, Field, Schema};

    fn window(slots: &[u32], values: &[i32]) -> RecordBatch {
        RecordBatch::try_from_iter([
            ("v", Arc::new(Int32Array::from(values.to_vec())) as _),
            ("s", Arc::new(UInt32Array::from(slots.to_vec())) as _),
        ])
        .unwrap()
    }

    #[test]
    fn rows_come_back_in_slot_order_in_full_batches() {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int32, false)]));
        let mut r = Rebatcher::new(schema, 2, 10);
        // Positions 10..13 are slots 0, 1, 2; the window sends them
        // shuffled over two batches, and slot 2 is missing (skipped).
        let missing = r
            .add(
                &[window(&[1], &[1]), window(&[0], &[3])],
                "s",
                10,
                3,
                Arc::new(()),
            )
            .unwrap();
        assert_eq!(missing, vec![2]);
        let cut = r.next(false).unwrap().unwrap();
        assert_eq!(
            cut.batch()
                .unwrap()
                .column(0)
                .as_primitive::<arrow::datatypes::Int32Type>()
                .values(),
            &[3, 1]
        );
        assert_eq!((cut.from, cut.next_offset), (10, 12));
        r.add(&[window(&[1, 0], &[4, 5])], "s", 13, 2, Arc::new(()))
            .unwrap();
        // The last full batch is held back for finish, which ends the range.
        assert!(r.next(true).unwrap().is_none());
        let end = r.finish(16).unwrap().unwrap();
        assert_eq!(
            end.batch()
                .unwrap()
                .column(0)
                .as_primitive::<arrow::datatypes::Int32Type>()
                .values(),
            &[5, 4]
        );
        assert_eq!((end.from, end.next_offset), (12, 16));
        assert!(r.finish(16).unwrap().is_none());
    }

    #[test]
    fn a_slot_twice_or_out_of_the_window_is_an_error() {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int32, false)]));
        let mut r = Rebatcher::new(Arc::clone(&schema), 2, 0);
        assert!(
            r.add(&[window(&[0, 0], &[1, 2])], "s", 0, 2, Arc::new(()))
                .is_err()
        );
        let mut r = Rebatcher::new(schema, 2, 0);
        assert!(
            r.add(&[window(&[5], &[1])], "s", 0, 2, Arc::new(()))
                .is_err()
        );
    }

    #[test]
    fn a_window_is_held_until_the_last_batch_with_its_rows_is_gone() {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int32, false)]));
        let mut r = Rebatcher::new(schema, 2, 0);
        let (a, b): (Hold, Hold) = (Arc::new(()), Arc::new(()));
        let (wa, wb) = (Arc::downgrade(&a), Arc::downgrade(&b));
        // Window a: positions 0..3; window b: 3..5.
        r.add(&[window(&[2, 0, 1], &[12, 10, 11])], "s", 0, 3, a)
            .unwrap();
        r.add(&[window(&[0, 1], &[13, 14])], "s", 3, 2, b).unwrap();
        let first = r.next(false).unwrap().unwrap();
        // Rows 0, 1: window a only.
        assert_eq!(first.rows.num_rows(), 2);
        let second = r.next(false).unwrap().unwrap();
        drop(first);
        assert!(wa.upgrade().is_some(), "row 2 of window a is still to go");
        let last = r.finish(5).unwrap().unwrap();
        drop(second);
        assert!(wa.upgrade().is_none(), "window a's rows are all gone");
        assert!(wb.upgrade().is_some());
        assert_eq!(
            last.batch()
                .unwrap()
                .column(0)
                .as_primitive::<arrow::datatypes::Int32Type>()
                .values(),
            &[14]
        );
        drop(last);
        assert!(wb.upgrade().is_none());
    }
}
