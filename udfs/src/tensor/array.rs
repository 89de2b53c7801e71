//! Array columns (NumPy arrays of any dtype and shape): a row read back as
//! an [`ArrayRefView`] through [`ArrayColumn`], and built by
//! [`ArrayBuilder`].

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, LargeBinaryBuilder, ListBuilder, NullBufferBuilder, StringBuilder,
    StructArray, UInt32Builder,
};
use arrow::buffer::Buffer;
use arrow::datatypes::{DataType, Field};
use datafusion::error::Result;

use super::{array_fields, not_an};

/// One row of an array column.
#[derive(Debug, Clone)]
pub struct ArrayRefView<'a> {
    /// NumPy dtype name.
    pub dtype: &'a str,
    /// Dimensions.
    pub shape: Vec<u32>,
    /// Little-endian, C-order elements.
    pub data: &'a [u8],
}

/// Reads an array column's rows.
#[derive(Debug)]
pub struct ArrayColumn<'a> {
    array: &'a StructArray,
    dtypes: &'a arrow::array::StringArray,
    shapes: &'a arrow::array::ListArray,
    data: &'a arrow::array::LargeBinaryArray,
}

impl<'a> ArrayColumn<'a> {
    /// Views `array`, which must be an array struct.
    pub fn new(array: &'a ArrayRef, udf: &str) -> Result<Self> {
        let Some(s) = array.as_struct_opt() else {
            return Err(not_an(udf, "array", array.data_type()));
        };
        if s.fields() != &array_fields() {
            return Err(not_an(udf, "array", array.data_type()));
        }
        Ok(Self {
            array: s,
            dtypes: s.column(0).as_string::<i32>(),
            shapes: s.column(1).as_list::<i32>(),
            data: s.column(2).as_binary::<i64>(),
        })
    }

    /// The data of all rows as one buffer, when no row is NULL and every
    /// row is a `dtype` array of `shape` (`bytes` bytes): then the data
    /// buffer already is a `[rows, shape…]` tensor and can be shared
    /// without a copy.
    pub fn contiguous(&self, dtype: &str, shape: &[u32], bytes: usize) -> Option<Buffer> {
        if self.array.null_count() > 0 {
            return None;
        }
        let same = (0..self.array.len()).all(|i| {
            let s = self.shapes.value(i);
            self.dtypes.value(i) == dtype
                && s.as_primitive::<arrow::datatypes::UInt32Type>().values() == shape
        });
        let offsets = self.data.value_offsets();
        let uniform = offsets
            .windows(2)
            .all(|o| usize::try_from(o[1] - o[0]).ok() == Some(bytes));
        let start = usize::try_from(offsets[0]).ok()?;
        (same && uniform).then(|| {
            self.data
                .values()
                .slice_with_length(start, bytes * self.array.len())
        })
    }

    /// Its number of rows.
    pub fn len(&self) -> usize {
        self.array.len()
    }

    /// Whether it has no rows.
    pub fn is_empty(&self) -> bool {
        self.array.is_empty()
    }

    /// Row `i`, or `None` when it is NULL.
    pub fn get(&self, i: usize) -> Option<ArrayRefView<'a>> {
        if self.array.is_null(i) {
            return None;
        }
        let shape = self.shapes.value(i);
        Some(ArrayRefView {
            dtype: self.dtypes.value(i),
            shape: shape
                .as_primitive::<arrow::datatypes::UInt32Type>()
                .values()
                .to_vec(),
            data: self.data.value(i),
        })
    }
}

/// Builds an array column.
#[derive(Debug)]
pub struct ArrayBuilder {
    dtypes: StringBuilder,
    shapes: ListBuilder<UInt32Builder>,
    data: LargeBinaryBuilder,
    nulls: NullBufferBuilder,
}

impl ArrayBuilder {
    /// A builder for `rows` rows.
    pub fn new(rows: usize) -> Self {
        Self {
            dtypes: StringBuilder::new(),
            shapes: ListBuilder::new(UInt32Builder::new())
                .with_field(Arc::new(Field::new_list_field(DataType::UInt32, false))),
            data: LargeBinaryBuilder::new(),
            nulls: NullBufferBuilder::new(rows),
        }
    }

    /// Appends an array.
    pub fn append(&mut self, dtype: &str, shape: &[u32], data: &[u8]) {
        self.dtypes.append_value(dtype);
        self.shapes.values().append_slice(shape);
        self.shapes.append(true);
        self.data.append_value(data);
        self.nulls.append_non_null();
    }

    /// Appends a NULL.
    pub fn append_null(&mut self) {
        self.dtypes.append_value("");
        self.shapes.append(true);
        self.data.append_value([]);
        self.nulls.append_null();
    }

    /// The column.
    pub fn finish(mut self) -> ArrayRef {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.dtypes.finish()),
            Arc::new(self.shapes.finish()),
            Arc::new(self.data.finish()),
        ];
        Arc::new(StructArray::new(
            array_fields(),
            columns,
            self.nulls.finish(),
        ))
    }
}
