//! [`BenchCommand`]: the benchmarks of `sluice bench` and their flags,
//! with [`Pattern`], the access pattern of `bench device`
//! (run by `commands/bench.rs`).

use std::path::PathBuf;

use clap::Subcommand;

use crate::size::parse_size;

/// Access pattern.
#[derive(Debug, Clone, Copy, clap::ValueEnum, PartialEq, Eq, serde::Serialize)]
pub enum Pattern {
    /// Uniformly random aligned offsets.
    Randread,
    /// Consecutive offsets, wrapping at the end.
    Read,
}

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Sequential scan of `data` vs dd/fio sequential reads of the same device file.
    Scan {
        /// Bytes of objects to ingest and scan.
        #[arg(long, default_value = "1GiB", value_parser = parse_size)]
        bytes: u64,
        /// Object size.
        #[arg(long, default_value = "256KiB", value_parser = parse_size)]
        object_size: u64,
        /// Repetitions (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Write results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Random object reads vs fio random reads at the same block size and depth.
    Random {
        /// Bytes of objects to ingest.
        #[arg(long, default_value = "1GiB", value_parser = parse_size)]
        bytes: u64,
        /// Object size (and fio block size).
        #[arg(long, default_value = "128KiB", value_parser = parse_size)]
        object_size: u64,
        /// Reads in flight.
        #[arg(long, default_value_t = 32)]
        depth: usize,
        /// Reads per run.
        #[arg(long, default_value_t = 4000)]
        reads: usize,
        /// Repetitions (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Write results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// A UDF pipeline on one core over the files of DIR in memory (table `files(key, data)`).
    Udf {
        /// Directory of input files.
        #[arg(long)]
        dir: PathBuf,
        /// The query, e.g. "SELECT decode_image(data) FROM files".
        #[arg(long)]
        sql: String,
        /// Repetitions after a warm-up (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Write results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// A job's epoch at scale: for each size, ingest that many tiny PNGs,
    /// submit a trivial job (decode + 16x16 resize) on an in-process node,
    /// and time submit → first batch and one epoch of one rank.
    Epoch {
        /// Dataset sizes, comma separated.
        #[arg(long, value_delimiter = ',', default_value = "10000,100000,1280000")]
        samples: Vec<usize>,
        /// Samples per batch.
        #[arg(long, default_value_t = 256)]
        batch: u64,
        /// Write results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Raw reads through the device backend (`--device`, read only): IOPS
    /// and MiB/s, to compare backends and SPDK's bdevperf on one device.
    Device {
        /// Random or sequential reads.
        #[arg(long, value_enum, default_value = "randread")]
        pattern: Pattern,
        /// Size of each read.
        #[arg(long, default_value = "4KiB", value_parser = parse_size)]
        io_size: u64,
        /// Reads in flight.
        #[arg(long, default_value_t = 32)]
        depth: usize,
        /// Seconds per run.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Repetitions (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Write results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Metadata path at scale: ingest many small objects, count, filter.
    Catalog {
        /// Number of objects.
        #[arg(long, default_value_t = 1_000_000)]
        samples: usize,
        /// Write results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
}
