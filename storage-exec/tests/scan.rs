//! The read path end to end, through SQL: zero copy, pushdown, integrity,
//! versions, and the failure modes of ingest.

use std::collections::HashMap;
use std::io::Cursor;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use datafusion::prelude::SessionContext;
use sluice_base::task::SpawnedTask;
use sluice_storage::device::Backend;
use sluice_storage::{
    IngestOptions, IngestSource, OnError, StorageError, Store, StoreOptions, ingest,
};

fn image(w: u32, h: u32, seed: u8, format: image::ImageFormat) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8 ^ seed, y as u8, seed]));
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

fn samples(n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let fmt = if i % 3 == 0 {
                image::ImageFormat::Png
            } else {
                image::ImageFormat::Jpeg
            };
            (
                format!("s{i:04}"),
                image(20 + i as u32 % 50, 30 + i as u32 % 7, i as u8, fmt),
            )
        })
        .collect()
}

fn open(dir: &std::path::Path, backend: Backend, device_size: u64) -> Arc<Store> {
    Store::open(&StoreOptions {
        backend,
        device_size,
        chunk_size: 1 << 20,
        fixed_buffers: 2,
        ..StoreOptions::new(dir)
    })
    .unwrap()
}

/// A 64 MiB store whose node cache holds all of it.
fn cached_store(dir: &std::path::Path) -> Arc<Store> {
    Store::open(&StoreOptions {
        chunk_size: 1 << 20,
        device_size: 64 << 20,
        cache_memory: Some(64 << 20),
        ..StoreOptions::new(dir)
    })
    .unwrap()
}

async fn ingest_mem(
    store: &Arc<Store>,
    name: &str,
    s: Vec<(String, Vec<u8>)>,
) -> sluice_storage::IngestReport {
    ingest(
        store,
        name,
        IngestSource::Memory(s),
        IngestOptions::with_policy(OnError::Fail),
    )
    .await
    .unwrap()
}

async fn query(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    ctx.sql(sql).await.unwrap().collect().await.unwrap()
}

fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(|b| b.num_rows()).sum()
}

#[tokio::test]
async fn data_values_buffer_is_the_read_buffer_and_bytes_round_trip() {
    for backend in [Backend::Uring, Backend::File] {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), backend, 64 << 20);
        let input = samples(300);
        let want: HashMap<String, Vec<u8>> = input.iter().cloned().collect();
        ingest_mem(&store, "imgs", input).await;
        let ctx = sluice_storage::session_context(Arc::clone(&store));
        let pool = Arc::clone(store.device().pool());
        let batches = query(&ctx, "SELECT key, data FROM imgs").await;
        assert_eq!(rows(&batches), 300);
        for b in &batches {
            let keys = b.column(0).as_string::<i32>();
            let data = b.column(1).as_binary::<i32>();
            // Pointer identity: the values buffer lies in a buffer on loan
            // from the device's pool, i.e. the memory the device read into.
            let values = data.values().as_ptr();
            assert!(
                pool.contains(values),
                "{backend}: values buffer {values:?} is not a read buffer"
            );
            assert_eq!(
                values as usize % store.device().block_size(),
                0,
                "read buffers are block aligned"
            );
            for i in 0..b.num_rows() {
                assert_eq!(
                    data.value(i),
                    &want[keys.value(i)][..],
                    "{backend}: bytes of {}",
                    keys.value(i)
                );
            }
        }
        assert!(pool.stats().outstanding > 0);
        drop(batches);
        assert_eq!(
            pool.stats().outstanding,
            0,
            "{backend}: dropping the batches returns every buffer"
        );
    }
}

