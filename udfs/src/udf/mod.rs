//! The UDFs: one file each, all wrapped by the generic [`Udf`].
//!
//! Each UDF is a small type implementing [`Function`]: its [`ArgSpec`], its
//! result field (computed from constant arguments and argument fields when
//! the query is planned), its evaluation over a batch, and its cost profile.
//! [`Udf`] turns any of them into a DataFusion `ScalarUDFImpl`.

mod center_crop;
mod crop3d;
mod decode_image;
mod decode_resize;
mod decode_video;
mod normalize;
mod npy;
mod npz;
mod random_flip;
mod random_resized_crop;
mod resize;
mod resize3d;
mod to_tensor;

use std::any::Any;
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, FieldRef};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};

use crate::args::{ArgSpec, Call, Consts};
use crate::cost::{Estimate, SampleStats};
use crate::env::UdfEnv;

pub use center_crop::CenterCrop;
pub use crop3d::Crop3d;
pub use decode_image::DecodeImage;
pub use decode_resize::{DecodeRandomResizedCrop, DecodeResize};
pub use decode_video::DecodeVideo;
pub use normalize::Normalize;
pub use npy::Npy;
pub use npz::Npz;
pub use random_flip::RandomHorizontalFlip;
pub use random_resized_crop::RandomResizedCrop;
pub use resize::Resize;
pub use resize3d::Resize3d;
pub use to_tensor::ToTensor;

/// What a sluice UDF is.
pub trait Function: Debug + Default + Send + Sync + 'static {
    /// Its arguments.
    const SPEC: ArgSpec;

    /// The result field, from the call's constants and argument fields.
    fn return_field(&self, consts: &Consts, fields: &[FieldRef]) -> Result<FieldRef>;

    /// Evaluates the call over a batch.
    fn invoke(&self, call: &Call<'_>) -> Result<ArrayRef>;

    /// Work and result size for one sample described by `input` (the stats
    /// of argument 0). The work is in the UDF's own unit, which its
    /// calibrated profile turns into CPU time.
    fn cost(&self, consts: &Consts, input: &SampleStats) -> Result<Estimate>;
}

/// A [`Function`] bound to a session's environment, as a DataFusion UDF.
#[derive(Debug)]
pub struct Udf<F: Function> {
    function: F,
    env: Arc<UdfEnv>,
    signature: Signature,
}

impl<F: Function> Udf<F> {
    /// Binds `F` to `env`.
    pub fn new(env: Arc<UdfEnv>) -> Self {
        Self {
            function: F::default(),
            env,
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }

    /// As a `ScalarUDF`.
    pub fn udf(env: &Arc<UdfEnv>) -> ScalarUDF {
        ScalarUDF::new_from_impl(Self::new(Arc::clone(env)))
    }
}

impl<F: Function> PartialEq for Udf<F> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.env, &other.env)
    }
}

impl<F: Function> Eq for Udf<F> {}

impl<F: Function> Hash for Udf<F> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        F::SPEC.name.hash(state);
    }
}

impl<F: Function> ScalarUDFImpl for Udf<F> {
    fn name(&self) -> &str {
        F::SPEC.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        F::SPEC.coerce(arg_types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Err(DataFusionError::Internal(format!(
            "{}: the result type comes from return_field_from_args",
            F::SPEC.name
        )))
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs<'_>) -> Result<FieldRef> {
        let consts = Consts::from_plan(F::SPEC, &args);
        self.function.return_field(&consts, args.arg_fields)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let call = Call::new(F::SPEC, &args, &self.env)?;
        self.function.invoke(&call).map(ColumnarValue::Array)
    }
}

/// The spec of the sluice UDF called `name`.
pub fn spec(name: &str) -> Option<ArgSpec> {
    SPECS.iter().find(|s| s.name == name).copied()
}

/// Estimates one call of the sluice UDF `udf` on a sample described by `input`.
pub fn estimate(udf: &ScalarUDF, consts: &Consts, input: &SampleStats) -> Option<Result<Estimate>> {
    estimate_any(udf.inner().as_ref(), consts, input)
}

/// The UDF types, listed once: their specs, their `ScalarUDF`s, and the
/// downcast that reaches a `ScalarUDF`'s cost model.
macro_rules! functions {
    ($($f:ident),* $(,)?) => {
        /// Every UDF's spec.
        pub const SPECS: &[ArgSpec] = &[$($f::SPEC),*];

        /// Every UDF bound to `env`.
        pub fn all(env: &Arc<UdfEnv>) -> Vec<ScalarUDF> {
            vec![$(Udf::<$f>::udf(env)),*]
        }

        fn estimate_any(inner: &dyn Any, c: &Consts, s: &SampleStats) -> Option<Result<Estimate>> {
            None$(.or_else(|| inner.downcast_ref::<Udf<$f>>().map(|u| u.function.cost(c, s))))*
        }
    };
}

functions!(
    DecodeImage,
    Resize,
    CenterCrop,
    RandomResizedCrop,
    RandomHorizontalFlip,
    Normalize,
    ToTensor,
    DecodeResize,
    DecodeRandomResizedCrop,
    DecodeVideo,
    Npy,
    Npz,
    Crop3d,
    Resize3d,
);

/// Applies `f` to every non-NULL image of argument 0, writing an image of
/// the size `size` gives (from the input image) in place. A row whose `f`
/// fails follows the session's policy.
pub(crate) fn map_images(
    call: &Call<'_>,
    size: impl Fn(&crate::tensor::ImageRef<'_>) -> (u32, u32),
    mut f: impl FnMut(usize, crate::tensor::ImageRef<'_>, &mut [u8]) -> std::result::Result<(), String>,
) -> Result<ArrayRef> {
    let input = call.array(0)?;
    let images = crate::tensor::ImageColumn::new(&input, call.spec.name)?;
    let mut out = crate::tensor::ImageBuilder::with_capacity(call.rows, 0);
    for row in 0..call.rows {
        let Some(img) = images.get(row) else {
            out.append_null();
            continue;
        };
        let (h, w) = size(&img);
        if let Err(reason) = out.try_append_with(h, w, img.channels, |dst| f(row, img, dst)) {
            call.bad(row, reason)?;
            out.append_null();
        }
    }
    Ok(out.finish())
}
