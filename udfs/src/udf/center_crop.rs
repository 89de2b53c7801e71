//! `center_crop(img, h, w)`: the centred h×w window, zero-padded when the image is smaller.

use arrow::array::ArrayRef;
use arrow::datatypes::FieldRef;
use datafusion::error::Result;

use super::{Function, map_images};
use crate::args::{ArgSpec, Call, Consts, Kind, req};
use crate::cost::{Estimate, SampleStats};
use crate::kernels::crop::{center_offsets, crop_into};
use crate::tensor::{expect_image, image_field};

/// torchvision's `CenterCrop`.
#[derive(Debug, Default)]
pub struct CenterCrop;

impl Function for CenterCrop {
    const SPEC: ArgSpec = ArgSpec {
        name: "center_crop",
        params: &[
            req("img", Kind::Value),
            req("h", Kind::Int),
            req("w", Kind::Int),
        ],
        random: false,
        keyed: false,
    };

    fn return_field(&self, consts: &Consts, fields: &[FieldRef]) -> Result<FieldRef> {
        let [_, _, c] = expect_image(Self::SPEC.name, &fields[0])?;
        Ok(image_field(
            Self::SPEC.name,
            [Some(consts.size(1)?), Some(consts.size(2)?), c],
        ))
    }

    fn invoke(&self, call: &Call<'_>) -> Result<ArrayRef> {
        let (h, w) = (call.consts.size(1)?, call.consts.size(2)?);
        map_images(
            call,
            |_| (h, w),
            |_, img, out| {
                let (top, left) = center_offsets(img.height, img.width, h, w);
                crop_into(img, top, left, h, w, out);
                Ok(())
            },
        )
    }

    fn cost(&self, consts: &Consts, input: &SampleStats) -> Result<Estimate> {
        let out = SampleStats::image(
            f64::from(consts.size(2)?),
            f64::from(consts.size(1)?),
            input.channels,
        );
        Ok(Estimate {
            work: out.bytes,
            out,
        })
    }
}