#[tokio::test]
async fn queries_without_data_read_no_extent_and_filters_prune_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Backend::Auto, 64 << 20);
    ingest_mem(&store, "imgs", samples(500)).await;
    let ctx = sluice_storage::session_context(Arc::clone(&store));
    let before = store.device().stats();
    let b = query(&ctx, "SELECT count(*) FROM imgs").await;
    assert_eq!(
        b[0].column(0)
            .as_primitive::<arrow::datatypes::Int64Type>()
            .value(0),
        500
    );
    let b = query(
        &ctx,
        "SELECT key, width, height FROM imgs WHERE format = 'png' AND width > 40",
    )
    .await;
    assert!(rows(&b) > 0);
    assert_eq!(
        store.device().stats().reads,
        before.reads,
        "metadata-only queries must not touch the device"
    );

    // One selected sample: one small read, covering only its blocks.
    let b = query(&ctx, "SELECT key, data FROM imgs WHERE key = 's0250'").await;
    assert_eq!(rows(&b), 1);
    let after = store.device().stats();
    assert_eq!(after.reads - before.reads, 1);
    let len = b[0].column(1).as_binary::<i32>().value(0).len() as u64;
    assert!(
        after.read_bytes - before.read_bytes <= len + 2 * 4096,
        "read more than the sample's blocks"
    );

    // The filter is applied in the scan, exactly: no FilterExec above it.
    let plan = query(
        &ctx,
        "EXPLAIN SELECT key, data FROM imgs WHERE key = 's0250'",
    )
    .await;
    let text = arrow::util::pretty::pretty_format_batches(&plan)
        .unwrap()
        .to_string();
    assert!(text.contains("ExtentSource: dataset=imgs@1"), "{text}");
    assert!(!text.contains("FilterExec"), "{text}");

    let b = query(&ctx, "SELECT key, data FROM imgs LIMIT 7").await;
    assert_eq!(rows(&b), 7);
}

#[tokio::test]
async fn a_flipped_byte_is_a_checksum_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Backend::Auto, 64 << 20);
    ingest_mem(&store, "imgs", samples(50)).await;
    let ctx = sluice_storage::session_context(Arc::clone(&store));
    let b = query(
        &ctx,
        "SELECT chunk, \"offset\" FROM imgs WHERE key = 's0017'",
    )
    .await;
    let chunk = b[0]
        .column(0)
        .as_primitive::<arrow::datatypes::UInt64Type>()
        .value(0);
    let offset = b[0]
        .column(1)
        .as_primitive::<arrow::datatypes::UInt64Type>()
        .value(0);
    let pos = chunk * store.chunk_size() + offset + 5;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path().join("device.img"))
        .unwrap();
    let mut byte = [0u8];
    dev.read_exact_at(&mut byte, pos).unwrap();
    dev.write_all_at(&[byte[0] ^ 0x40], pos).unwrap();
    dev.sync_all().unwrap();

    // Twice: the bad object never entered the node's cache, so the second
    // read finds it again.
    for _ in 0..2 {
        let err = ctx
            .sql("SELECT key, data FROM imgs")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("checksum mismatch"), "{msg}");
        assert!(
            msg.contains("dataset 'imgs' version 1, key 's0017'"),
            "{msg}"
        );
        // Whatever wraps it, the services answer it as lost data.
        let status = sluice_base::fault::status_of(&err, false);
        assert_eq!(status.code(), tonic::Code::DataLoss, "{status}");
        assert!(
            status.message().starts_with("checksum_mismatch: "),
            "{status}"
        );
    }
    // Samples not touching the bad one still read fine.
    let ok = query(&ctx, "SELECT data FROM imgs WHERE key = 's0030'").await;
    assert_eq!(rows(&ok), 1);
}

fn keyed(batches: &[RecordBatch]) -> HashMap<String, Vec<u8>> {
    let mut out = HashMap::new();
    for b in batches {
        let keys = b.column(0).as_string::<i32>();
        let data = b.column(1).as_binary::<i32>();
        for i in 0..b.num_rows() {
            out.insert(keys.value(i).to_owned(), data.value(i).to_vec());
        }
    }
    out
}

