//! `normalize(img, mean, std)`: uint8 HWC image → float32 CHW tensor.

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, FieldRef};
use datafusion::common::DFSchema;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, ExprSchemable};

use super::Function;
use crate::args::{ArgSpec, Call, Consts, Kind, req};
use crate::cost::{Estimate, SampleStats};
use crate::kernels::normalize::{check_stats, normalize_append, normalize_into};
use crate::tensor::{F32Tensor, ImageColumn, ImageRef, expect_image, tensor_field};

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
        let dims = fixed_dims(Self::SPEC.name, &call.fields[0])?;
        let how = NormalizeRows::new(call.consts.floats(1)?, call.consts.floats(2)?, dims)
            .map_err(|e| DataFusionError::Execution(format!("normalize: {e}")))?;
        let input = call.array(0)?;
        let images = ImageColumn::new(&input, Self::SPEC.name)?;
        let mut out = F32Tensor::new(call.rows, how.row_elements());
        for row in 0..call.rows {
            match images.get(row) {
                Some(img) => {
                    how.fits(row, img).map_err(DataFusionError::Execution)?;
                    out.append_pushed(|dst| normalize_append(img, &how.mean, &how.std, dst));
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

/// A `normalize` call that can run where its rows are written out rather
/// than as a stage of the plan (see `sluice_flight::finish`): its
/// parameters are literals that fit its input, an image of one fixed
/// size, so no row of it can fail.
#[derive(Debug, Clone, PartialEq)]
pub struct NormalizeRows {
    mean: Vec<f64>,
    std: Vec<f64>,
    /// `[h, w, c]` of every input row.
    dims: [u32; 3],
}

impl NormalizeRows {
    /// Statistics `mean` and `std` for images of `dims` (`[h, w, c]`), or
    /// why they do not fit.
    pub fn new(mean: Vec<f64>, std: Vec<f64>, dims: [u32; 3]) -> Result<Self, String> {
        let channels = u8::try_from(dims[2]).map_err(|_| format!("{} channels", dims[2]))?;
        check_stats(&mean, &std, channels)?;
        Ok(Self { mean, std, dims })
    }

    /// The call `expr` (an alias of it too) when it is a `normalize` that
    /// can be deferred, its input typed by `schema`: the input, and how.
    pub fn of(expr: &Expr, schema: &DFSchema) -> Option<(Expr, Self)> {
        let Expr::ScalarFunction(f) = expr.clone().unalias_nested().data else {
            return None;
        };
        let inner: &dyn std::any::Any = f.func.inner().as_ref();
        inner.downcast_ref::<super::Udf<Normalize>>()?;
        let [img, mean, std] = f.args.as_slice() else {
            return None;
        };
        let literal = |e: &Expr| match e {
            Expr::Literal(v, _) => Some(v.clone()),
            _ => None,
        };
        let consts = Consts::from_values(Normalize::SPEC, vec![None, literal(mean), literal(std)]);
        let (_, field) = img.to_field(schema).ok()?;
        let dims = fixed_dims(Normalize::SPEC.name, &field).ok()?;
        let how = Self::new(consts.floats(1).ok()?, consts.floats(2).ok()?, dims).ok()?;
        Some((img.clone(), how))
    }

    /// The call, as EXPLAIN shows it: `normalize(<input>, mean, std)`.
    pub fn describe(&self, input: &str) -> String {
        format!("normalize({input}, {:?}, {:?})", self.mean, self.std)
    }

    /// The elements of one output row.
    pub fn row_elements(&self) -> usize {
        self.dims.iter().map(|&d| d as usize).product()
    }

    /// Whether image `img` (row `row`) has the planned size.
    pub fn fits(&self, row: usize, img: ImageRef<'_>) -> Result<(), String> {
        let [h, w, c] = self.dims;
        if [img.height, img.width, u32::from(img.channels)] == self.dims {
            return Ok(());
        }
        Err(format!(
            "normalize: row {row} is {}x{}x{}, not the planned {h}x{w}x{c}",
            img.height, img.width, img.channels
        ))
    }

    /// Normalizes rows `start..start + len` of the image column `input`
    /// into `out` (`len` rows of [`NormalizeRows::row_elements`]); a NULL
    /// row is zeros.
    pub fn write(&self, input: &ArrayRef, start: usize, len: usize, out: &mut [f32]) {
        let images = match ImageColumn::new(input, Normalize::SPEC.name) {
            Ok(images) => Some(images),
            Err(e) => {
                // `of` planned an image column: this is a bug, not data.
                tracing::error!("normalize: deferred over a column that is not an image: {e}");
                None
            }
        };
        for (row, dst) in (start..start + len).zip(out.chunks_exact_mut(self.row_elements())) {
            match images.as_ref().and_then(|i| i.get(row)) {
                Some(img) => match self.fits(row, img) {
                    Ok(()) => normalize_into(img, &self.mean, &self.std, dst),
                    Err(e) => {
                        tracing::error!("{e}; written as zeros");
                        dst.fill(0.0);
                    }
                },
                None => dst.fill(0.0),
            }
        }
    }
}
