//! Placement transparency and split execution, against the real binary:
//! every offload mode gives byte-identical rows; two storage nodes plus a
//! compute node (separate processes over loopback Flight) give the rows of
//! the embedded default; a storage node that goes down fails the queries
//! that need it, by name, while the compute node keeps serving the others.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::common::{Env, gen_sample};
use sluice_udfs::kernels::{npy, npz, video};

/// The pipelines of the issue, at test sizes, in a stable order.
const PIPELINES: &[(&str, &str)] = &[
    (
        "classify",
        "SELECT key, label, normalize(random_horizontal_flip(random_resized_crop(decode_image(data), 24, 24)), \
         [0.5, 0.5, 0.5], [0.25, 0.25, 0.25]) AS img FROM pets ORDER BY key",
    ),
    (
        "resize",
        "SELECT key, to_tensor(resize(decode_image(data), 32, 32)) AS img FROM pets ORDER BY key",
    ),
    (
        "volume",
        "SELECT key, to_tensor(crop3d(npz(data, 'x'), 1, 1, 1, 4, 4, 4), 'float32') AS v FROM vols ORDER BY key",
    ),
    (
        "video",
        "SELECT key, decode_video(data, 4, 16, 16) AS clip FROM clips ORDER BY key",
    ),
    (
        "filter",
        "SELECT key, label, length FROM pets WHERE width > 100 AND label <> 'class_0' ORDER BY key",
    ),
];

fn clips(dir: &Path, n: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 0..n {
        video::encode_test_clip(
            &dir.join(format!("clip{i}.avi")),
            "mpeg4",
            10 + i as u32,
            64,
            48,
        )
        .unwrap();
    }
}

fn volumes(dir: &Path, n: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 0..n {
        let vol: Vec<u8> = (0..8 * 8 * 8u32)
            .flat_map(|v| ((v + i as u32) as f32).to_le_bytes())
            .collect();
        let z = npz::write(
            &[("x", npy::write(npy::DType::F32, &[8, 8, 8], &vol))],
            true,
        );
        std::fs::write(dir.join(format!("vol{i}.npz")), z).unwrap();
    }
}

