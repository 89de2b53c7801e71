//! [`Finish`]: a column computed as its batch is written out, from a
//! column of the rows' sources.
//!
//! A job's last elementwise stage (normalize: uint8 pixels in, float32
//! planes out) makes values four times the size of what it reads, and
//! the rows it makes are copied once more into the trainer's slot in the
//! epoch's order. Run as a [`Finish`] of a [`crate::gather::Gathered`]
//! batch instead, the stage reads the gathered rows' sources (the
//! pipeline's output before it) and writes each row's values straight
//! into the outgoing body — in a shared-memory slot, where the trainer
//! reads them — as a computed [`crate::piece::Piece`]: its values are
//! written once, and no batch of them is made.
//!
//! A finished column is a fixed-size list of a primitive type (a tensor),
//! every row the same number of bytes; a source row that is NULL is a
//! NULL row of zeros. A finish must not fail: whoever defers a stage to
//! one has checked at planning what could (shapes, parameters).

use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::DataType;

/// See the module docs.
pub trait Finish: Send + Sync + std::fmt::Debug {
    /// The bytes of one row's values.
    fn row_bytes(&self) -> usize;

    /// Writes rows `start..start + len` of `source`, in order, into `out`
    /// (`len * row_bytes()` bytes); a NULL row's bytes are zeros.
    fn write(&self, source: &ArrayRef, start: usize, len: usize, out: &mut [u8]);

    /// The stage, as EXPLAIN shows it, over the column named `input`.
    fn describe(&self, input: &str) -> String;
}

/// `(source, first row, rows)`: consecutive rows of one source as one run.
pub type Run = (usize, usize, usize);

/// A finished column's bytes, not made yet: its stage over runs of rows
/// of its sources' column. A computed body piece carries one
/// (`crate::piece`): a value that names its stage
/// ([`Finish::describe`]), made where the body is written.
#[derive(Debug, Clone)]
pub struct Finished {
    stage: Arc<dyn Finish>,
    columns: Vec<ArrayRef>,
    runs: Vec<Run>,
}

impl Finished {
    /// `stage` over the `runs` of `columns` (one per source).
    pub fn new(stage: Arc<dyn Finish>, columns: Vec<ArrayRef>, runs: Vec<Run>) -> Self {
        Self {
            stage,
            columns,
            runs,
        }
    }

    /// Its stage.
    pub fn stage(&self) -> &Arc<dyn Finish> {
        &self.stage
    }

    /// The bytes it makes.
    pub fn len(&self) -> usize {
        self.runs.iter().map(|r| r.2).sum::<usize>() * self.stage.row_bytes()
    }

    /// Whether it makes no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes its rows, one after another, into `out` (of its length).
    pub fn write(&self, out: &mut [u8]) {
        write_runs(self.stage.as_ref(), &self.columns, &self.runs, out);
    }
}

/// Writes the runs' rows of `columns` (one per source), finished by `f`,
/// one after another into `out`.
pub fn write_runs(f: &dyn Finish, columns: &[ArrayRef], runs: &[Run], out: &mut [u8]) {
    let row = f.row_bytes();
    let mut at = 0;
    for &(s, start, len) in runs {
        f.write(&columns[s], start, len, &mut out[at..at + len * row]);
        at += len * row;
    }
}

/// The bytes per row of a column of type `t` when it is a fixed-size list
/// of a primitive type (what a [`Finish`] may make), else `None`.
pub fn fixed_row_bytes(t: &DataType) -> Option<usize> {
    match t {
        DataType::FixedSizeList(item, k) => {
            let w = item.data_type().primitive_width()?;
            Some(w * usize::try_from(*k).ok()?)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::Field;

    use super::*;

    #[test]
    fn only_fixed_lists_of_primitives_have_fixed_rows() {
        let f32s = Arc::new(Field::new_list_field(DataType::Float32, false));
        assert_eq!(fixed_row_bytes(&DataType::FixedSizeList(f32s, 6)), Some(24));
        let strings = Arc::new(Field::new_list_field(DataType::Utf8, false));
        assert_eq!(fixed_row_bytes(&DataType::FixedSizeList(strings, 6)), None);
        assert_eq!(fixed_row_bytes(&DataType::Float32), None);
    }
}
