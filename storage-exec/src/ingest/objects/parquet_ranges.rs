//! [`FetchedRanges`]: the byte ranges of a Parquet object fetched from its
//! store, as the `parquet` crate's synchronous [`ChunkReader`], so that a
//! row group's column chunks, once fetched, decode on the blocking pool
//! (decompression and the copy of tens of MB of image bytes would
//! otherwise hold a worker of the async runtime; `super::parquet_shards`).
//! A read outside what was fetched is an error naming the bytes, never a
//! request to the store.

use bytes::{Buf, Bytes};
use parquet::errors::{ParquetError, Result};
use parquet::file::reader::{ChunkReader, Length};

/// See the module docs.
#[derive(Debug)]
pub(super) struct FetchedRanges {
    /// Each fetched range: where it starts in the object, and its bytes.
    ranges: Vec<(u64, Bytes)>,
    /// The object's size.
    size: u64,
}

impl FetchedRanges {
    /// The `ranges` (their starts in the object and their bytes) of an
    /// object of `size` bytes.
    pub(super) fn new(ranges: Vec<(u64, Bytes)>, size: u64) -> Self {
        Self { ranges, size }
    }

    /// The bytes from `start`: `length` of them, or to the end of the
    /// fetched range that holds `start`.
    fn slice(&self, start: u64, length: Option<usize>) -> Result<Bytes> {
        let holds = |(lo, bytes): &&(u64, Bytes)| {
            let end = lo + bytes.len() as u64;
            start >= *lo
                && match length {
                    Some(n) => start + n as u64 <= end,
                    None => start < end,
                }
        };
        let (lo, bytes) = self.ranges.iter().find(holds).ok_or_else(|| {
            ParquetError::General(format!(
                "bytes {start}..{} of the object were not fetched",
                length.map_or_else(String::new, |n| (start + n as u64).to_string())
            ))
        })?;
        let from = (start - lo) as usize;
        let to = length.map_or(bytes.len(), |n| from + n);
        Ok(bytes.slice(from..to))
    }
}

impl Length for FetchedRanges {
    fn len(&self) -> u64 {
        self.size
    }
}

impl ChunkReader for FetchedRanges {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> Result<Self::T> {
        Ok(self.slice(start, None)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> Result<Bytes> {
        self.slice(start, Some(length))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    #[test]
    fn reads_within_the_fetched_ranges_and_names_the_rest() {
        let f = FetchedRanges::new(
            vec![
                (10, Bytes::from_static(b"abcdef")),
                (100, Bytes::from_static(b"xyz")),
            ],
            200,
        );
        assert_eq!(f.len(), 200);
        assert_eq!(f.get_bytes(12, 3).unwrap(), Bytes::from_static(b"cde"));
        assert_eq!(f.get_bytes(100, 3).unwrap(), Bytes::from_static(b"xyz"));
        let mut rest = String::new();
        f.get_read(13).unwrap().read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "def", "a read runs to the end of its range");
        let past = f.get_bytes(14, 4).unwrap_err().to_string();
        assert!(past.contains("bytes 14..18"), "{past}");
        assert!(f.get_bytes(50, 1).is_err());
        assert!(f.get_read(16).is_err(), "the range's end is not in it");
    }
}
