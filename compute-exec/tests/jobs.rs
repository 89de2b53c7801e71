//! Jobs end to end over real in-process storage nodes (real stores on
//! files, real scans): the order a rank reads does not depend on how many
//! storage nodes hold the dataset or where the stages run, every epoch is
//! covered exactly once, resume gives the exact remainder, cancel ends
//! streams, and bad pipelines are refused with their codes.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use futures::{StreamExt, TryStreamExt};
use sluice_base::Fault;
use sluice_base::task::SpawnedTask;
use sluice_compute::job::{JobState, JobStore, PlanSpec, Shuffle, ShuffleMode};
use sluice_compute::{ComputeSession, JobError, JobSpec, Jobs, ResourceHints};
use sluice_flight::{StorageClient, StorageEndpoint};
use sluice_storage::flight_service::StorageFlightService;
use sluice_storage::scan::ScanOptions;
use sluice_storage::{IngestOptions, IngestSource, OnError, StorageNode, Store, StoreOptions};
use sluice_udfs::kernels::npy::DType;

const SAMPLES: usize = 37;

/// A float32 `.npy` of `values`.
fn npy(values: &[f32]) -> Vec<u8> {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    sluice_udfs::kernels::npy::write(DType::F32, &[values.len() as u32], &data)
}

/// Sample `i`'s relative path.
fn sample(i: usize) -> String {
    format!("c{}/v{i:03}.npy", i % 3)
}

fn write_samples(dir: &Path, which: impl Iterator<Item = usize>) {
    for i in which {
        let p = dir.join(sample(i));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, npy(&[i as f32, 0.5, -1.0, 2.0])).unwrap();
    }
}

async fn ingest(store: &Arc<Store>, src: &Path) {
    sluice_storage::ingest(
        store,
        "vecs",
        IngestSource::from_cli(src, None),
        IngestOptions::with_policy(OnError::Fail),
    )
    .await
    .unwrap();
}

async fn store_and_node(
    root: &Path,
    name: &str,
    which: Vec<usize>,
) -> (Arc<Store>, Arc<dyn StorageEndpoint>) {
    let (store, node) = storage_node(root, name, which, &[]).await;
    (store, node)
}

/// A node over a store of the samples `which`, and of files `extra`
/// (relative path, bytes) beside them.
async fn storage_node(
    root: &Path,
    name: &str,
    which: Vec<usize>,
    extra: &[(&str, &[u8])],
) -> (Arc<Store>, Arc<StorageNode>) {
    let src = root.join(format!("{name}-src"));
    write_samples(&src, which.into_iter());
    for (path, bytes) in extra {
        std::fs::create_dir_all(src.join(path).parent().unwrap()).unwrap();
        std::fs::write(src.join(path), bytes).unwrap();
    }
    let mut opts = StoreOptions::new(root.join(name));
    opts.device_size = 64 << 20;
    opts.chunk_size = 1 << 20;
    let store = Store::open(&opts).unwrap();
    ingest(&store, &src).await;
    let node = StorageNode::new(Arc::clone(&store), ScanOptions::default(), 2, None).unwrap();
    (store, node)
}

async fn node(root: &Path, name: &str, which: Vec<usize>) -> Arc<dyn StorageEndpoint> {
    store_and_node(root, name, which).await.1
}

fn session(endpoints: Vec<Arc<dyn StorageEndpoint>>) -> Arc<ComputeSession> {
    Arc::new(ComputeSession::new(
        endpoints,
        sluice_udfs::cost::default_profiles(),
        ResourceHints::default(),
    ))
}

fn jobs(endpoints: Vec<Arc<dyn StorageEndpoint>>) -> Jobs {
    Jobs::new(session(endpoints)).unwrap()
}

const SQL: &str = "SELECT key, label, npy(data) AS x FROM vecs";

fn spec(world: u64, drop_last: bool, offload: &str) -> JobSpec {
    let mut s = JobSpec::sql(SQL);
    s.batch_size = 4;
    s.epochs = 2;
    s.world_size = world;
    s.drop_last = drop_last;
    s.offload = sluice_compute::job::OffloadArg::Name(offload.into());
    s.shuffle = Some(Shuffle {
        seed: 11,
        mode: ShuffleMode::Full,
        block_size: 4,
        window: 8,
    });
    s
}

