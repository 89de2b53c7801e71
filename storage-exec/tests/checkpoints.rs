//! Checkpoints on a real file-backed device: round trips of many sizes,
//! parts written concurrently, versions and retention, uploads that never
//! commit (space returned, nothing listed, the previous version intact),
//! a flipped byte on the device, ingest running beside checkpoint
//! writers without sharing a chunk, kept shared-memory read regions
//! bound to the next version that fits, a group of versions in one
//! region, and a version larger than its
//! region streamed through it as a window.

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use sluice_flight::shm_handshake::{PROBE_PREFIX, Probe, SHM_DIR};
use sluice_storage::checkpoint::shared::{GetRequest, GroupItem, GroupRequest, MAX_KEPT};
use sluice_storage::checkpoint::{CheckpointOptions, Checkpoints};
use sluice_storage::device::Backend;
use sluice_storage::device::conformance::pattern;
use sluice_storage::{IngestOptions, IngestSource, StorageError, Store, StoreOptions, ingest};
use sluice_udfs::kernels::npy::DType;

const CHUNK: u64 = 64 * 1024;

fn open(dir: &std::path::Path) -> Arc<Store> {
    Store::open(&StoreOptions {
        backend: Backend::File,
        device_size: 64 << 20,
        chunk_size: CHUNK,
        ..StoreOptions::new(dir)
    })
    .unwrap()
}

fn bytes(len: usize, seed: u64) -> Vec<u8> {
    pattern(seed, len)
}

/// A one-dimensional uint8 `.npy` file of `len` random bytes.
fn npy(len: usize, seed: u64) -> Vec<u8> {
    sluice_udfs::kernels::npy::write(DType::U8, &[len as u32], &bytes(len, seed))
}

/// Writes `data` as parts of `part` bytes, in pieces of 10 000 bytes.
async fn write(c: &Checkpoints, name: &str, data: &[u8], part: usize) -> u64 {
    let id = c.begin(name).unwrap();
    let parts: Vec<_> = data.chunks(part.max(1)).enumerate().collect();
    futures::future::try_join_all(parts.into_iter().map(|(i, p)| {
        let pieces: Vec<Result<Vec<u8>, StorageError>> =
            p.chunks(10_000).map(|s| Ok(s.to_vec())).collect();
        let id = id.clone();
        async move {
            c.write(&id, (i * part) as u64, futures::stream::iter(pieces))
                .await
        }
    }))
    .await
    .unwrap();
    c.commit(&id, data.len() as u64).await.unwrap().version
}

async fn read(c: &Checkpoints, name: &str, offset: u64, len: u64) -> Vec<u8> {
    let rec = Arc::new(c.get(name, None).unwrap());
    let bufs: Vec<_> = c.read(rec, offset, len).try_collect().await.unwrap();
    bufs.iter().flat_map(|b| b.as_slice().to_vec()).collect()
}

#[tokio::test]
async fn round_trips_of_every_shape_of_size() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let c = Checkpoints::new(Arc::clone(&store), CheckpointOptions::default());
    let free = store.space().free_chunks;
    for (i, len) in [0, 1, 4095, CHUNK as usize, CHUNK as usize + 1, 1_000_003]
        .into_iter()
        .enumerate()
    {
        let data = bytes(len, i as u64);
        let name = format!("sizes/{len}.pt");
        for part in [CHUNK as usize, 3 * CHUNK as usize + 5, 1 << 30] {
            write(&c, &name, &data, part).await;
            assert_eq!(
                read(&c, &name, 0, len as u64).await,
                data,
                "{len} by {part}"
            );
        }
        // Ranges, clipped to the size.
        if len > 10 {
            let mid = read(&c, &name, 7, len as u64 / 2).await;
            assert_eq!(mid, data[7..7 + len / 2]);
            let tail = read(&c, &name, len as u64 - 3, 100).await;
            assert_eq!(tail, data[len - 3..]);
        }
    }
    // Two versions per name are kept; deleting frees everything.
    let listed = c.list("sizes/").unwrap();
    assert_eq!(listed.len(), 12, "{listed:?}");
    assert!(listed.iter().all(|v| v.version >= 2));
    for name in ["0", "1", "4095", "65536", "65537", "1000003"] {
        c.delete(&format!("sizes/{name}.pt"), None).unwrap();
    }
    assert!(c.list("").unwrap().is_empty());
    assert_eq!(store.space().free_chunks, free, "every chunk back");
}

