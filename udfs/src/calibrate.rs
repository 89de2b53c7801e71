//! Measuring the cost profiles on the machine at hand.
//!
//! Each UDF is invoked exactly as a query would invoke it (its
//! `ScalarUDFImpl`, on a batch of generated samples) at two input sizes; the
//! median time per sample and the work its cost model assigns to each size
//! give the two points [`fit`] draws its line through.

use std::io::Cursor;
use std::sync::Arc;

use arrow::array::{ArrayRef, BinaryArray, StringArray};
use arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::ScalarValue;
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF};

use crate::args::Consts;
use crate::cost::{Profile, Profiles, SampleStats, fit, median_ns};
use crate::env::UdfEnv;
use crate::kernels::{npy, npz, video};
use crate::tensor::{ArrayBuilder, ImageBuilder, ImageRef, array_field, image_field};
use crate::udf::{self, spec};

/// Rows per measured batch.
const ROWS: usize = 8;

/// A JPEG of `w`×`h` with smooth gradients and some texture (compresses like a photo).
pub fn photo_jpeg(w: u32, h: u32, seed: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        let n = (x.wrapping_mul(7919) ^ y.wrapping_mul(104_729) ^ seed.wrapping_mul(31)) % 23;
        image::Rgb([
            ((x * 255 / w.max(1)) as u8).wrapping_add(n as u8),
            ((y * 255 / h.max(1)) as u8).wrapping_add(n as u8),
            (((x + y + seed) % 256) as u8) / 2 + n as u8,
        ])
    });
    let mut out = Cursor::new(Vec::new());
    // Encoding into memory cannot fail for an RGB image.
    let _ = img.write_to(&mut out, image::ImageFormat::Jpeg);
    out.into_inner()
}

fn binary_column(objects: &[Vec<u8>]) -> ArrayRef {
    Arc::new(BinaryArray::from_iter_values(objects.iter()))
}

fn image_column(w: u32, h: u32) -> ArrayRef {
    let px: Vec<u8> = (0..w * h * 3).map(|i| (i % 251) as u8).collect();
    let mut b = ImageBuilder::with_capacity(ROWS, px.len());
    for _ in 0..ROWS {
        b.append(ImageRef {
            height: h,
            width: w,
            channels: 3,
            pixels: &px,
        });
    }
    b.finish()
}

fn volume_column(side: u32) -> ArrayRef {
    let data: Vec<u8> = (0..side * side * side * 4)
        .map(|i| (i % 253) as u8)
        .collect();
    let mut b = ArrayBuilder::new(ROWS);
    for _ in 0..ROWS {
        b.append("float32", &[side, side, side], &data);
    }
    b.finish()
}

struct Case {
    udf: &'static str,
    field: FieldRef,
    inputs: [(ArrayRef, SampleStats); 2],
    consts: Vec<ScalarValue>,
    /// Constants for the larger input, when the work depends on them (output sizes).
    large_consts: Option<Vec<ScalarValue>>,
}

fn int(v: i64) -> ScalarValue {
    ScalarValue::Int64(Some(v))
}

fn float(v: f64) -> ScalarValue {
    ScalarValue::Float64(Some(v))
}

fn text(v: &str) -> ScalarValue {
    ScalarValue::Utf8(Some(v.to_owned()))
}

/// Every UDF's case, in the order the table shows them.
fn cases() -> Result<Vec<Case>> {
    let mut all = image_cases();
    all.push(video_case()?);
    all.extend(array_cases());
    Ok(all)
}

