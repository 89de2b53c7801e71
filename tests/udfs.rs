//! The UDFs from `sluice sql` on ingested datasets: probing at ingest,
//! pipelines over images, videos and arrays, the error policies, and the
//! Arrow IPC output with its extension types.

use std::path::Path;

use crate::common::{Env, gen_sample};
use arrow::array::AsArray;
use sluice_udfs::kernels::{npy, npz, video};

/// An ImageFolder with JPEG/PNG images, plus a clip, a volume and a JPEG
/// whose header is sound but whose body is cut short.
fn mixed_dataset(env: &Env) -> std::path::PathBuf {
    let src = env.path("src");
    gen_sample(env, &src, 2, 4, 5);
    let other = src.join("other");
    std::fs::create_dir_all(&other).unwrap();
    video::encode_test_clip(&other.join("clip.avi"), "mpeg4", 12, 64, 48).unwrap();
    let vol: Vec<u8> = (0..8 * 8 * 8u32)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    let z = npz::write(
        &[("x", npy::write(npy::DType::F32, &[8, 8, 8], &vol))],
        true,
    );
    std::fs::write(other.join("vol.npz"), z).unwrap();
    let jpeg = std::fs::read(first_jpeg(&src.join("class_0"))).unwrap();
    std::fs::write(other.join("cut.jpg"), &jpeg[..jpeg.len() / 3]).unwrap();
    src
}

fn first_jpeg(dir: &Path) -> std::path::PathBuf {
    let mut jpegs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    jpegs.sort();
    jpegs.remove(0)
}

