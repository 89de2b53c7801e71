//! Fixed-shape tensor columns (`arrow.fixed_shape_tensor`): built row by
//! row by [`TensorBuilder`], or over a buffer already filled
//! ([`tensor_from_buffer`]).

use std::sync::Arc;

use arrow::array::{ArrayRef, FixedSizeListArray, NullBufferBuilder, PrimitiveArray};
use arrow::buffer::{Buffer, NullBuffer, ScalarBuffer};
use arrow::datatypes::{ArrowPrimitiveType, DataType, Field, Float32Type, UInt8Type};
use datafusion::error::{DataFusionError, Result};

/// Builds a fixed-shape tensor column of `T` with `size` elements a row.
#[derive(Debug)]
pub struct TensorBuilder<T: ArrowPrimitiveType> {
    values: Vec<T::Native>,
    size: usize,
    nulls: NullBufferBuilder,
}

impl<T: ArrowPrimitiveType> TensorBuilder<T> {
    /// A builder for `rows` rows of `size` elements.
    pub fn new(rows: usize, size: usize) -> Self {
        Self {
            values: Vec::with_capacity(rows.saturating_mul(size)),
            size,
            nulls: NullBufferBuilder::new(rows),
        }
    }

    /// Appends a row written in place by `fill`.
    pub fn append_with(&mut self, fill: impl FnOnce(&mut [T::Native])) {
        let start = self.values.len();
        self.values.resize(start + self.size, T::Native::default());
        fill(&mut self.values[start..]);
        self.nulls.append_non_null();
    }

    /// Appends a row that `fill` pushes onto the values (exactly `size`
    /// of them): unlike [`TensorBuilder::append_with`], nothing is zeroed
    /// before the row is written.
    pub fn append_pushed(&mut self, fill: impl FnOnce(&mut Vec<T::Native>)) {
        let start = self.values.len();
        fill(&mut self.values);
        assert_eq!(
            self.values.len() - start,
            self.size,
            "a tensor row of the wrong size"
        );
        self.nulls.append_non_null();
    }

    /// Appends a row that `fill` writes in place; when `fill` fails nothing
    /// is appended and its error is returned.
    pub fn try_append_with<E>(
        &mut self,
        fill: impl FnOnce(&mut [T::Native]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let start = self.values.len();
        self.values.resize(start + self.size, T::Native::default());
        if let Err(e) = fill(&mut self.values[start..]) {
            self.values.truncate(start);
            return Err(e);
        }
        self.nulls.append_non_null();
        Ok(())
    }

    /// Appends a NULL (zeros underneath).
    pub fn append_null(&mut self) {
        self.values
            .resize(self.values.len() + self.size, T::Native::default());
        self.nulls.append_null();
    }

    /// The column, typed as `field` (a tensor field from [`tensor_field`]).
    pub fn finish(mut self, field: &Field) -> Result<ArrayRef> {
        let DataType::FixedSizeList(item, size) = field.data_type() else {
            return Err(DataFusionError::Internal(format!(
                "tensor field of type {}",
                field.data_type()
            )));
        };
        let values = PrimitiveArray::<T>::new(ScalarBuffer::from(self.values), None);
        let nulls: Option<NullBuffer> = self.nulls.finish();
        Ok(Arc::new(FixedSizeListArray::try_new(
            Arc::clone(item),
            *size,
            Arc::new(values),
            nulls,
        )?))
    }
}

/// A uint8 tensor column typed as `field` over `values` (`rows * size` bytes), without a copy.
pub fn u8_tensor_from_buffer(field: &Field, values: Buffer) -> Result<ArrayRef> {
    // Bytes need no alignment: this is always a tensor.
    tensor_from_buffer::<UInt8Type>(field, values)?
        .ok_or_else(|| DataFusionError::Internal("a byte tensor was refused its buffer".into()))
}

/// A tensor column of `T` typed as `field` over `values` (`rows * size`
/// native-endian elements), without a copy; `None` when `values` is not
/// aligned for `T` (the caller copies instead).
pub fn tensor_from_buffer<T: ArrowPrimitiveType>(
    field: &Field,
    values: Buffer,
) -> Result<Option<ArrayRef>> {
    let DataType::FixedSizeList(item, size) = field.data_type() else {
        return Err(DataFusionError::Internal(format!(
            "tensor field of type {}",
            field.data_type()
        )));
    };
    let width = std::mem::size_of::<T::Native>();
    if values.as_ptr().align_offset(width) != 0 || !values.len().is_multiple_of(width) {
        return Ok(None);
    }
    let elements = values.len() / width;
    let values = PrimitiveArray::<T>::new(ScalarBuffer::new(values, 0, elements), None);
    Ok(Some(Arc::new(FixedSizeListArray::try_new(
        Arc::clone(item),
        *size,
        Arc::new(values),
        None,
    )?)))
}

/// uint8 tensor builder.
pub type U8Tensor = TensorBuilder<UInt8Type>;
/// float32 tensor builder.
pub type F32Tensor = TensorBuilder<Float32Type>;