/// `n` scans of all of `imgs` on `store`, begun at once; their rows.
async fn scans_at_once(store: &Arc<Store>, n: usize) -> Vec<Vec<RecordBatch>> {
    let scans: Vec<_> = (0..n)
        .map(|_| {
            let ctx = sluice_storage::session_context(Arc::clone(store));
            SpawnedTask::spawn(async move { query(&ctx, "SELECT key, data FROM imgs").await })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for s in scans {
        out.push(s.join().await.unwrap());
    }
    out
}

#[tokio::test]
async fn the_node_cache_serves_later_reads_the_same_bytes_within_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let input = samples(300);
    let total: usize = input.iter().map(|(_, b)| b.len()).sum();
    let want: HashMap<String, Vec<u8>> = input.iter().cloned().collect();
    {
        // Room for everything: the second read is all hits, from memory.
        let store = cached_store(dir.path());
        ingest_mem(&store, "imgs", input.clone()).await;
        let ctx = sluice_storage::session_context(Arc::clone(&store));
        let first = query(&ctx, "SELECT key, data FROM imgs").await;
        let after_first = store.cache().stats();
        assert_eq!(after_first.hits, 0);
        assert_eq!(after_first.objects, 300);
        let pool = Arc::clone(store.device().pool());
        let second = query(&ctx, "SELECT key, data FROM imgs").await;
        let stats = store.cache().stats();
        assert_eq!(stats.hits, 300, "{stats:?}");
        assert_eq!(keyed(&first), want);
        assert_eq!(keyed(&second), want);
        for b in &second {
            let values = b.column(1).as_binary::<i32>().values().as_ptr();
            assert!(!pool.contains(values), "a hit must not read the device");
        }
    }
    // A third of the dataset's room, eight scans at once: every scan gets
    // every byte, and the cache never holds more than its budget.
    let budget = (total / 3) as u64;
    let store = Store::open(&StoreOptions {
        cache_memory: Some(budget),
        ..StoreOptions::new(dir.path())
    })
    .unwrap();
    for rows in scans_at_once(&store, 8).await {
        assert_eq!(keyed(&rows), want);
        assert!(store.cache().stats().bytes <= budget);
    }
    let stats = store.cache().stats();
    assert!(stats.objects > 0 && stats.bytes <= budget, "{stats:?}");
}

/// With a cache, each object is read from the device once: a scan reads
/// only what the cache does not hold (a read partly cached is cut), and
/// scans at once over the same objects wait for each other's reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_object_is_read_from_the_device_once_however_scans_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let input = samples(300);
    let want: HashMap<String, Vec<u8>> = input.iter().cloned().collect();
    let store = cached_store(&dir.path().join("a"));
    ingest_mem(&store, "imgs", input.clone()).await;
    let ctx = sluice_storage::session_context(Arc::clone(&store));
    let third = query(&ctx, "SELECT key, data FROM imgs WHERE key < 's0100'").await;
    assert_eq!(keyed(&third).len(), 100);
    assert_eq!(store.cache().stats().misses, 100);
    // The rest is read, the third comes from memory: its reads (which
    // coalesce cached and uncached neighbours) are cut where the cache
    // holds them.
    let all = query(&ctx, "SELECT key, data FROM imgs").await;
    assert_eq!(keyed(&all), want);
    let stats = store.cache().stats();
    assert_eq!((stats.misses, stats.hits), (300, 100), "{stats:?}");

    // Eight scans at once on a cold cache: 300 device reads in all.
    let store = cached_store(&dir.path().join("b"));
    ingest_mem(&store, "imgs", input).await;
    for rows in scans_at_once(&store, 8).await {
        assert_eq!(keyed(&rows), want);
    }
    let stats = store.cache().stats();
    assert_eq!((stats.misses, stats.hits), (300, 7 * 300), "{stats:?}");
}