#[tokio::test]
async fn an_upload_that_never_commits_leaves_the_last_version_and_its_space() {
    let dir = tempfile::tempdir().unwrap();
    let good = bytes(300_000, 1);
    {
        let store = open(dir.path());
        let c = Checkpoints::new(
            Arc::clone(&store),
            CheckpointOptions {
                idle_timeout: Duration::from_millis(200),
                ..Default::default()
            },
        );
        write(&c, "run/model.pt", &good, 100_000).await;
        let before = store.space().free_chunks;

        // A writer that sends some parts, then dies: the upload expires.
        let id = c.begin("run/model.pt").unwrap();
        let part = vec![Ok::<_, StorageError>(bytes(200_000, 2))];
        c.write(&id, 0, futures::stream::iter(part)).await.unwrap();
        assert!(store.space().free_chunks < before, "the part holds chunks");
        assert_eq!(c.list("run/").unwrap().len(), 1, "nothing partial listed");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(c.expire_idle(), 1);
        assert_eq!(store.space().free_chunks, before, "space returned");
        let err = c.commit(&id, 200_000).await.unwrap_err();
        assert!(matches!(err, StorageError::UnknownUpload(_)), "{err}");

        // A commit that does not match what was written is refused, named.
        let id = c.begin("run/model.pt").unwrap();
        let part = vec![Ok::<_, StorageError>(bytes(1000, 3))];
        c.write(&id, 5000, futures::stream::iter(part))
            .await
            .unwrap();
        let err = c.commit(&id, 6000).await.unwrap_err().to_string();
        assert!(
            err.contains("run/model.pt") && err.contains("0..5000"),
            "{err}"
        );

        // A process that dies mid-upload: the chunks are reserved, not owned.
        let id = c.begin("run/model.pt").unwrap();
        let part = vec![Ok::<_, StorageError>(bytes(400_000, 4))];
        c.write(&id, 0, futures::stream::iter(part)).await.unwrap();
        drop(c);
        drop(store);
    }
    let store = open(dir.path());
    let c = Checkpoints::new(Arc::clone(&store), CheckpointOptions::default());
    assert_eq!(read(&c, "run/model.pt", 0, 1 << 20).await, good);
    let owned = c.get("run/model.pt", None).unwrap().runs;
    let used: u64 = owned.iter().map(|r| r.count).sum();
    assert_eq!(
        store.space().free_chunks,
        store.space().total_chunks - used,
        "only the committed version holds chunks after a restart"
    );
}

/// A probe in /dev/shm, as a client on this host makes one; removed on drop.
struct TestProbe(Probe);

impl TestProbe {
    fn new(tag: &str) -> Self {
        let name = format!("{PROBE_PREFIX}{}-{tag}", std::process::id());
        let nonce = format!("n{tag}");
        std::fs::write(std::path::Path::new(SHM_DIR).join(&name), &nonce).unwrap();
        Self(Probe { name, nonce })
    }
}

impl Drop for TestProbe {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(std::path::Path::new(SHM_DIR).join(&self.0.name));
    }
}

