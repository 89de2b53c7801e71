//! [`Rebatcher`]: puts the rows of a job's windows back in the epoch's
//! order and cuts them into batches of `batch_size`, copying each value
//! once (an interleave straight from the windows' batches).
//!
//! A window's rows arrive in whatever order the storage nodes and
//! partitions produce them; each is matched to its position by the
//! sample key. A position whose key has no row (a sample skipped by the
//! error policy) is passed over; the batch after it still resumes right.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{AsArray, RecordBatch};
use arrow::compute::interleave_record_batch;
use arrow::datatypes::SchemaRef;

use super::run::Delivery;
use super::spec::JobError;

fn internal(e: impl std::fmt::Display) -> JobError {
    JobError::Internal(e.to_string())
}

/// See the module docs.
#[derive(Debug)]
pub struct Rebatcher {
    schema: SchemaRef,
    batch_size: usize,
    sources: Vec<RecordBatch>,
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

    /// Adds a window: `batches` (with the key in `key_column`) holding the
    /// rows of `keys`, the samples at positions `start..`. Returns the keys
    /// that had no row.
    pub fn add<'k>(
        &mut self,
        batches: &[RecordBatch],
        key_column: &str,
        keys: &[&'k str],
        start: u64,
    ) -> Result<Vec<&'k str>, JobError> {
        let base = self.sources.len();
        let mut at: HashMap<&str, (usize, usize)> = HashMap::new();
        for (b, batch) in batches.iter().enumerate() {
            let col = batch
                .column_by_name(key_column)
                .and_then(|c| c.as_string_opt::<i32>())
                .ok_or_else(|| internal("a window without its (Utf8) key column"))?;
            for (r, k) in col.iter().enumerate() {
                if let Some(k) = k {
                    at.entry(k).or_insert((base + b, r));
                }
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
            self.sources
                .push(RecordBatch::try_new(Arc::clone(&self.schema), columns).map_err(internal)?);
        }
        let mut missing = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            match at.get(k) {
                Some(&row) => {
                    self.rows.push(row);
                    self.positions.push(start + i as u64);
                }
                None => missing.push(*k),
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
        let batch = if n == 0 {
            RecordBatch::new_empty(Arc::clone(&self.schema))
        } else {
            let refs: Vec<&RecordBatch> = self.sources.iter().collect();
            let b = interleave_record_batch(&refs, &self.rows[..n]).map_err(internal)?;
            RecordBatch::try_new(Arc::clone(&self.schema), b.columns().to_vec())
                .map_err(internal)?
        };
        self.rows.drain(..n);
        self.positions.drain(..n);
        let from = self.next_from;
        self.next_from = next_offset;
        self.compact();
        Ok(Delivery {
            batch,
            from,
            next_offset,
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
    use arrow::array::{Int32Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    fn window(keys: &[&str], values: &[i32]) -> RecordBatch {
        RecordBatch::try_from_iter([
            ("v", Arc::new(Int32Array::from(values.to_vec())) as _),
            ("k", Arc::new(StringArray::from(keys.to_vec())) as _),
        ])
        .unwrap()
    }

    #[test]
    fn rows_come_back_in_key_order_in_full_batches() {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int32, false)]));
        let mut r = Rebatcher::new(schema, 2, 10);
        // Positions 10..13 want keys c, a, b; the window sends them shuffled
        // over two batches, and b is missing (skipped).
        let missing = r
            .add(
                &[window(&["a"], &[1]), window(&["c"], &[3])],
                "k",
                &["c", "a", "b"],
                10,
            )
            .unwrap();
        assert_eq!(missing, vec!["b"]);
        let cut = r.next(false).unwrap().unwrap();
        assert_eq!(
            cut.batch
                .column(0)
                .as_primitive::<arrow::datatypes::Int32Type>()
                .values(),
            &[3, 1]
        );
        assert_eq!((cut.from, cut.next_offset), (10, 12));
        r.add(&[window(&["d", "e"], &[4, 5])], "k", &["e", "d"], 13)
            .unwrap();
        // The last full batch is held back for finish, which ends the range.
        assert!(r.next(true).unwrap().is_none());
        let end = r.finish(16).unwrap().unwrap();
        assert_eq!(
            end.batch
                .column(0)
                .as_primitive::<arrow::datatypes::Int32Type>()
                .values(),
            &[5, 4]
        );
        assert_eq!((end.from, end.next_offset), (12, 16));
        assert!(r.finish(16).unwrap().is_none());
    }
}