fn keys(batches: &[RecordBatch]) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| {
            b.column_by_name("key")
                .unwrap()
                .as_string::<i32>()
                .iter()
                .map(|k| k.unwrap().to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

async fn read(jobs: &Jobs, id: &str, rank: u64, epoch: u64, offset: u64) -> Vec<RecordBatch> {
    let job = jobs.get(id).unwrap();
    job.deliver(rank, epoch, offset, None)
        .await
        .unwrap()
        .map(|d| d.and_then(|d| d.batch()))
        .try_collect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_exact_deterministic_and_resumable() {
    let dir = tempfile::tempdir().unwrap();
    let all = node(dir.path(), "all", (0..SAMPLES).collect()).await;
    let a = node(
        dir.path(),
        "a",
        (0..SAMPLES).filter(|i| i % 2 == 0).collect(),
    )
    .await;
    let b = node(
        dir.path(),
        "b",
        (0..SAMPLES).filter(|i| i % 2 == 1).collect(),
    )
    .await;
    let one = jobs(vec![all]);
    let two = jobs(vec![a, b]);

    for (world, drop_last) in [(1, false), (3, false), (3, true), (5, false)] {
        let j1 = one.submit(spec(world, drop_last, "auto")).await.unwrap();
        let j2 = two.submit(spec(world, drop_last, "storage")).await.unwrap();
        let j3 = one.submit(spec(world, drop_last, "compute")).await.unwrap();
        let layout = j1.layout().await.unwrap();
        assert_eq!(layout.samples, SAMPLES as u64);
        for epoch in 0..2 {
            let mut seen = std::collections::BTreeMap::<String, usize>::new();
            let mut first_batches = Vec::new();
            for rank in 0..world {
                let r1 = read(&one, j1.id(), rank, epoch, 0).await;
                let r2 = read(&two, j2.id(), rank, epoch, 0).await;
                let r3 = read(&one, j3.id(), rank, epoch, 0).await;
                // Same rows in the same order whatever the nodes or the split.
                assert_eq!(
                    r1, r2,
                    "world {world} rank {rank} epoch {epoch}: 1 vs 2 nodes"
                );
                assert_eq!(
                    r1, r3,
                    "world {world} rank {rank} epoch {epoch}: auto vs compute"
                );
                let k = keys(&r1);
                assert_eq!(k.len() as u64, layout.per_rank());
                for b in &r1[..r1.len().saturating_sub(1)] {
                    assert_eq!(b.num_rows(), 4);
                }
                if drop_last {
                    assert!(r1.iter().all(|b| b.num_rows() == 4));
                }
                for key in &k {
                    *seen.entry(key.clone()).or_default() += 1;
                }
                // Resume at any offset gives exactly the rest.
                for offset in [1, 3, 4, k.len() as u64] {
                    let rest = keys(&read(&one, j1.id(), rank, epoch, offset).await);
                    assert_eq!(rest, k[offset as usize..], "resume at {offset}");
                }
                first_batches.push(k);
            }
            let total: usize = seen.values().sum();
            assert_eq!(total as u64, layout.per_rank() * world);
            if drop_last {
                assert!(seen.values().all(|&c| c == 1));
            } else {
                assert_eq!(seen.len(), SAMPLES, "every sample in epoch {epoch}");
                assert!(total - SAMPLES < world as usize);
            }
        }
        // Every position of every (rank, epoch) was read: done.
        assert_eq!(j1.state(), JobState::Done);
        let st = j1.status();
        assert_eq!(st.progress, 1.0);
        assert!(st.delivered >= layout.per_rank() * world * 2);
        assert!(st.bytes.link > 0, "{st:?}");
    }

    // Another epoch, another order; the same seed, the same order.
    let again = one.submit(spec(1, false, "auto")).await.unwrap();
    let e0 = keys(&read(&one, again.id(), 0, 0, 0).await);
    let e1 = keys(&read(&one, again.id(), 0, 1, 0).await);
    assert_ne!(e0, e1);
    let twin = two.submit(spec(1, false, "auto")).await.unwrap();
    assert_eq!(keys(&read(&two, twin.id(), 0, 0, 0).await), e0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_epoch_is_begun_ahead_and_reads_as_if_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let one = jobs(vec![node(dir.path(), "all", (0..SAMPLES).collect()).await]);
    let job = one.submit(spec(1, false, "auto")).await.unwrap();
    let fresh = one.submit(spec(1, false, "auto")).await.unwrap();
    read(&one, job.id(), 0, 0, 0).await;
    // Reading the whole of epoch 0 began epoch 1 (and nothing else).
    assert!(job.begun_ahead(0, 1));
    assert!(!job.begun_ahead(0, 0) && !job.begun_ahead(1, 1));
    // The whole epoch takes it over: the same rows as a stream begun on
    // request (the other job never read epoch 0, so nothing was begun).
    let e1 = read(&one, job.id(), 0, 1, 0).await;
    assert!(!job.begun_ahead(0, 1));
    assert!(!fresh.begun_ahead(0, 1));
    assert_eq!(e1, read(&one, fresh.id(), 0, 1, 0).await);
    // A request for part of the epoch (a resume) drops what was begun and
    // reads its own; an epoch asked for is not begun ahead again.
    let resumed = one.submit(spec(1, false, "auto")).await.unwrap();
    read(&one, resumed.id(), 0, 0, 0).await;
    assert!(resumed.begun_ahead(0, 1));
    let part = keys(&read(&one, resumed.id(), 0, 1, 3).await);
    assert!(!resumed.begun_ahead(0, 1));
    assert_eq!(part, keys(&e1)[3..]);
    read(&one, resumed.id(), 0, 0, 0).await;
    assert!(!resumed.begun_ahead(0, 1));
    // The last epoch begins nothing; every position was delivered once.
    assert!(!job.begun_ahead(0, 2));
    assert_eq!(job.state(), JobState::Done);
    assert_eq!(job.status().progress, 1.0);
    // A cancelled job drops what it began.
    let cancelled = one.submit(spec(1, false, "auto")).await.unwrap();
    read(&one, cancelled.id(), 0, 0, 0).await;
    assert!(cancelled.begun_ahead(0, 1));
    cancelled.cancel();
    assert!(!cancelled.begun_ahead(0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_jobs_are_refused_and_cancel_ends_streams() {
    let dir = tempfile::tempdir().unwrap();
    let all = node(dir.path(), "all", (0..SAMPLES).collect()).await;
    let jobs = jobs(vec![all]);
    let code = |r: Result<_, JobError>| r.map(|_: Arc<sluice_compute::Job>| ()).unwrap_err();
    let e = code(jobs.submit(JobSpec::sql("SELEC key FROM vecs")).await);
    assert_eq!(e.kind(), "invalid_sql", "{e}");
    let e = code(jobs.submit(JobSpec::sql("SELECT key FROM nope")).await);
    assert_eq!(e.kind(), "dataset_not_found", "{e}");
    assert!(e.to_string().contains("nope"), "{e}");
    let e = code(
        jobs.submit(JobSpec::sql(
            "SELECT label, count(*) FROM vecs GROUP BY label",
        ))
        .await,
    );
    assert_eq!(e.kind(), "not_a_pipeline", "{e}");
    let mut s = JobSpec::sql(SQL);
    s.world_size = 0;
    assert_eq!(code(jobs.submit(s).await).kind(), "invalid_options");
    let mut s = JobSpec::sql(SQL);
    s.offload = sluice_compute::job::OffloadArg::Cut(9);
    assert_eq!(code(jobs.submit(s).await).kind(), "invalid_options");

    // The plan form gives the same plan as its SQL.
    let plan = PlanSpec::from_yaml(
        "source: vecs\nfilters: [\"label <> 'c1'\"]\nstages:\n  - {name: x, udf: npy, args: [data]}\n\
         outputs: [key, x]\n",
    )
    .unwrap();
    let udfs = sluice_udfs::UdfEnv::new(Default::default());
    let from_plan = jobs
        .session()
        .prepare(&plan.to_sql().unwrap(), &udfs)
        .await
        .unwrap();
    let from_sql = jobs
        .session()
        .prepare(
            "SELECT key, npy(data) AS x FROM vecs WHERE label <> 'c1'",
            &udfs,
        )
        .await
        .unwrap();
    assert_eq!(
        from_plan.plan.display_indent_schema().to_string(),
        from_sql.plan.display_indent_schema().to_string()
    );

    // A rank or epoch past the job's, and cancel.
    let job = jobs.submit(spec(2, false, "auto")).await.unwrap();
    let e = job.deliver(2, 0, 0, None).await.err().unwrap();
    assert_eq!(e.kind(), "out_of_range");
    let e = job.deliver(0, 2, 0, None).await.err().unwrap();
    assert_eq!(e.kind(), "out_of_range");
    let stream = job.deliver(0, 0, 0, None).await.unwrap();
    jobs.cancel(job.id()).unwrap();
    let got: Result<Vec<_>, _> = stream.try_collect().await;
    // Batches already made may arrive; the stream cannot end cleanly
    // unless it finished before the cancel.
    if let Err(e) = got {
        assert_eq!(e.kind(), "job_cancelled");
    }
    assert_eq!(job.state(), JobState::Cancelled);
    let e = job.deliver(0, 0, 0, None).await.err().unwrap();
    assert_eq!(e.kind(), "job_cancelled");
    assert_eq!(jobs.counts()["cancelled"], 1);
}

/// Under `skip`, the check that drops bad rows runs on the outputs: each
/// stage is computed once, on the side the placement gives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_checks_do_not_run_stages_twice() {
    let dir = tempfile::tempdir().unwrap();
    let all = node(dir.path(), "all", (0..SAMPLES).collect()).await;
    let jobs = jobs(vec![all]);
    let udfs = sluice_udfs::UdfEnv::new(sluice_udfs::UdfOptions {
        on_error: sluice_udfs::OnError::Skip,
        ..Default::default()
    });
    let sql = "SELECT key, npy(data) AS x FROM vecs";
    for (offload, storage_calls, compute_calls) in [
        (sluice_planner::Offload::Compute, 0, 1),
        (sluice_planner::Offload::Storage, 1, 0),
    ] {
        let q = jobs.session().plan(sql, offload, &udfs).await.unwrap();
        let e = &q.explanation;
        let storage: usize = e
            .storage_fragments
            .iter()
            .map(|f| f.matches("npy(").count())
            .sum();
        let compute = e.compute_fragment.matches("npy(").count();
        assert_eq!(
            (storage, compute),
            (storage_calls, compute_calls),
            "{offload}: {e:?}"
        );
        assert!(
            e.compute_fragment.contains("x IS NOT NULL"),
            "{}",
            e.compute_fragment
        );
    }
}

/// `node` served on loopback as `sluice storage-node` serves it (Flight
/// and the engine's worker): the same node as a remote one.
async fn over_flight(node: Arc<StorageNode>) -> Arc<dyn StorageEndpoint> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let worker = sluice_storage::engine::worker(Arc::clone(&node), Default::default());
    let service = StorageFlightService::new(node).server();
    let serve = tonic::transport::Server::builder()
        .add_service(service)
        .add_service(worker.into_worker_server())
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    sluice_base::task::detach(async move {
        let _ = serve.await;
    });
    Arc::new(StorageClient::new(&format!("http://{addr}")).unwrap())
}

/// Over Flight, a job stream opens one feed on each storage node and sends
/// it every window: the rows, their order and the bad samples skipped are
/// those of the same nodes in process, under either placement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_flight_a_stream_is_one_feed_per_node_and_reads_what_in_process_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (evens, odds) = (0..SAMPLES).partition(|i| i % 2 == 0);
    // A header the ingest reads, four bytes short of its data.
    let mut short = npy(&[1.0, 2.0, 3.0, 4.0]);
    short.truncate(short.len() - 4);
    let bad = short.as_slice();
    let (_, a) = storage_node(dir.path(), "a", evens, &[]).await;
    let (_, b) = storage_node(dir.path(), "b", odds, &[("c1/bad.npy", bad)]).await;
    let in_process = jobs(vec![a.clone(), b.clone()]);
    let remote = jobs(vec![
        over_flight(a.clone()).await,
        over_flight(b.clone()).await,
    ]);
    for offload in ["storage", "compute"] {
        let mut s = spec(2, false, offload);
        s.on_error = sluice_udfs::OnError::Skip;
        s.batch_size = 2;
        // One epoch: no next epoch is begun ahead (its feeds would count).
        s.epochs = 1;
        let want_job = in_process.submit(s.clone()).await.unwrap();
        let got_job = remote.submit(s).await.unwrap();
        got_job.layout().await.unwrap();
        for rank in 0..2 {
            let want = read(&in_process, want_job.id(), rank, 0, 0).await;
            let before = [a.info(), b.info()];
            let got = read(&remote, got_job.id(), rank, 0, 0).await;
            let after = [a.info(), b.info()];
            assert_eq!(got, want, "{offload}: rank {rank}");
            let streams: Vec<u64> = (0..2)
                .map(|i| after[i].streams - before[i].streams)
                .collect();
            let fragments: u64 = (0..2)
                .map(|i| after[i].fragments - before[i].fragments)
                .sum();
            assert_eq!(streams, [1, 1], "{offload}: rank {rank}: one feed per node");
            assert!(
                fragments > 2,
                "{offload}: rank {rank}: {fragments} windows run"
            );
        }
        let (want, got) = (want_job.status(), got_job.status());
        assert_eq!(want.skipped, 1, "{offload}: {want:?}");
        assert_eq!(got.skipped, want.skipped, "{offload}");
        assert_eq!(got.bad_samples.len(), 1, "{offload}: {got:?}");
        assert!(
            got.bad_samples[0].key.contains("bad.npy"),
            "{offload}: {got:?}"
        );
    }
}

/// A bad sample counts when a reader receives the batch after it: the
/// next epoch, begun ahead and not read yet, counts none of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_samples_count_when_delivered_not_when_begun_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let mut short = npy(&[1.0, 2.0, 3.0, 4.0]);
    short.truncate(short.len() - 4);
    let ids = (0..SAMPLES).collect();
    let (_, node) = storage_node(dir.path(), "a", ids, &[("c1/bad.npy", short.as_slice())]).await;
    let jobs = jobs(vec![node]);
    let mut s = spec(1, false, "auto");
    s.on_error = sluice_udfs::OnError::Skip;
    // One batch holds the epoch: epoch 1's read-ahead decodes every
    // sample, the bad one too, in its first window.
    s.batch_size = 64;
    let job = jobs.submit(s).await.unwrap();
    read(&jobs, job.id(), 0, 0, 0).await;
    assert!(job.begun_ahead(0, 1));
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(job.status().skipped, 1, "{:?}", job.status().bad_samples);
    read(&jobs, job.id(), 0, 1, 0).await;
    let st = job.status();
    assert_eq!(st.skipped, 2, "{:?}", st.bad_samples);
    assert!(st.bad_samples.iter().all(|b| b.key.contains("bad.npy")));
}

/// `key` → the bytes of its `x` (a uint8 tensor) in `batches`.
fn tensors(batches: &[RecordBatch]) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    for b in batches {
        let keys = b.column_by_name("key").unwrap().as_string::<i32>();
        let x = b.column_by_name("x").unwrap().as_fixed_size_list();
        for i in 0..b.num_rows() {
            let v = x.value(i);
            let bytes = v
                .as_primitive::<arrow::datatypes::UInt8Type>()
                .values()
                .to_vec();
            out.insert(keys.value(i).to_string(), bytes);
        }
    }
    out
}

/// A job is planned and placed once, at submit: each epoch's streams run
/// that plan bound to their epoch, and compute exactly what a query
/// planned for that epoch computes, wherever the random stages run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_epoch_runs_the_plan_of_submit_bound_to_its_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let pngs: Vec<(String, Vec<u8>)> = (0..10u32)
        .map(|i| {
            let img = image::RgbImage::from_fn(40 + i * 3, 32, |x, y| {
                image::Rgb([(x * 5) as u8, (y * 7) as u8, ((x + y + i) * 3) as u8])
            });
            let mut png = std::io::Cursor::new(Vec::new());
            img.write_to(&mut png, image::ImageFormat::Png).unwrap();
            (format!("c{}/p{i}.png", i % 2), png.into_inner())
        })
        .collect();
    let extra: Vec<(&str, &[u8])> = pngs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    let (_, node) = storage_node(dir.path(), "imgs", Vec::new(), &extra).await;
    let jobs = jobs(vec![node]);
    let sql = "SELECT key, to_tensor(random_horizontal_flip(random_resized_crop(decode_image(data), 8, 8))) AS x FROM vecs";
    for offload in ["storage", "compute"] {
        let mut s = spec(2, false, offload);
        s.sql = Some(sql.into());
        s.epochs = 3;
        let job = jobs.submit(s).await.unwrap();
        let mut epochs = Vec::new();
        for epoch in 0..3 {
            let mut got = read(&jobs, job.id(), 0, epoch, 0).await;
            got.extend(read(&jobs, job.id(), 1, epoch, 0).await);
            let got = tensors(&got);
            assert_eq!(got.len(), pngs.len());
            // The same SQL planned afresh for this epoch, as one query.
            let udfs = sluice_udfs::UdfEnv::new(sluice_udfs::UdfOptions {
                seed: 11,
                epoch,
                ..Default::default()
            });
            let planned = jobs
                .session()
                .plan(sql, offload.parse().unwrap(), &udfs)
                .await
                .unwrap();
            let want = datafusion::physical_plan::collect(planned.plan, planned.ctx.task_ctx())
                .await
                .unwrap();
            assert_eq!(got, tensors(&want), "{offload}, epoch {epoch}");
            epochs.push(got);
        }
        assert_ne!(epochs[0], epochs[1], "{offload}: epochs draw other crops");
        assert_ne!(epochs[1], epochs[2], "{offload}: epochs draw other crops");
        assert_eq!(job.placed().generation(), 0, "placed once, never again");
    }
}

/// A job reads the version it pinned at submit: an ingest during an epoch
/// changes nothing it delivers, and a job submitted after reads the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_read_the_version_they_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let (store, all) = store_and_node(dir.path(), "all", (0..SAMPLES).collect()).await;
    let jobs = jobs(vec![all]);
    let job = jobs.submit(spec(1, false, "auto")).await.unwrap();
    let before = read(&jobs, job.id(), 0, 0, 0).await;
    let first = keys(&before);
    assert_eq!(first.len(), SAMPLES);
    // A new version: other values for the same keys, and more keys.
    let src = dir.path().join("v2");
    for i in 0..SAMPLES + 10 {
        let p = src.join(sample(i));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, npy(&[-(i as f32), 9.0, 9.0, 9.0])).unwrap();
    }
    ingest(&store, &src).await;
    assert_eq!(read(&jobs, job.id(), 0, 0, 0).await, before);
    assert_eq!(
        read(&jobs, job.id(), 0, 0, 5).await,
        before_from(&before, 5)
    );
    let newer = jobs.submit(spec(1, false, "auto")).await.unwrap();
    assert_eq!(
        keys(&read(&jobs, newer.id(), 0, 0, 0).await).len(),
        SAMPLES + 10
    );
}