/// The image UDFs' cases: JPEGs decoded, images transformed.
fn image_cases() -> Vec<Case> {
    let bin = Arc::new(Field::new("data", DataType::Binary, false));
    let jpegs = |w: u32, h: u32| -> (ArrayRef, SampleStats) {
        let objs: Vec<Vec<u8>> = (0..ROWS as u32).map(|s| photo_jpeg(w, h, s)).collect();
        let bytes = objs.iter().map(Vec::len).sum::<usize>() as f64 / ROWS as f64;
        let stats = SampleStats::encoded_image(bytes, f64::from(w), f64::from(h), 3.0);
        (binary_column(&objs), stats)
    };
    let images = |w: u32, h: u32| {
        (
            image_column(w, h),
            SampleStats::image(f64::from(w), f64::from(h), 3.0),
        )
    };
    let img_field = |w: u32, h: u32| image_field("img", [Some(h), Some(w), Some(3)]);
    let rrc = vec![
        int(224),
        int(224),
        float(0.08),
        float(1.0),
        float(0.75),
        float(4.0 / 3.0),
    ];
    let random = |mut v: Vec<ScalarValue>| {
        v.extend([int(0), int(0)]);
        v
    };
    vec![
        Case {
            udf: "decode_image",
            field: Arc::clone(&bin),
            inputs: [jpegs(320, 240), jpegs(1280, 960)],
            consts: vec![text("RGB")],
            large_consts: None,
        },
        Case {
            udf: "decode_resize",
            field: Arc::clone(&bin),
            inputs: [jpegs(500, 375), jpegs(2560, 1920)],
            consts: vec![int(224), int(224), text("bilinear"), text("RGB")],
            large_consts: None,
        },
        Case {
            udf: "decode_random_resized_crop",
            field: Arc::clone(&bin),
            inputs: [jpegs(500, 375), jpegs(2560, 1920)],
            consts: random([rrc.clone(), vec![text("RGB")]].concat()),
            large_consts: None,
        },
        Case {
            udf: "resize",
            field: img_field(320, 240),
            inputs: [images(320, 240), images(1280, 960)],
            consts: vec![int(224), int(224), text("bilinear")],
            large_consts: None,
        },
        Case {
            udf: "random_resized_crop",
            field: img_field(320, 240),
            inputs: [images(320, 240), images(1280, 960)],
            consts: random(rrc),
            large_consts: None,
        },
        Case {
            udf: "center_crop",
            field: img_field(512, 512),
            inputs: [images(256, 256), images(1024, 1024)],
            consts: vec![int(112), int(112)],
            large_consts: Some(vec![int(448), int(448)]),
        },
        Case {
            udf: "random_horizontal_flip",
            field: img_field(224, 224),
            inputs: [images(224, 224), images(896, 896)],
            consts: random(vec![float(1.0)]),
            large_consts: None,
        },
        Case {
            udf: "normalize",
            field: img_field(224, 224),
            inputs: [images(224, 224), images(896, 896)],
            consts: vec![float(0.5), float(0.25)],
            large_consts: None,
        },
        Case {
            udf: "to_tensor",
            field: img_field(224, 224),
            inputs: [images(224, 224), images(896, 896)],
            consts: vec![text("")],
            large_consts: None,
        },
    ]
}

/// `decode_video`'s case: MPEG-4 clips of 32 frames.
fn video_case() -> Result<Case> {
    let clip = |w: u32, h: u32| -> Result<(ArrayRef, SampleStats)> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("clip.avi");
        video::encode_test_clip(&path, "mpeg4", 32, w, h).map_err(DataFusionError::Execution)?;
        let bytes = std::fs::read(&path)?;
        let stats = SampleStats {
            bytes: bytes.len() as f64,
            width: f64::from(w),
            height: f64::from(h),
            channels: 3.0,
            frames: 32.0,
            elements: 0.0,
        };
        Ok((binary_column(&vec![bytes; ROWS]), stats))
    };
    Ok(Case {
        udf: "decode_video",
        field: Arc::new(Field::new("data", DataType::Binary, false)),
        inputs: [clip(64, 48)?, clip(256, 192)?],
        consts: vec![int(8), int(112), int(112), text("2")],
        large_consts: None,
    })
}

/// The array UDFs' cases: `.npy`, `.npz` and volumes.
fn array_cases() -> Vec<Case> {
    let bin = Arc::new(Field::new("data", DataType::Binary, false));
    let arrays = |n: usize| {
        let data: Vec<u8> = (0..n * 4).map(|i| (i % 7) as u8).collect();
        let file = npy::write(npy::DType::F32, &[n as u32], &data);
        let stats = SampleStats {
            bytes: file.len() as f64,
            elements: n as f64,
            ..SampleStats::default()
        };
        (file, stats)
    };
    let (npy_s, npy_l) = (arrays(1 << 18), arrays(1 << 21));
    let zipped = |(f, s): &(Vec<u8>, SampleStats)| {
        let z = npz::write(&[("x", f.clone())], true);
        (binary_column(&vec![z; ROWS]), *s)
    };
    let vol = |side: u32| {
        let e = f64::from(side).powi(3);
        (
            volume_column(side),
            SampleStats {
                bytes: e * 4.0,
                width: f64::from(side),
                height: f64::from(side),
                elements: e,
                ..SampleStats::default()
            },
        )
    };
    let vol_field = array_field("arr", None, Some("float32"));
    vec![
        Case {
            udf: "npy",
            field: Arc::clone(&bin),
            inputs: [
                (binary_column(&vec![npy_s.0.clone(); ROWS]), npy_s.1),
                (binary_column(&vec![npy_l.0.clone(); ROWS]), npy_l.1),
            ],
            consts: vec![],
            large_consts: None,
        },
        Case {
            udf: "npz",
            field: Arc::clone(&bin),
            inputs: [zipped(&npy_s), zipped(&npy_l)],
            consts: vec![text("x")],
            large_consts: None,
        },
        Case {
            udf: "crop3d",
            field: Arc::clone(&vol_field),
            inputs: [vol(48), vol(48)],
            consts: vec![int(0), int(0), int(0), int(16), int(16), int(16), int(1)],
            large_consts: Some(vec![
                int(0),
                int(0),
                int(0),
                int(40),
                int(40),
                int(40),
                int(1),
            ]),
        },
        Case {
            udf: "resize3d",
            field: vol_field,
            inputs: [vol(32), vol(64)],
            consts: vec![int(16), int(16), int(16), int(1)],
            large_consts: Some(vec![int(48), int(48), int(48), int(1)]),
        },
    ]
}

