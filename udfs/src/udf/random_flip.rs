//! `random_horizontal_flip(img[, p])`: mirror with probability p, drawn from (seed, epoch, key).

use arrow::array::ArrayRef;
use arrow::datatypes::FieldRef;
use datafusion::error::{DataFusionError, Result};

use super::{Function, map_images};
use crate::args::{ArgSpec, Call, Consts, Kind, Lit, opt, req};
use crate::cost::{Estimate, SampleStats};
use crate::kernels::flip::flip_horizontal_into;
use crate::tensor::{expect_image, image_field};

/// torchvision's `RandomHorizontalFlip`.
#[derive(Debug, Default)]
pub struct RandomHorizontalFlip;

fn probability(consts: &Consts) -> Result<f64> {
    let p = consts.float(1)?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(DataFusionError::Plan(format!(
            "random_horizontal_flip: p must be in [0, 1], got {p}"
        )))
    }
}

impl Function for RandomHorizontalFlip {
    const SPEC: ArgSpec = ArgSpec {
        name: "random_horizontal_flip",
        params: &[
            req("img", Kind::Value),
            opt("p", Kind::Float, Lit::Float(0.5)),
        ],
        random: true,
        keyed: true,
    };

    fn return_field(&self, consts: &Consts, fields: &[FieldRef]) -> Result<FieldRef> {
        let dims = expect_image(Self::SPEC.name, &fields[0])?;
        probability(consts)?;
        Ok(image_field(Self::SPEC.name, dims))
    }

    fn invoke(&self, call: &Call<'_>) -> Result<ArrayRef> {
        let p = probability(&call.consts)?;
        let flips = (0..call.rows)
            .map(|r| Ok(call.rng(r)?.unit() < p))
            .collect::<Result<Vec<bool>>>()?;
        map_images(
            call,
            |img| (img.height, img.width),
            |row, img, out| {
                if flips[row] {
                    flip_horizontal_into(img, out);
                } else {
                    out.copy_from_slice(img.pixels);
                }
                Ok(())
            },
        )
    }

    fn cost(&self, _consts: &Consts, input: &SampleStats) -> Result<Estimate> {
        Ok(Estimate {
            work: input.bytes,
            out: *input,
        })
    }
}