/// The rows of `batches` from row `offset` on, in batches of 4 as a read
/// resumed at `offset` cuts them.
fn before_from(batches: &[RecordBatch], offset: usize) -> Vec<RecordBatch> {
    let all = arrow::compute::concat_batches(&batches[0].schema(), batches).unwrap();
    (offset..all.num_rows())
        .step_by(4)
        .map(|at| all.slice(at, 4.min(all.num_rows() - at)))
        .collect()
}

/// Jobs survive a restart of the node: their records come back, each is
/// planned again over the version it pinned, and a reader resuming at its
/// offset gets exactly the rest, bit-identical, in the same order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (store, all) = store_and_node(dir.path(), "all", (0..SAMPLES).collect()).await;
    let records = dir.path().join("jobs");
    let first = Jobs::with_store(
        session(vec![Arc::clone(&all)]),
        Some(JobStore::open(&records).unwrap()),
    )
    .unwrap();
    let job = first.submit(spec(2, false, "auto")).await.unwrap();
    let whole = read(&first, job.id(), 1, 1, 0).await;
    let id = job.id().to_string();
    let cancelled = first.submit(spec(1, false, "auto")).await.unwrap();
    first.cancel(cancelled.id()).unwrap();
    drop(first);
    // A newer version, ingested while the server was down.
    write_samples(&dir.path().join("all-src"), SAMPLES..SAMPLES + 3);
    ingest(&store, &dir.path().join("all-src")).await;

    let second =
        Jobs::with_store(session(vec![all]), Some(JobStore::open(&records).unwrap())).unwrap();
    assert_eq!(
        second.restore().await.unwrap(),
        1,
        "the cancelled job is gone"
    );
    let back = second.get(&id).unwrap();
    assert_eq!(back.spec(), job.spec());
    assert_eq!(back.layout().await.unwrap(), job.layout().await.unwrap());
    assert_eq!(read(&second, &id, 1, 1, 0).await, whole);
    assert_eq!(read(&second, &id, 1, 1, 6).await, before_from(&whole, 6));
    assert!(second.get(cancelled.id()).is_err());
}

