//! Any bytes as an ingest manifest: the first byte picks the format
//! (CSV, JSON lines or Parquet), the rest is the file. Parsed and checked
//! as an ingest does ([`IngestSource::list`]): a listing or an error that
//! names the manifest. The third-party readers may panic on a malformed
//! file (the Parquet reader did on a cut footer); `list` catches that and
//! names the manifest, so caught panics are allowed here
//! ([`sluice_fuzz::quiet_panics`]); one that escapes is a finding.
#![no_main]

use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use sluice_storage::IngestSource;

/// Formats, by the first byte of the input.
const EXTENSIONS: [&str; 3] = ["csv", "jsonl", "parquet"];

struct Scratch {
    dir: tempfile::TempDir,
    runtime: tokio::runtime::Runtime,
}

thread_local! {
    static SCRATCH: Scratch = Scratch {
        dir: tempfile::tempdir().expect("a scratch directory"),
        runtime: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime"),
    };
}

fuzz_target!(
    init: {
        sluice_fuzz::quiet_panics();
    },
    |data: &[u8]| {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    let ext = EXTENSIONS[usize::from(kind) % EXTENSIONS.len()];
    SCRATCH.with(|s| {
        let manifest: PathBuf = s.dir.path().join(format!("m.{ext}"));
        std::fs::write(&manifest, body).expect("write the manifest");
        let source = IngestSource::Manifest {
            manifest: manifest.clone(),
            base: s.dir.path().to_owned(),
        };
        match s.runtime.block_on(source.list()) {
            Ok(listing) => {
                for (key, path) in &listing {
                    assert!(path.is_some(), "manifest row {key:?} has no path");
                }
            }
            Err(e) => {
                let text = e.to_string();
                assert!(
                    text.contains("m."),
                    "an error not naming the manifest: {text}"
                );
            }
        }
    });
}
);
