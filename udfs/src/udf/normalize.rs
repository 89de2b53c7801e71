//! `normalize(img, mean, std)`: uint8 HWC image → float32 CHW tensor.

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, FieldRef};
use datafusion::error::{DataFusionError, Result};

use super::Function;
use crate::args::{ArgSpec, Call, Consts, Kind, req};
use crate::cost::{Estimate, SampleStats};
use crate::kernels::normalize::{check_stats, normalize_append};
use crate::tensor::{F32Tensor, ImageColumn, expect_image, tensor_field};

/// `(x / 255 - mean) / std` per channel, planar, as torchvision's
/// `ToTensor` + `Normalize`.
#[derive(Debug, Default)]
pub struct Normalize;

/// `[h, w, c]` of an image argument whose size is fixed, or a plan error.
pub(crate) fn fixed_dims(udf: &str, field: &arrow::datatypes::Field) -> Result<[u32; 3]> {
    match expect_image(udf, field)? {
        [Some(h), Some(w), Some(c)] => Ok([h, w, c]),
        _ => Err(DataFusionError::Plan(format!(
            "{udf}: needs images of one fixed size to make a tensor; resize or crop them first, \
             e.g. {udf}(resize(decode_image(data), 224, 224), …)"
        ))),
    }
}

impl Function for Normalize {
    const SPEC: ArgSpec = ArgSpec {
        name: "normalize",
        params: &[
            req("img", Kind::Value),
            req("mean", Kind::Floats),
            req("std", Kind::Floats),
        ],
        random: false,
        keyed: false,
    };

    fn return_field(&self, consts: &Consts, fields: &[FieldRef]) -> Result<FieldRef> {
        let [h, w, c] = fixed_dims(Self::SPEC.name, &fields[0])?;
        if consts.is_known(1) && consts.is_known(2) {
            check_stats(&consts.floats(1)?, &consts.floats(2)?, c as u8)
                .map_err(|e| DataFusionError::Plan(format!("normalize: {e}")))?;
        }
        Ok(tensor_field(Self::SPEC.name, DataType::Float32, &[c, h, w]))
    }

    fn invoke(&self, call: &Call<'_>) -> Result<ArrayRef> {
        let [h, w, c] = fixed_dims(Self::SPEC.name, &call.fields[0])?;
        let (mean, std) = (call.consts.floats(1)?, call.consts.floats(2)?);
        check_stats(&mean, &std, c as u8)
            .map_err(|e| DataFusionError::Execution(format!("normalize: {e}")))?;
        let input = call.array(0)?;
        let images = ImageColumn::new(&input, Self::SPEC.name)?;
        let mut out = F32Tensor::new(call.rows, (h * w * c) as usize);
        for row in 0..call.rows {
            match images.get(row) {
                Some(img) if [img.height, img.width, u32::from(img.channels)] == [h, w, c] => {
                    out.append_pushed(|dst| normalize_append(img, &mean, &std, dst));
                }
                Some(img) => {
                    return Err(DataFusionError::Execution(format!(
                        "normalize: row {row} is {}x{}x{}, not the planned {h}x{w}x{c}",
                        img.height, img.width, img.channels
                    )));
                }
                None => out.append_null(),
            }
        }
        out.finish(call.return_field)
    }

    fn cost(&self, _consts: &Consts, input: &SampleStats) -> Result<Estimate> {
        let elements = input.pixels() * input.channels;
        Ok(Estimate {
            work: elements,
            out: SampleStats {
                bytes: elements * 4.0,
                elements,
                ..*input
            },
        })
    }
}
