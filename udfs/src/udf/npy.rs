//! `npy(data)`: a `.npy` file → array.

use arrow::array::ArrayRef;
use arrow::datatypes::FieldRef;
use datafusion::error::Result;

use super::Function;
use crate::args::{ArgSpec, Call, Consts, Kind, req};
use crate::cost::{Estimate, SampleStats};
use crate::kernels::npy::{Parsed, parse};
use crate::tensor::{ArrayBuilder, array_field, binary_value, expect_binary};

/// Parses NumPy arrays (any of NumPy's integer, bool and float types; big-endian and
/// Fortran-order data are converted to little-endian C order).
#[derive(Debug, Default)]
pub struct Npy;

/// Appends each row's parse result (NULL and the policy on failure).
pub(crate) fn build_arrays(
    call: &Call<'_>,
    mut parse_row: impl for<'a> FnMut(&'a [u8]) -> std::result::Result<Parsed<'a>, String>,
) -> Result<ArrayRef> {
    let data = call.array(0)?;
    let mut out = ArrayBuilder::new(call.rows);
    for row in 0..call.rows {
        call.live()?;
        match binary_value(&data, row).map(&mut parse_row) {
            None => out.append_null(),
            Some(Ok(p)) => out.append(p.dtype.name(), &p.shape, &p.data),
            Some(Err(reason)) => {
                call.bad(row, reason)?;
                out.append_null();
            }
        }
    }
    Ok(out.finish())
}

impl Function for Npy {
    const SPEC: ArgSpec = ArgSpec {
        name: "npy",
        params: &[req("data", Kind::Value)],
        random: false,
        keyed: true,
    };

    fn return_field(&self, _consts: &Consts, fields: &[FieldRef]) -> Result<FieldRef> {
        expect_binary(Self::SPEC.name, &fields[0])?;
        Ok(array_field(Self::SPEC.name, None, None))
    }

    fn invoke(&self, call: &Call<'_>) -> Result<ArrayRef> {
        let limits = call.limits();
        build_arrays(call, |b| parse(b, &limits))
    }

    fn cost(&self, _consts: &Consts, input: &SampleStats) -> Result<Estimate> {
        Ok(Estimate {
            work: input.bytes,
            out: *input,
        })
    }
}
