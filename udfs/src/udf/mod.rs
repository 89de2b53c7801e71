//! The UDFs: one file each, all wrapped by the generic [`Udf`].
//!
//! Each UDF is a small type implementing [`Function`]: its [`ArgSpec`], its
//! result field (computed from constant arguments and argument fields when
//! the query is planned), its evaluation over a batch, and its cost profile.
//! [`Udf`] turns any of them into a DataFusion `ScalarUDFImpl`.
//!
//! Modules:
//! - `center_crop`: `center_crop(img, h, w)`: the centred h×w window,
//!   zero-padded when the image is smaller;
//! - `crop3d`: `crop3d(arr, z, y, x, d, h, w[, channels])`: a box of a
//!   volume;
//! - `decode_image`: `decode_image(data[, mode])`: encoded bytes → image;
//! - `decode_resize`: fused decode + resize and decode + random resized crop,
//!   with JPEG DCT-domain downscaling;
//! - `decode_video`: `decode_video(data, num_frames, h, w[, stride |
//!   'uniform'])` → uint8 [T, H, W, 3];
//! - `normalize`: `normalize(img, mean, std)`: uint8 HWC image → float32 CHW
//!   tensor;
//! - `npy`: `npy(data)`: a `.npy` file → array;
//! - `npz`: `npz(data, name)`: one member of a `.npz` archive → array;
//! - `random_flip`: `random_horizontal_flip(img[, p])`: mirror with
//!   probability p, drawn from (seed, epoch, key);
//! - `random_resized_crop`: `random_resized_crop(img, h, w[, scale_min,
//!   scale_max, ratio_min, ratio_max])`;
//! - `resize`: `resize(img, h, w[, filter])`: resample an image to h×w;
//! - `resize3d`: `resize3d(arr, d, h, w[, channels])`: trilinear resize of a
//!   volume to float32;
//! - `to_tensor`: `to_tensor(img)` → uint8 [H, W, C].

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
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use arrow::array::{ArrayRef, new_null_array};
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
pub use normalize::{Normalize, NormalizeRows};
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
        let field = self.function.return_field(&consts, args.arg_fields)?;
        self.check_size(&field)?;
        Ok(field)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let started = std::time::Instant::now();
        let call = Call::new(F::SPEC, &args, &self.env)?;
        // Third-party decoders can panic on odd files. A panic costs the
        // batch nothing: its rows are evaluated again one by one, and the
        // row that panics is one bad sample, under the policy.
        let result = match catch_unwind(AssertUnwindSafe(|| self.function.invoke(&call))) {
            Ok(result) => result.map(ColumnarValue::Array),
            Err(_) => self.row_by_row(&args, &call).map(ColumnarValue::Array),
        };
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.env
            .clock
            .record(&self.env.site, F::SPEC.name, args.number_rows as u64, nanos);
        result
    }
}

impl<F: Function> Udf<F> {
    /// Refuses, when the query is planned, a result whose size is known
    /// then and over the session's limits (`resize(…, 100000, 100000)`):
    /// the query fails with a clear error before anything is allocated.
    fn check_size(&self, field: &FieldRef) -> Result<()> {
        // Images are bytes; tensors are counted at 4 bytes an element.
        let element: u64 = if crate::tensor::is_image(field) { 1 } else { 4 };
        let dims: Option<Vec<u64>> = if crate::tensor::is_image(field) {
            match crate::tensor::image_dims(field) {
                [Some(h), Some(w), c] => {
                    Some(vec![u64::from(h), u64::from(w), u64::from(c.unwrap_or(4))])
                }
                _ => None,
            }
        } else {
            crate::tensor::tensor_shape(field).map(|s| s.into_iter().map(u64::from).collect())
        };
        let Some(dims) = dims else {
            return Ok(());
        };
        let pixels = dims.iter().take(2).fold(1u64, |a, &d| a.saturating_mul(d));
        let bytes = dims.iter().fold(element, |a, &d| a.saturating_mul(d));
        let shape: Vec<String> = dims.iter().map(u64::to_string).collect();
        self.env
            .options
            .limits
            .check(
                &format!("its result ({})", shape.join("x")),
                pixels,
                0,
                bytes,
            )
            .map_err(|reason| DataFusionError::Plan(format!("{}: {reason}", F::SPEC.name)))
    }

    /// Evaluates each row of `args` alone; a row whose evaluation panics is
    /// a bad sample named by its key (an error under `fail`), NULL
    /// otherwise.
    fn row_by_row(&self, args: &ScalarFunctionArgs, call: &Call<'_>) -> Result<ArrayRef> {
        let mut parts: Vec<ArrayRef> = Vec::with_capacity(args.number_rows);
        for row in 0..args.number_rows {
            let one = ScalarFunctionArgs {
                args: args
                    .args
                    .iter()
                    .map(|a| match a {
                        ColumnarValue::Array(a) => ColumnarValue::Array(a.slice(row, 1)),
                        s => s.clone(),
                    })
                    .collect(),
                arg_fields: args.arg_fields.clone(),
                number_rows: 1,
                return_field: Arc::clone(&args.return_field),
                config_options: Arc::clone(&args.config_options),
            };
            let one_call = Call::new(F::SPEC, &one, &self.env)?;
            match catch_unwind(AssertUnwindSafe(|| self.function.invoke(&one_call))) {
                Ok(result) => parts.push(result?),
                Err(panic) => {
                    call.bad(
                        row,
                        format!("the decoder panicked: {}", panic_message(&panic)),
                    )?;
                    parts.push(new_null_array(args.return_field.data_type(), 1));
                }
            }
        }
        let refs: Vec<&dyn arrow::array::Array> = parts.iter().map(|a| a.as_ref()).collect();
        if refs.is_empty() {
            return Ok(new_null_array(args.return_field.data_type(), 0));
        }
        Ok(arrow::compute::concat(&refs)?)
    }
}

