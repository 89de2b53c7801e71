//! The data dir is never lost to a read: a missing, truncated or damaged
//! catalog is refused with an error naming it (never recreated empty, never
//! a panic), no read-only command deletes a file, orphans go only through
//! `sluice gc`, and one damaged metadata file affects only its dataset.

use std::path::{Path, PathBuf};

use crate::common::{Env, gen_sample};

/// An env with two ingested datasets, `pets` and `more`.
fn populated() -> Env {
    let env = Env::new();
    let src = env.path("pets");
    gen_sample(&env, &src, 2, 4, 3);
    env.ok(&["ingest", "pets", src.to_str().unwrap()]);
    env.ok(&["ingest", "more", src.to_str().unwrap()]);
    env
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(files_under(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out.sort();
    out
}

/// Read-only commands, each of which once recreated the catalog and
/// deleted every metadata file.
const READERS: &[&[&str]] = &[
    &["datasets"],
    &["datasets", "--format", "json"],
    &["checkpoints", "list"],
    &["info"],
    &["sql", "SELECT count(*) FROM pets"],
];

fn assert_refused_and_untouched(env: &Env, why: &str) {
    let meta = files_under(&env.data_dir().join("meta"));
    assert_eq!(meta.len(), 2, "{meta:?}");
    let catalog_before = std::fs::read(env.data_dir().join("catalog.redb")).ok();
    for args in READERS {
        let out = env.run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{why}: sluice {args:?}: {stderr}"
        );
        assert!(
            stderr.contains("catalog.redb") && stderr.contains("Restore"),
            "{why}: sluice {args:?} should name the catalog and the way back: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{why}: {stderr}");
    }
    assert_eq!(files_under(&env.data_dir().join("meta")), meta, "{why}");
    assert_eq!(
        std::fs::read(env.data_dir().join("catalog.redb")).ok(),
        catalog_before,
        "{why}: the catalog file changed"
    );
}

#[test]
fn a_missing_or_empty_catalog_is_refused_and_nothing_is_deleted() {
    let env = populated();
    let catalog = env.data_dir().join("catalog.redb");
    let saved = std::fs::read(&catalog).unwrap();

    std::fs::write(&catalog, b"").unwrap();
    assert_refused_and_untouched(&env, "truncated to 0 bytes");

    std::fs::remove_file(&catalog).unwrap();
    assert_refused_and_untouched(&env, "deleted");

    // Restored from the backup, everything is back.
    std::fs::write(&catalog, &saved).unwrap();
    let list = env.json(&["datasets", "--format", "json"]);
    assert_eq!(list.as_array().unwrap().len(), 2);
    assert_eq!(
        env.sql_json("SELECT count(*) AS n FROM pets", &[])[0]["n"],
        8
    );
}

#[test]
fn a_bit_flipped_catalog_never_panics_and_never_loses_a_dataset() {
    let env = populated();
    let catalog = env.data_dir().join("catalog.redb");
    let saved = std::fs::read(&catalog).unwrap();
    let mut refused = 0;
    // A deterministic spread of flips over the whole file: headers, pages
    // of the tables, free space.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for round in 0..24 {
        let mut bytes = saved.clone();
        for _ in 0..4 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x as usize) % bytes.len();
            bytes[i] ^= 1 << (x >> 61);
        }
        std::fs::write(&catalog, &bytes).unwrap();
        let out = env.run(&["datasets", "--format", "json"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "round {round}: {stderr}");
        match out.status.code() {
            Some(0) => {
                // The flips hit bytes redb does not use: the listing is whole.
                let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                assert_eq!(list.as_array().unwrap().len(), 2, "round {round}");
            }
            Some(1) => {
                refused += 1;
                assert!(stderr.contains("catalog.redb"), "round {round}: {stderr}");
            }
            other => panic!("round {round}: exit {other:?}: {stderr}"),
        }
        assert_eq!(files_under(&env.data_dir().join("meta")).len(), 2);
    }
    assert!(refused > 0, "no flip was detected in 24 rounds");
}

#[test]
fn orphans_are_removed_only_by_gc() {
    let env = populated();
    let orphan = env.data_dir().join("meta/pets/v2.parquet");
    std::fs::write(&orphan, b"left by an interrupted ingest").unwrap();
    for args in READERS {
        env.ok(args);
        assert!(orphan.exists(), "sluice {args:?} deleted an orphan");
    }
    let info = env.json(&["info", "--format", "json"]);
    assert_eq!(
        info["orphaned_metadata"]["metadata_files"][0],
        "meta/pets/v2.parquet"
    );
    let dry = env.ok(&["gc", "--dry-run"]);
    assert!(dry.contains("would remove meta/pets/v2.parquet"), "{dry}");
    assert!(orphan.exists());
    let done = env.ok(&["gc"]);
    assert!(done.contains("removed 1 orphaned metadata files"), "{done}");
    assert!(!orphan.exists());
    assert_eq!(files_under(&env.data_dir().join("meta")).len(), 2);
    // A second ingest of the dataset takes the version the orphan had.
    let src = env.path("pets");
    let out = env.ok(&["ingest", "pets", src.to_str().unwrap()]);
    assert!(out.contains("version 2"), "{out}");
}

#[test]
fn one_damaged_metadata_file_affects_only_its_dataset() {
    let env = populated();
    let meta = env.data_dir().join("meta/more/v1.parquet");
    let len = std::fs::metadata(&meta).unwrap().len() as usize;
    std::fs::write(&meta, vec![0xAB; len]).unwrap();

    let list = env.json(&["datasets", "--format", "json"]);
    assert_eq!(list.as_array().unwrap().len(), 2);
    assert_eq!(
        env.sql_json("SELECT count(*) AS n FROM pets", &[])[0]["n"],
        8
    );
    let err = env.fails(&["sql", "SELECT count(*) FROM more"]);
    assert!(err.contains("meta/more/v1.parquet"), "{err}");
    assert!(meta.exists());
}
