//! The UDFs through DataFusion SQL on in-memory tables of generated samples:
//! golden shapes and values, determinism, fusion, and every bad-input path
//! under each error policy.

use std::io::Cursor;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Float32Type, Schema, UInt8Type};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use sluice_base::task::SpawnedTask;
use sluice_udfs::kernels::{npy, npz, video};
use sluice_udfs::tensor::{ImageColumn, tensor_shape};
use sluice_udfs::{OnError, UdfEnv, UdfOptions};

fn encode(img: &image::RgbImage, format: image::ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

fn gradient(w: u32, h: u32) -> image::RgbImage {
    image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([(x % 256) as u8, (y % 256) as u8, ((x + y) % 256) as u8])
    })
}

fn session(rows: Vec<(&str, Vec<u8>)>, options: UdfOptions) -> (SessionContext, Arc<UdfEnv>) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("data", DataType::Binary, false),
    ]));
    let keys: ArrayRef = Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0)));
    let data: ArrayRef = Arc::new(BinaryArray::from_iter_values(
        rows.iter().map(|r| r.1.as_slice()),
    ));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![keys, data]).unwrap();
    let ctx = SessionContext::new();
    ctx.register_table(
        "ds",
        Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap()),
    )
    .unwrap();
    let env = UdfEnv::new(options);
    sluice_udfs::register(&ctx, &env);
    (ctx, env)
}

async fn query(ctx: &SessionContext, sql: &str) -> datafusion::error::Result<Vec<RecordBatch>> {
    ctx.sql(sql).await?.collect().await
}

/// The float32 values of the tensor column `i`.
fn tensor_f32(b: &RecordBatch, i: usize) -> Vec<f32> {
    b.column(i)
        .as_fixed_size_list()
        .values()
        .as_primitive::<Float32Type>()
        .values()
        .to_vec()
}

fn one(batches: &[RecordBatch]) -> RecordBatch {
    arrow::compute::concat_batches(&batches[0].schema(), batches).unwrap()
}

#[tokio::test]
async fn image_pipeline_gives_tensors_of_the_planned_shape_and_values() {
    let png = encode(&gradient(64, 48), image::ImageFormat::Png);
    let (ctx, _) = session(vec![("a.png", png)], UdfOptions::default());
    let b = one(&query(
        &ctx,
        "SELECT decode_image(data) AS img, to_tensor(resize(decode_image(data), 24, 32)) AS t, \
         normalize(center_crop(decode_image(data), 8, 8), [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]) AS n FROM ds",
    )
    .await
    .unwrap());
    // PNG decodes exactly.
    let img_col = b.column(0);
    let images = ImageColumn::new(img_col, "test").unwrap();
    let img = images.get(0).unwrap();
    assert_eq!((img.height, img.width, img.channels), (48, 64, 3));
    assert_eq!(&img.pixels[(10 * 64 + 20) * 3..][..3], &[20, 10, 30]);
    // to_tensor: arrow.fixed_shape_tensor uint8 [24, 32, 3].
    let schema = b.schema();
    assert_eq!(tensor_shape(schema.field(1)), Some(vec![24, 32, 3]));
    let t = b.column(1).as_fixed_size_list();
    assert_eq!(t.value_length(), 24 * 32 * 3);
    assert_eq!(t.values().as_primitive::<UInt8Type>().len(), 24 * 32 * 3);
    // normalize: float32 [3, 8, 8]; the centre crop starts at (20, 28):
    // red at (0, 0) is 28 → (28/255 - 0.5) / 0.5.
    assert_eq!(tensor_shape(schema.field(2)), Some(vec![3, 8, 8]));
    let n = tensor_f32(&b, 2);
    assert!((n[0] - (28.0 / 255.0 - 0.5) / 0.5).abs() < 1e-6, "{}", n[0]);
    // Green plane, row 0: y = 20.
    assert!(
        (n[64] - (20.0 / 255.0 - 0.5) / 0.5).abs() < 1e-6,
        "{}",
        n[64]
    );
}