#[tokio::test]
async fn large_cached_objects_are_served_over_the_cached_bytes() {
    let dir = tempfile::tempdir().unwrap();
    // Adjacent on the device (one run each read): small and large objects
    // alternate, so a run is cut into copied groups and shared objects.
    let input: Vec<(String, Vec<u8>)> = (0..40u32)
        .map(|i| {
            // Noise does not compress: a 200² PNG is ~120 KB, a 10² ~300 B.
            let side = if i % 3 == 0 { 10 } else { 200 };
            let img = image::RgbImage::from_fn(side, side, |x, y| {
                let v = (x * 7919 + y * 104_729 + i * 15_485_863).wrapping_mul(2_654_435_761);
                image::Rgb([(v >> 24) as u8, (v >> 16) as u8, (v >> 8) as u8])
            });
            let mut out = Cursor::new(Vec::new());
            img.write_to(&mut out, image::ImageFormat::Png).unwrap();
            (format!("o{i:03}"), out.into_inner())
        })
        .collect();
    let want: HashMap<String, Vec<u8>> = input.iter().cloned().collect();
    let store = cached_store(dir.path());
    ingest_mem(&store, "objs", input).await;
    let ctx = sluice_storage::session_context(Arc::clone(&store));
    let _fill = query(&ctx, "SELECT key, data FROM objs").await;
    let values = |batches: &[RecordBatch]| -> HashMap<String, (usize, usize)> {
        let mut out = HashMap::new();
        for b in batches {
            let keys = b.column(0).as_string::<i32>();
            let data = b.column(1).as_binary::<i32>();
            for i in 0..b.num_rows() {
                out.insert(
                    keys.value(i).to_owned(),
                    (data.value(i).as_ptr() as usize, data.value(i).len()),
                );
            }
        }
        out
    };
    let (a, b) = (
        query(&ctx, "SELECT key, data FROM objs").await,
        query(&ctx, "SELECT key, data FROM objs").await,
    );
    assert_eq!(store.cache().stats().hits, 80);
    assert_eq!(keyed(&a), want);
    assert_eq!(keyed(&b), want);
    let (pa, pb) = (values(&a), values(&b));
    for (key, bytes) in &want {
        let same = pa[key].0 == pb[key].0;
        // Two reads of a large object give the very bytes the cache holds;
        // small ones are copied beside their neighbours each time.
        assert_eq!(
            same,
            bytes.len() >= sluice_storage::scan::SHARED_OBJECT,
            "{key}"
        );
    }
}

#[tokio::test]
async fn versions_are_kept_and_addressable() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Backend::Auto, 64 << 20);
    ingest_mem(&store, "ds", samples(10)).await;
    let r2 = ingest_mem(&store, "ds", samples(25)).await;
    assert_eq!(r2.version, 2);
    let ctx = sluice_storage::session_context(Arc::clone(&store));
    assert_eq!(rows(&query(&ctx, "SELECT key FROM ds").await), 25);
    assert_eq!(
        rows(&query(&ctx, "SELECT key, data FROM \"ds@1\"").await),
        10
    );
    let err = ctx
        .sql("SELECT * FROM \"ds@9\"")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("dataset 'ds' has no version 9"), "{err}");
    let err = ctx
        .sql("SELECT * FROM nothing_here")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("nothing_here") && err.contains("not found"),
        "{err}"
    );
    let err = ctx
        .sql("SELECT no_such_column FROM ds")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no_such_column"), "{err}");
}