#[tokio::test]
async fn a_kept_region_is_read_into_again_when_the_version_fits() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let c = Checkpoints::new(Arc::clone(&store), CheckpointOptions::default());
    let big = bytes(5 * CHUNK as usize + 123, 1);
    let small = bytes(10_000, 2);
    let other = bytes(5 * CHUNK as usize + 123, 3);
    for (name, data) in [("big", &big), ("small", &small), ("other", &other)] {
        write(&c, name, data, CHUNK as usize).await;
    }
    let probe = TestProbe::new("kept");
    let open_own = |name: &'static str, kept: Vec<String>, fill: u64, own: (u64, u64)| {
        let c = Arc::clone(&c);
        let probe = probe.0.clone();
        async move {
            c.shm_get_open(GetRequest {
                name,
                version: None,
                probe: &probe,
                kept: &kept,
                fill,
                own_from: own.0,
                own_below: own.1,
                window: 0,
            })
            .await
        }
    };
    let open = |name, kept, fill| open_own(name, kept, fill, (0, 0));
    // The region's file, as the client would see it through its mapping.
    let held = |path: &str, len: usize| std::fs::read(path).unwrap()[..len].to_vec();

    // A new region, read in ranges by the client.
    let first = open("big", vec![], 0).await.unwrap();
    assert!(!first.kept && first.filled == 0 && first.gone.is_empty());
    let id = first.region.region.clone();
    assert_eq!(first.region.size, big.len() as u64);
    let n = c.shm_get(&id, 0, 0, big.len() as u64, None).await.unwrap();
    assert_eq!(n, big.len() as u64);
    assert_eq!(held(&first.region.path, big.len()), big);

    // A smaller version lands in the same region, read whole before the
    // answer; a larger region than the version is fine.
    let again = open("small", vec![id.clone()], 1 << 20).await.unwrap();
    assert!(again.kept, "{again:?}");
    assert_eq!(again.region.region, id);
    assert_eq!(again.filled, small.len() as u64);
    assert_eq!(again.checkpoint.size, small.len() as u64);
    assert_eq!(held(&first.region.path, small.len()), small);
    // Reads are clipped to the version bound to it now.
    assert_eq!(
        c.shm_get(&id, 0, 0, u64::MAX, None).await.unwrap(),
        small.len() as u64
    );

    // Ids the server does not lend come back as gone; the one it does
    // is reused.
    let third = open("other", vec!["0123456789abcdef".into(), id.clone()], 0)
        .await
        .unwrap();
    assert!(third.kept && third.region.region == id);
    assert_eq!(third.gone, vec!["0123456789abcdef".to_string()]);
    c.shm_get(&id, 0, 0, other.len() as u64, None)
        .await
        .unwrap();
    assert_eq!(held(&first.region.path, other.len()), other);

    // A version the client will map takes a region of its own, exactly
    // its size; the kept one stays idle.
    let own = open_own("other", vec![id.clone()], 0, (100_000, 0))
        .await
        .unwrap();
    assert!(!own.kept && own.region.region != id && own.gone.is_empty());
    assert_eq!(own.region.size, other.len() as u64);
    assert!(c.shm_close(&own.region.region).await.is_ok());
    // Below `own_from`, the kept one is used as before.
    let under = open_own("small", vec![id.clone()], 1 << 20, (100_000, 0))
        .await
        .unwrap();
    assert!(under.kept && under.region.region == id);
    // From `own_below` up, none of its own either: the kept one again.
    let large = open_own("other", vec![id.clone()], 0, (100_000, other.len() as u64))
        .await
        .unwrap();
    assert!(large.kept && large.region.region == id, "{large:?}");

    // Too small a kept region: a new one is lent, the small one stays.
    let tiny = open("small", vec![], 1 << 20).await.unwrap();
    let grown = open("big", vec![tiny.region.region.clone()], 0)
        .await
        .unwrap();
    assert!(!grown.kept && grown.region.region != tiny.region.region);
    assert!(grown.gone.is_empty());
    assert_eq!(c.lent_regions(), 3);

    // A put region is never bound to a version.
    let put = c.shm_put_open(&probe.0, 1 << 20).await.unwrap();
    let not_put = open("small", vec![put.region.clone()], 1 << 20)
        .await
        .unwrap();
    assert!(!not_put.kept && not_put.region.region != put.region);

    let many: Vec<String> = (0..=MAX_KEPT).map(|i| format!("{i:032x}")).collect();
    let err = open("small", many, 0).await.unwrap_err();
    assert!(err.to_string().contains("kept regions named"), "{err}");
}

