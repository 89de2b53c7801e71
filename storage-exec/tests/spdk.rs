//! The SPDK backend against a real SPDK (feature `spdk`, which needs
//! `SPDK_DIR` at build time): the device conformance suite on an AIO, an
//! io_uring and a malloc bdev, ingest + SQL round trips on AIO and malloc
//! bdevs, and the same data read through SPDK and through sluice's own
//! io_uring backend.
//!
//! Without the feature this file compiles to nothing; `scripts/test.sh`
//! says so when `SPDK_DIR` is unset. SPDK starts once per process with one
//! config, so every test here shares the bdevs of [`spdk`].
//!
//! Memory: hugepages when at least 1 GiB of them are free
//! (`/proc/sys/vm/nr_hugepages`), else SPDK's no-huge mode; the test prints
//! which.
#![cfg(feature = "spdk")]

use std::collections::HashMap;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arrow::array::{AsArray, RecordBatch};
use sluice_storage::device::affinity::cpus_of;
use sluice_storage::device::spdk::{SpdkDevice, SpdkOptions};
use sluice_storage::device::{Backend, Device, DeviceOptions, conformance};
use sluice_storage::{IngestOptions, IngestSource, OnError, Store, StoreOptions, ingest};

/// Size of every file-backed bdev and of the malloc bdevs.
const BDEV_BYTES: u64 = 64 << 20;

struct Fixture {
    dir: tempfile::TempDir,
    opts: SpdkOptions,
}

/// Files and config for the bdevs below, made once per process:
/// - `aio_conf`, `uring_conf`, `malloc_conf`: for the conformance suite;
/// - `aio_store`, `malloc_store`: data dirs ingested into through SPDK;
/// - `aio_shared`: an AIO bdev over the device file of a data dir created
///   with the io_uring backend.
fn spdk() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str| -> String {
            let path = dir.path().join(name);
            sluice_storage::device::create_device_file(&path, BDEV_BYTES).unwrap();
            path.to_string_lossy().into_owned()
        };
        // Made on a thread of its own: the fixture is first used inside a
        // tokio test, where a nested runtime may not block.
        let root = dir.path().to_owned();
        let shared = std::thread::spawn(move || shared_dir(&root)).join().unwrap();
        let config = serde_json::json!({
            "subsystems": [{
                "subsystem": "bdev",
                "config": [
                    {"method": "bdev_aio_create",
                     "params": {"name": "aio_conf", "filename": file("aio_conf.img"), "block_size": 4096}},
                    {"method": "bdev_uring_create",
                     "params": {"name": "uring_conf", "filename": file("uring_conf.img"), "block_size": 4096}},
                    {"method": "bdev_malloc_create",
                     "params": {"name": "malloc_conf", "num_blocks": BDEV_BYTES / 4096, "block_size": 4096}},
                    {"method": "bdev_aio_create",
                     "params": {"name": "aio_store", "filename": file("aio_store.img"), "block_size": 512}},
                    {"method": "bdev_malloc_create",
                     "params": {"name": "malloc_store", "num_blocks": BDEV_BYTES / 512, "block_size": 512}},
                    {"method": "bdev_aio_create",
                     "params": {"name": "aio_shared",
                                "filename": shared.join("device.img").to_string_lossy(),
                                "block_size": 4096}}
                ]
            }]
        });
        let config_path = dir.path().join("bdevs.json");
        std::fs::write(&config_path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
        let huge_free = hugepages_free_mib();
        let no_huge = huge_free < 1024;
        eprintln!(
            "SPDK {}: {} ({} MiB of hugepages free)",
            spdk_sys_version(),
            if no_huge { "no-huge mode" } else { "hugepages" },
            huge_free
        );
        let opts = SpdkOptions {
            mem_size_mb: 1024,
            no_huge,
            ..SpdkOptions::new(config_path)
        };
        Fixture { dir, opts }
    })
}

fn spdk_sys_version() -> String {
    sluice_storage::device::spdk::version()
}

fn hugepages_free_mib() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    field("HugePages_Free:") * field("Hugepagesize:") / 1024
}

/// A data dir with the io_uring backend, ingested before SPDK starts;
/// its device file is also the `aio_shared` bdev.
fn shared_dir(root: &Path) -> PathBuf {
    let dir = root.join("shared");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = Store::open(&StoreOptions {
        backend: Backend::Auto,
        device_size: BDEV_BYTES,
        chunk_size: 1 << 20,
        fixed_buffers: 2,
        ..StoreOptions::new(&dir)
    })
    .unwrap();
    rt.block_on(ingest(
        &store,
        "imgs",
        IngestSource::Memory(samples(120, 7)),
        IngestOptions::with_policy(OnError::Fail),
    ))
    .unwrap();
    dir
}

