//! Arrow representations of images, arrays and fixed-shape tensors.
//!
//! See the crate docs for the layouts. This module builds the Arrow types
//! and fields, reads rows back as borrowed views, and builds columns.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, LargeBinaryBuilder, ListBuilder,
    NullBufferBuilder, PrimitiveArray, StringBuilder, StructArray, UInt8Builder, UInt32Builder,
};
use arrow::buffer::{Buffer, NullBuffer, ScalarBuffer};
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Field, FieldRef, Fields, Float32Type, UInt8Type,
};
use datafusion::error::{DataFusionError, Result};

/// Field metadata key of an image or array whose shape is the same on every row.
pub const SHAPE_KEY: &str = "sluice.shape";
/// Arrow's extension name key.
pub const EXTENSION_NAME: &str = "ARROW:extension:name";
/// Arrow's extension metadata key.
pub const EXTENSION_METADATA: &str = "ARROW:extension:metadata";
/// The canonical fixed-shape tensor extension.
pub const FIXED_SHAPE_TENSOR: &str = "arrow.fixed_shape_tensor";

/// The struct fields of an image.
pub fn image_fields() -> Fields {
    Fields::from(vec![
        Field::new("height", DataType::UInt32, false),
        Field::new("width", DataType::UInt32, false),
        Field::new("channels", DataType::UInt8, false),
        Field::new("pixels", DataType::LargeBinary, false),
    ])
}

/// The struct fields of an array.
pub fn array_fields() -> Fields {
    Fields::from(vec![
        Field::new("dtype", DataType::Utf8, false),
        Field::new(
            "shape",
            DataType::List(Arc::new(Field::new_list_field(DataType::UInt32, false))),
            false,
        ),
        Field::new("data", DataType::LargeBinary, false),
    ])
}

/// Dimensions of an image column known when the query is planned:
/// `[height, width, channels]`, each `None` when it varies by row.
pub type ImageDims = [Option<u32>; 3];

/// An image field, recording the dimensions known for every row.
pub fn image_field(name: &str, dims: ImageDims) -> FieldRef {
    let text = dims
        .iter()
        .map(|d| d.map_or("?".to_owned(), |d| d.to_string()))
        .collect::<Vec<_>>()
        .join(",");
    Arc::new(
        Field::new(name, DataType::Struct(image_fields()), true)
            .with_metadata(HashMap::from([(SHAPE_KEY.to_owned(), text)])),
    )
}

/// The dimensions recorded on an image field (all `None` when none are).
pub fn image_dims(field: &Field) -> ImageDims {
    let mut dims = [None; 3];
    if let Some(text) = field.metadata().get(SHAPE_KEY) {
        for (d, t) in dims.iter_mut().zip(text.split(',')) {
            *d = t.parse().ok();
        }
    }
    dims
}

/// Field metadata key of an array column's element type, when fixed.
pub const DTYPE_KEY: &str = "sluice.dtype";

/// An array field, recording the shape and element type when they are the same on every row.
pub fn array_field(name: &str, shape: Option<&[u32]>, dtype: Option<&str>) -> FieldRef {
    let mut meta = HashMap::new();
    if let Some(s) = shape {
        let text = s.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        meta.insert(SHAPE_KEY.to_owned(), text);
    }
    if let Some(d) = dtype {
        meta.insert(DTYPE_KEY.to_owned(), d.to_owned());
    }
    Arc::new(Field::new(name, DataType::Struct(array_fields()), true).with_metadata(meta))
}

/// The shape recorded on an array field, if any.
pub fn array_shape(field: &Field) -> Option<Vec<u32>> {
    let text = field.metadata().get(SHAPE_KEY)?;
    text.split(',').map(|d| d.parse().ok()).collect()
}

/// The element type recorded on an array field, if any.
pub fn array_dtype(field: &Field) -> Option<&str> {
    field.metadata().get(DTYPE_KEY).map(String::as_str)
}

/// Whether `field` is an image struct.
pub fn is_image(field: &Field) -> bool {
    matches!(field.data_type(), DataType::Struct(f) if f == &image_fields())
}

/// Whether `field` is an array struct.
pub fn is_array(field: &Field) -> bool {
    matches!(field.data_type(), DataType::Struct(f) if f == &array_fields())
}