fn measure(
    udf: &ScalarUDF,
    case: &Case,
    input: &(ArrayRef, SampleStats),
    consts: &[ScalarValue],
) -> Result<(f64, f64)> {
    let spec =
        spec(case.udf).ok_or_else(|| DataFusionError::Internal(format!("no udf {}", case.udf)))?;
    let (array, stats) = input;
    let mut args = vec![ColumnarValue::Array(Arc::clone(array))];
    // An image argument's field records the size of the images it carries.
    let field = match crate::tensor::ImageColumn::new(array, case.udf)
        .ok()
        .and_then(|c| c.get(0))
    {
        Some(img) => image_field(
            "img",
            [
                Some(img.height),
                Some(img.width),
                Some(u32::from(img.channels)),
            ],
        ),
        None => Arc::clone(&case.field),
    };
    let mut fields = vec![field];
    for c in consts {
        args.push(ColumnarValue::Scalar(c.clone()));
        fields.push(Arc::new(Field::new("c", c.data_type(), true)));
    }
    if spec.keyed {
        let keys: StringArray = (0..ROWS).map(|i| Some(format!("sample-{i}"))).collect();
        args.push(ColumnarValue::Array(Arc::new(keys)));
        fields.push(Arc::new(Field::new("key", DataType::Utf8, true)));
    }
    let scalars: Vec<Option<&ScalarValue>> = args
        .iter()
        .map(|a| match a {
            ColumnarValue::Scalar(s) => Some(s),
            ColumnarValue::Array(_) => None,
        })
        .collect();
    let return_field = udf.return_field_from_args(ReturnFieldArgs {
        arg_fields: &fields,
        scalar_arguments: &scalars,
    })?;
    let config = Arc::new(ConfigOptions::default());
    let mut failure = None;
    let ns = median_ns(5, || {
        let r = udf.invoke_with_args(ScalarFunctionArgs {
            args: args.clone(),
            arg_fields: fields.clone(),
            number_rows: ROWS,
            return_field: Arc::clone(&return_field),
            config_options: Arc::clone(&config),
        });
        if let Err(e) = r {
            failure = Some(e);
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    let mut values: Vec<Option<ScalarValue>> = vec![None];
    values.extend(consts.iter().cloned().map(Some));
    let consts = Consts::from_values(spec, values);
    let work = udf::estimate(udf, &consts, stats)
        .ok_or_else(|| DataFusionError::Internal(format!("{} has no cost model", case.udf)))??
        .work;
    Ok((work, ns / ROWS as f64))
}

/// Measures every UDF's profile here. Takes some seconds.
pub fn calibrate() -> Result<Profiles> {
    let env = UdfEnv::new(Default::default());
    let udfs = udf::all(&env);
    let defaults = crate::cost::default_profiles();
    let mut out = Profiles::new();
    for case in cases()? {
        let udf = udfs
            .iter()
            .find(|u| u.name() == case.udf)
            .ok_or_else(|| DataFusionError::Internal(format!("no udf {}", case.udf)))?;
        let small = measure(udf, &case, &case.inputs[0], &case.consts)?;
        let large_consts = case.large_consts.as_ref().unwrap_or(&case.consts);
        let large = measure(udf, &case, &case.inputs[1], large_consts)?;
        let unit = defaults
            .get(case.udf)
            .map_or("unit", |p: &Profile| p.unit.as_str());
        out.insert(case.udf.to_owned(), fit(unit, small, large));
    }
    Ok(out)
}