#[tokio::test]
async fn variable_size_images_need_a_resize_before_a_tensor() {
    let png = encode(&gradient(8, 8), image::ImageFormat::Png);
    let (ctx, _) = session(vec![("a", png)], UdfOptions::default());
    let e = query(&ctx, "SELECT to_tensor(decode_image(data)) FROM ds")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("resize or crop them first"), "{e}");
    let e = query(&ctx, "SELECT resize(decode_image(data), 0, 5) FROM ds")
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("argument h must be in 1..=1048576"),
        "{e}"
    );
    let e = query(&ctx, "SELECT resize(decode_image(data), 5) FROM ds")
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("resize takes 3 to 4 arguments"),
        "{e}"
    );
    let e = query(
        &ctx,
        "SELECT resize(decode_image(data), 5, 5, 'box') FROM ds",
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("unknown filter 'box'"), "{e}");
}

fn dataset(n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let img = image::RgbImage::from_fn(96 + i as u32 * 7, 80, |x, y| {
                image::Rgb([
                    (x * 3 % 256) as u8,
                    (y * 5 % 256) as u8,
                    ((x * y + i as u32) % 256) as u8,
                ])
            });
            (
                format!("s{i:03}.jpg"),
                encode(&img, image::ImageFormat::Jpeg),
            )
        })
        .collect()
}

async fn augmented(rows: &[(String, Vec<u8>)], seed: u64, epoch: u64, sql: &str) -> Vec<u8> {
    let rows = rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let (ctx, _) = session(
        rows,
        UdfOptions {
            seed,
            epoch,
            ..UdfOptions::default()
        },
    );
    let b = one(&query(&ctx, sql).await.unwrap());
    let t = b.column(1).as_fixed_size_list();
    t.values().as_primitive::<UInt8Type>().values().to_vec()
}

const AUGMENT: &str = "SELECT key, to_tensor(random_horizontal_flip(random_resized_crop(decode_image(data), 32, 32))) FROM ds ORDER BY key";

#[tokio::test]
async fn random_augmentations_are_a_function_of_seed_epoch_and_key() {
    let rows = dataset(12);
    let base = augmented(&rows, 7, 0, AUGMENT).await;
    // Same inputs on other threads: the same bytes.
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let rows = rows.clone();
            SpawnedTask::spawn(async move { augmented(&rows, 7, 0, AUGMENT).await })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().await.unwrap(), base);
    }
    // Row order and batch composition do not matter: reversed input, one row alone.
    let mut reversed = rows.clone();
    reversed.reverse();
    assert_eq!(augmented(&reversed, 7, 0, AUGMENT).await, base);
    let alone = augmented(&rows[5..6], 7, 0, AUGMENT).await;
    let per = alone.len();
    assert_eq!(&base[5 * per..6 * per], alone.as_slice());
    // Another epoch or seed: other crops.
    assert_ne!(augmented(&rows, 7, 1, AUGMENT).await, base);
    assert_ne!(augmented(&rows, 8, 0, AUGMENT).await, base);
}

#[tokio::test]
async fn fused_decode_crop_picks_the_same_window_as_the_unfused_form() {
    let big = gradient(1600, 1200);
    let rows = vec![("big.jpg".to_owned(), encode(&big, image::ImageFormat::Jpeg))];
    let fused = augmented(
        &rows,
        3,
        0,
        "SELECT key, to_tensor(random_resized_crop(decode_image(data), 64, 64)) FROM ds",
    )
    .await;
    // A flip with p = 0 between decode and crop keeps the planner from fusing.
    let unfused = augmented(
        &rows,
        3,
        0,
        "SELECT key, to_tensor(random_resized_crop(random_horizontal_flip(decode_image(data), 0.0), 64, 64)) FROM ds",
    )
    .await;
    let mad = fused
        .iter()
        .zip(&unfused)
        .map(|(a, b)| (i32::from(*a) - i32::from(*b)).abs())
        .sum::<i32>() as f64
        / fused.len() as f64;
    assert!(mad < 4.0, "mean abs difference {mad}");
    let resized = augmented(
        &rows,
        0,
        0,
        "SELECT key, to_tensor(resize(decode_image(data), 60, 80)) FROM ds",
    )
    .await;
    // Left column red ≈ 10 (mean of x in 0..20), bottom rows green ≈ 255 clipped → high.
    assert!((i32::from(resized[0]) - 10).abs() < 6, "{}", resized[0]);
}

