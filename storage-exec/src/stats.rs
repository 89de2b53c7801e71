//! A dataset version's statistics for the planner: counts and bytes from
//! the catalog, and the probed sizes of an evenly spaced sample of its
//! objects, read from the metadata file (no object is read).

use std::fs::File;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{UInt8Type, UInt32Type, UInt64Type};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use sluice_planner::DatasetStats;
use sluice_udfs::cost::SampleStats;

use crate::error::{Result, StorageError};
use crate::metadata::{CHANNELS, FRAMES, HEIGHT, LENGTH, SHAPE, WIDTH};
use crate::scan::DatasetVersion;

/// Objects sampled per dataset.
pub const SAMPLE: usize = 256;

/// The statistics of `version`, with at most `max_sample` objects sampled.
pub fn dataset_stats(version: &DatasetVersion, max_sample: usize) -> Result<DatasetStats> {
    let samples = version.record.samples;
    let stride = (samples as usize).div_ceil(max_sample.max(1)).max(1);
    let schema = &version.metadata_schema;
    let wanted = [LENGTH, WIDTH, HEIGHT, CHANNELS, FRAMES, SHAPE];
    let leaves: Vec<usize> = wanted
        .iter()
        .filter_map(|c| schema.index_of(c).ok())
        .collect();
    let parquet_err = |source| StorageError::Parquet {
        path: version.metadata_path.clone(),
        source,
    };
    let file = File::open(&version.metadata_path)
        .map_err(|e| StorageError::io("open metadata", &version.metadata_path, e))?;
    let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(file, version.parquet.clone());
    let mask = ProjectionMask::roots(builder.parquet_schema(), leaves);
    let reader = builder
        .with_projection(mask)
        .with_batch_size(8192)
        .build()
        .map_err(parquet_err)?;
    let mut sample = Vec::new();
    let mut row = 0usize;
    for batch in reader {
        let batch = batch.map_err(|e| parquet_err(e.into()))?;
        let u32_col = |n: &str| {
            batch
                .column_by_name(n)
                .map(|c| c.as_primitive::<UInt32Type>().clone())
        };
        let length = batch
            .column_by_name(LENGTH)
            .map(|c| c.as_primitive::<UInt64Type>().clone());
        let (width, height) = (u32_col(WIDTH), u32_col(HEIGHT));
        let channels = batch
            .column_by_name(CHANNELS)
            .map(|c| c.as_primitive::<UInt8Type>().clone());
        let frames = batch
            .column_by_name(FRAMES)
            .map(|c| c.as_primitive::<UInt64Type>().clone());
        let shape = batch
            .column_by_name(SHAPE)
            .map(|c| c.as_list::<i32>().clone());
        for i in 0..batch.num_rows() {
            if !(row + i).is_multiple_of(stride) {
                continue;
            }
            let get32 = |a: &Option<arrow::array::UInt32Array>| {
                a.as_ref()
                    .filter(|a| a.is_valid(i))
                    .map_or(0.0, |a| f64::from(a.value(i)))
            };
            let mut s = SampleStats {
                bytes: length
                    .as_ref()
                    .filter(|a| a.is_valid(i))
                    .map_or(0.0, |a| a.value(i) as f64),
                width: get32(&width),
                height: get32(&height),
                channels: channels
                    .as_ref()
                    .filter(|a| a.is_valid(i))
                    .map_or(0.0, |a| f64::from(a.value(i))),
                frames: frames
                    .as_ref()
                    .filter(|a| a.is_valid(i))
                    .map_or(1.0, |a| a.value(i) as f64),
                elements: 0.0,
            };
            if let Some(shape) = shape.as_ref().filter(|a| a.is_valid(i)) {
                let dims: Vec<f64> = shape
                    .value(i)
                    .as_primitive::<UInt32Type>()
                    .iter()
                    .map(|d| f64::from(d.unwrap_or(0)))
                    .collect();
                s.elements = dims.iter().product();
                if dims.len() >= 2 {
                    s.width = dims[dims.len() - 1];
                    s.height = dims[dims.len() - 2];
                }
                if dims.len() >= 3 {
                    s.frames = dims[dims.len() - 3];
                }
            }
            sample.push(s);
        }
        row += batch.num_rows();
    }
    Ok(DatasetStats {
        samples,
        bytes: version.record.bytes,
        sample,
    })
}
