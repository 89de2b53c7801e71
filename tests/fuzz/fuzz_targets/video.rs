//! Any bytes through FFmpeg's probe and `decode_video`'s clip decode, in
//! both sampling modes: a result or an error, within the frame budget and
//! the time limit; never a fault or a hang.
#![no_main]

use arrow::buffer::Buffer;
use libfuzzer_sys::fuzz_target;
use sluice_udfs::env::Cancel;
use sluice_udfs::kernels::video::{Sampling, decode_clip, probe};

fuzz_target!(init: sluice_fuzz::quiet_panics(), |data: &[u8]| {
    let buffer = Buffer::from(data);
    let _ = sluice_fuzz::as_in_serve(|| probe(buffer.clone()));
    let sampling = if data.len() % 2 == 0 {
        Sampling::Uniform
    } else {
        Sampling::Stride(2)
    };
    let mut out = vec![0; 4 * 16 * 16 * 3];
    let _ = sluice_fuzz::as_in_serve(|| {
        decode_clip(
            buffer,
            (4, 16, 16),
            sampling,
            &sluice_fuzz::limits(),
            &Cancel::default(),
            &mut out,
        )
    });
});