#[tokio::test]
async fn explain_shows_fusion_and_completed_arguments() {
    let (ctx, _) = session(
        vec![("a", vec![1])],
        UdfOptions {
            seed: 42,
            epoch: 3,
            ..UdfOptions::default()
        },
    );
    let b = one(&query(
        &ctx,
        "EXPLAIN SELECT random_resized_crop(decode_image(data), 224, 224) AS x FROM ds",
    )
    .await
    .unwrap());
    let text = arrow::util::pretty::pretty_format_batches(&[b])
        .unwrap()
        .to_string();
    assert!(
        text.contains("decode_random_resized_crop(ds.data, Int64(224), Int64(224)"),
        "{text}"
    );
    assert!(text.contains("Int64(42), Int64(3), ds.key"), "{text}");
}

/// A JPEG whose frame header claims `w`×`h`.
fn jpeg_claiming(w: u16, h: u16) -> Vec<u8> {
    let mut jpeg = encode(&gradient(16, 16), image::ImageFormat::Jpeg);
    let sof = jpeg.windows(2).position(|m| m == [0xff, 0xc0]).unwrap();
    jpeg[sof + 5..sof + 7].copy_from_slice(&h.to_be_bytes());
    jpeg[sof + 7..sof + 9].copy_from_slice(&w.to_be_bytes());
    jpeg
}

fn clip(frames: u32) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.avi");
    video::encode_test_clip(&path, "mpeg4", frames, 64, 48).unwrap();
    std::fs::read(path).unwrap()
}

/// One good and one bad sample per case: (query, good, bad, words the reason contains).
fn bad_cases() -> Vec<(&'static str, Vec<u8>, Vec<u8>, &'static str)> {
    let jpeg = encode(&gradient(32, 32), image::ImageFormat::Jpeg);
    let truncated = jpeg[..jpeg.len() / 3].to_vec();
    let good_clip = clip(8);
    let mut corrupt_clip = good_clip.clone();
    corrupt_clip.truncate(400);
    let arr = npy::write(npy::DType::U8, &[2, 2], &[1, 2, 3, 4]);
    let with_x = npz::write(&[("x", arr.clone())], true);
    let with_y = npz::write(&[("y", arr.clone())], true);
    let img = "SELECT key, decode_image(data) AS v FROM ds";
    vec![
        (img, jpeg.clone(), truncated, "JPEG"),
        (
            img,
            jpeg.clone(),
            b"GIF87a\x04\x00\x04\x00\x00\x00\x00 garbage".to_vec(),
            "Gif",
        ),
        (
            img,
            jpeg.clone(),
            b"plain words".to_vec(),
            "not a recognised image format",
        ),
        (img, jpeg.clone(), Vec::new(), "empty object"),
        (
            img,
            jpeg.clone(),
            jpeg_claiming(65_000, 65_000),
            "max_pixels",
        ),
        (
            "SELECT key, decode_video(data, 4, 16, 16) AS v FROM ds",
            good_clip,
            corrupt_clip,
            "video",
        ),
        (
            "SELECT key, npz(data, 'x') AS v FROM ds",
            with_x,
            with_y,
            "no array 'x'",
        ),
        (
            "SELECT key, npy(data) AS v FROM ds",
            arr.clone(),
            arr[..arr.len() - 2].to_vec(),
            "truncated .npy data",
        ),
        (
            "SELECT key, to_tensor(resize(decode_image(data), 8, 8)) AS v FROM ds",
            jpeg.clone(),
            b"\xff\xd8\xff\xe0 broken".to_vec(),
            "JPEG",
        ),
    ]
}

