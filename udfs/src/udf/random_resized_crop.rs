//! `random_resized_crop(img, h, w[, scale_min, scale_max, ratio_min, ratio_max])`.

use arrow::array::ArrayRef;
use arrow::datatypes::FieldRef;
use datafusion::error::{DataFusionError, Result};

use super::{Function, map_images};
use crate::args::{ArgSpec, Call, Consts, Kind, Lit, opt, req};
use crate::cost::{Estimate, SampleStats};
use crate::kernels::crop::RrcParams;
use crate::kernels::resize::{Filter, resize_into};
use crate::tensor::{expect_image, image_field};

/// torchvision's `RandomResizedCrop` (bilinear), its window drawn from (seed, epoch, key).
#[derive(Debug, Default)]
pub struct RandomResizedCrop;

/// The crop parameters of a call whose arguments 3..7 are the ranges.
pub(crate) fn rrc_params(consts: &Consts) -> Result<RrcParams> {
    let p = RrcParams {
        scale: (consts.float(3)?, consts.float(4)?),
        ratio: (consts.float(5)?, consts.float(6)?),
    };
    p.validate()
        .map_err(|e| DataFusionError::Plan(format!("{}: {e}", consts.name())))?;
    Ok(p)
}

/// The parameters shared by the random resized crops.
pub(crate) const RRC_PARAMS: [crate::args::Param; 7] = [
    req("img", Kind::Value),
    req("h", Kind::Int),
    req("w", Kind::Int),
    opt("scale_min", Kind::Float, Lit::Float(0.08)),
    opt("scale_max", Kind::Float, Lit::Float(1.0)),
    opt("ratio_min", Kind::Float, Lit::Float(3.0 / 4.0)),
    opt("ratio_max", Kind::Float, Lit::Float(4.0 / 3.0)),
];

impl Function for RandomResizedCrop {
    const SPEC: ArgSpec = ArgSpec {
        name: "random_resized_crop",
        params: &RRC_PARAMS,
        random: true,
        keyed: true,
    };

    fn return_field(&self, consts: &Consts, fields: &[FieldRef]) -> Result<FieldRef> {
        let [_, _, c] = expect_image(Self::SPEC.name, &fields[0])?;
        rrc_params(consts)?;
        Ok(image_field(
            Self::SPEC.name,
            [Some(consts.size(1)?), Some(consts.size(2)?), c],
        ))
    }

    fn invoke(&self, call: &Call<'_>) -> Result<ArrayRef> {
        let (h, w) = (call.consts.size(1)?, call.consts.size(2)?);
        let params = rrc_params(&call.consts)?;
        let mut rngs = (0..call.rows)
            .map(|r| call.rng(r))
            .collect::<Result<Vec<_>>>()?;
        map_images(
            call,
            |_| (h, w),
            |row, img, out| {
                let window = params.window(&mut rngs[row], img.height, img.width);
                resize_into(img, Some(window), h, w, Filter::Bilinear, out)
            },
        )
    }

    fn cost(&self, consts: &Consts, input: &SampleStats) -> Result<Estimate> {
        let (h, w) = (f64::from(consts.size(1)?), f64::from(consts.size(2)?));
        // The mean window covers (scale_min + scale_max) / 2 of the image.
        let area = (consts.float(3)? + consts.float(4)?) / 2.0;
        Ok(Estimate {
            work: input.pixels() * area + h * w,
            out: SampleStats::image(w, h, input.channels),
        })
    }
}