/// An epoch over 200k samples runs at the rate of one over 10k: nothing a
/// window does grows with the dataset (the speed itself is the epoch
/// benchmark's business; this catches per-window work linear in N).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epoch_rate_does_not_fall_with_the_dataset_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut rates = Vec::new();
    for n in [10_000usize, 200_000] {
        let mut opts = StoreOptions::new(dir.path().join(format!("n{n}")));
        opts.device_size = 1 << 30;
        let store = Store::open(&opts).unwrap();
        let object = npy(&[1.0, 2.0]);
        let samples = (0..n)
            .map(|i| (format!("s{i:07}"), object.clone()))
            .collect();
        sluice_storage::ingest(
            &store,
            "vecs",
            IngestSource::Memory(samples),
            IngestOptions::with_policy(OnError::Fail),
        )
        .await
        .unwrap();
        let node = StorageNode::new(store, ScanOptions::default(), 2, None).unwrap();
        let jobs = jobs(vec![node]);
        let mut s = JobSpec::sql("SELECT key, npy(data) AS x FROM vecs");
        s.batch_size = 256;
        s.shuffle = Some(Shuffle {
            seed: 3,
            mode: ShuffleMode::Full,
            block_size: 64,
            window: 1024,
        });
        let job = jobs.submit(s).await.unwrap();
        job.layout().await.unwrap();
        let t = std::time::Instant::now();
        let rows: usize = job
            .deliver(0, 0, 0, None)
            .await
            .unwrap()
            .map_ok(|d| d.num_rows())
            .try_fold(0, |a, n| async move { Ok(a + n) })
            .await
            .unwrap();
        assert_eq!(rows, n);
        rates.push(n as f64 / t.elapsed().as_secs_f64());
    }
    // Work per window linear in N makes the larger epoch 20x slower per
    // sample; a third is far from that and still above what the other
    // tests of this binary, run beside it, take away from it (0.36 seen
    // with another test binary looping on the same two cores).
    assert!(
        rates[1] >= rates[0] / 3.0,
        "samples/s over 10k vs 200k samples: {rates:?}"
    );
}

