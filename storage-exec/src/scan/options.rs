//! [`ScanOptions`]: how a scan reads the device (the largest coalesced
//! read, the gaps it bridges, the reads in flight per partition).

/// Tuning of the read path.
#[derive(Debug, Clone)]
pub struct ScanOptions {
    /// Largest coalesced read in bytes.
    pub max_read: u64,
    /// Largest gap between extents bridged by one read.
    pub max_gap: u64,
    /// Reads in flight per partition.
    pub reads_in_flight: usize,
}

impl Default for ScanOptions {
    fn default() -> Self {
        Self {
            max_read: 4 << 20,
            max_gap: 64 << 10,
            reads_in_flight: 8,
        }
    }
}
