//! `to_tensor(img)` → uint8 [H, W, C]; `to_tensor(arr[, dtype])` → tensor of the array's shape.

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, FieldRef, Float32Type, UInt8Type};
use datafusion::error::{DataFusionError, Result};

use super::Function;
use super::normalize::fixed_dims;
use crate::args::{ArgSpec, Call, Consts, Kind, Lit, opt, req};
use crate::cost::{Estimate, SampleStats};
use crate::kernels::npy::DType;
use crate::tensor::{
    ArrayColumn, ImageColumn, TensorBuilder, array_dtype, array_shape, is_image, tensor_field,
    tensor_from_buffer, u8_tensor_from_buffer,
};

/// Fixed-shape tensors (`arrow.fixed_shape_tensor`) from images or arrays.
#[derive(Debug, Default)]
pub struct ToTensor;

/// What a call makes: element type and shape.
fn plan(consts: &Consts, field: &arrow::datatypes::Field) -> Result<(DType, Vec<u32>)> {
    let name = ToTensor::SPEC.name;
    if is_image(field) {
        let [h, w, c] = fixed_dims(name, field)?;
        let requested = consts.str(1)?;
        if !matches!(requested.as_str(), "" | "uint8") {
            return Err(DataFusionError::Plan(format!(
                "{name}: an image becomes a uint8 tensor, not '{requested}' \
                 (normalize makes float32)"
            )));
        }
        return Ok((DType::U8, vec![h, w, c]));
    }
    crate::tensor::expect_array(name, field).map_err(|_| {
        DataFusionError::Plan(format!(
            "{name}: expected an image or an array, got {}",
            field.data_type()
        ))
    })?;
    let shape = array_shape(field).ok_or_else(|| {
        DataFusionError::Plan(format!(
            "{name}: needs arrays of one fixed shape; use resize3d or crop3d first"
        ))
    })?;
    let requested = consts.str(1)?;
    let dtype = match (requested.as_str(), array_dtype(field)) {
        ("", Some(d)) => d.to_owned(),
        ("", None) => {
            return Err(DataFusionError::Plan(format!(
                "{name}: the array's element type varies; give one, e.g. {name}(arr, 'float32')"
            )));
        }
        (d, _) => d.to_owned(),
    };
    match DType::from_name(&dtype) {
        Some(d @ (DType::U8 | DType::F32)) => Ok((d, shape)),
        _ => Err(DataFusionError::Plan(format!(
            "{name}: tensors are made as uint8 or float32, not '{dtype}'"
        ))),
    }
}

impl Function for ToTensor {
    const SPEC: ArgSpec = ArgSpec {
        name: "to_tensor",
        params: &[req("x", Kind::Value), opt("dtype", Kind::Str, Lit::Str(""))],
        random: false,
        keyed: false,
    };

    fn return_field(&self, consts: &Consts, fields: &[FieldRef]) -> Result<FieldRef> {
        let (dtype, shape) = plan(consts, &fields[0])?;
        let element = if dtype == DType::U8 {
            DataType::UInt8
        } else {
            DataType::Float32
        };
        Ok(tensor_field(Self::SPEC.name, element, &shape))
    }

    fn invoke(&self, call: &Call<'_>) -> Result<ArrayRef> {
        let (dtype, shape) = plan(&call.consts, &call.fields[0])?;
        let size: usize = shape.iter().map(|&d| d as usize).product();
        let input = call.array(0)?;
        let mismatch = |row: usize, got: String| {
            DataFusionError::Execution(format!(
                "to_tensor: row {row} is {got}, not the planned {shape:?}"
            ))
        };
        if is_image(&call.fields[0]) {
            let images = ImageColumn::new(&input, Self::SPEC.name)?;
            if let Some(pixels) = images.contiguous(size) {
                return u8_tensor_from_buffer(call.return_field, pixels);
            }
            let mut out = TensorBuilder::<UInt8Type>::new(call.rows, size);
            for row in 0..call.rows {
                match images.get(row) {
                    Some(img) if img.pixels.len() == size => {
                        out.append_with(|d| d.copy_from_slice(img.pixels))
                    }
                    Some(img) => {
                        return Err(mismatch(
                            row,
                            format!("{}x{}x{}", img.height, img.width, img.channels),
                        ));
                    }
                    None => out.append_null(),
                }
            }
            return out.finish(call.return_field);
        }
        let arrays = ArrayColumn::new(&input, Self::SPEC.name)?;
        // Arrays already of the tensor's element type and shape, one after
        // another in the data buffer (what `npy` makes of such files): the
        // buffer is the tensor, shared (the values are little-endian).
        if cfg!(target_endian = "little")
            && let Some(values) = arrays.contiguous(dtype.name(), &shape, size * dtype.size())
        {
            let shared = match dtype {
                DType::U8 => tensor_from_buffer::<UInt8Type>(call.return_field, values)?,
                _ => tensor_from_buffer::<Float32Type>(call.return_field, values)?,
            };
            if let Some(tensor) = shared {
                return Ok(tensor);
            }
        }
        let mut u8s = TensorBuilder::<UInt8Type>::new(call.rows, size);
        let mut f32s = TensorBuilder::<Float32Type>::new(call.rows, size);
        for row in 0..call.rows {
            let Some(a) = arrays.get(row) else {
                u8s.append_null();
                f32s.append_null();
                continue;
            };
            if a.shape != shape {
                return Err(mismatch(row, format!("{:?}", a.shape)));
            }
            let src = DType::from_name(a.dtype).ok_or_else(|| {
                DataFusionError::Execution(format!("to_tensor: unknown dtype '{}'", a.dtype))
            })?;
            match dtype {
                // Same element type: a straight copy (the values are
                // little-endian in both).
                DType::U8 if src == DType::U8 => u8s.append_with(|d| {
                    let n = d.len().min(a.data.len());
                    d[..n].copy_from_slice(&a.data[..n]);
                }),
                DType::F32 if src == DType::F32 => f32s.append_with(|d| {
                    for (v, b) in d.iter_mut().zip(a.data.chunks_exact(4)) {
                        *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    }
                }),
                DType::U8 => u8s.append_with(|d| {
                    for (i, v) in d.iter_mut().enumerate() {
                        *v = src.get_f32(a.data, i).round().clamp(0.0, 255.0) as u8;
                    }
                }),
                _ => f32s.append_with(|d| {
                    for (i, v) in d.iter_mut().enumerate() {
                        *v = src.get_f32(a.data, i);
                    }
                }),
            }
        }
        match dtype {
            DType::U8 => u8s.finish(call.return_field),
            _ => f32s.finish(call.return_field),
        }
    }

    fn cost(&self, _consts: &Consts, input: &SampleStats) -> Result<Estimate> {
        Ok(Estimate {
            work: input.bytes,
            out: *input,
        })
    }
}
