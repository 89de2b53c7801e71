//! `crop3d(arr, z, y, x, d, h, w[, channels])`: a box of a volume.

use arrow::array::ArrayRef;
use arrow::datatypes::FieldRef;
use datafusion::error::Result;

use super::Function;
use crate::args::{ArgSpec, Call, Consts, Kind, Lit, opt, req};
use crate::cost::{Estimate, SampleStats};
use crate::kernels::npy::DType;
use crate::kernels::volume::crop3d;
use crate::tensor::{ArrayBuilder, ArrayColumn, ArrayRefView, array_field, expect_array};

/// Crops the first three dimensions of `[D, H, W]` or `[D, H, W, channels]` volumes.
#[derive(Debug, Default)]
pub struct Crop3d;

/// The planned output shape `[d, h, w]` or `[d, h, w, c]` from arguments `first..first+3` and `channels_at`.
pub(crate) fn volume_shape(consts: &Consts, first: usize, channels_at: usize) -> Result<Vec<u32>> {
    let mut shape = vec![
        consts.size(first)?,
        consts.size(first + 1)?,
        consts.size(first + 2)?,
    ];
    let c = consts.size(channels_at)?;
    if c > 1 {
        shape.push(c);
    }
    Ok(shape)
}

/// Checks a row's shape against the planned channel count.
pub(crate) fn check_volume(shape: &[u32], channels: u32) -> std::result::Result<(), String> {
    let ok = match shape.len() {
        3 => channels == 1,
        4 => shape[3] == channels,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "expected a [D, H, W] volume{}, got shape {shape:?}",
            if channels > 1 {
                format!(" with {channels} channels")
            } else {
                String::new()
            }
        ))
    }
}

/// Applies `f` to every non-NULL `[D, H, W(, channels)]` volume of argument
/// 0; `f` gets the element type and returns the result's element type name,
/// its first three dimensions and its bytes (trailing dimensions are kept).
/// A row that fails follows the session's policy.
pub(crate) fn map_volumes(
    call: &Call<'_>,
    channels: u32,
    mut f: impl FnMut(
        &ArrayRefView<'_>,
        DType,
    ) -> std::result::Result<(&'static str, [u32; 3], Vec<u8>), String>,
) -> Result<ArrayRef> {
    let input = call.array(0)?;
    let arrays = ArrayColumn::new(&input, call.spec.name)?;
    let mut out = ArrayBuilder::new(call.rows);
    for row in 0..call.rows {
        call.live()?;
        let Some(a) = arrays.get(row) else {
            out.append_null();
            continue;
        };
        let result = check_volume(&a.shape, channels).and_then(|()| {
            let dtype =
                DType::from_name(a.dtype).ok_or_else(|| format!("unknown dtype '{}'", a.dtype))?;
            f(&a, dtype)
        });
        match result {
            Ok((dtype, dims, bytes)) => {
                let mut shape = dims.to_vec();
                shape.extend_from_slice(&a.shape[3..]);
                out.append(dtype, &shape, &bytes);
            }
            Err(reason) => {
                call.bad(row, reason)?;
                out.append_null();
            }
        }
    }
    Ok(out.finish())
}

/// Whether a box of `size` at the origin is the whole of every non-NULL
/// row of `arrays`, each a valid volume of `channels` (a row that is not
/// takes the general path, which names it).
fn whole(arrays: &ArrayColumn<'_>, size: [u32; 3], channels: u32) -> bool {
    (0..arrays.len()).all(|row| {
        arrays.get(row).is_none_or(|a| {
            let elements: u64 = a.shape.iter().map(|&d| u64::from(d)).product();
            check_volume(&a.shape, channels).is_ok()
                && a.shape[..3] == size
                && DType::from_name(a.dtype)
                    .is_some_and(|d| elements * d.size() as u64 == a.data.len() as u64)
        })
    })
}

impl Function for Crop3d {
    const SPEC: ArgSpec = ArgSpec {
        name: "crop3d",
        params: &[
            req("arr", Kind::Value),
            req("z", Kind::Int),
            req("y", Kind::Int),
            req("x", Kind::Int),
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
        let shape = volume_shape(consts, 4, 7)?;
        let dtype = crate::tensor::array_dtype(&fields[0]);
        Ok(array_field(Self::SPEC.name, Some(&shape), dtype))
    }

    fn invoke(&self, call: &Call<'_>) -> Result<ArrayRef> {
        let c = &call.consts;
        let start =
            [c.int(1)?, c.int(2)?, c.int(3)?].map(|v| v.clamp(0, i64::from(u32::MAX)) as u32);
        let size = [c.size(4)?, c.size(5)?, c.size(6)?];
        let channels = c.size(7)?;
        if start == [0; 3] {
            let input = call.array(0)?;
            if whole(&ArrayColumn::new(&input, Self::SPEC.name)?, size, channels) {
                // Every box is its whole volume: the column as it is.
                return Ok(input);
            }
        }
        map_volumes(call, channels, |a, dtype| {
            Ok((
                dtype.name(),
                size,
                crop3d(a.data, &a.shape, dtype.size(), start, size)?,
            ))
        })
    }

    fn cost(&self, consts: &Consts, input: &SampleStats) -> Result<Estimate> {
        let shape = volume_shape(consts, 4, 7)?;
        let elements: f64 = shape.iter().map(|&d| f64::from(d)).product();
        let esize = if input.elements > 0.0 {
            input.bytes / input.elements
        } else {
            4.0
        };
        let bytes = elements * esize;
        Ok(Estimate {
            work: bytes,
            out: SampleStats {
                bytes,
                elements,
                ..*input
            },
        })
    }
}
