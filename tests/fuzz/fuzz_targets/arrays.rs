//! Any bytes as a `.npy` file and as a `.npz` archive (sluice's own
//! parsers: no panic is caught), within the size limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_udfs::kernels::{npy, npz};

fuzz_target!(|data: &[u8]| {
    let limits = sluice_fuzz::limits();
    if let Ok(p) = npy::parse(data, &limits) {
        let elements: u64 = p.shape.iter().map(|&d| u64::from(d)).product();
        assert_eq!(elements * p.dtype.size() as u64, p.data.len() as u64);
    }
    let _ = npz::member(data, "x", &limits);
});
