//! EXPLAIN snapshots of representative pipelines under different resources:
//! the choice must flip where the link or the cores make another cut best.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::TableProvider;
use datafusion::datasource::MemTable;
use datafusion::error::Result;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use sluice_planner::{
    Choice, DatasetStats, FragmentTables, Offload, Placement, Planner, Resources, StorageFragment,
};
use sluice_udfs::cost::{SampleStats, default_profiles};
use sluice_udfs::{UdfEnv, UdfOptions};

const GBIT: f64 = 1e9 / 8.0;

fn table_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("label", DataType::Utf8, true),
        Field::new("format", DataType::Utf8, true),
        Field::new("width", DataType::UInt32, true),
        Field::new("height", DataType::UInt32, true),
        Field::new("channels", DataType::UInt8, true),
        Field::new("frames", DataType::UInt64, true),
        Field::new("length", DataType::UInt64, false),
        Field::new("data", DataType::Binary, true),
    ]))
}

fn image(bytes: f64, w: f64, h: f64) -> SampleStats {
    SampleStats::encoded_image(bytes, w, h, 3.0)
}

fn stats(samples: u64, rows: Vec<SampleStats>) -> DatasetStats {
    let mean = rows.iter().map(|r| r.bytes).sum::<f64>() / rows.len() as f64;
    DatasetStats {
        samples,
        bytes: (mean * samples as f64) as u64,
        sample: rows,
    }
}

fn datasets() -> HashMap<String, DatasetStats> {
    let mut m = HashMap::new();
    m.insert(
        "thumbs".into(),
        stats(50_000, vec![image(40e3, 500.0, 375.0); 8]),
    );
    m.insert(
        "photos".into(),
        stats(10_000, vec![image(4e6, 4000.0, 3000.0); 8]),
    );
    let mut mixed = vec![image(4e6, 4000.0, 3000.0); 4];
    mixed.extend(vec![image(6e3, 96.0, 96.0); 12]);
    m.insert("mixed".into(), stats(20_000, mixed));
    m.insert(
        "volumes".into(),
        stats(
            1_000,
            vec![
                SampleStats {
                    bytes: 64.0 * 128.0 * 128.0 * 4.0,
                    width: 128.0,
                    height: 128.0,
                    channels: 1.0,
                    frames: 64.0,
                    elements: 64.0 * 128.0 * 128.0,
                };
                4
            ],
        ),
    );
    m.insert(
        "clips".into(),
        stats(
            2_000,
            vec![
                SampleStats {
                    bytes: 1e6,
                    width: 320.0,
                    height: 240.0,
                    channels: 3.0,
                    frames: 300.0,
                    elements: 0.0,
                };
                4
            ],
        ),
    );
    m
}

struct Tables;

impl FragmentTables for Tables {
    fn table(&self, f: &StorageFragment) -> Result<Arc<dyn TableProvider>> {
        let schema = Arc::new(f.plan.schema().as_arrow().clone());
        Ok(Arc::new(MemTable::try_new(schema, vec![vec![]])?))
    }
}

fn resources(storage_cores: f64, link: Option<f64>) -> Resources {
    Resources {
        storage_nodes: 1,
        storage_cores,
        compute_cores: 2.0,
        link_bytes_per_s: link,
        link_source: "configured".into(),
        colocated: None,
    }
}

/// `sql` optimized over empty tables of every dataset, with the UDFs.
async fn optimized(sql: &str) -> LogicalPlan {
    let ctx = SessionContext::new();
    sluice_udfs::register(&ctx, &UdfEnv::new(UdfOptions::default()));
    for name in datasets().keys() {
        let t = MemTable::try_new(table_schema(), vec![vec![]]).unwrap();
        ctx.register_table(name.as_str(), Arc::new(t)).unwrap();
    }
    ctx.sql(sql).await.unwrap().into_optimized_plan().unwrap()
}

/// A planner for `res`, with the default profiles and no calibration.
fn planner(res: Resources) -> Planner {
    Planner {
        profiles: default_profiles(),
        resources: res,
        stats: datasets(),
        calibrations: Default::default(),
        delivery: Default::default(),
    }
}

async fn place(sql: &str, res: Resources, offload: Offload) -> Placement {
    planner(res)
        .place(optimized(sql).await, offload, &Tables)
        .unwrap()
}

fn cut_of(p: &Placement) -> String {
    match &p.explanation.pipelines[0].choice {
        Choice::Cut { cut } => format!("cut {cut}"),
        Choice::Split(s) => format!("split {}/{}", s.above, s.below),
    }
}

const CLASSIFY: &str = "SELECT key, label, normalize(random_horizontal_flip(\
    random_resized_crop(decode_image(data), 224, 224)), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]) AS image \
    FROM thumbs";