#[test]
fn ingest_probes_videos_and_arrays_and_sql_runs_every_kind_of_pipeline() {
    let env = Env::new();
    let src = mixed_dataset(&env);
    env.ok(&["ingest", "mix", src.to_str().unwrap()]);

    let rows = env.sql_json(
        "SELECT key, format, codec, width, height, frames, dtype, shape FROM mix WHERE label = 'other' ORDER BY key",
        &[],
    );
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(rows[0]["format"], "avi");
    assert_eq!(rows[0]["codec"], "mpeg4");
    assert_eq!(
        (rows[0]["width"].as_u64(), rows[0]["frames"].as_u64()),
        (Some(64), Some(12))
    );
    assert_eq!(rows[1]["format"], "jpeg");
    assert_eq!(rows[2]["dtype"], "float32");
    assert_eq!(rows[2]["shape"], serde_json::json!([8, 8, 8]));

    // Images: the classification pipeline, with the cut JPEG skipped.
    let out = env.run(&[
        "sql",
        "SELECT key, to_tensor(random_horizontal_flip(random_resized_crop(decode_image(data), 32, 32))) AS t \
         FROM mix WHERE format IN ('jpeg', 'png') ORDER BY key",
        "--on-error",
        "skip",
        "--seed",
        "3",
        "--format",
        "json",
        "--binary",
        "length",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 8, "{stdout}");
    assert!(!stdout.contains("cut.jpg"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("skipped 1 bad sample(s):") && stderr.contains("other/cut.jpg"),
        "{stderr}"
    );

    // The same query under `fail` names the sample.
    let err = env.fails(&[
        "sql",
        "SELECT key, decode_image(data) FROM mix WHERE format = 'jpeg'",
    ]);
    assert!(
        err.contains("decode_image: sample 'other/cut.jpg'"),
        "{err}"
    );
    // … and under `null` keeps the row.
    let rows = env.sql_json(
        "SELECT key, decode_image(data) IS NULL AS bad FROM mix WHERE format = 'jpeg' ORDER BY key",
        &["--on-error", "null"],
    );
    assert_eq!(rows.iter().filter(|r| r["bad"] == true).count(), 1);

    // Video and volume pipelines.
    let rows = env.sql_json(
        "SELECT key, decode_video(data, 4, 16, 16, 'uniform') AS v FROM mix WHERE codec IS NOT NULL",
        &[],
    );
    assert_eq!(rows[0]["v"], "tensor uint8 [4, 16, 16, 3]");
    let rows = env.sql_json(
        "SELECT to_tensor(resize3d(npz(data, 'x'), 4, 4, 4)) AS v FROM mix WHERE format = 'npz'",
        &[],
    );
    assert_eq!(rows[0]["v"], "tensor float32 [4, 4, 4]");
}

#[test]
fn arrow_output_carries_fixed_shape_tensors() {
    let env = Env::new();
    let src = env.path("src");
    gen_sample(&env, &src, 1, 3, 9);
    env.ok(&["ingest", "small", src.to_str().unwrap()]);
    let out = env.run(&[
        "sql",
        "SELECT key, to_tensor(resize(decode_image(data), 8, 6)) AS t FROM small ORDER BY key",
        "--format",
        "arrow",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reader =
        arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(out.stdout), None).unwrap();
    let schema = reader.schema();
    let field = schema.field_with_name("t").unwrap();
    assert_eq!(
        field
            .metadata()
            .get("ARROW:extension:name")
            .map(String::as_str),
        Some("arrow.fixed_shape_tensor")
    );
    assert_eq!(
        field
            .metadata()
            .get("ARROW:extension:metadata")
            .map(String::as_str),
        Some(r#"{"shape":[8,6,3]}"#)
    );
    let batches: Vec<_> = reader.map(Result::unwrap).collect();
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 3);
    let t = batches[0].column(1).as_fixed_size_list();
    assert_eq!(t.value_length(), 8 * 6 * 3);
}

#[test]
fn bad_udf_calls_are_clear_errors() {
    let env = Env::new();
    let src = env.path("src");
    gen_sample(&env, &src, 1, 2, 1);
    env.ok(&["ingest", "d", src.to_str().unwrap()]);
    let err = env.fails(&["sql", "SELECT to_tensor(decode_image(data)) FROM d"]);
    assert!(err.contains("resize or crop them first"), "{err}");
    let err = env.fails(&["sql", "SELECT decode_image(key) FROM d"]);
    assert!(
        err.contains("decode_image: expected the encoded bytes"),
        "{err}"
    );
    let err = env.fails(&["sql", "SELECT decode_image(data, 'CMYK') FROM d"]);
    assert!(err.contains("unknown mode 'CMYK'"), "{err}");
    let err = env.fails(&["sql", "SELECT 1", "--on-error", "drop"]);
    assert!(err.contains("unknown error policy 'drop'"), "{err}");
    let err = env.fails(&[
        "sql",
        "SELECT random_horizontal_flip(img) FROM (SELECT decode_image(data) AS img FROM d)",
    ]);
    assert!(
        err.contains("draws its randomness from the sample key"),
        "{err}"
    );
    let err = env.fails(&[
        "sql",
        "SELECT decode_image(data) FROM d",
        "--max-pixels",
        "100",
    ]);
    assert!(err.contains("max_pixels"), "{err}");
}

#[test]
fn udfs_lists_every_udf_with_its_cost_profile() {
    let env = Env::new();
    let list = env.json(&["udfs", "--format", "json"]);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 14);
    let rrc = list
        .iter()
        .find(|u| u["name"] == "random_resized_crop")
        .unwrap();
    assert_eq!(rrc["random"], true);
    assert!(
        rrc["usage"]
            .as_str()
            .unwrap()
            .starts_with("random_resized_crop(img, h, w")
    );
    assert!(rrc["profile"]["per_unit_ns"].as_f64().unwrap() > 0.0);
    // A saved calibration overrides the defaults.
    std::fs::create_dir_all(env.data_dir()).unwrap();
    std::fs::write(
        env.data_dir().join("udf-profiles.json"),
        r#"{"resize": {"per_call_ns": 1.0, "per_unit_ns": 2.0, "unit": "source + output pixel"}}"#,
    )
    .unwrap();
    let list = env.json(&["udfs", "--format", "json"]);
    let resize = list
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "resize")
        .unwrap();
    assert_eq!(resize["profile"]["per_unit_ns"], 2.0);
    std::fs::write(env.data_dir().join("udf-profiles.json"), "not json").unwrap();
    let err = env.fails(&["udfs"]);
    assert!(err.contains("bad profiles file"), "{err}");
}