#[tokio::test]
async fn device_full_commits_nothing_and_keeps_free_space() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Backend::Auto, 8 << 20);
    let small: Vec<_> = (0..4)
        .map(|i| {
            (
                format!("a{i}"),
                pad(image(8, 8, i, image::ImageFormat::Png), 300_000),
            )
        })
        .collect();
    ingest_mem(&store, "ds", small).await;
    let free_before = store.space().free_chunks;
    let big: Vec<_> = (0..40)
        .map(|i| {
            (
                format!("b{i}"),
                pad(image(8, 8, i, image::ImageFormat::Png), 300_000),
            )
        })
        .collect();
    let err = ingest(
        &store,
        "ds",
        IngestSource::Memory(big),
        IngestOptions::default(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, StorageError::DeviceFull { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("device full while ingesting dataset 'ds'"),
        "{err}"
    );
    assert_eq!(
        store.space().free_chunks,
        free_before,
        "space of the failed ingest is not lost"
    );
    assert_eq!(store.catalog().latest_version("ds").unwrap(), Some(1));
    drop(store);
    let store = open(dir.path(), Backend::Auto, 8 << 20);
    assert_eq!(
        store.space().free_chunks,
        free_before,
        "and stays free after reopening"
    );
}

/// A PNG followed by padding (decoders stop at IEND; the header sniff is unaffected).
fn pad(mut bytes: Vec<u8>, len: usize) -> Vec<u8> {
    bytes.resize(len, 0xAB);
    bytes
}

#[tokio::test]
async fn bad_objects_follow_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Backend::Auto, 64 << 20);
    let mut s = samples(5);
    s.push(("empty".into(), vec![]));
    s.push(("text".into(), b"just some text".to_vec()));
    let truncated = image(40, 40, 1, image::ImageFormat::Png)[..20].to_vec();
    s.push(("truncated".into(), truncated));
    let report = ingest(
        &store,
        "mixed",
        IngestSource::Memory(s.clone()),
        IngestOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(report.samples, 5);
    let skipped: Vec<&str> = report.skipped.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(skipped, ["empty", "text", "truncated"]);
    assert!(
        report.skipped[1]
            .reason
            .contains("not a recognised image, video or array format")
    );

    let free = store.space().free_chunks;
    let err = ingest(
        &store,
        "mixed",
        IngestSource::Memory(s),
        IngestOptions::with_policy(OnError::Fail),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("sample 'empty' refused: empty file"),
        "{err}"
    );
    assert_eq!(
        store.catalog().latest_version("mixed").unwrap(),
        Some(1),
        "nothing committed"
    );
    assert_eq!(store.space().free_chunks, free);

    for name in ["no/slashes", "Capitals", "x".repeat(4096).as_str()] {
        let err = ingest(
            &store,
            name,
            IngestSource::Memory(samples(1)),
            IngestOptions::default(),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, StorageError::InvalidDatasetName(_)), "{err}");
        assert!(err.to_string().len() < 200, "the name is not echoed whole");
    }
}

#[tokio::test]
async fn incompatible_or_foreign_data_dirs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), Backend::Auto, 16 << 20));
    let fmt = dir.path().join("FORMAT");
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&fmt).unwrap()).unwrap();
    doc["format_version"] = 2.into();
    std::fs::write(&fmt, doc.to_string()).unwrap();
    let err = Store::open(&StoreOptions::new(dir.path())).unwrap_err();
    assert!(
        matches!(err, StorageError::IncompatibleDataDir { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("format version 2"), "{err}");

    std::fs::remove_file(&fmt).unwrap();
    let err = Store::open(&StoreOptions::new(dir.path())).unwrap_err();
    assert!(err.to_string().contains("no FORMAT file"), "{err}");

    let other = tempfile::tempdir().unwrap();
    std::fs::write(
        other.path().join("FORMAT"),
        "{\"magic\": \"something else\"}",
    )
    .unwrap();
    let err = Store::open(&StoreOptions::new(other.path())).unwrap_err();
    assert!(
        err.to_string().contains("not describe a sluice data dir"),
        "{err}"
    );
}

#[tokio::test]
async fn orphans_of_an_interrupted_ingest_are_counted_at_open_and_removed_by_gc() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Backend::Auto, 64 << 20);
    ingest_mem(&store, "ds", samples(10)).await;
    let free = store.space().free_chunks;
    drop(store);
    // What a crash between the metadata write and the commit leaves behind.
    std::fs::write(dir.path().join("meta/ds/v2.parquet"), b"partial").unwrap();
    std::fs::write(dir.path().join("meta/ds/v2.parquet.tmp"), b"partial").unwrap();
    let store = open(dir.path(), Backend::Auto, 64 << 20);
    assert_eq!(store.orphans().metadata_files.len(), 2);
    assert_eq!(store.space().free_chunks, free);
    // Opening deletes nothing.
    assert!(dir.path().join("meta/ds/v2.parquet").exists());
    let gc = store.collect_garbage().await.unwrap();
    assert_eq!(gc.removed.len(), 2);
    assert!(!dir.path().join("meta/ds/v2.parquet").exists());
    assert!(dir.path().join("meta/ds/v1.parquet").exists());
    let r = ingest_mem(&store, "ds", samples(3)).await;
    assert_eq!(r.version, 2);
}