#[tokio::test]
async fn every_bad_input_follows_each_policy_and_the_session_keeps_working() {
    for (sql, good, bad, reason) in bad_cases() {
        let rows = || vec![("good", good.clone()), ("bad", bad.clone())];
        // fail: an error naming the UDF, the key and the reason.
        let (ctx, _) = session(
            rows(),
            UdfOptions {
                on_error: OnError::Fail,
                ..UdfOptions::default()
            },
        );
        let e = query(&ctx, sql).await.unwrap_err().to_string();
        assert!(
            e.contains("sample 'bad'") && e.to_lowercase().contains(&reason.to_lowercase()),
            "{sql}: {e}"
        );
        // The same session still answers.
        assert_eq!(
            one(&query(&ctx, "SELECT count(*) FROM ds").await.unwrap()).num_rows(),
            1
        );
        // null: both rows, the bad one NULL, logged.
        let (ctx, env) = session(
            rows(),
            UdfOptions {
                on_error: OnError::Null,
                ..UdfOptions::default()
            },
        );
        let b = one(&query(&ctx, &format!("{sql} ORDER BY key DESC"))
            .await
            .unwrap());
        assert_eq!(b.num_rows(), 2, "{sql}");
        assert!(!b.column(1).is_null(0) && b.column(1).is_null(1), "{sql}");
        let (n, log) = env.errors.snapshot();
        assert_eq!((n, log[0].key.as_str()), (1, "bad"), "{sql}");
        // skip: only the good row.
        let (ctx, env) = session(
            rows(),
            UdfOptions {
                on_error: OnError::Skip,
                ..UdfOptions::default()
            },
        );
        let b = one(&query(&ctx, sql).await.unwrap());
        let keys = b.column(0).as_string::<i32>();
        assert_eq!((b.num_rows(), keys.value(0)), (1, "good"), "{sql}");
        assert_eq!(env.errors.snapshot().0, 1, "{sql}");
    }
}

#[tokio::test]
async fn video_frames_come_in_order_at_the_requested_size() {
    let (ctx, _) = session(vec![("c", clip(24))], UdfOptions::default());
    let b = one(&query(&ctx, "SELECT decode_video(data, 5, 24, 32, 'uniform') AS v, decode_video(data, 3, 8, 8, 4) AS s FROM ds").await.unwrap());
    let schema = b.schema();
    assert_eq!(tensor_shape(schema.field(0)), Some(vec![5, 24, 32, 3]));
    assert_eq!(tensor_shape(schema.field(1)), Some(vec![3, 8, 8, 3]));
    let v = b
        .column(0)
        .as_fixed_size_list()
        .values()
        .as_primitive::<UInt8Type>()
        .values()
        .to_vec();
    let plane = 24 * 32 * 3;
    let means: Vec<f64> = v
        .chunks(plane)
        .map(|f| f.iter().map(|&x| f64::from(x)).sum::<f64>() / plane as f64)
        .collect();
    assert!(means.windows(2).all(|w| w[1] > w[0]), "{means:?}");
}

#[tokio::test]
async fn arrays_volumes_and_their_tensors() {
    // A 4x4x4 float32 ramp along z: value = z.
    let data: Vec<u8> = (0..64u32)
        .flat_map(|i| ((i / 16) as f32).to_le_bytes())
        .collect();
    let file = npy::write(npy::DType::F32, &[4, 4, 4], &data);
    let z = npz::write(&[("image", file.clone())], true);
    let (ctx, _) = session(vec![("v", z)], UdfOptions::default());
    let b = one(&query(
        &ctx,
        "SELECT npz(data, 'image') AS a, to_tensor(crop3d(npz(data, 'image'), 1, 0, 0, 2, 2, 2), 'float32') AS c, \
         to_tensor(resize3d(npz(data, 'image'), 2, 2, 2)) AS r FROM ds",
    )
    .await
    .unwrap());
    let a = b.column(0).as_struct();
    assert_eq!(a.column(0).as_string::<i32>().value(0), "float32");
    let schema = b.schema();
    assert_eq!(tensor_shape(schema.field(1)), Some(vec![2, 2, 2]));
    let c = tensor_f32(&b, 1);
    assert_eq!(c, [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]);
    let r = tensor_f32(&b, 2);
    assert_eq!(r, [0.5, 0.5, 0.5, 0.5, 2.5, 2.5, 2.5, 2.5]);
    // A crop that does not fit is a bad sample, not a crash.
    let e = query(
        &ctx,
        "SELECT crop3d(npz(data, 'image'), 3, 0, 0, 2, 2, 2) FROM ds",
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("exceeds the volume's shape"), "{e}");
}