/// A fixed-shape tensor field of `element` values with `shape`.
pub fn tensor_field(name: &str, element: DataType, shape: &[u32]) -> FieldRef {
    let size: u64 = shape.iter().map(|&d| u64::from(d)).product();
    let dt = DataType::FixedSizeList(
        Arc::new(Field::new_list_field(element, false)),
        i32::try_from(size).unwrap_or(i32::MAX),
    );
    let meta = serde_json::json!({ "shape": shape }).to_string();
    Arc::new(Field::new(name, dt, true).with_metadata(HashMap::from([
        (EXTENSION_NAME.to_owned(), FIXED_SHAPE_TENSOR.to_owned()),
        (EXTENSION_METADATA.to_owned(), meta),
    ])))
}

/// The shape of a fixed-shape tensor field.
pub fn tensor_shape(field: &Field) -> Option<Vec<u32>> {
    if field.metadata().get(EXTENSION_NAME)? != FIXED_SHAPE_TENSOR {
        return None;
    }
    let meta: serde_json::Value =
        serde_json::from_str(field.metadata().get(EXTENSION_METADATA)?).ok()?;
    meta.get("shape")?
        .as_array()?
        .iter()
        .map(|d| d.as_u64().and_then(|d| u32::try_from(d).ok()))
        .collect()
}

/// One row of an image column.
#[derive(Debug, Clone, Copy)]
pub struct ImageRef<'a> {
    /// Rows.
    pub height: u32,
    /// Columns.
    pub width: u32,
    /// Interleaved channels.
    pub channels: u8,
    /// `height * width * channels` bytes, row-major.
    pub pixels: &'a [u8],
}

/// A decoded image that owns its pixels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Rows.
    pub height: u32,
    /// Columns.
    pub width: u32,
    /// Interleaved channels.
    pub channels: u8,
    /// `height * width * channels` bytes, row-major.
    pub pixels: Vec<u8>,
}

impl Image {
    /// A borrowed view.
    pub fn view(&self) -> ImageRef<'_> {
        ImageRef {
            height: self.height,
            width: self.width,
            channels: self.channels,
            pixels: &self.pixels,
        }
    }
}

/// Reads an image column's rows.
#[derive(Debug)]
pub struct ImageColumn<'a> {
    array: &'a StructArray,
    heights: &'a [u32],
    widths: &'a [u32],
    channels: &'a [u8],
    pixels: &'a arrow::array::LargeBinaryArray,
}

impl<'a> ImageColumn<'a> {
    /// Views `array`, which must be an image struct.
    pub fn new(array: &'a ArrayRef, udf: &str) -> Result<Self> {
        let Some(s) = array.as_struct_opt() else {
            return Err(not_an(udf, "image", array.data_type()));
        };
        if s.fields() != &image_fields() {
            return Err(not_an(udf, "image", array.data_type()));
        }
        Ok(Self {
            array: s,
            heights: s
                .column(0)
                .as_primitive::<arrow::datatypes::UInt32Type>()
                .values(),
            widths: s
                .column(1)
                .as_primitive::<arrow::datatypes::UInt32Type>()
                .values(),
            channels: s.column(2).as_primitive::<UInt8Type>().values(),
            pixels: s.column(3).as_binary::<i64>(),
        })
    }

    /// The pixels of all rows as one buffer, when no row is NULL and every
    /// row has exactly `size` bytes: then the values buffer already is a
    /// `[rows, size]` tensor and can be shared without a copy.
    pub fn contiguous(&self, size: usize) -> Option<Buffer> {
        if self.array.null_count() > 0 {
            return None;
        }
        let offsets = self.pixels.value_offsets();
        let uniform = offsets
            .windows(2)
            .all(|o| usize::try_from(o[1] - o[0]).ok() == Some(size));
        let start = usize::try_from(offsets[0]).ok()?;
        uniform.then(|| {
            self.pixels
                .values()
                .slice_with_length(start, size * self.array.len())
        })
    }

    /// Row `i`, or `None` when it is NULL.
    pub fn get(&self, i: usize) -> Option<ImageRef<'a>> {
        if self.array.is_null(i) {
            return None;
        }
        Some(ImageRef {
            height: self.heights[i],
            width: self.widths[i],
            channels: self.channels[i],
            pixels: self.pixels.value(i),
        })
    }
}

fn not_an(udf: &str, what: &str, got: &DataType) -> DataFusionError {
    DataFusionError::Plan(format!("{udf}: expected an {what}, got {got}"))
}