#[tokio::test]
async fn a_version_streams_through_a_window_smaller_than_itself() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let c = Checkpoints::new(Arc::clone(&store), CheckpointOptions::default());
    // Six chunks and a tail, through a window of two chunks.
    let data = bytes(6 * CHUNK as usize + 321, 4);
    write(&c, "w", &data, CHUNK as usize).await;
    let probe = TestProbe::new("window");
    let window = 2 * CHUNK;
    let open = |window: u64, fill: u64| {
        c.shm_get_open(GetRequest {
            name: "w",
            version: None,
            probe: &probe.0,
            kept: &[],
            fill,
            own_from: 0,
            own_below: 0,
            window,
        })
    };
    let opened = open(window, 1 << 30).await.unwrap();
    assert_eq!(opened.region.size, window, "{opened:?}");
    // A version its window cannot hold is never read whole by get_open.
    assert_eq!(opened.filled, 0);
    let id = opened.region.region.clone();
    let mapped = |len: usize| std::fs::read(&opened.region.path).unwrap()[..len].to_vec();
    // Each chunk of the version lands in one of the window's two slots,
    // in turn, the last (a tail, not a whole block) too.
    for (i, lo) in (0..data.len() as u64).step_by(CHUNK as usize).enumerate() {
        let slot = (i as u64 % 2) * CHUNK;
        let n = c.shm_get(&id, 0, lo, CHUNK, Some(slot)).await.unwrap();
        let hi = (lo + n) as usize;
        assert_eq!(n, CHUNK.min(data.len() as u64 - lo));
        let got = mapped(slot as usize + n as usize);
        assert_eq!(&got[slot as usize..], &data[lo as usize..hi], "chunk {i}");
    }
    // An odd place (not aligned) still lands right, through a copy.
    let n = c.shm_get(&id, 0, CHUNK, 1000, Some(7)).await.unwrap();
    assert_eq!(n, 1000);
    assert_eq!(
        &mapped(1007)[7..],
        &data[CHUNK as usize..CHUNK as usize + 1000]
    );
    // A range that would run past the window is refused, naming it.
    let err = c
        .shm_get(&id, 0, 0, CHUNK, Some(window - 10))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("run past"), "{err}");
    // A window no smaller than the version is the version's size, and
    // get_open reads a version it holds whole within `fill`.
    let whole = open(1 << 30, 1 << 30).await.unwrap();
    assert_eq!(whole.region.size, data.len() as u64);
    assert_eq!(whole.filled, data.len() as u64);
    assert_eq!(std::fs::read(&whole.region.path).unwrap(), data);
}

#[tokio::test]
async fn a_flipped_byte_on_the_device_is_a_named_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let c = Checkpoints::new(Arc::clone(&store), CheckpointOptions::default());
    let data = bytes(3 * CHUNK as usize, 9);
    write(&c, "ckpt/rank0.pt", &data, CHUNK as usize).await;
    let rec = c.get("ckpt/rank0.pt", None).unwrap();
    let victim = rec.extents[1];
    let device = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path().join("device.img"))
        .unwrap();
    let mut b = [0u8; 1];
    device.read_at(&mut b, victim.device + 17).unwrap();
    device.write_at(&[b[0] ^ 0x40], victim.device + 17).unwrap();
    drop(device);
    let err = c
        .read(Arc::new(rec), 0, data.len() as u64)
        .try_collect::<Vec<_>>()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, StorageError::CheckpointCorrupt { .. }),
        "{text}"
    );
    assert!(
        text.contains("ckpt/rank0.pt") && text.contains(&format!("{}..", victim.offset)),
        "{text}"
    );
}

#[tokio::test]
async fn checkpoint_writers_and_an_ingest_never_share_a_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let src = tempfile::tempdir().unwrap();
    for i in 0..200 {
        std::fs::write(src.path().join(format!("f{i:03}.npy")), npy(20_000, i)).unwrap();
    }
    let c = Checkpoints::new(Arc::clone(&store), CheckpointOptions::default());
    let writers = futures::future::join_all((0..4).map(|r| {
        let c = Arc::clone(&c);
        async move {
            let data = bytes(700_000, 100 + r);
            write(&c, &format!("par/rank{r}.pt"), &data, 150_000).await;
            data
        }
    }));
    let ingest = ingest(
        &store,
        "blobs",
        IngestSource::Directory(src.path().to_owned()),
        IngestOptions::default(),
    );
    let (written, report) = tokio::join!(writers, ingest);
    assert_eq!(report.unwrap().samples, 200);
    for (r, data) in written.iter().enumerate() {
        let name = format!("par/rank{r}.pt");
        assert_eq!(&read(&c, &name, 0, 1 << 30).await, data, "{name}");
    }
    let ctx = sluice_storage::session_context(Arc::clone(&store));
    let batches = ctx
        .sql("SELECT key, data FROM blobs")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let mut n = 0;
    for b in &batches {
        let data = arrow::array::AsArray::as_binary::<i32>(b.column(1));
        for v in data.iter() {
            assert_eq!(v.unwrap().len(), 20_128);
            n += 1;
        }
    }
    assert_eq!(n, 200, "every sample reads back with a good crc");
}