const LARGE: &str =
    "SELECT key, to_tensor(resize(decode_image(data), 224, 224)) AS image FROM photos";
const VOLUME: &str = "SELECT key, to_tensor(crop3d(npz(data, 'image'), 0, 32, 32, 32, 64, 64), 'float32') AS v FROM volumes";
const VIDEO: &str = "SELECT key, decode_video(data, 16, 112, 112) AS clip FROM clips";
const FILTER: &str = "SELECT key, label FROM thumbs WHERE width > 400 AND label = 'cat'";
const MIXED: &str = "SELECT key, resize(decode_image(data), 224, 224) AS image FROM mixed";

#[tokio::test]
async fn explain_small_jpeg_classification() {
    let fast = place(CLASSIFY, resources(1.0, None), Offload::Auto).await;
    insta::assert_snapshot!("classify_unlimited_1core", fast.explanation.to_text());
    let slow = place(CLASSIFY, resources(2.0, Some(GBIT)), Offload::Auto).await;
    insta::assert_snapshot!("classify_1gbit_2cores", slow.explanation.to_text());
    // The normalized float tensor is 15x the JPEG: never worth shipping
    // from storage. Over 1 Gbit/s the decoded crop is (the rig measured
    // cut 1 at 1.5x cut 0: compute's one core pays the decode and the
    // trainer's stream); over 100 Mbit/s only the JPEG fits.
    assert_eq!(cut_of(&slow), "cut 1");
    let slower = place(CLASSIFY, resources(2.0, Some(GBIT / 10.0)), Offload::Auto).await;
    assert_eq!(cut_of(&slower), "cut 0");
}

#[tokio::test]
async fn explain_large_photos_flip_with_the_link() {
    let fast = place(LARGE, resources(1.0, None), Offload::Auto).await;
    let slow = place(LARGE, resources(2.0, Some(GBIT)), Offload::Auto).await;
    insta::assert_snapshot!("large_unlimited_1core", fast.explanation.to_text());
    insta::assert_snapshot!("large_1gbit_2cores", slow.explanation.to_text());
    assert_eq!(cut_of(&fast), "cut 0");
    assert_ne!(cut_of(&slow), "cut 0");
}

#[tokio::test]
async fn explain_volume_crop() {
    let p = place(VOLUME, resources(2.0, Some(10.0 * GBIT)), Offload::Auto).await;
    insta::assert_snapshot!("volume_10gbit_2cores", p.explanation.to_text());
}

#[tokio::test]
async fn explain_video_clips() {
    let p = place(VIDEO, resources(2.0, Some(GBIT)), Offload::Auto).await;
    insta::assert_snapshot!("video_1gbit_2cores", p.explanation.to_text());
}

#[tokio::test]
async fn explain_filter_only() {
    let p = place(FILTER, resources(1.0, Some(GBIT)), Offload::Auto).await;
    insta::assert_snapshot!("filter_only", p.explanation.to_text());
}

#[tokio::test]
async fn mixed_sizes_split_per_sample() {
    // A big storage server (16 cores) behind a 1 Gbit/s link: photos
    // shrink 27x on storage; thumbnails grow when resized, so they travel raw.
    let p = place(MIXED, resources(16.0, Some(GBIT)), Offload::Auto).await;
    insta::assert_snapshot!("mixed_1gbit_16cores", p.explanation.to_text());
    let Choice::Split(s) = &p.explanation.pipelines[0].choice else {
        panic!("expected a split:\n{}", p.explanation.to_text());
    };
    assert!(s.above > s.below, "{s:?}");
    assert_eq!(p.fragments.len(), 2);
}

#[tokio::test]
async fn fixed_modes_and_bad_cuts() {
    let all = place(CLASSIFY, resources(1.0, None), Offload::Storage).await;
    assert_eq!(cut_of(&all), "cut 3");
    let none = place(CLASSIFY, resources(1.0, None), Offload::Compute).await;
    assert_eq!(cut_of(&none), "cut 0");
    let two = place(CLASSIFY, resources(1.0, None), Offload::Cut(2)).await;
    assert_eq!(cut_of(&two), "cut 2");
    let plan = optimized(CLASSIFY).await;
    let planner = planner(resources(1.0, None));
    let e = planner.place(plan, Offload::Cut(7), &Tables).unwrap_err();
    assert!(
        e.to_string()
            .contains("offload cut 7 is out of range: the pipeline over thumbs has cuts 0 to 3"),
        "{e}"
    );
}

/// One machine's two cores, as the embedded default has them.
fn colocated() -> Resources {
    Resources {
        colocated: Some("every storage node runs on this machine".into()),
        ..resources(2.0, None)
    }
}

