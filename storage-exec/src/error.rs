//! The storage crate's error type.
//!
//! One enum for everything below the SQL layer. Each variant says what went
//! wrong and carries the thing at fault (path, dataset, version, key), so a
//! message printed to a user names the culprit without a backtrace. Inside
//! DataFusion plans these travel as `DataFusionError::External`, keeping
//! the gRPC code and kind each variant answers with ([`Fault`]).

use std::path::PathBuf;

use sluice_base::Fault;
use tonic::Code;

/// Errors raised by devices, the extent store, the catalog and ingest.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// An I/O error on a path (device file, metadata file, source object).
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done ("read", "open", "write" …).
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A request whose offset or length is not a multiple of the block size.
    #[error("device {device}: {what} {value} is not a multiple of the block size {block_size}")]
    Misaligned {
        /// The device's display name.
        device: String,
        /// "offset" or "length".
        what: &'static str,
        /// The offending value.
        value: u64,
        /// The device's block size.
        block_size: usize,
    },
    /// A request past the end of the device.
    #[error("device {device}: range {offset}+{len} is past its capacity {capacity}")]
    OutOfRange {
        /// The device's display name.
        device: String,
        /// Start of the request.
        offset: u64,
        /// Length of the request.
        len: u64,
        /// Device capacity in bytes.
        capacity: u64,
    },
    /// The SPDK backend could not start, load its bdev config or open a bdev.
    #[error("SPDK: {0}")]
    Spdk(String),
    /// The filesystem holding a device file refuses O_DIRECT.
    #[error(
        "device {}: O_DIRECT is not supported here ({source}); use --device-backend file",
        path.display()
    )]
    DirectIoUnsupported {
        /// The device path.
        path: PathBuf,
        /// The error from open(2).
        #[source]
        source: std::io::Error,
    },
    /// io_uring could not be set up (old kernel, disabled by sysctl or seccomp).
    #[error("io_uring unavailable: {0}")]
    UringUnavailable(#[source] std::io::Error),
    /// The device has no room for an ingest.
    #[error(
        "device full while ingesting dataset '{dataset}': {needed} bytes needed, {free} bytes free in whole chunks"
    )]
    DeviceFull {
        /// The dataset being ingested.
        dataset: String,
        /// Bytes the next object needed.
        needed: u64,
        /// Free bytes left on the device.
        free: u64,
    },
    /// An extent read back does not match the checksum recorded at ingest.
    #[error(
        "checksum mismatch in dataset '{dataset}' version {version}, key '{key}': stored crc32c {expected:08x}, read {actual:08x}"
    )]
    ChecksumMismatch {
        /// Dataset name.
        dataset: String,
        /// Dataset version.
        version: u64,
        /// Sample key.
        key: String,
        /// crc32c recorded at ingest.
        expected: u32,
        /// crc32c of the bytes read.
        actual: u32,
    },
    /// The data directory was written by an incompatible sluice, or is not one.
    #[error("data dir {}: {reason}", path.display())]
    IncompatibleDataDir {
        /// The data directory.
        path: PathBuf,
        /// Why it cannot be opened.
        reason: String,
    },
    /// Another process holds the data directory.
    #[error("data dir {} is in use by another sluice process", path.display())]
    DataDirLocked {
        /// The data directory.
        path: PathBuf,
    },
    /// The embedded catalog database failed.
    #[error("catalog {}: {message}", path.display())]
    Catalog {
        /// The catalog file.
        path: PathBuf,
        /// What redb reported.
        message: String,
    },
    /// The catalog of an existing data dir is missing, empty or damaged.
    /// sluice never recreates it over data: a fresh catalog would call
    /// every dataset and checkpoint free space.
    #[error(
        "catalog {}: {reason}. The data dir's datasets and checkpoints are listed only there, \
         so sluice will not open it (nothing was changed). Restore catalog.redb from a backup \
         or a copy of the data dir; to start afresh, move the data dir aside",
        path.display()
    )]
    CatalogDamaged {
        /// The catalog file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A job asked for a row a dataset version does not have.
    #[error("dataset '{dataset}' version {version} has {rows} rows; row {row} was asked for")]
    RowOutOfRange {
        /// Dataset name.
        dataset: String,
        /// Dataset version.
        version: u64,
        /// The row asked for.
        row: u32,
        /// Rows in the version.
        rows: usize,
    },
    /// A dataset that does not exist.
    #[error("unknown dataset '{0}'")]
    UnknownDataset(String),
    /// A version of a dataset that does not exist.
    #[error("dataset '{dataset}' has no version {version}")]
    UnknownVersion {
        /// Dataset name.
        dataset: String,
        /// Requested version.
        version: u64,
    },
    /// A dataset name that cannot be used as a table name or path.
    #[error(
        "invalid dataset name '{0}': use lowercase letters, digits, '_' and '-', starting with a letter"
    )]
    InvalidDatasetName(String),
    /// A source object that cannot be ingested (unreadable, unknown format, bad header).
    #[error("dataset '{dataset}': sample '{key}' refused: {reason}; nothing was committed")]
    BadSample {
        /// The dataset being ingested.
        dataset: String,
        /// The key the sample would have had.
        key: String,
        /// Why it was refused.
        reason: String,
    },
    /// An ingest source (directory or manifest) that cannot be used.
    #[error("ingest source {}: {reason}", path.display())]
    BadSource {
        /// The source path.
        path: PathBuf,
        /// Why it cannot be used.
        reason: String,
    },
    /// An ingest source outside the roots this process may ingest from
    /// (its `--ingest-root`s), or any source where it has none.
    #[error("{} is outside the ingest roots ({roots})", path.display())]
    OutsideRoots {
        /// The source path, as asked.
        path: PathBuf,
        /// The roots, comma-separated (`none` where ingest is off).
        roots: String,
    },
    /// A prepared ingest part this node does not hold (never prepared,
    /// dropped after its time to live, or lost with a restart).
    #[error("no prepared ingest {0} on this node (never prepared, expired, or lost in a restart)")]
    UnknownIngest(String),
    /// An ingest that found nothing to commit.
    #[error("dataset '{0}': no samples to ingest")]
    EmptyIngest(String),
    /// Parquet metadata could not be written or read.
    #[error("metadata {}: {source}", path.display())]
    Parquet {
        /// The metadata file.
        path: PathBuf,
        /// The parquet error.
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// An Arrow error while building metadata.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// A checkpoint name that cannot be used.
    #[error("invalid checkpoint name '{name}': {reason}")]
    InvalidCheckpointName {
        /// The name as given (at most 64 characters of it).
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A checkpoint (or one version of it) that does not exist.
    #[error("unknown checkpoint '{name}'{}", version.map(|v| format!(" version {v}")).unwrap_or_default())]
    UnknownCheckpoint {
        /// Its name.
        name: String,
        /// The version asked for, if one was.
        version: Option<u64>,
    },
    /// A repair whose bytes are not the object's, or whose object is not
    /// there.
    #[error("cannot repair key '{key}' of dataset '{dataset}' version {version}: {reason}")]
    BadRepair {
        /// Dataset name.
        dataset: String,
        /// Dataset version.
        version: u64,
        /// Sample key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A checkpoint repair whose bytes are not the extent's, or whose
    /// extent is not there.
    #[error("cannot repair checkpoint '{name}' version {version} at byte {offset}: {reason}")]
    BadCheckpointRepair {
        /// The checkpoint.
        name: String,
        /// Its version.
        version: u64,
        /// Where the extent was said to start.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A checkpoint upload that does not exist (never begun, committed,
    /// aborted, or expired after a writer went silent).
    #[error("unknown checkpoint upload '{0}' (committed, aborted, or expired)")]
    UnknownUpload(String),
    /// A put with an upload pass that is not the named upload's (or the
    /// upload is over): the same answer either way, so a pass tells its
    /// holder nothing of other uploads.
    #[error(
        "the upload pass presented is not checkpoint upload '{0}''s, or the upload is over \
         (committed, aborted, or expired)"
    )]
    PassRefused(String),
    /// A checkpoint upload that cannot be committed or written as asked.
    #[error("checkpoint '{name}': {reason}")]
    BadUpload {
        /// The checkpoint name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A shared-memory region for a checkpoint that cannot be had: the
    /// client is not on this host, or `/dev/shm` refused it.
    #[error("shared memory for {what}: {reason}")]
    SharedMemory {
        /// What it was for ("checkpoint 'run/step-3'").
        what: String,
        /// Why not.
        reason: String,
    },
    /// A shared-memory region that does not exist (closed, or expired
    /// after its client went silent).
    #[error("unknown shared-memory region '{0}' (closed or expired)")]
    UnknownRegion(String),
    /// Bytes of a checkpoint read back do not match their checksum.
    #[error(
        "checkpoint '{name}' version {version} is corrupt at bytes {offset}..{end}: stored crc32c {expected:08x}, read {actual:08x}"
    )]
    CheckpointCorrupt {
        /// The checkpoint name.
        name: String,
        /// Its version.
        version: u64,
        /// First byte of the damaged extent.
        offset: u64,
        /// End of the damaged extent.
        end: u64,
        /// crc32c recorded at write.
        expected: u32,
        /// crc32c of the bytes read.
        actual: u32,
    },
    /// No room on the device for a write other than an ingest.
    #[error("device full writing {what}: {needed} bytes needed, {free} bytes free in whole chunks")]
    NoSpace {
        /// What was being written.
        what: String,
        /// Bytes needed.
        needed: u64,
        /// Free bytes left.
        free: u64,
    },
    /// A DataFusion error while reading a manifest.
    #[error("{0}")]
    DataFusion(#[from] datafusion::error::DataFusionError),
}

/// Result alias for this crate.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

impl StorageError {
    /// Shorthand for [`StorageError::Io`].
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

impl From<StorageError> for datafusion::error::DataFusionError {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::DataFusion(e) => e,
            // Keeps its code and kind: a checksum mismatch inside a plan
            // still answers DATA_LOSS.
            other => sluice_base::fault::external(other),
        }
    }
}

