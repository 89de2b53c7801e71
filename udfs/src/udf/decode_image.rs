//! `decode_image(data[, mode])`: encoded bytes → image.

use arrow::array::ArrayRef;
use arrow::datatypes::FieldRef;
use datafusion::error::Result;

use super::Function;
use crate::args::{ArgSpec, Call, Consts, Kind, Lit, opt, req};
use crate::cost::{Estimate, SampleStats};
use crate::kernels::decode::{Mode, decode};
use crate::tensor::{ImageBuilder, binary_value, expect_binary, image_field};

/// Decodes JPEG, PNG, WebP, GIF, BMP and TIFF to RGB (or L / RGBA).
#[derive(Debug, Default)]
pub struct DecodeImage;

impl Function for DecodeImage {
    const SPEC: ArgSpec = ArgSpec {
        name: "decode_image",
        params: &[
            req("data", Kind::Value),
            opt("mode", Kind::Str, Lit::Str("RGB")),
        ],
        random: false,
        keyed: true,
    };

    fn return_field(&self, consts: &Consts, fields: &[FieldRef]) -> Result<FieldRef> {
        expect_binary(Self::SPEC.name, &fields[0])?;
        let c = consts.parsed(1, Mode::parse)?.channels();
        Ok(image_field(
            Self::SPEC.name,
            [None, None, Some(u32::from(c))],
        ))
    }

    fn invoke(&self, call: &Call<'_>) -> Result<ArrayRef> {
        let data = call.array(0)?;
        let mode = call.consts.parsed(1, Mode::parse)?;
        let limits = call.limits();
        let mut out = ImageBuilder::with_capacity(call.rows, 0);
        for i in 0..call.rows {
            call.live()?;
            match binary_value(&data, i).map(|b| decode(b, mode, &limits)) {
                None => out.append_null(),
                Some(Ok(img)) => out.append(img.view()),
                Some(Err(reason)) => {
                    call.bad(i, reason)?;
                    out.append_null();
                }
            }
        }
        Ok(out.finish())
    }

    fn cost(&self, consts: &Consts, input: &SampleStats) -> Result<Estimate> {
        let c = f64::from(consts.parsed(1, Mode::parse)?.channels());
        Ok(Estimate {
            work: input.pixels(),
            out: SampleStats::image(input.width, input.height, c),
        })
    }
}