/// Finished jobs are not kept forever: past the number kept, the oldest
/// are forgotten as new ones arrive; running ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_finished_jobs_are_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let all = node(dir.path(), "all", (0..SAMPLES).collect()).await;
    let jobs = jobs(vec![all]).with_finished_kept(2);
    let running = jobs.submit(spec(1, false, "auto")).await.unwrap();
    running.layout().await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..4 {
        let j = jobs.submit(spec(1, false, "auto")).await.unwrap();
        j.layout().await.unwrap();
        jobs.cancel(j.id()).unwrap();
        ids.push(j.id().to_string());
    }
    jobs.submit(spec(1, false, "auto")).await.unwrap();
    let listed: Vec<String> = jobs.list().iter().map(|j| j.id().to_string()).collect();
    assert!(listed.contains(&running.id().to_string()), "{listed:?}");
    assert!(
        jobs.get(&ids[0]).is_err() && jobs.get(&ids[1]).is_err(),
        "{listed:?}"
    );
    assert!(
        jobs.get(&ids[2]).is_ok() && jobs.get(&ids[3]).is_ok(),
        "{listed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_share_the_window_budget_and_lose_nothing() {
    // A budget of one 64 KiB unit: every window takes all of it, so the
    // windows of eight concurrent readers run one at a time. Each reader
    // still gets its whole share, the same rows as with the default.
    let dir = tempfile::tempdir().unwrap();
    let all = node(dir.path(), "all", (0..SAMPLES).collect()).await;
    let tight = Arc::new(
        ComputeSession::new(
            vec![Arc::clone(&all)],
            sluice_udfs::cost::default_profiles(),
            ResourceHints::default(),
        )
        .with_stream_memory(1),
    );
    let budget = tight.window_budget().clone();
    assert_eq!(budget.bytes(), 64 << 10);
    let tight = Jobs::new(tight).unwrap();
    let roomy = jobs(vec![all]);
    let job = tight.submit(spec(4, false, "auto")).await.unwrap();
    let reference = roomy.submit(spec(4, false, "auto")).await.unwrap();
    let watch = {
        let budget = budget.clone();
        SpawnedTask::spawn(async move {
            let mut least = budget.available();
            for _ in 0..2000 {
                least = least.min(budget.available());
                tokio::time::sleep(std::time::Duration::from_micros(200)).await;
            }
            least
        })
    };
    let readers: Vec<_> = (0..8u64)
        .map(|i| {
            let job = tight.get(job.id()).unwrap();
            SpawnedTask::spawn(async move {
                job.deliver(i % 4, i / 4, 0, None)
                    .await
                    .unwrap()
                    .map(|d| d.and_then(|d| d.batch()))
                    .try_collect::<Vec<_>>()
                    .await
                    .unwrap()
            })
        })
        .collect();
    for (i, r) in readers.into_iter().enumerate() {
        let got = r.join().await.unwrap();
        let want = read(&roomy, reference.id(), i as u64 % 4, i as u64 / 4, 0).await;
        assert_eq!(got, want, "reader {i}");
    }
    assert_eq!(
        watch.join().await.unwrap(),
        0,
        "the windows reserved from the budget"
    );
    assert_eq!(
        budget.available(),
        budget.bytes(),
        "every window gave its room back"
    );
}