#[tokio::test]
async fn gc_refuses_a_catalog_that_names_no_version_of_the_metadata_it_sees() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Backend::Auto, 64 << 20);
    ingest_mem(&store, "ds", samples(4)).await;
    drop(store);
    // A valid but empty catalog put in place of the real one.
    let saved = std::fs::read(dir.path().join("catalog.redb")).unwrap();
    let other = tempfile::tempdir().unwrap();
    drop(open(other.path(), Backend::Auto, 64 << 20));
    std::fs::copy(
        other.path().join("catalog.redb"),
        dir.path().join("catalog.redb"),
    )
    .unwrap();
    let store = open(dir.path(), Backend::Auto, 64 << 20);
    let err = store.collect_garbage().await.unwrap_err();
    assert!(matches!(err, StorageError::CatalogDamaged { .. }), "{err}");
    assert!(dir.path().join("meta/ds/v1.parquet").exists());
    drop(store);
    std::fs::write(dir.path().join("catalog.redb"), saved).unwrap();
    let store = open(dir.path(), Backend::Auto, 64 << 20);
    assert_eq!(store.catalog().dataset_names().unwrap(), vec!["ds"]);
}

#[tokio::test]
async fn manifest_columns_become_filterable_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let mut lines = String::new();
    for i in 0..12 {
        let name = format!("img{i}.png");
        std::fs::write(
            src.path().join(&name),
            image(10 + i, 10, i as u8, image::ImageFormat::Png),
        )
        .unwrap();
        lines.push_str(&format!(
            "{{\"path\": \"{name}\", \"label\": {}, \"split\": \"{}\"}}\n",
            i % 4,
            if i < 9 { "train" } else { "val" }
        ));
    }
    std::fs::write(src.path().join("m.jsonl"), lines).unwrap();
    let store = open(dir.path(), Backend::Auto, 64 << 20);
    let source = IngestSource::from_cli(&src.path().join("m.jsonl"), None);
    let r = ingest(&store, "man", source, IngestOptions::default())
        .await
        .unwrap();
    assert_eq!(r.samples, 12);
    let ctx = sluice_storage::session_context(Arc::clone(&store));
    let b = query(
        &ctx,
        "SELECT key, label, width, data FROM man WHERE split = 'val' ORDER BY key",
    )
    .await;
    assert_eq!(rows(&b), 3);
    let b = &b[0];
    assert_eq!(b.column(0).as_string::<i32>().value(0), "img10.png");
    assert_eq!(
        b.column(1)
            .as_primitive::<arrow::datatypes::Int64Type>()
            .value(0),
        2
    );
    assert_eq!(
        b.column(2)
            .as_primitive::<arrow::datatypes::UInt32Type>()
            .value(0),
        20
    );
    assert!(!b.column(3).is_null(0));
}

/// A `.npy` of `len` bytes in all (a float32 vector) whose data is a
/// pattern, so a misplaced piece would show.
fn big_npy(len: usize) -> Vec<u8> {
    let header_len = 118; // 10-byte preamble + header text, 128 in all
    let n = (len - 128) / 4;
    let text = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({n},), }}");
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header_len as u16).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    out.resize(127, b' ');
    out.push(b'\n');
    out.extend((0..n * 4).map(|i| (i % 253) as u8));
    out
}

