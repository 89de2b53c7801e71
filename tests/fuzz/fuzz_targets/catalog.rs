//! Any bytes as a data dir's `catalog.redb` (the seed is a real catalog
//! with two datasets, one of two versions): opening it is the catalog or an
//! error naming the file, and every record of an opened catalog reads
//! back — never a panic, an abort or a hang. The database engine may
//! panic on a damaged file; `Catalog::open` catches that and says the
//! file is damaged, so those caught panics are allowed here
//! ([`sluice_fuzz::quiet_panics`]); one that leaves the catalog is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_storage::StorageError;
use sluice_storage::catalog::Catalog;

thread_local! {
    static DIR: tempfile::TempDir = tempfile::tempdir().expect("a scratch directory");
}

fuzz_target!(
    init: {
        sluice_fuzz::quiet_panics();
    },
    |data: &[u8]| {
        DIR.with(|dir| {
            let path = dir.path().join("catalog.redb");
            std::fs::write(&path, data).expect("write the catalog");
            let catalog = match Catalog::open(&path) {
                Ok(c) => c,
                Err(StorageError::CatalogDamaged { path: named, .. }) => {
                    assert_eq!(named, path);
                    return;
                }
                Err(e) => panic!("a damaged catalog gave an error of another kind: {e}"),
            };
            // Open: everything the commands read must read back.
            for name in catalog.dataset_names().expect("dataset names of an opened catalog") {
                catalog.versions(&name).expect("versions of an opened catalog");
                let _ = catalog.latest_version(&name).expect("latest version");
            }
            catalog.chunk_runs().expect("chunk map of an opened catalog");
            catalog.metadata_files().expect("metadata files of an opened catalog");
        });
    }
);