/// A deterministic job's rows enter the node's output cache: the same
/// rows, batches and bad samples, epoch by epoch, as without it, wherever
/// the stages run; a second job of the same identity is served from it
/// without reading the device (bad samples, never cached, are computed and
/// counted again); a job with random stages does not use it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deterministic_job_s_later_epochs_come_from_the_output_cache() {
    let dir = tempfile::tempdir().unwrap();
    let mut short = npy(&[1.0, 2.0, 3.0, 4.0]);
    short.truncate(short.len() - 4);
    let ids = (0..SAMPLES).collect();
    let (store, node) =
        storage_node(dir.path(), "a", ids, &[("c1/bad.npy", short.as_slice())]).await;
    let node: Arc<dyn StorageEndpoint> = node;
    let cached = Arc::new(
        ComputeSession::new(
            vec![Arc::clone(&node)],
            sluice_udfs::cost::default_profiles(),
            ResourceHints::default(),
        )
        .with_output_cache(64 << 20),
    );
    let cache = Arc::clone(cached.output_cache());
    let cached = Jobs::new(cached).unwrap();
    let plain = jobs(vec![node]);
    assert!(!plain.session().output_cache().enabled());
    let spec_of = |offload: &str| {
        let mut s = spec(2, false, offload);
        s.on_error = sluice_udfs::OnError::Skip;
        s.epochs = 3;
        s
    };
    let good = SAMPLES as u64;
    for offload in ["storage", "compute"] {
        let job = cached.submit(spec_of(offload)).await.unwrap();
        let reference = plain.submit(spec_of(offload)).await.unwrap();
        let before = cache.stats();
        for epoch in 0..3 {
            for rank in 0..2 {
                let got = read(&cached, job.id(), rank, epoch, 0).await;
                let want = read(&plain, reference.id(), rank, epoch, 0).await;
                assert_eq!(got, want, "{offload}, rank {rank}, epoch {epoch}");
            }
        }
        // Each epoch met the bad sample and counted it.
        assert_eq!(job.status().skipped, 3, "{offload}");
        assert_eq!(reference.status().skipped, 3, "{offload}");
        let after = cache.stats();
        let (hits, misses) = (after.hits - before.hits, after.misses - before.misses);
        assert_eq!(
            hits + misses,
            3 * (good + 1),
            "{offload}: every sample looked up"
        );
        // Epoch 2 began after epoch 0 of both ranks was done: every good
        // sample a hit. (Epoch 1 began ahead, with rank 1's epoch 0 to come.)
        assert!(hits >= good, "{offload}: {after:?}");
        assert_eq!(after.rows, good, "{offload}: each good sample once, shared");

        // A second job of the same identity: from memory, the device idle.
        let device = store.cache().stats().misses;
        let again = cached.submit(spec_of(offload)).await.unwrap();
        let before = cache.stats();
        for rank in 0..2 {
            let got = read(&cached, again.id(), rank, 0, 0).await;
            assert_eq!(got, read(&plain, reference.id(), rank, 0, 0).await);
        }
        let after = cache.stats();
        assert!(after.hits - before.hits >= good, "{offload}: {after:?}");
        assert_eq!(
            store.cache().stats().misses,
            device,
            "{offload}: no device read"
        );
        assert_eq!(
            again.status().skipped,
            1,
            "{offload}: the bad sample, computed again"
        );
    }
    // Something volatile: not cached, not even looked up.
    let before = cache.stats();
    let mut random = spec_of("storage");
    random.sql = Some("SELECT key, npy(data) AS x, random() AS r FROM vecs".into());
    let job = cached.submit(random).await.unwrap();
    read(&cached, job.id(), 0, 0, 0).await;
    let after = cache.stats();
    assert_eq!(
        (after.hits, after.misses, after.rows),
        (before.hits, before.misses, before.rows)
    );
}