#[tokio::test]
async fn large_files_are_streamed_in_and_read_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    // Over the streaming threshold (16 MiB), and not a multiple of a piece
    // or a chunk; a small object after it shares the large one's last chunk.
    let big = big_npy(41 << 20 | 12_345);
    std::fs::write(src.join("a_big.npy"), &big).unwrap();
    let small = image(33, 21, 5, image::ImageFormat::Png);
    std::fs::write(src.join("b_small.png"), &small).unwrap();
    // A large file that is not media is refused from its header alone.
    std::fs::write(src.join("c_text.bin"), vec![b'x'; 20 << 20]).unwrap();
    let store = open(&dir.path().join("data"), Backend::Auto, 256 << 20);
    let report = ingest(
        &store,
        "large",
        IngestSource::Directory(src),
        IngestOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(report.samples, 2, "{report:?}");
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].key, "c_text.bin");
    assert!(
        report.skipped[0]
            .reason
            .contains("not a recognised image, video or array format"),
        "{:?}",
        report.skipped
    );
    let ctx = sluice_storage::session_context(Arc::clone(&store));
    let batches = query(
        &ctx,
        "SELECT key, format, shape, data FROM large ORDER BY key",
    )
    .await;
    let b = &batches[0];
    let keys = b.column(0).as_string::<i32>();
    let data = b.column(3).as_binary::<i32>();
    assert_eq!((keys.value(0), keys.value(1)), ("a_big.npy", "b_small.png"));
    assert_eq!(b.column(1).as_string::<i32>().value(0), "npy");
    assert!(
        data.value(0) == &big[..],
        "the streamed object reads back whole"
    );
    assert_eq!(data.value(1), &small[..]);
}

/// The two phases of an ingest spread over nodes: a prepared version is
/// invisible, holds its chunks and the store's ingest lock; dropped, it
/// leaves nothing (chunks free, metadata file gone, lock free); committed,
/// it is the dataset's latest.
#[tokio::test]
async fn a_prepared_ingest_is_invisible_until_committed_and_leaves_nothing_when_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Backend::File, 64 << 20);
    let free = store.space().free_chunks;
    let source = || IngestSource::Memory(samples(40));
    let opts = || IngestOptions::with_policy(OnError::Fail);
    let prepared = sluice_storage::ingest::prepare(&store, "two", source(), opts())
        .await
        .unwrap();
    assert_eq!(prepared.report().version, 1);
    assert_eq!(prepared.report().samples, 40);
    assert!(store.space().free_chunks < free, "its chunks are held");
    assert_eq!(store.catalog().latest_version("two").unwrap(), None);
    assert_eq!(
        store.catalog().dataset_names().unwrap(),
        Vec::<String>::new()
    );
    let meta = dir.path().join("meta/two/v1.parquet");
    assert!(meta.exists());
    // Another ingest waits for the prepared one's lock.
    let blocked = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        sluice_storage::ingest::prepare(&store, "other", source(), opts()),
    )
    .await;
    assert!(
        blocked.is_err(),
        "a second ingest ran while one was prepared"
    );

    drop(prepared);
    assert_eq!(
        store.space().free_chunks,
        free,
        "the dropped part's chunks are free"
    );
    assert!(!meta.exists(), "the dropped part's metadata file is gone");
    assert_eq!(store.catalog().latest_version("two").unwrap(), None);

    let prepared = sluice_storage::ingest::prepare(&store, "two", source(), opts())
        .await
        .unwrap();
    let report = prepared.commit().unwrap();
    assert_eq!((report.version, report.samples), (1, 40));
    assert_eq!(store.catalog().latest_version("two").unwrap(), Some(1));
    assert!(meta.exists());
}