/// Builds an image column. Pixels are written straight into the column's
/// values buffer ([`ImageBuilder::try_append_with`]), never staged elsewhere.
#[derive(Debug)]
pub struct ImageBuilder {
    heights: UInt32Builder,
    widths: UInt32Builder,
    channels: UInt8Builder,
    offsets: Vec<i64>,
    values: Vec<u8>,
    nulls: NullBufferBuilder,
}

impl ImageBuilder {
    /// A builder for `rows` rows of about `bytes_per_row` pixels.
    pub fn with_capacity(rows: usize, bytes_per_row: usize) -> Self {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        Self {
            heights: UInt32Builder::with_capacity(rows),
            widths: UInt32Builder::with_capacity(rows),
            channels: UInt8Builder::with_capacity(rows),
            offsets,
            values: Vec::with_capacity(rows.saturating_mul(bytes_per_row)),
            nulls: NullBufferBuilder::new(rows),
        }
    }

    fn push_row(&mut self, h: u32, w: u32, c: u8, valid: bool) {
        self.heights.append_value(h);
        self.widths.append_value(w);
        self.channels.append_value(c);
        self.offsets.push(self.values.len() as i64);
        self.nulls.append(valid);
    }

    /// Appends a copy of an image.
    pub fn append(&mut self, img: ImageRef<'_>) {
        self.values.extend_from_slice(img.pixels);
        self.push_row(img.height, img.width, img.channels, true);
    }

    /// Appends an `h`×`w`×`c` image that `fill` writes in place. When `fill`
    /// fails nothing is appended and its error is returned.
    pub fn try_append_with<E>(
        &mut self,
        h: u32,
        w: u32,
        c: u8,
        fill: impl FnOnce(&mut [u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let start = self.values.len();
        self.values
            .resize(start + h as usize * w as usize * usize::from(c), 0);
        if let Err(e) = fill(&mut self.values[start..]) {
            self.values.truncate(start);
            return Err(e);
        }
        self.push_row(h, w, c, true);
        Ok(())
    }

    /// Appends a NULL.
    pub fn append_null(&mut self) {
        self.push_row(0, 0, 0, false);
    }

    /// The column.
    pub fn finish(mut self) -> ArrayRef {
        let pixels = arrow::array::LargeBinaryArray::new(
            arrow::buffer::OffsetBuffer::new(ScalarBuffer::from(self.offsets)),
            Buffer::from_vec(self.values),
            None,
        );
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.heights.finish()),
            Arc::new(self.widths.finish()),
            Arc::new(self.channels.finish()),
            Arc::new(pixels),
        ];
        Arc::new(StructArray::new(
            image_fields(),
            columns,
            self.nulls.finish(),
        ))
    }
}

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

/// The bytes of row `i` of a binary column as an owned, reference-counted
/// Arrow buffer, for readers that need `'static` data: a slice of the
/// column's buffer (no copy) for Binary and LargeBinary, a copy for
/// BinaryView. `None` when the row is NULL.
pub fn binary_buffer(array: &ArrayRef, i: usize) -> Option<Buffer> {
    if array.is_null(i) {
        return None;
    }
    match array.data_type() {
        DataType::Binary => {
            let a = array.as_binary::<i32>();
            let (s, e) = (a.value_offsets()[i], a.value_offsets()[i + 1]);
            Some(a.values().slice_with_length(s as usize, (e - s) as usize))
        }
        DataType::LargeBinary => {
            let a = array.as_binary::<i64>();
            let (s, e) = (a.value_offsets()[i], a.value_offsets()[i + 1]);
            Some(a.values().slice_with_length(s as usize, (e - s) as usize))
        }
        _ => binary_value(array, i).map(Buffer::from_slice_ref),
    }
}

/// Row `i` of a binary column (Binary, LargeBinary or BinaryView), or `None` when NULL.
pub fn binary_value(array: &ArrayRef, i: usize) -> Option<&[u8]> {
    if array.is_null(i) {
        return None;
    }
    Some(match array.data_type() {
        DataType::Binary => array.as_binary::<i32>().value(i),
        DataType::LargeBinary => array.as_binary::<i64>().value(i),
        DataType::BinaryView => array.as_binary_view().value(i),
        _ => return None,
    })
}