/// Each variant's gRPC code and kind (REST derives its HTTP status from
/// the code). Damaged bytes and a damaged catalog are `DATA_LOSS`;
/// what the caller named and does not exist, `NOT_FOUND`; what it asked
/// and cannot be, `INVALID_ARGUMENT`; a full device, `RESOURCE_EXHAUSTED`;
/// a data dir that cannot be opened as it is, `FAILED_PRECONDITION`.
impl Fault for StorageError {
    fn code(&self) -> Code {
        match self {
            Self::ChecksumMismatch { .. }
            | Self::CheckpointCorrupt { .. }
            | Self::CatalogDamaged { .. } => Code::DataLoss,
            Self::UnknownDataset(_)
            | Self::UnknownVersion { .. }
            | Self::UnknownCheckpoint { .. }
            | Self::UnknownUpload(_)
            | Self::UnknownRegion(_) => Code::NotFound,
            Self::InvalidDatasetName(_)
            | Self::InvalidCheckpointName { .. }
            | Self::BadSample { .. }
            | Self::BadSource { .. }
            | Self::EmptyIngest(_)
            | Self::BadRepair { .. }
            | Self::BadCheckpointRepair { .. }
            | Self::BadUpload { .. } => Code::InvalidArgument,
            Self::RowOutOfRange { .. } => Code::OutOfRange,
            Self::OutsideRoots { .. } | Self::PassRefused(_) => Code::PermissionDenied,
            Self::UnknownIngest(_) | Self::SharedMemory { .. } => Code::FailedPrecondition,
            Self::DeviceFull { .. } | Self::NoSpace { .. } => Code::ResourceExhausted,
            Self::IncompatibleDataDir { .. }
            | Self::DataDirLocked { .. }
            | Self::DirectIoUnsupported { .. }
            | Self::UringUnavailable(_) => Code::FailedPrecondition,
            Self::Io { .. }
            | Self::Misaligned { .. }
            | Self::OutOfRange { .. }
            | Self::Spdk(_)
            | Self::Catalog { .. }
            | Self::Parquet { .. }
            | Self::Arrow(_) => Code::Internal,
            Self::DataFusion(e) => sluice_base::fault::code_of(e, false).0,
        }
    }