#[tokio::test]
async fn a_group_of_versions_lands_side_by_side_in_one_region() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let c = Checkpoints::new(Arc::clone(&store), CheckpointOptions::default());
    // Small ones (read by get_group itself), one of several chunks and
    // an odd tail (read by the client, by item), and an empty one.
    let files = [
        ("l0", bytes(10_000, 5)),
        ("big", bytes(3 * CHUNK as usize + 777, 6)),
        ("l1", bytes(5_000, 7)),
        ("empty", Vec::new()),
    ];
    for (name, data) in &files {
        write(&c, name, data, CHUNK as usize).await;
    }
    let probe = TestProbe::new("group");
    let items: Vec<GroupItem> = files
        .iter()
        .map(|(name, _)| GroupItem {
            name: (*name).into(),
            version: None,
        })
        .collect();
    let bounded = |items: Vec<GroupItem>, kept: Vec<String>, max_bytes: u64| {
        let c = Arc::clone(&c);
        let probe = probe.0.clone();
        async move {
            c.shm_get_group(GroupRequest {
                items: &items,
                probe: &probe,
                kept: &kept,
                fill: 20_000,
                max_bytes,
            })
            .await
        }
    };
    let open = |items, kept| bounded(items, kept, 0);
    let first = open(items.clone(), vec![]).await.unwrap();
    assert!(!first.kept && first.items.len() == 4);
    let region = first.region.clone().unwrap();
    let id = region.region.clone();
    let mut end = 0;
    for (placed, (_, data)) in first.items.iter().zip(&files) {
        // In order, block-aligned, apart.
        assert!(placed.at >= end, "{first:?}");
        assert!(data.is_empty() || placed.at % 4096 == 0, "{first:?}");
        assert_eq!(first.items[placed.index].at, placed.at);
        assert_eq!(placed.checkpoint.size, data.len() as u64);
        end = placed.at + data.len() as u64;
        let small = !data.is_empty() && data.len() <= 20_000;
        assert_eq!(placed.filled, if small { data.len() as u64 } else { 0 });
    }
    assert!(region.size >= end);
    // The large one by item, in two ranges; its place is the item's.
    let big = &files[1].1;
    let half = 2 * CHUNK;
    assert_eq!(c.shm_get(&id, 1, 0, half, None).await.unwrap(), half);
    let rest = big.len() as u64 - half;
    assert_eq!(c.shm_get(&id, 1, half, u64::MAX, None).await.unwrap(), rest);
    let held = std::fs::read(&region.path).unwrap();
    for (placed, (name, data)) in first.items.iter().zip(&files) {
        let at = placed.at as usize;
        assert_eq!(&held[at..at + data.len()], &data[..], "{name}");
    }
    // An item the region does not hold is refused, naming it.
    let err = c.shm_get(&id, 4, 0, 10, None).await.unwrap_err();
    assert!(err.to_string().contains("item 4"), "{err}");

    // The next load of the same shape takes the kept region.
    let again = open(items.clone(), vec![id.clone()]).await.unwrap();
    assert!(again.kept && again.region.as_ref().unwrap().region == id);
    // Bounded: the large one is left out (read alone), the rest placed;
    // none fits, none lent.
    let some = bounded(items.clone(), vec![], 3 * 4096 + 5_000)
        .await
        .unwrap();
    let placed: Vec<usize> = some.items.iter().map(|p| p.index).collect();
    assert_eq!(placed, vec![0, 2, 3], "{some:?}");
    let none = bounded(items[1..2].to_vec(), vec![], 4096).await.unwrap();
    assert!(none.region.is_none() && none.items.is_empty());
    // An unknown checkpoint fails the group, naming it; none is lent.
    let lent = c.lent_regions();
    let mut bad = items.clone();
    bad.push(GroupItem {
        name: "nope".into(),
        version: None,
    });
    let err = open(bad, vec![]).await.unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
    assert_eq!(c.lent_regions(), lent);
    let err = open(vec![], vec![]).await.unwrap_err();
    assert!(err.to_string().contains("versions named"), "{err}");
}

