//! Criterion benchmarks of the kernels behind the UDFs, one sample at a time.
//!
//! `cargo bench -p sluice-udfs` (or `--bench kernels -- NAME` for one). The
//! whole-pipeline comparison with Pillow and PyAV is `scripts/bench_udfs.py`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_udfs::calibrate::photo_jpeg;
use sluice_udfs::env::Limits;
use sluice_udfs::kernels::crop::RrcParams;
use sluice_udfs::kernels::decode::{Mode, decode, decode_at_least, header};
use sluice_udfs::kernels::flip::flip_horizontal_into;
use sluice_udfs::kernels::normalize::normalize_into;
use sluice_udfs::kernels::resize::{Filter, resize_into};
use sluice_udfs::random::SampleRng;

fn images(c: &mut Criterion) {
    let limits = Limits::default();
    for (name, w, h) in [("500x375", 500, 375), ("12MP", 4000, 3000)] {
        let jpeg = photo_jpeg(w, h, 1);
        let hd = header(&jpeg, Mode::Rgb, &limits).unwrap();
        c.bench_function(&format!("decode_jpeg_full/{name}"), |b| {
            b.iter(|| decode(black_box(&jpeg), Mode::Rgb, &limits).unwrap())
        });
        c.bench_function(&format!("decode_jpeg_at_least_224/{name}"), |b| {
            b.iter(|| {
                decode_at_least(black_box(&jpeg), Mode::Rgb, &hd, 224.0, 224.0, &limits).unwrap()
            })
        });
        let img = decode(&jpeg, Mode::Rgb, &limits).unwrap();
        let mut out = vec![0u8; 224 * 224 * 3];
        let mut f32s = vec![0f32; 224 * 224 * 3];
        c.bench_function(&format!("rrc_flip_normalize_224/{name}"), |b| {
            let mut rng = SampleRng::new(1, 0, "k", "bench");
            b.iter(|| {
                let win = RrcParams::default().window(&mut rng, h, w);
                resize_into(img.view(), Some(win), 224, 224, Filter::Bilinear, &mut out).unwrap();
                let mut flipped = vec![0u8; out.len()];
                let view = sluice_udfs::tensor::ImageRef {
                    height: 224,
                    width: 224,
                    channels: 3,
                    pixels: &out,
                };
                flip_horizontal_into(view, &mut flipped);
                let view = sluice_udfs::tensor::ImageRef {
                    height: 224,
                    width: 224,
                    channels: 3,
                    pixels: &flipped,
                };
                normalize_into(
                    view,
                    &[0.485, 0.456, 0.406],
                    &[0.229, 0.224, 0.225],
                    &mut f32s,
                );
            })
        });
    }
}

criterion_group! {
    name = kernels;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(3));
    targets = images
}
criterion_main!(kernels);