/// `sluice serve`'s shape: the storage node's fragments and the jobs'
/// windows on one executor. With one thread for both roles (windows wait
/// on fragments queued behind them on that thread) and with two, every
/// split reads exactly what separate executors read, and the node's cores
/// are the executor's threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_executor_for_both_sides_reads_what_two_read() {
    let dir = tempfile::tempdir().unwrap();
    let (store, apart) = store_and_node(dir.path(), "all", (0..SAMPLES).collect()).await;
    let apart = jobs(vec![apart]);
    for threads in [1, 2] {
        let cpu = sluice_base::Executor::new("sluice-test-cpu", threads).unwrap();
        let node = StorageNode::on(
            Arc::clone(&cpu),
            Arc::clone(&store),
            ScanOptions::default(),
            None,
        );
        assert_eq!(node.info().cores, threads);
        let shared = Jobs::on(cpu, session(vec![node]), None);
        for offload in ["storage", "compute", "auto"] {
            let want = apart.submit(spec(2, false, offload)).await.unwrap();
            let got = shared.submit(spec(2, false, offload)).await.unwrap();
            for epoch in 0..2 {
                for rank in 0..2 {
                    assert_eq!(
                        read(&shared, got.id(), rank, epoch, 0).await,
                        read(&apart, want.id(), rank, epoch, 0).await,
                        "{threads} thread(s), {offload}, rank {rank} epoch {epoch}"
                    );
                }
            }
            assert_eq!(got.state(), JobState::Done);
        }
    }
}

