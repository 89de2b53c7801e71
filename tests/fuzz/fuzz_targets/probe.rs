//! Any bytes through the ingest prober, which reads headers with the
//! `image` crate and FFmpeg: facts or an error, never a panic (the prober
//! catches its decoders' own).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_udfs::probe::probe;

fuzz_target!(|data: &[u8]| {
    let _ = probe(data);
});