#[test]
fn cost_estimates_follow_the_statistics() {
    use datafusion::common::ScalarValue;
    use sluice_udfs::args::Consts;
    use sluice_udfs::cost::{SampleStats, default_profiles};
    use sluice_udfs::udf::{all, estimate, spec};
    let env = UdfEnv::new(UdfOptions::default());
    let udfs = all(&env);
    let find = |n: &str| udfs.iter().find(|u| u.name() == n).unwrap();
    let int = |v: i64| Some(ScalarValue::Int64(Some(v)));
    let photo = SampleStats::encoded_image(4e6, 4000.0, 3000.0, 3.0);
    let full = estimate(
        find("decode_image"),
        &Consts::from_values(spec("decode_image").unwrap(), vec![None]),
        &photo,
    )
    .unwrap()
    .unwrap();
    assert_eq!(full.work, 12e6);
    assert_eq!(full.out.bytes, 36e6);
    let fused = estimate(
        find("decode_resize"),
        &Consts::from_values(
            spec("decode_resize").unwrap(),
            vec![None, int(224), int(224)],
        ),
        &photo,
    )
    .unwrap()
    .unwrap();
    assert!(fused.work < full.work * 0.6, "{fused:?}");
    assert_eq!(fused.out.bytes, 224.0 * 224.0 * 3.0);
    let p = default_profiles();
    assert!(p["decode_resize"].ns(fused.work) < p["decode_image"].ns(full.work));
    let clip = SampleStats {
        bytes: 1e6,
        width: 320.0,
        height: 240.0,
        channels: 3.0,
        frames: 300.0,
        elements: 0.0,
    };
    let v = estimate(
        find("decode_video"),
        &Consts::from_values(
            spec("decode_video").unwrap(),
            vec![None, int(16), int(112), int(112)],
        ),
        &clip,
    )
    .unwrap()
    .unwrap();
    // Stride 1: frames 0..16 decoded, 16 frames of 112x112x3 out.
    assert_eq!(
        (v.work, v.out.bytes),
        (16.0 * 320.0 * 240.0, 16.0 * 112.0 * 112.0 * 3.0)
    );
}

#[tokio::test]
async fn fused_crop_windows_stay_inside_dct_scaled_images() {
    // Odd sizes make libjpeg-turbo round the scaled image up; a window at
    // the right or bottom edge must not overhang it (found by the
    // placement bench on 500x375 photos).
    let rows: Vec<(String, Vec<u8>)> = (0..400)
        .map(|i| {
            let (w, h) = [(500, 375), (333, 251), (1001, 667)][i % 3];
            (
                format!("k{i}"),
                encode(&gradient(w, h), image::ImageFormat::Jpeg),
            )
        })
        .collect();
    let refs: Vec<(&str, Vec<u8>)> = rows.iter().map(|(k, b)| (k.as_str(), b.clone())).collect();
    let (ctx, _) = session(refs, UdfOptions::default());
    for size in [32, 57, 224] {
        let sql = format!(
            "SELECT random_resized_crop(decode_image(data), {size}, {size}, 0.01, 1.0) AS x FROM ds"
        );
        let out = query(&ctx, &sql).await.unwrap();
        let n: usize = out.iter().map(|b| b.num_rows()).sum();
        assert_eq!(n, 400, "{sql}");
    }
}