    fn kind(&self) -> &str {
        match self {
            Self::Io { .. } => "io",
            Self::Misaligned { .. } => "misaligned",
            Self::OutOfRange { .. } => "device_out_of_range",
            Self::Spdk(_) => "spdk",
            Self::DirectIoUnsupported { .. } => "direct_io_unsupported",
            Self::UringUnavailable(_) => "uring_unavailable",
            Self::DeviceFull { .. } | Self::NoSpace { .. } => "device_full",
            Self::ChecksumMismatch { .. } => "checksum_mismatch",
            Self::IncompatibleDataDir { .. } => "incompatible_data_dir",
            Self::DataDirLocked { .. } => "data_dir_locked",
            Self::Catalog { .. } => "catalog",
            Self::CatalogDamaged { .. } => "catalog_damaged",
            Self::RowOutOfRange { .. } => "row_out_of_range",
            Self::UnknownDataset(_) | Self::UnknownVersion { .. } => "dataset_not_found",
            Self::InvalidDatasetName(_) => "invalid_dataset_name",
            Self::BadSample { .. } => "bad_sample",
            Self::BadSource { .. } => "bad_source",
            Self::BadRepair { .. } | Self::BadCheckpointRepair { .. } => "bad_repair",
            Self::OutsideRoots { .. } => "forbidden_path",
            Self::UnknownIngest(_) => "ingest_not_prepared",
            Self::EmptyIngest(_) => "empty_ingest",
            Self::Parquet { .. } => "metadata",
            Self::Arrow(_) => "arrow",
            Self::InvalidCheckpointName { .. } => "invalid_checkpoint_name",
            Self::UnknownCheckpoint { .. } => "checkpoint_not_found",
            Self::UnknownUpload(_) => "upload_not_found",
            Self::PassRefused(_) => "forbidden",
            Self::BadUpload { .. } => "bad_upload",
            Self::SharedMemory { .. } => "shm_unavailable",
            Self::UnknownRegion(_) => "region_not_found",
            Self::CheckpointCorrupt { .. } => "checkpoint_corrupt",
            Self::DataFusion(e) => sluice_base::fault::code_of(e, false).1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_flight::LinkError;

    /// Each variant's code and kind, and both unchanged after a trip
    /// through `tonic::Status` to the node's client (what a compute node,
    /// the job and the trainer then carry).
    #[test]
    fn each_variant_answers_its_code_and_keeps_it_over_the_wire() {
        let io = || std::io::Error::other("boom");
        let p = || PathBuf::from("/d");
        let s = String::new;
        let cases: Vec<(StorageError, Code, &str)> = vec![
            (StorageError::io("read", "/d", io()), Code::Internal, "io"),
            (
                StorageError::Misaligned {
                    device: s(),
                    what: "offset",
                    value: 3,
                    block_size: 4096,
                },
                Code::Internal,
                "misaligned",
            ),
            (
                StorageError::OutOfRange {
                    device: s(),
                    offset: 1,
                    len: 2,
                    capacity: 0,
                },
                Code::Internal,
                "device_out_of_range",
            ),
            (StorageError::Spdk(s()), Code::Internal, "spdk"),
            (
                StorageError::DirectIoUnsupported {
                    path: p(),
                    source: io(),
                },
                Code::FailedPrecondition,
                "direct_io_unsupported",
            ),
            (
                StorageError::UringUnavailable(io()),
                Code::FailedPrecondition,
                "uring_unavailable",
            ),
            (
                StorageError::DeviceFull {
                    dataset: s(),
                    needed: 2,
                    free: 1,
                },
                Code::ResourceExhausted,
                "device_full",
            ),
            (
                StorageError::ChecksumMismatch {
                    dataset: "pets".into(),
                    version: 1,
                    key: "a".into(),
                    expected: 1,
                    actual: 2,
                },
                Code::DataLoss,
                "checksum_mismatch",
            ),
            (
                StorageError::IncompatibleDataDir {
                    path: p(),
                    reason: s(),
                },
                Code::FailedPrecondition,
                "incompatible_data_dir",
            ),
            (
                StorageError::DataDirLocked { path: p() },
                Code::FailedPrecondition,
                "data_dir_locked",
            ),
            (
                StorageError::Catalog {
                    path: p(),
                    message: s(),
                },
                Code::Internal,
                "catalog",
            ),
            (
                StorageError::CatalogDamaged {
                    path: p(),
                    reason: s(),
                },
                Code::DataLoss,
                "catalog_damaged",
            ),
            (
                StorageError::RowOutOfRange {
                    dataset: s(),
                    version: 1,
                    row: 9,
                    rows: 1,
                },
                Code::OutOfRange,
                "row_out_of_range",
            ),
            (
                StorageError::UnknownDataset("pets".into()),
                Code::NotFound,
                "dataset_not_found",
            ),
            (
                StorageError::UnknownVersion {
                    dataset: "pets".into(),
                    version: 9,
                },
                Code::NotFound,
                "dataset_not_found",
            ),
            (
                StorageError::InvalidDatasetName(s()),
                Code::InvalidArgument,
                "invalid_dataset_name",
            ),
            (
                StorageError::BadSample {
                    dataset: s(),
                    key: s(),
                    reason: s(),
                },
                Code::InvalidArgument,
                "bad_sample",
            ),
            (
                StorageError::BadSource {
                    path: p(),
                    reason: s(),
                },
                Code::InvalidArgument,
                "bad_source",
            ),
            (
                StorageError::OutsideRoots {
                    path: p(),
                    roots: "/data".into(),
                },
                Code::PermissionDenied,
                "forbidden_path",
            ),
            (
                StorageError::UnknownIngest("t".into()),
                Code::FailedPrecondition,
                "ingest_not_prepared",
            ),
            (
                StorageError::EmptyIngest(s()),
                Code::InvalidArgument,
                "empty_ingest",
            ),
            (
                StorageError::Parquet {
                    path: p(),
                    source: parquet::errors::ParquetError::General(s()),
                },
                Code::Internal,
                "metadata",
            ),
            (
                StorageError::Arrow(arrow::error::ArrowError::ComputeError(s())),
                Code::Internal,
                "arrow",
            ),
            (
                StorageError::InvalidCheckpointName {
                    name: s(),
                    reason: "empty",
                },
                Code::InvalidArgument,
                "invalid_checkpoint_name",
            ),
            (
                StorageError::UnknownCheckpoint {
                    name: s(),
                    version: None,
                },
                Code::NotFound,
                "checkpoint_not_found",
            ),
            (
                StorageError::UnknownUpload(s()),
                Code::NotFound,
                "upload_not_found",
            ),
            (
                StorageError::BadUpload {
                    name: s(),
                    reason: s(),
                },
                Code::InvalidArgument,
                "bad_upload",
            ),
            (
                StorageError::SharedMemory {
                    what: s(),
                    reason: s(),
                },
                Code::FailedPrecondition,
                "shm_unavailable",
            ),
            (
                StorageError::UnknownRegion(s()),
                Code::NotFound,
                "region_not_found",
            ),
            (
                StorageError::CheckpointCorrupt {
                    name: s(),
                    version: 1,
                    offset: 0,
                    end: 1,
                    expected: 1,
                    actual: 2,
                },
                Code::DataLoss,
                "checkpoint_corrupt",
            ),
            (
                StorageError::NoSpace {
                    what: s(),
                    needed: 2,
                    free: 1,
                },
                Code::ResourceExhausted,
                "device_full",
            ),
        ];
        for (e, code, kind) in cases {
            let text = e.to_string();
            assert_eq!((e.code(), e.kind()), (code, kind), "{text}");
            let status = sluice_base::fault::status(&e);
            assert_eq!(status.code(), code, "{text}");
            let back = LinkError::from_status("http://10.0.0.7:50051", &status);
            assert_eq!(back.code(), code, "{text}");
            if kind != "dataset_not_found" {
                assert_eq!(back.kind(), kind, "{text}");
            }
        }
        // DataFusion's own errors keep the engine's code and kind.
        let df = datafusion::error::DataFusionError::ResourcesExhausted(s());
        let want = sluice_base::fault::code_of(&df, false);
        let (code, kind) = (want.0, want.1.to_string());
        let e = StorageError::DataFusion(df);
        assert_eq!((e.code(), e.kind()), (code, kind.as_str()));
    }
}