fn image(w: u32, h: u32, seed: u8, format: image::ImageFormat) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8 ^ seed, y as u8, seed]));
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

fn samples(n: usize, seed: u8) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let fmt = if i % 3 == 0 {
                image::ImageFormat::Png
            } else {
                image::ImageFormat::Jpeg
            };
            let s = seed.wrapping_add(i as u8);
            (
                format!("s{i:04}"),
                image(20 + i as u32 % 50, 30 + i as u32 % 7, s, fmt),
            )
        })
        .collect()
}

fn device(bdev: &str) -> Arc<dyn Device> {
    let opts = DeviceOptions {
        backend: Backend::Spdk,
        spdk: Some(spdk().opts.clone()),
        ..DeviceOptions::default()
    };
    Arc::new(SpdkDevice::open(bdev, &spdk().opts, &opts).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aio_bdev_passes_the_conformance_suite() {
    let dev = device("aio_conf");
    assert_eq!(dev.describe().backend, "spdk");
    assert_eq!(dev.describe().path, PathBuf::from("bdev:aio_conf"));
    assert_eq!(dev.capacity(), BDEV_BYTES);
    conformance::run_all(dev).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_bdev_passes_the_conformance_suite() {
    conformance::run_all(device("uring_conf")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malloc_bdev_passes_the_conformance_suite() {
    conformance::run_all(device("malloc_conf")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_buffers_are_spdk_dma_memory() {
    let dev = device("malloc_conf");
    assert_eq!(dev.pool().allocator_name(), "spdk-dma");
}

#[tokio::test]
async fn unknown_bdev_is_refused_naming_it_and_the_known_ones() {
    let opts = DeviceOptions {
        backend: Backend::Spdk,
        ..DeviceOptions::default()
    };
    let err = SpdkDevice::open("nvme9n1", &spdk().opts, &opts).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("nvme9n1") && msg.contains("aio_conf"), "{msg}");
    // A second config in the same process is refused, naming both.
    let other = SpdkOptions::new("/nonexistent/other.json");
    let err = SpdkDevice::open("aio_conf", &other, &opts).unwrap_err();
    assert!(err.to_string().contains("other.json"), "{err}");
}

async fn rows_by_key(store: &Arc<Store>, sql: &str) -> HashMap<String, Vec<u8>> {
    let ctx = sluice_storage::session_context(Arc::clone(store));
    let batches: Vec<RecordBatch> = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let mut out = HashMap::new();
    for b in &batches {
        let keys = b.column(0).as_string::<i32>();
        let data = b.column(1).as_binary::<i32>();
        for i in 0..b.num_rows() {
            out.insert(keys.value(i).to_owned(), data.value(i).to_vec());
        }
    }
    out
}

/// A store on `bdev`, with no object cache: every read comes from the
/// device (a cached object is a copy in memory of its own, by design).
fn spdk_store(data_dir: &Path, bdev: &str) -> Arc<Store> {
    Store::open(&StoreOptions {
        backend: Backend::Spdk,
        device_path: Some(PathBuf::from(format!("bdev:{bdev}"))),
        chunk_size: 1 << 20,
        fixed_buffers: 2,
        cache_memory: Some(0),
        spdk: Some(spdk().opts.clone()),
        ..StoreOptions::new(data_dir)
    })
    .unwrap()
}

/// Ingest through SPDK, then SQL: every byte back, the values buffer in
/// SPDK's DMA memory, and the data still there after the store is reopened.
async fn ingest_and_query(bdev: &str) {
    let data_dir = spdk().dir.path().join(format!("dir_{bdev}"));
    let input = samples(300, 1);
    let want: HashMap<String, Vec<u8>> = input.iter().cloned().collect();
    {
        let store = spdk_store(&data_dir, bdev);
        assert_eq!(store.device().describe().backend, "spdk");
        let report = ingest(
            &store,
            "imgs",
            IngestSource::Memory(input),
            IngestOptions::with_policy(OnError::Fail),
        )
        .await
        .unwrap();
        assert_eq!(report.samples, 300);
        let got = rows_by_key(&store, "SELECT key, data FROM imgs").await;
        assert_eq!(got, want, "{bdev}: bytes read back through SPDK");
        let ctx = sluice_storage::session_context(Arc::clone(&store));
        let batches = ctx
            .sql("SELECT data FROM imgs WHERE key = 's0042'")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let data = batches[0].column(0).as_binary::<i32>();
        assert!(
            store.device().pool().contains(data.values().as_ptr()),
            "{bdev}: the values buffer is the DMA buffer SPDK read into"
        );
    }
    // Reopened (same process, same SPDK): the catalog and the bdev agree.
    let store = spdk_store(&data_dir, bdev);
    let got = rows_by_key(&store, "SELECT key, data FROM imgs").await;
    assert_eq!(got, want, "{bdev}: after reopening");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_and_sql_round_trip_on_an_aio_bdev() {
    ingest_and_query("aio_store").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_and_sql_round_trip_on_a_malloc_bdev() {
    ingest_and_query("malloc_store").await;
}

/// Placement transparency for the device: a data dir written through
/// sluice's io_uring backend reads identically through SPDK (an AIO bdev
/// over the same file), and what SPDK then ingests reads identically
/// through io_uring again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_and_spdk_read_the_same_data_dir_identically() {
    let fixture = spdk();
    let dir = fixture.dir.path().join("shared");
    let want: HashMap<String, Vec<u8>> = samples(120, 7).into_iter().collect();
    let more: HashMap<String, Vec<u8>> = samples(80, 99).into_iter().collect();
    {
        let store = spdk_store(&dir, "aio_shared");
        assert_eq!(store.device().describe().backend, "spdk");
        let got = rows_by_key(&store, "SELECT key, data FROM imgs").await;
        assert_eq!(got, want, "uring-written data read through SPDK");
        ingest(
            &store,
            "more",
            IngestSource::Memory(more.clone().into_iter().collect()),
            IngestOptions::with_policy(OnError::Fail),
        )
        .await
        .unwrap();
        store.device().flush().await.unwrap();
    }
    let store = Store::open(&StoreOptions {
        backend: Backend::Uring,
        ..StoreOptions::new(&dir)
    })
    .unwrap();
    assert_eq!(store.device().describe().backend, "uring");
    assert_eq!(
        rows_by_key(&store, "SELECT key, data FROM imgs").await,
        want
    );
    assert_eq!(
        rows_by_key(&store, "SELECT key, data FROM more").await,
        more,
        "SPDK-written data read through io_uring"
    );
}

#[test]
fn a_file_path_is_refused_by_the_spdk_backend() {
    let opts = DeviceOptions {
        backend: Backend::Spdk,
        spdk: Some(spdk().opts.clone()),
        ..DeviceOptions::default()
    };
    let err = sluice_storage::device::open_device(Path::new("/tmp/device.img"), &opts).unwrap_err();
    assert!(err.to_string().contains("bdev:NAME"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spdk_thread_polls_on_a_core_no_other_thread_uses() {
    let _device = device("malloc_conf");
    let core = sluice_storage::device::spdk::core().expect("SPDK runs in this process");
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if online < 2 {
        eprintln!("SKIP: one CPU online; the SPDK thread must share it");
        assert!(!core.dedicated);
        return;
    }
    assert!(core.dedicated, "{core:?}");
    assert!(!core.spdk_cpus.is_empty());
    let mut spdk_threads = 0;
    for entry in std::fs::read_dir("/proc/self/task").unwrap() {
        let entry = entry.unwrap();
        let tid: libc::pid_t = entry.file_name().to_str().unwrap().parse().unwrap();
        let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        // A thread that ended meanwhile has no mask to check.
        let cpus = cpus_of(tid).unwrap_or_default();
        if name.trim() == "sluice-spdk" {
            spdk_threads += 1;
            assert_eq!(cpus, core.spdk_cpus);
        } else {
            assert!(
                cpus.iter().all(|c| !core.spdk_cpus.contains(c)),
                "thread {tid} ({}) may run on {cpus:?}, SPDK polls on {:?}",
                name.trim(),
                core.spdk_cpus
            );
        }
    }
    assert_eq!(spdk_threads, 1);
    // Threads made from now on stay off it too (they inherit the mask).
    let cpus = std::thread::spawn(|| cpus_of(0).unwrap()).join().unwrap();
    assert!(cpus.iter().all(|c| !core.spdk_cpus.contains(c)), "{cpus:?}");
}