/// A result whose size the query fixes and that is over the limits is
/// refused when the query is planned, naming the UDF and the limit —
/// before anything is allocated.
#[tokio::test]
async fn huge_results_are_refused_when_planned() {
    let ctx = datafusion::prelude::SessionContext::new();
    sluice_udfs::register(&ctx, &sluice_udfs::UdfEnv::new(Default::default()));
    let png = {
        let mut out = std::io::Cursor::new(Vec::new());
        image::RgbImage::new(2, 2)
            .write_to(&mut out, image::ImageFormat::Png)
            .unwrap();
        out.into_inner()
    };
    let hex: String = png.iter().map(|b| format!("{b:02x}")).collect();
    for (call, limit) in [
        ("center_crop(decode_image(d), 100000, 100000)", "max_pixels"),
        ("resize(decode_image(d), 46341, 46341)", "max_pixels"),
        ("resize(decode_image(d), 65536, 65537)", "max_pixels"),
    ] {
        let sql = format!("SELECT {call} FROM (SELECT X'{hex}' AS d)");
        let e = match ctx.sql(&sql).await {
            Ok(df) => df.collect().await.unwrap_err(),
            Err(e) => e,
        }
        .to_string();
        assert!(
            e.contains(limit) && e.contains("over the limit"),
            "{call}: {e}"
        );
    }
}

