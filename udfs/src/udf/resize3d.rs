//! `resize3d(arr, d, h, w[, channels])`: trilinear resize of a volume to float32.

use arrow::array::ArrayRef;
use arrow::datatypes::FieldRef;
use datafusion::error::Result;

use super::Function;
use super::crop3d::{map_volumes, volume_shape};
use crate::args::{ArgSpec, Call, Consts, Kind, Lit, opt, req};
use crate::cost::{Estimate, SampleStats};
use crate::kernels::volume::resize3d;
use crate::tensor::{array_field, expect_array};

/// Resizes `[D, H, W]` or `[D, H, W, channels]` volumes (align-corners false), as float32.
#[derive(Debug, Default)]
pub struct Resize3d;

impl Function for Resize3d {
    const SPEC: ArgSpec = ArgSpec {
        name: "resize3d",
        params: &[
            req("arr", Kind::Value),
            req("d", Kind::Int),
            req("h", Kind::Int),
            req("w", Kind::Int),
            opt("channels", Kind::Int, Lit::Int(1)),
        ],
        random: false,
        keyed: false,
    };

    fn return_field(&self, consts: &Consts, fields: &[FieldRef]) -> Result<FieldRef> {
        expect_array(Self::SPEC.name, &fields[0])?;
        let shape = volume_shape(consts, 1, 4)?;
        Ok(array_field(Self::SPEC.name, Some(&shape), Some("float32")))
    }

    fn invoke(&self, call: &Call<'_>) -> Result<ArrayRef> {
        let c = &call.consts;
        let to = [c.size(1)?, c.size(2)?, c.size(3)?];
        let channels = c.size(4)?;
        map_volumes(call, channels, |a, dtype| {
            Ok(("float32", to, resize3d(a.data, &a.shape, dtype, to)?))
        })
    }

    fn cost(&self, consts: &Consts, input: &SampleStats) -> Result<Estimate> {
        let shape = volume_shape(consts, 1, 4)?;
        let elements: f64 = shape.iter().map(|&d| f64::from(d)).product();
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
