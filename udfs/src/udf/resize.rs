//! `resize(img, h, w[, filter])`: resample an image to h×w.

use arrow::array::ArrayRef;
use arrow::datatypes::FieldRef;
use datafusion::error::Result;

use super::{Function, map_images};
use crate::args::{ArgSpec, Call, Consts, Kind, Lit, opt, req};
use crate::cost::{Estimate, SampleStats};
use crate::kernels::resize::{Filter, resize_into};
use crate::tensor::{expect_image, image_field};

/// Antialiased resampling (bilinear by default) with SIMD convolution.
#[derive(Debug, Default)]
pub struct Resize;

impl Function for Resize {
    const SPEC: ArgSpec = ArgSpec {
        name: "resize",
        params: &[
            req("img", Kind::Value),
            req("h", Kind::Int),
            req("w", Kind::Int),
            opt("filter", Kind::Str, Lit::Str("bilinear")),
        ],
        random: false,
        keyed: false,
    };

    fn return_field(&self, consts: &Consts, fields: &[FieldRef]) -> Result<FieldRef> {
        let [_, _, c] = expect_image(Self::SPEC.name, &fields[0])?;
        consts.parsed(3, Filter::parse)?;
        Ok(image_field(
            Self::SPEC.name,
            [Some(consts.size(1)?), Some(consts.size(2)?), c],
        ))
    }

    fn invoke(&self, call: &Call<'_>) -> Result<ArrayRef> {
        let (h, w) = (call.consts.size(1)?, call.consts.size(2)?);
        let filter = call.consts.parsed(3, Filter::parse)?;
        map_images(
            call,
            |_| (h, w),
            |_, img, out| resize_into(img, None, h, w, filter, out),
        )
    }

    fn cost(&self, consts: &Consts, input: &SampleStats) -> Result<Estimate> {
        let (h, w) = (f64::from(consts.size(1)?), f64::from(consts.size(2)?));
        Ok(Estimate {
            work: input.pixels() + h * w,
            out: SampleStats::image(w, h, input.channels),
        })
    }
}
