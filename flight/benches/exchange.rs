//! What compressing the storage → compute exchange would buy: Arrow IPC
//! encode + decode of one window's batch with no compression (what the
//! feeds send), LZ4 frame (datafusion-distributed's default on its
//! exchanges) and zstd, for the three kinds of column that cross a cut —
//! raw JPEG objects, decoded 224² uint8 crops and normalized float32
//! tensors — with each codec's size ratio printed beside the timings.
//!
//! `cargo bench -p sluice-flight --bench exchange`; results and the
//! choice made from them in docs/benchmarks.md. The images are
//! `photo_jpeg`'s generated photos (gradients over the whole 0–255 range
//! and fine noise), not real photographs, whose skewed histograms would
//! give zstd a little on decoded pixels.

use std::hint::black_box;
use std::io::Cursor;
use std::sync::Arc;

use arrow::array::{ArrayRef, BinaryArray, RecordBatch};
use arrow::datatypes::{Field, Schema};
use arrow::ipc::CompressionType;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_udfs::calibrate::photo_jpeg;
use sluice_udfs::env::Limits;
use sluice_udfs::kernels::decode::{Mode, decode};
use sluice_udfs::kernels::normalize::normalize_into;
use sluice_udfs::kernels::resize::{Filter, resize_into};
use sluice_udfs::tensor::{ImageBuilder, ImageColumn, ImageRef, TensorBuilder, tensor_field};

/// Rows of one batch (a trainer batch of 64).
const ROWS: u32 = 64;

/// The three batches: raw objects, uint8 crops, float32 tensors.
fn batches() -> Vec<(&'static str, RecordBatch)> {
    let limits = Limits::default();
    let jpegs: Vec<Vec<u8>> = (0..ROWS).map(|i| photo_jpeg(500, 375, i)).collect();
    let mut crops = ImageBuilder::with_capacity(ROWS as usize, 224 * 224 * 3);
    let mut tensors =
        TensorBuilder::<arrow::datatypes::Float32Type>::new(ROWS as usize, 3 * 224 * 224);
    for jpeg in &jpegs {
        let img = decode(jpeg, Mode::Rgb, &limits).expect("a generated photo decodes");
        crops
            .try_append_with(224, 224, 3, |out| {
                resize_into(img.view(), None, 224, 224, Filter::Bilinear, out)
            })
            .expect("resize");
    }
    let crops = crops.finish();
    let pixels = ImageColumn::new(&crops, "bench").expect("an image column");
    for i in 0..ROWS as usize {
        let view: ImageRef<'_> = pixels.get(i).expect("a crop");
        tensors.append_with(|out| {
            normalize_into(view, &[0.485, 0.456, 0.406], &[0.229, 0.224, 0.225], out)
        });
    }
    let field = tensor_field("img", arrow::datatypes::DataType::Float32, &[3, 224, 224]);
    let tensors = tensors.finish(&field).expect("a tensor column");
    let raw: ArrayRef = Arc::new(BinaryArray::from_iter_values(jpegs.iter()));
    let one = |name: &str, col: ArrayRef| {
        let schema = Schema::new(vec![Field::new(name, col.data_type().clone(), true)]);
        RecordBatch::try_new(Arc::new(schema), vec![col]).expect("a batch")
    };
    vec![
        ("raw_jpeg", one("data", raw)),
        ("uint8_crops", one("img", crops)),
        ("float32_tensors", one("img", tensors)),
    ]
}

fn encode(batch: &RecordBatch, codec: Option<CompressionType>) -> Vec<u8> {
    let options = IpcWriteOptions::default()
        .try_with_compression(codec)
        .expect("arrow-ipc built with lz4 and zstd");
    let mut out = Vec::new();
    let mut w =
        StreamWriter::try_new_with_options(&mut out, &batch.schema(), options).expect("a writer");
    w.write(batch).expect("encode");
    w.finish().expect("finish");
    drop(w);
    out
}

fn decode_all(bytes: &[u8]) -> usize {
    StreamReader::try_new(Cursor::new(bytes), None)
        .expect("a reader")
        .map(|b| b.expect("decode").num_rows())
        .sum()
}

fn exchange(c: &mut Criterion) {
    let codecs = [
        ("none", None),
        ("lz4", Some(CompressionType::LZ4_FRAME)),
        ("zstd", Some(CompressionType::ZSTD)),
    ];
    for (kind, batch) in batches() {
        let plain = encode(&batch, None).len();
        let mut group = c.benchmark_group(format!("exchange/{kind}"));
        group.throughput(Throughput::Bytes(plain as u64));
        for (name, codec) in codecs {
            let bytes = encode(&batch, codec);
            println!(
                "exchange/{kind}/{name}: {} bytes, {:.3} of uncompressed",
                bytes.len(),
                bytes.len() as f64 / plain as f64
            );
            group.bench_function(format!("encode/{name}"), |b| {
                b.iter(|| encode(black_box(&batch), codec))
            });
            group.bench_function(format!("decode/{name}"), |b| {
                b.iter(|| decode_all(black_box(&bytes)))
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = exchange
}
criterion_main!(benches);
