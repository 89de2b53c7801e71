//! [`WindowRows`]: a window's output, row by slot — what its plan made, what
//! the output cache held, or both — before the rows go back in the epoch's
//! order ([`super::rebatch`]).
//!
//! A window's plan sends its rows in whatever order the storage nodes and
//! partitions produce them, each with its slot (its position in the
//! window) in a `UInt32` column; here each slot names the batch and row
//! its sample's output lies at, or nothing (a sample skipped by the error
//! policy). Nothing is copied: the batches are the plan's (projected to
//! the job's schema) or the cache's, shared.

use std::sync::Arc;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{SchemaRef, UInt32Type};

use crate::error::JobError;
use crate::session::output_cache::{CachedRow, row_bytes};

fn internal(e: impl std::fmt::Display) -> JobError {
    JobError::Internal(e.to_string())
}

/// See the module docs.
#[derive(Debug, Clone, Default)]
pub struct WindowRows {
    /// The batches the rows lie in, in the job's schema.
    pub sources: Vec<Arc<RecordBatch>>,
    /// Per slot: (source, row), or none.
    pub at: Vec<Option<(usize, usize)>>,
}

impl WindowRows {
    /// The rows of a window of `count` slots that its plan sent as
    /// `batches` (each row's slot in `slot_column`), projected to
    /// `schema`. A slot out of the window, or twice, is an error.
    pub fn from_plan(
        batches: &[RecordBatch],
        schema: &SchemaRef,
        slot_column: &str,
        count: usize,
    ) -> Result<Self, JobError> {
        let mut out = Self {
            sources: Vec::with_capacity(batches.len()),
            at: vec![None; count],
        };
        for (b, batch) in batches.iter().enumerate() {
            let col = batch
                .column_by_name(slot_column)
                .and_then(|c| c.as_primitive_opt::<UInt32Type>())
                .ok_or_else(|| internal("a window without its (UInt32) slot column"))?;
            for (r, slot) in col.iter().enumerate() {
                let Some(slot) = slot else { continue };
                let Some(cell) = out.at.get_mut(slot as usize) else {
                    return Err(internal(format!(
                        "a row with slot {slot} in a window of {count}"
                    )));
                };
                if cell.is_some() {
                    return Err(internal(format!(
                        "two rows for slot {slot}: the sample was read twice"
                    )));
                }
                *cell = Some((b, r));
            }
            let columns = schema
                .fields()
                .iter()
                .map(|f| {
                    batch
                        .column_by_name(f.name())
                        .cloned()
                        .ok_or_else(|| internal(format!("a window without column {}", f.name())))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let source = RecordBatch::try_new(Arc::clone(schema), columns).map_err(internal)?;
            out.sources.push(Arc::new(source));
        }
        Ok(out)
    }

    /// The rows the output cache held for a window: slot `i` is
    /// `cached[i]`'s. Rows of one batch in a run share one source (a
    /// cached row's batch is its own, so each is a source).
    pub fn from_cache(cached: Vec<Option<CachedRow>>) -> Self {
        let mut out = Self {
            sources: Vec::new(),
            at: Vec::with_capacity(cached.len()),
        };
        for row in cached {
            let cell = row.map(|CachedRow { batch, row }| {
                let source = match out.sources.last() {
                    Some(last) if Arc::ptr_eq(last, &batch) => out.sources.len() - 1,
                    _ => {
                        out.sources.push(batch);
                        out.sources.len() - 1
                    }
                };
                (source, row)
            });
            out.at.push(cell);
        }
        out
    }

    /// Puts `other`'s slot `j` at slot `slots[j]` (slots this one has no
    /// row at: the samples the plan ran for).
    pub fn fill(&mut self, slots: &[usize], other: WindowRows) {
        let base = self.sources.len();
        self.sources.extend(other.sources);
        for (&slot, cell) in slots.iter().zip(other.at) {
            if let Some((b, r)) = cell {
                self.at[slot] = Some((base + b, r));
            }
        }
    }

    /// Each source's bytes per row (its memory over its rows), measured
    /// once per source, not per row.
    fn per_row(&self) -> Vec<u64> {
        self.sources.iter().map(|s| row_bytes(s)).collect()
    }

    /// Each row with its slot, as the output cache keeps it, and the bytes
    /// it counts.
    pub fn rows(&self) -> impl Iterator<Item = (usize, CachedRow, u64)> + '_ {
        let each = self.per_row();
        self.at.iter().enumerate().filter_map(move |(slot, cell)| {
            cell.map(|(b, row)| {
                let batch = Arc::clone(&self.sources[b]);
                (slot, CachedRow { batch, row }, each[b])
            })
        })
    }

    /// The rows there are.
    pub fn len(&self) -> usize {
        self.at.iter().flatten().count()
    }

    /// Whether no slot has a row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes its rows count (each its batch's memory over its rows).
    pub fn bytes(&self) -> u64 {
        let each = self.per_row();
        self.at.iter().flatten().map(|&(b, _)| each[b]).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int32Array, UInt32Array};
    use arrow::datatypes::{DataType, Field, Schema};

    fn plan_batch(slots: &[u32], values: &[i32]) -> RecordBatch {
        RecordBatch::try_from_iter([
            ("v", Arc::new(Int32Array::from(values.to_vec())) as _),
            ("s", Arc::new(UInt32Array::from(slots.to_vec())) as _),
        ])
        .unwrap()
    }

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("v", DataType::Int32, false)]))
    }

    #[test]
    fn cached_rows_and_the_plan_s_fill_one_window() {
        // A window of 4: slots 0 and 2 were cached (one batch), 1 and 3
        // computed now, as the plan's slots 0 and 1 (3 was skipped).
        let cached_batch = Arc::new(plan_batch(&[0, 1], &[7, 8]).project(&[0]).unwrap());
        let cached = vec![
            Some(CachedRow {
                batch: Arc::clone(&cached_batch),
                row: 1,
            }),
            None,
            Some(CachedRow {
                batch: Arc::clone(&cached_batch),
                row: 0,
            }),
            None,
        ];
        let mut w = WindowRows::from_cache(cached);
        assert_eq!(w.sources.len(), 1, "one source per cached batch");
        let computed = WindowRows::from_plan(&[plan_batch(&[0], &[5])], &schema(), "s", 2).unwrap();
        w.fill(&[1, 3], computed);
        let values: Vec<Option<i32>> =
            w.at.iter()
                .map(|c| {
                    c.map(|(b, r)| {
                        w.sources[b]
                            .column(0)
                            .as_primitive::<arrow::datatypes::Int32Type>()
                            .value(r)
                    })
                })
                .collect();
        assert_eq!(values, vec![Some(8), Some(5), Some(7), None]);
        assert_eq!(w.len(), 3);
        let slots: Vec<usize> = w.rows().map(|(s, _, _)| s).collect();
        assert_eq!(slots, vec![0, 1, 2]);
    }

    #[test]
    fn a_slot_twice_or_out_of_the_window_is_an_error() {
        assert!(WindowRows::from_plan(&[plan_batch(&[0, 0], &[1, 2])], &schema(), "s", 2).is_err());
        assert!(WindowRows::from_plan(&[plan_batch(&[5], &[1])], &schema(), "s", 2).is_err());
    }
}