/// An ImageFolder whose classes start at `first`.
fn images(env: &Env, dir: &Path, first: u32, seed: u64) {
    let tmp = env.path(&format!("gen{seed}"));
    gen_sample(env, &tmp, 2, 5, seed);
    std::fs::create_dir_all(dir).unwrap();
    for c in 0..2 {
        std::fs::rename(
            tmp.join(format!("class_{c}")),
            dir.join(format!("class_{}", first + c)),
        )
        .unwrap();
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

fn sluice(data_dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.env("SLUICE_DATA_DIR", data_dir)
        .env("SLUICE_DEVICE_SIZE", "256MiB")
        .env("SLUICE_CHUNK_SIZE", "1MiB")
        .env_remove("SLUICE_LOG");
    c
}

fn ok(c: &mut Command) -> Vec<u8> {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{c:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn fails(c: &mut Command) -> String {
    let out = c.output().unwrap();
    assert!(!out.status.success(), "{c:?} should fail");
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn ingest(data_dir: &Path, name: &str, src: &Path) {
    ok(sluice(data_dir).args(["ingest", name]).arg(src));
}

/// A node process, killed when dropped.
struct Node {
    child: Child,
    url: String,
}

impl Node {
    fn start(data_dir: &Path, args: &[&str]) -> Self {
        let mut child = sluice(data_dir)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split("listening on ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        Self {
            child,
            url: format!("http://{addr}"),
        }
    }
}

impl Node {
    /// `sluice serve` on free loopback ports, with `extra` flags.
    fn serve(data_dir: &Path, extra: &[&str]) -> Self {
        let mut args = vec!["serve", "--flight", "127.0.0.1:0", "--rest", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        Self::start(data_dir, &args)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rows(data_dir: &Path, query: &str, extra: &[&str]) -> Vec<u8> {
    let out = ok(sluice(data_dir)
        .args(["sql", query, "--format", "arrow", "--seed", "7"])
        .args(extra));
    assert!(out.len() > 200, "{query} {extra:?} gave almost nothing");
    out
}

/// Sources: two halves of an image dataset, clips and volumes.
fn sources(env: &Env) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    let (a, b) = (env.path("pets_a"), env.path("pets_b"));
    images(env, &a, 0, 1);
    images(env, &b, 2, 2);
    let (c, v) = (env.path("clips"), env.path("vols"));
    clips(&c, 3);
    volumes(&v, 3);
    (a, b, c, v)
}

#[test]
fn every_offload_mode_gives_the_same_bytes() {
    let env = Env::new();
    let (a, _, c, v) = sources(&env);
    let data = env.data_dir();
    ingest(&data, "pets", &a);
    ingest(&data, "clips", &c);
    ingest(&data, "vols", &v);
    filters_on_udf_outputs_run_on_either_side(&data);
    for (name, q) in PIPELINES {
        let reference = rows(&data, q, &["--offload", "compute"]);
        let mut variants: Vec<Vec<&str>> = vec![
            vec!["--offload", "storage"],
            vec!["--offload", "auto"],
            vec!["--offload", "1"],
            // A slow link and a big storage side push auto elsewhere
            // (for the images, to a per-sample split).
            vec!["--link-bandwidth", "20Mbit", "--storage-cores", "64"],
            vec!["--link-bandwidth", "100Gbit", "--storage-cores", "1"],
        ];
        if *name == "filter" {
            variants.retain(|v| v[1] != "1");
        }
        for extra in variants {
            assert!(
                rows(&data, q, &extra) == reference,
                "{name}: {extra:?} differs from --offload compute"
            );
        }
    }
    // The explanation names every candidate and the choice.
    let text = String::from_utf8(ok(sluice(&data).args([
        "explain",
        PIPELINES[0].1,
        "--link-bandwidth",
        "1Gbit",
    ])))
    .unwrap();
    for needle in [
        "stage 1: decode_random_resized_crop",
        "stage 3: normalize",
        "offload auto:",
        "storage fragment 0:",
        "compute fragment:",
        "link 1.00 Gbit/s (configured)",
    ] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }
    let json: serde_json::Value = serde_json::from_slice(&ok(sluice(&data).args([
        "explain",
        PIPELINES[0].1,
        "--format",
        "json",
        "--offload",
        "2",
    ])))
    .unwrap();
    assert_eq!(json["pipelines"][0]["choice"]["cut"], 2);
    assert_eq!(
        json["pipelines"][0]["candidates"].as_array().unwrap().len(),
        4
    );
    // SQL EXPLAIN shows the placement too.
    let explained = String::from_utf8(ok(sluice(&data).args([
        "sql",
        &format!("EXPLAIN {}", PIPELINES[1].1),
        "--format",
        "csv",
    ])))
    .unwrap();
    assert!(explained.contains("placement") && explained.contains("RemoteFragmentExec"));
    let e = fails(sluice(&data).args(["sql", PIPELINES[0].1, "--offload", "9"]));
    assert!(e.contains("offload cut 9 is out of range"), "{e}");
}

/// Queries whose filter (or `HAVING`) reads a UDF's output, with the
/// CSV they must give: each UDF whose result type depends on its
/// arguments, in `SELECT`, in `WHERE`, in a subquery's filter and in
/// `HAVING`.
const FILTERED: &[(&str, &str)] = &[
    (
        "SELECT count(*) AS n FROM pets WHERE to_tensor(resize(decode_image(data), 32, 32)) IS NOT NULL",
        "n\n10\n",
    ),
    (
        "SELECT count(*) AS n FROM (SELECT to_tensor(resize(decode_image(data), 32, 32)) AS x FROM pets) \
         WHERE x IS NOT NULL",
        "n\n10\n",
    ),
    (
        "SELECT count(*) AS n FROM pets \
         WHERE normalize(resize(decode_image(data), 8, 8), [0.5, 0.5, 0.5], [0.2, 0.2, 0.2]) IS NULL",
        "n\n0\n",
    ),
    (
        "SELECT label, count(*) AS n FROM pets GROUP BY label \
         HAVING count(to_tensor(center_crop(decode_image(data), 16, 16))) > 4 ORDER BY label",
        "label,n\nclass_0,5\nclass_1,5\n",
    ),
    (
        "SELECT key FROM vols WHERE to_tensor(crop3d(npz(data, 'x'), 1, 1, 1, 4, 4, 4), 'float32') \
         IS NOT NULL AND npz(data, 'x') IS NOT NULL ORDER BY key",
        "key\nvol0.npz\nvol1.npz\nvol2.npz\n",
    ),
    (
        "SELECT count(*) AS n FROM (SELECT decode_video(data, 4, 16, 16) AS clip FROM clips) \
         WHERE clip IS NOT NULL",
        "n\n3\n",
    ),
];

/// Each of [`FILTERED`] gives its rows with every offload mode (over the
/// datasets of [`every_offload_mode_gives_the_same_bytes`]).
fn filters_on_udf_outputs_run_on_either_side(data: &Path) {
    for (q, want) in FILTERED {
        for offload in ["compute", "storage", "auto"] {
            let got = ok(sluice(data).args(["sql", q, "--format", "csv", "--offload", offload]));
            assert_eq!(
                String::from_utf8_lossy(&got),
                *want,
                "{q} with --offload {offload}"
            );
        }
    }
}

#[test]
fn separate_nodes_match_the_embedded_default_and_survive_a_node_going_down() {
    let env = Env::new();
    let (a, b, c, v) = sources(&env);
    // Node A: the first half of pets and the clips; node B: the other half
    // and the volumes. The embedded data dir has all of it.
    let (dir_a, dir_b, all) = (env.path("node_a"), env.path("node_b"), env.data_dir());
    ingest(&dir_a, "pets", &a);
    ingest(&dir_a, "clips", &c);
    ingest(&dir_b, "pets", &b);
    ingest(&dir_b, "vols", &v);
    let both = env.path("pets_all");
    copy_dir(&a, &both);
    copy_dir(&b, &both);
    // A data dir is locked by the process serving it: the embedded rows
    // come first, and the loopback server gets its own copy.
    let all2 = env.path("data2");
    for dir in [&all, &all2] {
        ingest(dir, "pets", &both);
        ingest(dir, "clips", &c);
        ingest(dir, "vols", &v);
    }
    let embedded: Vec<Vec<u8>> = PIPELINES.iter().map(|(_, q)| rows(&all, q, &[])).collect();

    let node_a = Node::start(
        &dir_a,
        &["storage-node", "--listen", "127.0.0.1:0", "--cores", "1"],
    );
    let mut node_b = Node::start(&dir_b, &["storage-node", "--listen", "127.0.0.1:0"]);
    let storage = format!("{},{}", node_a.url, node_b.url);
    let compute = Node::start(
        &env.path("compute"),
        &[
            "compute-node",
            "--listen",
            "127.0.0.1:0",
            "--storage",
            &storage,
        ],
    );
    let serve = Node::serve(&all, &[]);
    let looped = Node::serve(&all2, &["--loopback"]);
    let remote_serve = Node::serve(&env.path("serve-remote"), &["--storage", &storage]);

    for ((name, q), embedded) in PIPELINES.iter().zip(&embedded) {
        for (how, extra) in [
            ("--storage", vec!["--storage", storage.as_str()]),
            (
                "--storage, all on storage",
                vec!["--storage", storage.as_str(), "--offload", "storage"],
            ),
            ("compute-node", vec!["--connect", compute.url.as_str()]),
            ("serve", vec!["--connect", serve.url.as_str()]),
            ("serve --loopback", vec!["--connect", looped.url.as_str()]),
            (
                "serve --storage",
                vec!["--connect", remote_serve.url.as_str()],
            ),
        ] {
            assert!(
                rows(&env.path("client"), q, &extra) == *embedded,
                "{name} via {how} differs from the embedded default"
            );
        }
    }

    // An unknown dataset names itself; the compute node keeps serving.
    let e = fails(sluice(&env.path("client")).args([
        "sql",
        "SELECT key FROM nope",
        "--connect",
        &compute.url,
    ]));
    assert!(e.contains("nope"), "{e}");

    // Node B goes down: pets (half on B) fails naming B; clips (only on A)
    // still work through the same compute node.
    let _ = node_b.child.kill();
    let _ = node_b.child.wait();
    let e =
        fails(sluice(&env.path("client")).args(["sql", PIPELINES[1].1, "--connect", &compute.url]));
    let port_b = node_b.url.rsplit(':').next().unwrap();
    assert!(e.contains(port_b) && e.contains("unavailable"), "{e}");
    // EXPLAIN of a pipeline not timed before still answers: B cannot time
    // its part, which is named, and the plan falls back on the profiles.
    let json: serde_json::Value = serde_json::from_slice(&ok(sluice(&env.path("client")).args([
        "explain",
        "SELECT key, to_tensor(resize(decode_image(data), 12, 12)) FROM pets",
        "--connect",
        &compute.url,
        "--format",
        "json",
    ])))
    .unwrap();
    let cal = &json["pipelines"][0]["calibration"];
    assert_eq!(cal["kind"], "fallback", "{cal}");
    assert!(cal["reason"].as_str().unwrap().contains(port_b), "{cal}");
    let clips = rows(
        &env.path("client"),
        PIPELINES[3].1,
        &["--connect", &compute.url],
    );
    assert!(clips == embedded[3]);
}

/// Profiles that say a stage is nearly free (as if measured on a far
/// faster machine) put it on a one-core storage side; calibration times it
/// on the dataset's own objects and moves it to the two compute cores.
#[test]
fn calibration_on_the_datasets_objects_overrides_wrong_profiles() {
    let env = Env::new();
    let src = env.path("pets");
    images(&env, &src, 0, 3);
    let data = env.data_dir();
    ingest(&data, "pets", &src);
    std::fs::write(
        data.join("udf-profiles.json"),
        r#"{"decode_resize": {"per_call_ns": 1.0, "per_unit_ns": 0.0, "unit": "effective source pixel"}}"#,
    )
    .unwrap();
    let explain = |extra: &[&str]| -> serde_json::Value {
        serde_json::from_slice(&ok(sluice(&data)
            .args(["explain", PIPELINES[1].1, "--format", "json"])
            .args(["--storage-cores", "1", "--compute-cores", "2"])
            .args(["--link-bandwidth", "100Gbit"])
            .args(extra)))
        .unwrap()
    };
    let profiled = explain(&["--no-calibrate"]);
    let p = &profiled["pipelines"][0];
    assert!(p.get("calibration").is_none(), "{p}");
    assert_eq!(
        p["choice"],
        serde_json::json!({"kind": "cut", "cut": 1}),
        "{p}"
    );

    let calibrated = explain(&[]);
    let p = &calibrated["pipelines"][0];
    let cal = &p["calibration"];
    assert_eq!(cal["kind"], "measured", "{cal}");
    assert_eq!(cal["nodes"][0], "in-process storage node", "{cal}");
    let decode = &cal["levels"][1];
    assert!(
        decode["calibrated_ns"].as_f64().unwrap()
            > 1000.0 * decode["estimated_ns"].as_f64().unwrap(),
        "{decode}"
    );
    // Decoding now runs on compute, for every sample or for most of them.
    let choice = &p["choice"];
    let on_compute = choice["cut"] == 0 || choice["kind"] == "split";
    assert!(
        on_compute,
        "calibrated choice {choice} keeps decoding on storage"
    );
    let text = String::from_utf8(ok(sluice(&data)
        .args(["explain", PIPELINES[1].1, "--storage-cores", "1"])
        .args(["--compute-cores", "2", "--link-bandwidth", "100Gbit"])))
    .unwrap();
    assert!(
        text.contains("stage 1: decode_resize  (storage CPU/sample: estimated 0 µs, calibrated "),
        "{text}"
    );
    assert!(text.contains("calibrated on "), "{text}");
}

/// What `sluice explain --format json` says of the calibration of
/// `sql`'s first pipeline over `data`.
fn calibration_of(data: &Path, sql: &str) -> serde_json::Value {
    let json: serde_json::Value =
        serde_json::from_slice(&ok(sluice(data).args(["explain", sql, "--format", "json"])))
            .unwrap();
    json["pipelines"][0]["calibration"].clone()
}

/// Every stage of a pipeline is timed by itself: a cheap stage after an
/// expensive one (flip and normalize after decode + crop) has a measured
/// cost of its own, never the zero that the difference of two noisy runs
/// gave.
#[test]
fn calibration_times_each_stage_by_itself() {
    let env = Env::new();
    let src = env.path("pets");
    images(&env, &src, 0, 5);
    let data = env.data_dir();
    ingest(&data, "pets", &src);
    let cal = &calibration_of(&data, PIPELINES[0].1);
    assert_eq!(cal["kind"], "measured", "{cal}");
    let levels = cal["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 4, "{cal}");
    // Level 0, the read of a few small files, is the difference of two
    // whole runs and may well be below their noise; the stages are not.
    let stages: Vec<f64> = levels[1..]
        .iter()
        .map(|l| l["calibrated_ns"].as_f64().unwrap())
        .collect();
    assert!(stages.iter().all(|&t| t > 0.0), "{cal}");
}

/// A sample of nothing but bad objects cannot time the stages: EXPLAIN
/// says so, names one, and plans with the profiles; an unknown offload is
/// a clear error.
#[test]
fn calibration_on_bad_objects_only_falls_back_and_says_why() {
    let env = Env::new();
    let src = env.path("broken");
    images(&env, &src, 0, 4);
    // Every image cut short: its header (and so its ingest) is fine, its
    // pixels are not.
    for class in std::fs::read_dir(&src).unwrap() {
        for f in std::fs::read_dir(class.unwrap().path()).unwrap() {
            let p = f.unwrap().path();
            let bytes = std::fs::read(&p).unwrap();
            std::fs::write(&p, &bytes[..bytes.len() / 3]).unwrap();
        }
    }
    let data = env.data_dir();
    ingest(&data, "pets", &src);
    let cal = &calibration_of(&data, PIPELINES[1].1);
    assert_eq!(cal["kind"], "fallback", "{cal}");
    let reason = cal["reason"].as_str().unwrap();
    assert!(
        reason.contains("every sampled object was a bad sample") && reason.contains("class_"),
        "{reason}"
    );
    let text = String::from_utf8(ok(sluice(&data).args(["explain", PIPELINES[1].1]))).unwrap();
    assert!(
        text.contains("not calibrated (every sampled object was a bad sample"),
        "{text}"
    );
    let e = fails(sluice(&data).args(["explain", PIPELINES[1].1, "--offload", "sideways"]));
    assert!(e.contains("sideways"), "{e}");
}
