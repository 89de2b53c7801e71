//! `npz(data, name)`: one member of a `.npz` archive → array.

use arrow::array::ArrayRef;
use arrow::datatypes::FieldRef;
use datafusion::error::Result;

use super::Function;
use super::npy::build_arrays;
use crate::args::{ArgSpec, Call, Consts, Kind, req};
use crate::cost::{Estimate, SampleStats};
use crate::kernels::npz::member;
use crate::tensor::{array_field, expect_binary};

/// Reads the named array of an `.npz` (stored or deflated).
#[derive(Debug, Default)]
pub struct Npz;

impl Function for Npz {
    const SPEC: ArgSpec = ArgSpec {
        name: "npz",
        params: &[req("data", Kind::Value), req("name", Kind::Str)],
        random: false,
        keyed: true,
    };

    fn return_field(&self, consts: &Consts, fields: &[FieldRef]) -> Result<FieldRef> {
        expect_binary(Self::SPEC.name, &fields[0])?;
        consts.str(1)?;
        Ok(array_field(Self::SPEC.name, None, None))
    }

    fn invoke(&self, call: &Call<'_>) -> Result<ArrayRef> {
        let name = call.consts.str(1)?;
        let limits = call.limits();
        build_arrays(call, |b| member(b, &name, &limits))
    }

    fn cost(&self, _consts: &Consts, input: &SampleStats) -> Result<Estimate> {
        // Inflating dominates; the result is the uncompressed member.
        Ok(Estimate {
            work: input.bytes,
            out: *input,
        })
    }
}