#[tokio::test]
async fn co_located_sides_are_one_pool_and_never_split() {
    for (name, sql) in [
        ("classify", CLASSIFY),
        ("large", LARGE),
        ("mixed", MIXED),
        ("video", VIDEO),
    ] {
        let p = place(sql, colocated(), Offload::Auto).await;
        let e = &p.explanation;
        if name == "classify" {
            insta::assert_snapshot!("classify_colocated_2cores", e.to_text());
        }
        let pipe = &e.pipelines[0];
        assert!(
            matches!(pipe.choice, Choice::Cut { .. }),
            "{name}: no split between two names for the same cores:\n{}",
            e.to_text()
        );
        // Every candidate is costed against the same two cores: no
        // estimate is above what the whole machine does with the cut's
        // total CPU per sample.
        for c in &pipe.candidates {
            let whole = 2.0 * 1e9 / (c.rates.storage_ns + c.rates.compute_ns);
            assert!(c.rates.per_s <= whole * 1.0001, "{name}: {c:?}");
            assert_eq!(c.rates.bottleneck(), "cpu");
        }
        assert!(e.to_text().starts_with("resources: co-located ("), "{name}");
        // The pick is the least CPU per sample, ties to fewer bytes.
        let best = pipe
            .candidates
            .iter()
            .map(|c| c.rates.per_s)
            .fold(0.0, f64::max);
        assert!(pipe.rates.per_s >= best * (1.0 - 0.011), "{name}");
    }
    // The same pipelines on two machines of two cores each do split.
    let apart = place(MIXED, resources(16.0, Some(GBIT)), Offload::Auto).await;
    assert!(matches!(
        apart.explanation.pipelines[0].choice,
        Choice::Split(_)
    ));
}

/// A job's window plan without the query's last stage (normalize, run at
/// delivery) keeps the query's calibration of the levels it computes, and
/// every candidate's compute side pays the deferred stage: planned alone,
/// the window found no calibration and costed normalize nowhere.
#[tokio::test]
async fn a_stage_deferred_to_delivery_is_costed_on_compute_with_the_query_s_calibration() {
    let query = optimized(CLASSIFY).await;
    let window = optimized(
        "SELECT key, label, random_horizontal_flip(random_resized_crop(decode_image(data), 224, 224)) \
         AS image FROM thumbs",
    )
    .await;
    let planner = planner(resources(2.0, Some(10.0 * GBIT)));
    // The query's calibration, as a job's session makes it: read 20 µs,
    // decode + crop 3 ms, flip 100 µs, normalize 400 µs per object.
    let probes = planner.probes(&query, 24).unwrap();
    let through = [20e3, 3020e3, 3120e3, 3520e3];
    let cuts = through
        .iter()
        .map(|ns| sluice_planner::CutTiming {
            objects: 10,
            cpu_ns: ns * 10.0,
        })
        .collect();
    let mut calibrated = planner.clone();
    calibrated.calibrations.insert(
        probes[0].key.clone(),
        sluice_planner::Calibration::Measured {
            cuts,
            nodes: vec!["a".into()],
        },
    );

    let alone = calibrated
        .clone()
        .place(window.clone(), Offload::Auto, &Tables)
        .unwrap();
    let alone = &alone.explanation.pipelines[0];
    assert!(alone.calibration.is_none() && alone.delivery.is_none());

    let deferred = calibrated
        .deferring(&query, &window)
        .place(window.clone(), Offload::Auto, &Tables)
        .unwrap();
    let p = &deferred.explanation.pipelines[0];
    let delivery = p.delivery.as_ref().expect("the deferred stage");
    assert_eq!(delivery.stages, ["normalize"]);
    assert!(
        (delivery.calibrated_ns.unwrap() - 400e3).abs() < 1.0,
        "{delivery:?}"
    );
    assert!(delivery.estimated_ns > 0.0);
    let Some(sluice_planner::CalibrationReport::Measured { levels, .. }) = &p.calibration else {
        panic!(
            "the window's levels keep the query's calibration: {:?}",
            p.calibration
        );
    };
    assert_eq!(levels.len(), 3);
    assert!((levels[1].calibrated_ns - 3000e3).abs() < 1.0, "{levels:?}");
    // Every cut's compute side is slower by the deferred stage.
    let plain = planner
        .clone()
        .deferring(&query, &query)
        .place(window.clone(), Offload::Auto, &Tables)
        .unwrap();
    let costed = planner
        .deferring(&query, &window)
        .place(window, Offload::Auto, &Tables)
        .unwrap();
    for (with, without) in costed.explanation.pipelines[0]
        .candidates
        .iter()
        .zip(&plain.explanation.pipelines[0].candidates)
    {
        assert!(
            with.rates.compute_per_s < without.rates.compute_per_s,
            "{with:?} {without:?}"
        );
    }
    let text = deferred.explanation.to_text();
    assert!(
        text.contains("at delivery: normalize  (compute CPU/sample: estimated "),
        "{text}"
    );
}