/// A PNG of `w`x`h` RGB pixels that vary with `seed`.
fn png(w: u32, h: u32, seed: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([
            (x * 37 + seed * 11) as u8,
            (y * 53 + seed * 7) as u8,
            ((x + y) * 29 + seed) as u8,
        ])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

/// Rows by key: the bytes of column `x`'s values, or `None` for a NULL.
fn rows_by_key(batches: &[RecordBatch]) -> std::collections::BTreeMap<String, Option<Vec<u8>>> {
    let mut out = std::collections::BTreeMap::new();
    for b in batches {
        let keys = b.column_by_name("key").unwrap().as_string::<i32>();
        let x = b.column_by_name("x").unwrap().as_fixed_size_list();
        for i in 0..b.num_rows() {
            let v = x.is_valid(i).then(|| {
                let f = x.value(i);
                f.as_primitive::<arrow::datatypes::Float32Type>()
                    .values()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect()
            });
            out.insert(keys.value(i).to_string(), v);
        }
    }
    out
}

/// A batch's message read back, its body written as into a slot: each
/// piece (a finished column's computed in place) into one buffer.
fn read_back(
    m: &sluice_flight::slices::SlicedMessage,
    schema: &arrow::datatypes::SchemaRef,
) -> RecordBatch {
    let mut body = vec![0u8; m.body_len()];
    m.write_body(&mut body);
    let msg = arrow::ipc::root_as_message(&m.header).unwrap();
    arrow::ipc::reader::read_record_batch(
        &arrow::buffer::Buffer::from(body),
        msg.header_as_record_batch().unwrap(),
        Arc::clone(schema),
        &Default::default(),
        None,
        &msg.version(),
    )
    .unwrap()
}

/// A job whose last stage is `normalize` writes it as its batches are
/// written out (see `job::finish`): whether the batch is made or encoded
/// into a message, for every offload and error policy, the rows are those
/// of the same SQL run as a query, where `normalize` is a stage of the
/// plan; and the type the trainer sees is the query's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_normalize_gives_the_query_s_rows() {
    use sluice_udfs::OnError as Policy;
    let dir = tempfile::tempdir().unwrap();
    let mut files: Vec<(String, Vec<u8>)> = (0..11)
        .map(|i| {
            (
                format!("c{}/img{i:02}.png", i % 2),
                png(9 + i, 7 + i % 3, i),
            )
        })
        .collect();
    // A PNG whose header is whole and whose pixels are not: it ingests,
    // and its decode fails.
    let mut broken = png(8, 8, 99);
    broken.truncate(60);
    broken.extend_from_slice(&[0xAB; 40]);
    files.push(("c0/broken.png".into(), broken));
    let extra: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(p, b)| (p.as_str(), b.as_slice()))
        .collect();
    let (_, node) = storage_node(dir.path(), "imgs", Vec::new(), &extra).await;
    let node: Arc<dyn StorageEndpoint> = node;
    let jobs = jobs(vec![node]);
    // The broken image is NULL under `null`, skipped under `skip` (the
    // check runs on the deferred column, NULL exactly where normalize's is).
    let sql = "SELECT key, normalize(resize(decode_image(data), 6, 5), \
               [0.4, 0.5, 0.6], [0.2, 0.3, 0.25]) AS x FROM vecs";
    for on_error in [Policy::Null, Policy::Skip] {
        let udfs = sluice_udfs::UdfEnv::new(sluice_udfs::UdfOptions {
            on_error: Policy::Null,
            ..Default::default()
        });
        let stream = jobs
            .session()
            .execute(sql, sluice_planner::Offload::Auto, &udfs)
            .await
            .unwrap();
        let queried: Vec<RecordBatch> = stream.try_collect().await.unwrap();
        let all = rows_by_key(&queried);
        assert_eq!(all.len(), 12);
        assert_eq!(all.values().filter(|v| v.is_none()).count(), 1);
        let want: std::collections::BTreeMap<_, _> = all
            .into_iter()
            .filter(|(_, v)| on_error == Policy::Null || v.is_some())
            .collect();
        for offload in ["storage", "compute"] {
            let mut s = JobSpec::sql(sql);
            s.batch_size = 5;
            s.on_error = on_error;
            s.offload = sluice_compute::job::OffloadArg::Name(offload.into());
            let job = jobs.submit(s).await.unwrap();
            assert_eq!(
                job.schema().field_with_name("x").unwrap(),
                queried[0].schema().field_with_name("x").unwrap(),
                "the trainer's type is the query's"
            );
            // EXPLAIN says where normalize went.
            let e = job.explanation();
            assert_eq!(
                e.at_delivery,
                ["x = normalize(the window's x, [0.4, 0.5, 0.6], [0.2, 0.3, 0.25])"]
            );
            assert!(e.to_text().contains("at delivery"));
            // ... and the planner costed it there, on the compute side.
            let d = e.pipelines[0].delivery.as_ref().expect("normalize costed");
            assert_eq!(d.stages, ["normalize"]);
            assert!(d.estimated_ns > 0.0);
            assert!(
                !e.compute_fragment.contains("normalize")
                    && !e.to_json().contains("normalize(resize")
            );
            let deliveries: Vec<_> = job
                .deliver(0, 0, 0, None)
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            assert!(
                deliveries
                    .iter()
                    .all(|d| d.rows.encode().unwrap().has_computed()),
                "normalize was deferred to the delivery"
            );
            let made: Vec<RecordBatch> = deliveries.iter().map(|d| d.batch().unwrap()).collect();
            let encoded: Vec<RecordBatch> = deliveries
                .iter()
                .map(|d| read_back(&d.rows.encode().unwrap(), job.schema()))
                .collect();
            assert_eq!(made, encoded, "{on_error:?} {offload}");
            // The job's stages still show normalize, on the compute side.
            let stages = job.status().stages.expect("stage statistics");
            assert!(
                stages
                    .stages
                    .iter()
                    .any(|s| s.udf == "normalize" && s.tier == "compute"),
                "{stages:?}"
            );
            assert_eq!(rows_by_key(&made), want, "{on_error:?} {offload}");
        }
    }
}

/// Flips one byte of the first copy of `bytes` in `store`'s device file.
fn flip_in_device(data_dir: &Path, bytes: &[u8]) {
    let path = data_dir.join("device.img");
    let mut device = std::fs::read(&path).unwrap();
    let at = device
        .windows(bytes.len())
        .position(|w| w == bytes)
        .expect("the object is on the device");
    // Its last byte: the npy's values, past the header the probe reads.
    device[at + bytes.len() - 1] ^= 0xff;
    std::fs::write(&path, device).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_replica_is_read_from_the_other_holder() {
    let dir = tempfile::tempdir().unwrap();
    // Two nodes holding every sample: each key has two replicas.
    let (_, a) = storage_node(dir.path(), "a", (0..SAMPLES).collect(), &[]).await;
    let (_, b) = storage_node(dir.path(), "b", (0..SAMPLES).collect(), &[]).await;
    let (_, clean) = storage_node(dir.path(), "clean", (0..SAMPLES).collect(), &[]).await;
    let want = {
        let jobs = jobs(vec![clean as Arc<dyn StorageEndpoint>]);
        let job = jobs.submit(spec(1, false, "storage")).await.unwrap();
        read(&jobs, job.id(), 0, 0, 0).await
    };
    for i in [3, 17, 30] {
        flip_in_device(&dir.path().join("a"), &npy(&[i as f32, 0.5, -1.0, 2.0]));
    }
    // Over Flight, as a cluster's nodes are: an error names its node.
    let (a, b) = (over_flight(a).await, over_flight(b).await);
    let a_name = a.name().to_string();
    let jobs = jobs(vec![a, b]);
    let job = jobs.submit(spec(1, false, "storage")).await.unwrap();
    let got = read(&jobs, job.id(), 0, 0, 0).await;
    assert_eq!(keys(&got).len(), SAMPLES, "every sample once");
    assert_eq!(
        got, want,
        "the bytes of the good replicas, in the same order"
    );
    let status = jobs.get(job.id()).unwrap().status();
    assert_eq!(status.skipped, 0, "no sample was lost to the bad replica");
    let corrupt: Vec<_> = status
        .failovers
        .iter()
        .filter(|f| f.what == "corrupt")
        .collect();
    assert!(!corrupt.is_empty(), "{:?}", status.failovers);
    assert!(
        corrupt.iter().all(|f| f.node == a_name),
        "{:?}",
        status.failovers
    );
    assert!(
        corrupt[0].reason.contains("checksum"),
        "{}",
        corrupt[0].reason
    );
}