/// The message a panic carried, if it was a string.
pub fn panic_message(panic: &Box<dyn Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// The spec of the sluice UDF called `name`.
pub fn spec(name: &str) -> Option<ArgSpec> {
    SPECS.iter().find(|s| s.name == name).copied()
}

/// Estimates one call of the sluice UDF `udf` on a sample described by `input`.
pub fn estimate(udf: &ScalarUDF, consts: &Consts, input: &SampleStats) -> Option<Result<Estimate>> {
    estimate_any(udf.inner().as_ref(), consts, input)
}

/// The sluice UDF `udf` bound to `env` instead (`None`: `udf` is not one
/// of sluice's).
pub fn bound_to(udf: &ScalarUDF, env: &Arc<UdfEnv>) -> Option<ScalarUDF> {
    bound_to_any(udf.inner().as_ref(), env)
}

/// The UDF types, listed once: their specs, their `ScalarUDF`s, and the
/// downcasts that reach a `ScalarUDF`'s cost model and bind it anew.
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

        fn bound_to_any(inner: &dyn Any, env: &Arc<UdfEnv>) -> Option<ScalarUDF> {
            None$(.or_else(|| inner.downcast_ref::<Udf<$f>>().map(|_| Udf::<$f>::udf(env))))*
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
    // The output's size is known before any row is written: one
    // allocation, not a doubling (and a copy) per few rows.
    let bytes: usize = (0..call.rows)
        .filter_map(|row| images.get(row))
        .map(|img| {
            let (h, w) = size(&img);
            h as usize * w as usize * usize::from(img.channels)
        })
        .sum();
    let mut out =
        crate::tensor::ImageBuilder::with_capacity(call.rows, bytes.div_ceil(call.rows.max(1)));
    for row in 0..call.rows {
        call.live()?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Kind, req};
    use crate::env::{OnError, UdfOptions};
    use arrow::array::{Array, AsArray, BinaryArray, StringArray};
    use arrow::datatypes::Field;
    use datafusion::config::ConfigOptions;

    /// Byte lengths, panicking on an object that starts with `boom`: a
    /// decoder with a bug.
    #[derive(Debug, Default)]
    struct Fragile;

    impl Function for Fragile {
        const SPEC: ArgSpec = ArgSpec {
            name: "fragile",
            params: &[req("data", Kind::Value)],
            random: false,
            keyed: true,
        };

        fn return_field(&self, _consts: &Consts, _fields: &[FieldRef]) -> Result<FieldRef> {
            Ok(Arc::new(Field::new("fragile", DataType::UInt64, true)))
        }

        fn invoke(&self, call: &Call<'_>) -> Result<ArrayRef> {
            let data = call.array(0)?;
            let data = data.as_binary::<i32>();
            let lens: arrow::array::UInt64Array = data
                .iter()
                .map(|b| {
                    let b = b?;
                    assert!(!b.starts_with(b"boom"), "a decoder bug");
                    Some(b.len() as u64)
                })
                .collect();
            Ok(Arc::new(lens))
        }

        fn cost(&self, _consts: &Consts, input: &SampleStats) -> Result<Estimate> {
            Ok(Estimate {
                work: 0.0,
                out: *input,
            })
        }
    }

    fn run(on_error: OnError) -> (Result<ColumnarValue>, Arc<UdfEnv>) {
        let env = UdfEnv::new(UdfOptions {
            on_error,
            ..Default::default()
        });
        let udf = Udf::<Fragile>::new(Arc::clone(&env));
        let data: ArrayRef = Arc::new(BinaryArray::from_iter_values([
            b"ok".as_slice(),
            b"boom!",
            b"fine.",
        ]));
        let keys: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "c"]));
        let args = ScalarFunctionArgs {
            args: vec![ColumnarValue::Array(data), ColumnarValue::Array(keys)],
            arg_fields: vec![
                Arc::new(Field::new("data", DataType::Binary, true)),
                Arc::new(Field::new("key", DataType::Utf8, true)),
            ],
            number_rows: 3,
            return_field: Arc::new(Field::new("fragile", DataType::UInt64, true)),
            config_options: Arc::new(ConfigOptions::default()),
        };
        (udf.invoke_with_args(args), env)
    }

    #[test]
    fn a_panicking_decoder_is_one_bad_sample() {
        let (out, env) = run(OnError::Null);
        let out = out.unwrap().to_array(3).unwrap();
        let lens = out.as_primitive::<arrow::datatypes::UInt64Type>();
        assert_eq!(lens.len(), 3);
        assert_eq!(
            (lens.value(0), lens.is_null(1), lens.value(2)),
            (2, true, 5)
        );
        let (n, bad) = env.errors.snapshot();
        assert_eq!(n, 1);
        assert_eq!(bad[0].key, "b");
        assert!(bad[0].reason.contains("panicked: a decoder bug"), "{bad:?}");

        let (out, _) = run(OnError::Fail);
        let e = out.unwrap_err().to_string();
        assert!(e.contains("sample 'b'") && e.contains("panicked"), "{e}");
    }
}