/// Checks that `field` holds encoded bytes.
pub fn expect_binary(udf: &str, field: &Field) -> Result<()> {
    match field.data_type() {
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::Null => Ok(()),
        other => Err(DataFusionError::Plan(format!(
            "{udf}: expected the encoded bytes (a binary column such as `data`), got {other}"
        ))),
    }
}

/// Checks that `field` is an image; returns its known dimensions.
pub fn expect_image(udf: &str, field: &Field) -> Result<ImageDims> {
    if is_image(field) {
        Ok(image_dims(field))
    } else {
        Err(DataFusionError::Plan(format!(
            "{udf}: expected an image (from decode_image), got {}",
            field.data_type()
        )))
    }
}

/// Checks that `field` is an array.
pub fn expect_array(udf: &str, field: &Field) -> Result<()> {
    if is_array(field) {
        Ok(())
    } else {
        Err(DataFusionError::Plan(format!(
            "{udf}: expected an array (from npy or npz), got {}",
            field.data_type()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_sized_images_are_already_a_tensor() {
        let mut b = ImageBuilder::with_capacity(3, 12);
        for v in 0..3u8 {
            b.append(ImageRef {
                height: 2,
                width: 2,
                channels: 3,
                pixels: &[v; 12],
            });
        }
        let col = b.finish();
        let images = ImageColumn::new(&col, "t").unwrap();
        let shared = images.contiguous(12).unwrap();
        let pixels = col
            .as_struct()
            .column(3)
            .as_binary::<i64>()
            .values()
            .as_ptr();
        assert_eq!(shared.as_ptr(), pixels);
        assert_eq!(shared.len(), 36);
        assert!(images.contiguous(11).is_none());
        // A NULL row (or a failed fill) breaks the layout: no sharing.
        let mut b = ImageBuilder::with_capacity(2, 12);
        b.append(ImageRef {
            height: 2,
            width: 2,
            channels: 3,
            pixels: &[1; 12],
        });
        assert!(b.try_append_with(2, 2, 3, |_| Err("bad")).is_err());
        b.append_null();
        let col = b.finish();
        let images = ImageColumn::new(&col, "t").unwrap();
        assert!(images.contiguous(12).is_none());
        assert_eq!(images.get(0).unwrap().pixels, &[1; 12]);
        assert!(images.get(1).is_none());
    }

    #[test]
    fn arrays_of_one_type_and_shape_are_already_a_tensor() {
        let floats = |r: u8| -> Vec<u8> {
            (0..6)
                .flat_map(|i| f32::from(r * 10 + i).to_le_bytes())
                .collect()
        };
        let mut b = ArrayBuilder::new(3);
        for r in 0..3 {
            b.append("float32", &[2, 3], &floats(r));
        }
        let col = b.finish();
        let arrays = ArrayColumn::new(&col, "t").unwrap();
        let shared = arrays.contiguous("float32", &[2, 3], 24).unwrap();
        let data = col
            .as_struct()
            .column(2)
            .as_binary::<i64>()
            .values()
            .as_ptr();
        assert_eq!(shared.as_ptr(), data);
        assert_eq!(shared.len(), 72);
        // Another type, shape or size: no sharing.
        assert!(arrays.contiguous("uint8", &[2, 3], 24).is_none());
        assert!(arrays.contiguous("float32", &[3, 2], 24).is_none());
        assert!(arrays.contiguous("float32", &[2, 3], 20).is_none());
        let field = Field::new(
            "t",
            DataType::FixedSizeList(Arc::new(Field::new_list_field(DataType::Float32, false)), 6),
            true,
        );
        let t = tensor_from_buffer::<Float32Type>(&field, shared.clone())
            .unwrap()
            .unwrap();
        let values = t
            .as_fixed_size_list()
            .values()
            .as_primitive::<Float32Type>()
            .clone();
        assert_eq!(values.values()[7], 11.0);
        assert_eq!(values.values().inner().as_ptr(), data);
        // A buffer not aligned for floats is refused: the caller copies.
        let odd = shared.slice_with_length(1, 24);
        assert!(
            tensor_from_buffer::<Float32Type>(&field, odd)
                .unwrap()
                .is_none()
        );
        // A NULL row breaks the layout.
        let mut b = ArrayBuilder::new(2);
        b.append("float32", &[2, 3], &floats(0));
        b.append_null();
        let col = b.finish();
        let arrays = ArrayColumn::new(&col, "t").unwrap();
        assert!(arrays.contiguous("float32", &[2, 3], 24).is_none());
    }
}
