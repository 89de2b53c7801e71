//! [`Rebatcher`]: puts the rows of a job's windows back in the epoch's
//! order and cuts them into batches of `batch_size`, copying nothing: a
//! batch is a [`Gathered`] list of (window batch, row), which the reader's
//! encoding lays out straight from the windows' buffers (each value is
//! copied once, into the trainer's slot or the socket). A batch holds only
//! the window batches its rows lie in, and each window's room (its
//! reservation in the node's window budget): a window's memory is counted
//! until the last batch with a row of it is gone, as long as it lives.
//!
//! A window comes as its rows by slot ([`WindowRows`]: from its plan, the
//! output cache or both). A slot with no row (a sample skipped by the
//! error policy) is passed over; the batch after it still resumes right.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use sluice_flight::gather::{Finishes, Gathered};

use super::rank_batch::{RankBatch, Room};
use super::window_rows::WindowRows;
use crate::error::JobError;

fn internal(e: impl std::fmt::Display) -> JobError {
    JobError::Internal(e.to_string())
}

/// See the module docs.
#[derive(Debug)]
pub struct Rebatcher {
    schema: SchemaRef,
    finishes: Option<Finishes>,
    batch_size: usize,
    /// Each window batch with its window's room (the same for all of a
    /// window's batches).
    sources: Vec<(Arc<RecordBatch>, Room)>,
    rows: Vec<(usize, usize)>,
    positions: Vec<u64>,
    next_from: u64,
}

impl Rebatcher {
    /// Batches of `batch_size` rows of `schema` (its columns that have a
    /// finish made by it from the windows', see [`Gathered::finished`]),
    /// from position `from`.
    pub fn new(
        schema: SchemaRef,
        finishes: Option<Finishes>,
        batch_size: usize,
        from: u64,
    ) -> Self {
        Self {
            schema,
            finishes,
            batch_size: batch_size.max(1),
            sources: Vec::new(),
            rows: Vec::new(),
            positions: Vec::new(),
            next_from: from,
        }
    }

    /// Adds a window: `window`'s rows, slot `i` at position `start + i`,
    /// and its `room`, kept while any of its rows is. Returns the slots
    /// that had no row.
    pub fn add(&mut self, window: WindowRows, start: u64, room: Room) -> Vec<u32> {
        let base = self.sources.len();
        self.sources
            .extend(window.sources.into_iter().map(|s| (s, Arc::clone(&room))));
        let mut missing = Vec::new();
        for (i, cell) in window.at.into_iter().enumerate() {
            match cell {
                Some((b, r)) => {
                    self.rows.push((base + b, r));
                    self.positions.push(start + i as u64);
                }
                None => missing.push(i as u32),
            }
        }
        missing
    }

    /// The next full batch, if there are enough rows; `last` holds back a
    /// final full batch so that [`Rebatcher::finish`] can end the range.
    pub fn next(&mut self, last: bool) -> Result<Option<RankBatch>, JobError> {
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
    pub fn finish(&mut self, to: u64) -> Result<Option<RankBatch>, JobError> {
        if self.rows.is_empty() && self.next_from >= to {
            return Ok(None);
        }
        self.cut(self.rows.len(), to).map(Some)
    }

    fn cut(&mut self, n: usize, next_offset: u64) -> Result<RankBatch, JobError> {
        // Only the sources these rows lie in, and their windows' room.
        let mut at = vec![usize::MAX; self.sources.len()];
        let (mut sources, mut rooms) = (Vec::new(), Vec::<Room>::new());
        let mut rows = Vec::with_capacity(n);
        for &(b, r) in &self.rows[..n] {
            if at[b] == usize::MAX {
                let (source, room) = &self.sources[b];
                at[b] = sources.len();
                sources.push(RecordBatch::clone(source));
                if !rooms.iter().any(|h| Arc::ptr_eq(h, room)) {
                    rooms.push(Arc::clone(room));
                }
            }
            rows.push((at[b], r));
        }
        let rows = if n == 0 {
            Gathered::empty(Arc::clone(&self.schema))
        } else {
            Gathered::finished(
                Arc::clone(&self.schema),
                self.finishes.clone(),
                sources,
                rows,
            )
            .map_err(internal)?
        };
        self.rows.drain(..n);
        self.positions.drain(..n);
        let from = self.next_from;
        self.next_from = next_offset;
        self.compact();
        Ok(RankBatch {
            rows,
            _rooms: rooms,
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
    use arrow::array::{AsArray, Int32Array, UInt32Array};
    use arrow::datatypes::{DataType, Field, Schema};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("v", DataType::Int32, false)]))
    }

    /// A window of `count` slots whose plan sent `batches` (values, slots).
    fn window(batches: &[(&[u32], &[i32])], count: usize) -> WindowRows {
        let batches: Vec<RecordBatch> = batches
            .iter()
            .map(|(slots, values)| {
                RecordBatch::try_from_iter([
                    ("v", Arc::new(Int32Array::from(values.to_vec())) as _),
                    ("s", Arc::new(UInt32Array::from(slots.to_vec())) as _),
                ])
                .unwrap()
            })
            .collect();
        WindowRows::from_plan(&batches, &schema(), "s", count).unwrap()
    }

    #[test]
    fn rows_come_back_in_slot_order_in_full_batches() {
        let mut r = Rebatcher::new(schema(), None, 2, 10);
        // Positions 10..13 are slots 0, 1, 2; the window sends them
        // shuffled over two batches, and slot 2 is missing (skipped).
        let missing = r.add(window(&[(&[1], &[1]), (&[0], &[3])], 3), 10, Arc::new(()));
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
        r.add(window(&[(&[1, 0], &[4, 5])], 2), 13, Arc::new(()));
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
    fn a_window_is_held_until_the_last_batch_with_its_rows_is_gone() {
        let mut r = Rebatcher::new(schema(), None, 2, 0);
        let (a, b): (Room, Room) = (Arc::new(()), Arc::new(()));
        let (wa, wb) = (Arc::downgrade(&a), Arc::downgrade(&b));
        // Window a: positions 0..3; window b: 3..5.
        r.add(window(&[(&[2, 0, 1], &[12, 10, 11])], 3), 0, a);
        r.add(window(&[(&[0, 1], &[13, 14])], 2), 3, b);
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
