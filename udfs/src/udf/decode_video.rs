//! `decode_video(data, num_frames, h, w[, stride | 'uniform'])` → uint8 [T, H, W, 3].

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, FieldRef, UInt8Type};
use datafusion::error::Result;

use super::Function;
use crate::args::{ArgSpec, Call, Consts, Kind, Lit, opt, req};
use crate::cost::{Estimate, SampleStats};
use crate::kernels::video::{Sampling, decode_clip};
use crate::tensor::{TensorBuilder, binary_buffer, expect_binary, tensor_field};

/// Decodes sampled frames of a clip with FFmpeg, resized to h×w RGB.
#[derive(Debug, Default)]
pub struct DecodeVideo;

fn sampling(consts: &Consts) -> Result<Sampling> {
    consts.parsed(4, Sampling::parse)
}

impl Function for DecodeVideo {
    const SPEC: ArgSpec = ArgSpec {
        name: "decode_video",
        params: &[
            req("data", Kind::Value),
            req("num_frames", Kind::Int),
            req("h", Kind::Int),
            req("w", Kind::Int),
            opt("stride", Kind::IntOrStr, Lit::Str("1")),
        ],
        random: false,
        keyed: true,
    };

    fn return_field(&self, consts: &Consts, fields: &[FieldRef]) -> Result<FieldRef> {
        expect_binary(Self::SPEC.name, &fields[0])?;
        sampling(consts)?;
        let shape = [consts.size(1)?, consts.size(2)?, consts.size(3)?, 3];
        Ok(tensor_field(Self::SPEC.name, DataType::UInt8, &shape))
    }

    fn invoke(&self, call: &Call<'_>) -> Result<ArrayRef> {
        let (n, h, w) = (
            call.consts.size(1)?,
            call.consts.size(2)?,
            call.consts.size(3)?,
        );
        let sampling = sampling(&call.consts)?;
        let data = call.array(0)?;
        let limits = call.limits();
        let size = n as usize * h as usize * w as usize * 3;
        let mut out = TensorBuilder::<UInt8Type>::new(call.rows, size);
        for row in 0..call.rows {
            call.live()?;
            let Some(bytes) = binary_buffer(&data, row) else {
                out.append_null();
                continue;
            };
            // Frames are converted straight into the tensor column.
            let decoded = out.try_append_with(|dst| {
                decode_clip(bytes, (n, h, w), sampling, &limits, call.cancel(), dst)
            });
            if let Err(reason) = decoded {
                call.bad(row, reason)?;
                out.append_null();
            }
        }
        out.finish(call.return_field)
    }

    fn cost(&self, consts: &Consts, input: &SampleStats) -> Result<Estimate> {
        let (n, h, w) = (
            f64::from(consts.size(1)?),
            f64::from(consts.size(2)?),
            f64::from(consts.size(3)?),
        );
        let last = match sampling(consts)? {
            Sampling::Stride(k) => (n - 1.0) * f64::from(k) + 1.0,
            Sampling::Uniform => input.frames.max(n),
        };
        let elements = n * h * w * 3.0;
        Ok(Estimate {
            work: last.min(input.frames.max(1.0)) * input.pixels(),
            out: SampleStats {
                bytes: elements,
                width: w,
                height: h,
                channels: 3.0,
                frames: n,
                elements,
            },
        })
    }
}
