//! What a function's arguments hold, row by row, measured without
//! expanding a scalar into an array: integers, byte lengths, short texts
//! and strings. The size bounds of [`crate::bounded`] and of the `||`
//! operator ([`crate::concat_operator`]) are computed from these.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Int64Type};
use datafusion::error::Result;
use datafusion::logical_expr::ColumnarValue;

/// Argument `i` as integers, one per row (NULL and missing as 0).
pub(crate) fn ints(args: &[ColumnarValue], i: usize, rows: usize) -> Result<Vec<i64>> {
    let Some(a) = args.get(i) else {
        return Ok(vec![0; rows]);
    };
    let a = a.to_array(rows)?;
    let a = arrow::compute::cast(&a, &DataType::Int64)?;
    let a = a.as_primitive::<Int64Type>();
    Ok((0..rows)
        .map(|r| if a.is_null(r) { 0 } else { a.value(r) })
        .collect())
}

/// Bytes of argument `i`'s value in each row (its memory share for
/// non-strings; 0 when missing or NULL). A scalar is measured once, never
/// repeated into an array.
pub(crate) fn byte_lens(args: &[ColumnarValue], i: usize, rows: usize) -> Result<Vec<u64>> {
    let Some(arg) = args.get(i) else {
        return Ok(vec![0; rows]);
    };
    let a: ArrayRef = match arg {
        ColumnarValue::Array(a) => Arc::clone(a),
        ColumnarValue::Scalar(v) => {
            let one = byte_lens(&[ColumnarValue::Array(v.to_array_of_size(1)?)], 0, 1)?;
            return Ok(vec![one[0]; rows]);
        }
    };
    let len = |r: usize, n: usize| if a.is_null(r) { 0 } else { n as u64 };
    Ok(match a.data_type() {
        DataType::Utf8 => {
            let s = a.as_string::<i32>();
            (0..rows)
                .map(|r| len(r, s.value_length(r) as usize))
                .collect()
        }
        DataType::LargeUtf8 => {
            let s = a.as_string::<i64>();
            (0..rows)
                .map(|r| len(r, s.value_length(r) as usize))
                .collect()
        }
        DataType::Utf8View => {
            let s = a.as_string_view();
            (0..rows).map(|r| len(r, s.value(r).len())).collect()
        }
        DataType::Binary => {
            let b = a.as_binary::<i32>();
            (0..rows)
                .map(|r| len(r, b.value_length(r) as usize))
                .collect()
        }
        DataType::LargeBinary => {
            let b = a.as_binary::<i64>();
            (0..rows)
                .map(|r| len(r, b.value_length(r) as usize))
                .collect()
        }
        DataType::BinaryView => {
            let b = a.as_binary_view();
            (0..rows).map(|r| len(r, b.value(r).len())).collect()
        }
        DataType::FixedSizeBinary(n) => (0..rows).map(|r| len(r, *n as usize)).collect(),
        t => {
            let each = t
                .primitive_width()
                .unwrap_or_else(|| a.get_array_memory_size() / rows.max(1))
                .max(1);
            (0..rows).map(|r| len(r, each)).collect()
        }
    })
}

/// Argument `i` as text, one per row (NULL and missing as empty); only
/// for short arguments such as a replacement.
pub(crate) fn texts(args: &[ColumnarValue], i: usize, rows: usize) -> Result<Vec<String>> {
    let Some(arg) = args.get(i) else {
        return Ok(vec![String::new(); rows]);
    };
    if let ColumnarValue::Scalar(v) = arg {
        let one = texts(&[ColumnarValue::Array(v.to_array_of_size(1)?)], 0, 1)?;
        return Ok(vec![one[0].clone(); rows]);
    }
    let a = arg.to_array(rows)?;
    let a = arrow::compute::cast(&a, &DataType::Utf8)?;
    let s = a.as_string::<i32>();
    Ok((0..rows)
        .map(|r| {
            if s.is_null(r) {
                String::new()
            } else {
                s.value(r).to_owned()
            }
        })
        .collect())
}

/// Argument `i`'s string values, a scalar measured once rather than
/// repeated into an array.
pub(crate) enum Strs {
    One(Option<String>),
    Many(arrow::array::StringViewArray),
}

impl Strs {
    pub(crate) fn new(args: &[ColumnarValue], i: usize) -> Result<Self> {
        let view = |a: &ArrayRef| -> Result<arrow::array::StringViewArray> {
            Ok(arrow::compute::cast(a, &DataType::Utf8View)?
                .as_string_view()
                .clone())
        };
        Ok(match args.get(i) {
            None => Self::One(None),
            Some(ColumnarValue::Scalar(v)) => {
                let one = view(&v.to_array_of_size(1)?)?;
                Self::One((!one.is_null(0)).then(|| one.value(0).to_owned()))
            }
            Some(ColumnarValue::Array(a)) => Self::Many(view(a)?),
        })
    }

    pub(crate) fn get(&self, row: usize) -> Option<&str> {
        match self {
            Self::One(v) => v.as_deref(),
            Self::Many(a) => (!a.is_null(row)).then(|| a.value(row)),
        }
    }
}

/// The sum of `row_bytes` over a batch's rows, computed once when every
/// argument is a scalar (each row is the same).
pub(crate) fn sum_rows(
    args: &[ColumnarValue],
    rows: usize,
    mut row_bytes: impl FnMut(usize) -> u64,
) -> u64 {
    if args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_))) {
        row_bytes(0).saturating_mul(rows.max(1) as u64)
    } else {
        (0..rows).fold(0u64, |t, r| t.saturating_add(row_bytes(r)))
    }
}