/// `sql`'s physical plan in `ctx`, guarded as compute plans are.
async fn physical(
    ctx: &SessionContext,
    env: &Arc<UdfEnv>,
    sql: &str,
) -> Arc<dyn datafusion::physical_plan::ExecutionPlan> {
    let plan = ctx
        .sql(sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    sluice_udfs::panic_guard::guard_plan(plan, env).unwrap()
}

#[tokio::test]
async fn a_plan_rebound_to_another_epoch_computes_what_one_planned_for_it_does() {
    let mut rows = dataset(8);
    rows.push(("bad.jpg".into(), b"\xff\xd8 not a jpeg".to_vec()));
    let sql = "SELECT key, to_tensor(random_horizontal_flip(random_resized_crop(decode_image(data), 32, 32))) FROM ds ORDER BY key";
    let options = |epoch| UdfOptions {
        seed: 7,
        epoch,
        on_error: OnError::Null,
        ..UdfOptions::default()
    };
    let owned = || rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let tensors = |batches: &[RecordBatch]| {
        let b = one(batches);
        let t = b.column(1).as_fixed_size_list().values().clone();
        t.as_primitive::<UInt8Type>().values().to_vec()
    };
    // Planned once, for epoch 0.
    let (ctx, planned_env) = session(owned(), options(0));
    let plan = physical(&ctx, &planned_env, sql).await;
    // Planned afresh for epoch 3: what the rebound plan must compute.
    let (fresh_ctx, fresh_env) = session(owned(), options(3));
    let fresh = physical(&fresh_ctx, &fresh_env, sql).await;
    let want = tensors(
        &datafusion::physical_plan::collect(fresh, fresh_ctx.task_ctx())
            .await
            .unwrap(),
    );

    let env = UdfEnv::new(options(3));
    let rebound = sluice_udfs::rebind::rebind_plan(Arc::clone(&plan), &env).unwrap();
    let got = tensors(
        &datafusion::physical_plan::collect(rebound, ctx.task_ctx())
            .await
            .unwrap(),
    );
    assert_eq!(got, want);
    // The bad sample is the rebound stream's, not the planned one's.
    assert_eq!(env.errors.snapshot().0, 1);
    assert_eq!(planned_env.errors.snapshot().0, 0);
    // The plan it came from still computes epoch 0, which differs.
    let epoch0 = tensors(
        &datafusion::physical_plan::collect(plan, ctx.task_ctx())
            .await
            .unwrap(),
    );
    assert_eq!(epoch0, augmented_with(&rows, options(0), sql).await);
    assert_ne!(epoch0, want);
}

async fn augmented_with(rows: &[(String, Vec<u8>)], options: UdfOptions, sql: &str) -> Vec<u8> {
    let rows = rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let (ctx, _) = session(rows, options);
    let b = one(&query(&ctx, sql).await.unwrap());
    let t = b.column(1).as_fixed_size_list();
    t.values().as_primitive::<UInt8Type>().values().to_vec()
}

#[tokio::test]
async fn only_plans_without_random_or_volatile_calls_are_the_same_every_epoch() {
    let (ctx, _) = session(
        vec![("a", encode(&gradient(16, 16), image::ImageFormat::Png))],
        UdfOptions::default(),
    );
    for (sql, same) in [
        (
            "SELECT key, to_tensor(resize(decode_image(data), 8, 8)) FROM ds WHERE key <> 'b'",
            true,
        ),
        ("SELECT key, data FROM ds", true),
        (
            "SELECT key, to_tensor(random_resized_crop(decode_image(data), 8, 8)) FROM ds",
            false,
        ),
        (
            "SELECT key FROM ds WHERE random_horizontal_flip(decode_image(data)) IS NOT NULL",
            false,
        ),
        ("SELECT key, random() AS r FROM ds", false),
    ] {
        let plan = ctx.sql(sql).await.unwrap().into_optimized_plan().unwrap();
        assert_eq!(sluice_udfs::rebind::same_every_epoch(&plan), same, "{sql}");
    }
}

#[tokio::test]
async fn a_node_other_than_a_projection_or_filter_holding_a_udf_call_is_not_rebound() {
    let (ctx, env) = session(
        vec![("a", encode(&gradient(16, 16), image::ImageFormat::Png))],
        UdfOptions::default(),
    );
    let sql =
        "SELECT key FROM ds ORDER BY to_tensor(random_resized_crop(decode_image(data), 8, 8))";
    let plan = physical(&ctx, &env, sql).await;
    let err = sluice_udfs::rebind::rebind_plan(plan, &UdfEnv::new(UdfOptions::default()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("SortExec holds sluice UDF calls"), "{err}");
}

#[tokio::test]
async fn whole_arrays_become_tensors_with_the_values_of_the_copying_path() {
    let arrays: Vec<Vec<f32>> = (0..3)
        .map(|r| (0..24).map(|i| (r * 100 + i) as f32).collect())
        .collect();
    let bytes = |a: &[f32]| -> Vec<u8> { a.iter().flat_map(|v| v.to_le_bytes()).collect() };
    let mut rows: Vec<(String, Vec<u8>)> = arrays
        .iter()
        .enumerate()
        .map(|(r, a)| {
            (
                format!("a{r}"),
                npy::write(npy::DType::F32, &[2, 3, 4], &bytes(a)),
            )
        })
        .collect();
    rows.push(("bad".into(), b"not an npy".to_vec()));
    let owned = rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let (ctx, _) = session(
        owned,
        UdfOptions {
            on_error: OnError::Null,
            ..UdfOptions::default()
        },
    );
    let whole = "to_tensor(crop3d(npy(data), 0, 0, 0, 2, 3, 4), 'float32')";
    // Good rows only: the whole boxes are the column as it is, and the
    // tensor shares its bytes.
    let sql = format!("SELECT key, {whole} FROM ds WHERE key <> 'bad' ORDER BY key");
    let shared = tensor_f32(&one(&query(&ctx, &sql).await.unwrap()), 1);
    assert_eq!(shared, arrays.concat());
    // With the bad row NULL: the copying path, the same values.
    let sql = format!("SELECT key, {whole} FROM ds ORDER BY key");
    let b = one(&query(&ctx, &sql).await.unwrap());
    assert!(b.column(1).is_null(3));
    assert_eq!(tensor_f32(&b, 1)[..72], arrays.concat()[..]);
    // A box that is not the whole: its own values.
    let sql = "SELECT key, to_tensor(crop3d(npy(data), 1, 0, 0, 1, 3, 4), 'float32') FROM ds \
               WHERE key <> 'bad' ORDER BY key";
    let half = tensor_f32(&one(&query(&ctx, sql).await.unwrap()), 1);
    let want: Vec<f32> = arrays.iter().flat_map(|a| a[12..].to_vec()).collect();
    assert_eq!(half, want);
    // A whole box of another element type: converted, not shared.
    let sql = format!(
        "SELECT key, {} FROM ds WHERE key <> 'bad' ORDER BY key",
        whole.replace("float32", "uint8")
    );
    let b = one(&query(&ctx, &sql).await.unwrap());
    let u8s = b
        .column(1)
        .as_fixed_size_list()
        .values()
        .as_primitive::<UInt8Type>()
        .values()
        .to_vec();
    assert_eq!(u8s[..3], [0, 1, 2]);
    assert_eq!(u8s[24], 100);
}

#[tokio::test]
async fn a_random_plan_s_decode_served_from_the_stage_cache_gives_the_same_bytes() {
    use sluice_udfs::stage_cache::{StageCache, cache_plan};
    let mut rows = dataset(8);
    rows.push(("bad.jpg".into(), b"\xff\xd8 not a jpeg".to_vec()));
    let sql = "SELECT key, to_tensor(random_horizontal_flip(resize(decode_image(data), 24, 24))) FROM ds ORDER BY key";
    let options = |epoch| UdfOptions {
        seed: 7,
        epoch,
        on_error: OnError::Null,
        cache_stages: true,
        ..UdfOptions::default()
    };
    let owned = || rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let tensors = |batches: &[RecordBatch]| {
        let b = one(batches);
        let t = b.column(1).as_fixed_size_list();
        (
            t.values().as_primitive::<UInt8Type>().values().to_vec(),
            t.null_count(),
        )
    };
    let (ctx, env) = session(owned(), options(0));
    let plan = physical(&ctx, &env, sql).await;
    let run = |plan| datafusion::physical_plan::collect(plan, ctx.task_ctx());
    let want = tensors(&run(Arc::clone(&plan)).await.unwrap());
    assert_eq!(want.1, 1, "the bad sample's row is NULL");
    let limits = env.options.limits;

    // Room for all: the first run fills it, the second is served from it.
    let cache = Arc::new(StageCache::new(64 << 20));
    let cached = cache_plan(Arc::clone(&plan), &cache, &limits).unwrap();
    assert_eq!(tensors(&run(Arc::clone(&cached)).await.unwrap()), want);
    let first = cache.stats();
    assert_eq!(
        (first.hits, first.misses, first.values),
        (0, 9, 8),
        "{first:?}"
    );
    assert_eq!(tensors(&run(Arc::clone(&cached)).await.unwrap()), want);
    let second = cache.stats();
    assert_eq!((second.hits, second.misses), (8, 10), "{second:?}");
    // The bad sample is decoded, and reported, every time.
    assert_eq!(env.errors.snapshot().0, 3);

    // Another epoch's stream (the plan rebound) decodes nothing again and
    // computes what a plan made for that epoch does.
    let (fresh_ctx, fresh_env) = session(owned(), options(3));
    let fresh = physical(&fresh_ctx, &fresh_env, sql).await;
    let epoch3 = tensors(
        &datafusion::physical_plan::collect(fresh, fresh_ctx.task_ctx())
            .await
            .unwrap(),
    );
    assert_ne!(epoch3, want);
    let rebound = sluice_udfs::rebind::rebind_plan(cached, &UdfEnv::new(options(3))).unwrap();
    assert_eq!(tensors(&run(rebound).await.unwrap()), epoch3);
    assert_eq!(cache.stats().hits, 16);

    // Other limits are other keys: nothing decoded under these is served.
    let stricter = sluice_udfs::Limits {
        max_pixels: limits.max_pixels / 2,
        ..limits
    };
    let other = cache_plan(Arc::clone(&plan), &cache, &stricter).unwrap();
    assert_eq!(tensors(&run(other).await.unwrap()), want);
    assert_eq!(cache.stats().hits, 16);

    // Room for a few: a batch of hits and misses together, in its order.
    let small = Arc::new(StageCache::new(8 << 10));
    let partly = cache_plan(Arc::clone(&plan), &small, &limits).unwrap();
    for _ in 0..2 {
        assert_eq!(tensors(&run(Arc::clone(&partly)).await.unwrap()), want);
    }
    let st = small.stats();
    assert!(
        st.bytes <= st.budget && st.hits > 0 && st.misses > 9,
        "{st:?}"
    );

    // A disabled cache leaves the plan as it is.
    let off = Arc::new(StageCache::new(0));
    assert!(Arc::ptr_eq(
        &cache_plan(Arc::clone(&plan), &off, &limits).unwrap(),
        &plan
    ));
}