#[tokio::test]
async fn an_upload_pass_writes_its_own_upload_only_and_only_where_passes_are_given() {
    use sluice_access::UploadPass;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let part = || futures::stream::iter([Ok::<_, StorageError>(bytes(5_000, 7))]);
    // A store that gives no passes (one machine's): none is answered, and
    // no pass writes its uploads.
    let closed = Checkpoints::new(Arc::clone(&store), CheckpointOptions::default());
    let (id, pass) = closed.begin_with_pass("run/a.pt").unwrap();
    assert!(pass.is_none());
    let guess = UploadPass("0".repeat(64));
    let e = closed.write_with_pass(&id, &guess, 0, part()).await;
    assert!(matches!(e, Err(StorageError::PassRefused(_))), "{e:?}");
    drop(closed);

    let c = Checkpoints::new(
        Arc::clone(&store),
        CheckpointOptions {
            passes: true,
            ..Default::default()
        },
    );
    let (a, pass_a) = c.begin_with_pass("run/a.pt").unwrap();
    let (b, pass_b) = c.begin_with_pass("run/b.pt").unwrap();
    let (pass_a, pass_b) = (UploadPass(pass_a.unwrap()), UploadPass(pass_b.unwrap()));
    let plain = c.begin("run/c.pt").unwrap();
    // Its own upload: written, committed, read back.
    assert_eq!(
        c.write_with_pass(&a, &pass_a, 0, part()).await.unwrap(),
        5_000
    );
    // Another's, one begun without a pass, one that does not exist: the
    // same refusal.
    for (id, pass) in [
        (&b, &pass_a),
        (&plain, &pass_a),
        (&"nope".to_string(), &pass_b),
    ] {
        let e = c.write_with_pass(id, pass, 0, part()).await;
        assert!(matches!(e, Err(StorageError::PassRefused(_))), "{e:?}");
    }
    c.commit(&a, 5_000).await.unwrap();
    assert_eq!(read(&c, "run/a.pt", 0, 5_000).await, bytes(5_000, 7));
    // A pass dies with its upload.
    let e = c.write_with_pass(&a, &pass_a, 0, part()).await;
    assert!(matches!(e, Err(StorageError::PassRefused(_))), "{e:?}");
    assert_eq!(c.open_uploads(&[a, b.clone(), plain.clone()]), [b, plain]);
}

#[tokio::test]
async fn a_read_pass_reads_its_own_version_only_and_only_where_passes_are_given() {
    use sluice_access::ReadPass;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let write = |c: Arc<Checkpoints>, name: &'static str, fill: u64| async move {
        let id = c.begin(name).unwrap();
        let part = futures::stream::iter([Ok::<_, StorageError>(bytes(3_000, fill))]);
        c.write(&id, 0, part).await.unwrap();
        c.commit(&id, 3_000).await.unwrap().version
    };
    // A store that gives no passes (one machine's): none is answered, and
    // no pass reads its versions.
    let closed = Checkpoints::new(Arc::clone(&store), CheckpointOptions::default());
    let v = write(Arc::clone(&closed), "run/a.pt", 1).await;
    let (version, pass) = closed.read_pass("run/a.pt", None).unwrap();
    assert_eq!((version, pass), (v, None));
    assert!(!closed.admits_read(&ReadPass("0.00".into()), "run/a.pt", v));
    drop(closed);

    let c = Checkpoints::new(
        Arc::clone(&store),
        CheckpointOptions {
            passes: true,
            keep: 4,
            ..Default::default()
        },
    );
    let v2 = write(Arc::clone(&c), "run/a.pt", 2).await;
    write(Arc::clone(&c), "run/b.pt", 3).await;
    // The newest version by default, or the one named.
    let (newest, pass) = c.read_pass("run/a.pt", None).unwrap();
    assert_eq!(newest, v2);
    let pass = ReadPass(pass.unwrap());
    assert!(c.admits_read(&pass, "run/a.pt", v2));
    assert!(!c.admits_read(&pass, "run/a.pt", v));
    assert!(!c.admits_read(&pass, "run/b.pt", v2));
    let (older, old_pass) = c.read_pass("run/a.pt", Some(v)).unwrap();
    assert_eq!(older, v);
    assert!(c.admits_read(&ReadPass(old_pass.unwrap()), "run/a.pt", v));
    // No pass for a version that is not there; another store's passes
    // (another key) read nothing here.
    assert!(c.read_pass("run/a.pt", Some(v2 + 5)).is_err());
    assert!(c.read_pass("run/zzz.pt", None).is_err());
    let other = Checkpoints::new(
        Arc::clone(&store),
        CheckpointOptions {
            passes: true,
            ..Default::default()
        },
    );
    assert!(!other.admits_read(&pass, "run/a.pt", v2));
}
