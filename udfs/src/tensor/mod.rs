//! Arrow representations of images, arrays and fixed-shape tensors.
//!
//! See the crate docs for the layouts. This module builds the Arrow types
//! and fields and checks a UDF's argument against them; its files read
//! rows back as borrowed views and build columns:
//!
//! - `image`: image columns (`ImageColumn`, `ImageBuilder`);
//! - `array`: array columns (`ArrayColumn`, `ArrayBuilder`);
//! - `fixed`: fixed-shape tensor columns (`TensorBuilder`).

mod array;
mod fixed;
mod image;

pub use array::{ArrayBuilder, ArrayColumn, ArrayRefView};
pub use fixed::{F32Tensor, TensorBuilder, U8Tensor, tensor_from_buffer, u8_tensor_from_buffer};
pub use image::{Image, ImageBuilder, ImageColumn, ImageRef};

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::buffer::Buffer;
use arrow::datatypes::{DataType, Field, FieldRef, Fields};
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

pub(super) fn not_an(udf: &str, what: &str, got: &DataType) -> DataFusionError {
    DataFusionError::Plan(format!("{udf}: expected an {what}, got {got}"))
}

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
    use arrow::datatypes::Float32Type;

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
