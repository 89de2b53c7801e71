//! Reading one object of a source: a file beneath the ingest's roots
//! (never through a symbolic link), a range of a shard, a Parquet cell or
//! bytes already fetched; probed and checksummed, or refused with the
//! reason. A file larger than [`STREAM_ABOVE`] is not read whole: it is
//! streamed into the device a piece at a time ([`stream_file`]), and a
//! file that changes meanwhile is refused.

use std::path::Path;
use std::sync::Arc;

use sluice_udfs::probe::{Probe, probe, probe_file};

use super::confine::open_no_follow;
use super::entries::{Entry, KeptObject, Origin};
use super::shard_files::Readers;
use super::writer::{Extent, ExtentWriter};
use super::{Confinement, MAX_OBJECT_BYTES, too_large};
use crate::error::{Result, StorageError};

/// An object read and probed, waiting for the writer.
pub(super) struct Loaded {
    pub(super) body: Body,
    pub(super) probed: Probe,
    /// The version stamp its store's GET answered, for an object no
    /// listing stamped (`Origin::Fetched`).
    pub(super) stamp: Option<Arc<str>>,
}

/// An object's bytes: in memory, or (a large file) still in the file,
/// streamed into the device a piece at a time, or (kept by a failed run
/// before) on the device already.
pub(super) enum Body {
    Memory {
        bytes: Vec<u8>,
        crc: u32,
    },
    File {
        file: std::fs::File,
        len: u64,
    },
    /// On the device already, at `extent` (`super::resume`).
    Kept {
        extent: Extent,
        crc: u32,
    },
}

/// Files larger than this are streamed into the device rather than read
/// whole, in pieces of [`PIECE_BYTES`].
pub(super) const STREAM_ABOVE: u64 = 16 << 20;
const PIECE_BYTES: usize = 4 << 20;

/// Opens a source file (beneath the roots of `confine`, when set) and
/// returns it with its length, refusing one over [`MAX_OBJECT_BYTES`]
/// before reading a byte of it.
fn open_source(
    path: &Path,
    confine: Option<&Confinement>,
) -> std::result::Result<(std::fs::File, u64), String> {
    let f = match confine {
        Some(c) => c.open(path)?,
        None => open_no_follow(path)?,
    };
    let meta = f
        .metadata()
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if meta.len() > MAX_OBJECT_BYTES {
        return Err(too_large(meta.len()));
    }
    Ok((f, meta.len()))
}

/// Why a file whose length was `len` when opened is refused after `got`
/// bytes (fewer: it shrank; more: it grew): an object is the file as it
/// was when opened, or nothing.
fn changed(len: u64, got: u64) -> String {
    let how = if got < len { "shrank" } else { "grew" };
    format!("the file {how} while it was read ({len} bytes when opened)")
}

/// Reads a whole (small) source file, `len` bytes as opened.
fn read_whole(f: std::fs::File, len: u64, path: &Path) -> std::result::Result<Vec<u8>, String> {
    use std::io::Read;
    let mut out = Vec::with_capacity(len as usize);
    f.take(len + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if out.len() as u64 != len {
        return Err(changed(len, out.len() as u64));
    }
    Ok(out)
}

/// Reads one entry's object (beneath `confine`'s roots, when set),
/// probes it and computes its crc32c, or says why it is refused; a file
/// over [`STREAM_ABOVE`] stays in its file, probed through its handle.
pub(super) fn load(
    entry: Entry,
    confine: Option<&Confinement>,
    shards: &Readers,
) -> (String, std::result::Result<Loaded, String>) {
    let bytes = match entry.origin {
        Origin::Inline(b) if b.len() as u64 > MAX_OBJECT_BYTES => {
            return (entry.key, Err(too_large(b.len() as u64)));
        }
        Origin::Fetched { bytes, .. } if bytes.len() as u64 > MAX_OBJECT_BYTES => {
            return (entry.key, Err(too_large(bytes.len() as u64)));
        }
        Origin::Inline(b) => b,
        Origin::Fetched { bytes, stamp } => {
            let loaded = loaded(bytes).map(|l| Loaded {
                stamp: Some(stamp),
                ..l
            });
            return (entry.key, loaded);
        }
        Origin::Refused(reason) => return (entry.key, Err(reason)),
        Origin::Kept(kept) => {
            let KeptObject {
                extent, crc, probe, ..
            } = *kept;
            let body = Body::Kept { extent, crc };
            return (
                entry.key,
                Ok(Loaded {
                    body,
                    probed: probe,
                    stamp: None,
                }),
            );
        }
        // Fetched by its group before it is loaded (`objects::fetch_group`).
        Origin::Object { location, .. } | Origin::ObjectCell { location, .. } => {
            return (entry.key, Err(format!("{location} was not fetched")));
        }
        Origin::Range { len, .. } if len > MAX_OBJECT_BYTES => {
            return (entry.key, Err(too_large(len)));
        }
        Origin::Range { path, offset, len } => {
            let open = || match confine {
                Some(c) => c.open(&path),
                None => open_no_follow(&path),
            };
            match shards.files.read(&path, offset, len, open) {
                Ok(bytes) => bytes,
                Err(reason) => return (entry.key, Err(reason)),
            }
        }
        Origin::Cell {
            path,
            row_group,
            row,
        } => match shards.row_groups.object(&path, row_group, row, confine) {
            Ok(bytes) => bytes,
            Err(reason) => return (entry.key, Err(reason)),
        },
        Origin::Path(p) => {
            let opened = open_source(&p, confine).and_then(|(f, len)| {
                if len <= STREAM_ABOVE {
                    return read_whole(f, len, &p).map(Ok);
                }
                let probed = f
                    .try_clone()
                    .map_err(|e| format!("cannot read {}: {e}", p.display()))
                    .and_then(probe_file)?;
                Ok(Err(Loaded {
                    body: Body::File { file: f, len },
                    probed,
                    stamp: None,
                }))
            });
            match opened {
                Ok(Ok(bytes)) => bytes,
                Ok(Err(streamed)) => return (entry.key, Ok(streamed)),
                Err(reason) => return (entry.key, Err(reason)),
            }
        }
    };
    (entry.key, loaded(bytes))
}

/// `bytes` probed and checksummed.
fn loaded(bytes: Vec<u8>) -> std::result::Result<Loaded, String> {
    probe(&bytes).map(|probed| Loaded {
        body: Body::Memory {
            crc: crc32c::crc32c(&bytes),
            bytes,
        },
        probed,
        stamp: None,
    })
}

/// Streams `len` bytes of `file` into the writer as one object and returns
/// its extent and crc32c. Memory holds one piece, read and checksummed on
/// the blocking pool. A file that fails to read, shrinks or grows
/// meanwhile is this object's error (the inner one): its extent is filled
/// with zeros and left to nobody, so the writer stays whole; a device
/// error is the ingest's (the outer one).
pub(super) async fn stream_file(
    writer: &mut ExtentWriter,
    file: std::fs::File,
    len: u64,
) -> Result<(Extent, std::result::Result<u32, String>)> {
    let extent = writer.begin(len).await?;
    let mut piece = Piece {
        file,
        buf: Vec::with_capacity(PIECE_BYTES),
        crc: Ok(0),
        len,
    };
    let mut left = len;
    while left > 0 {
        let want = left.min(PIECE_BYTES as u64) as usize;
        piece = tokio::task::spawn_blocking(move || piece.next(want))
            .await
            .map_err(|e| StorageError::io("read", ".", std::io::Error::other(e)))?;
        writer.put(&piece.buf).await?;
        left -= want as u64;
    }
    let piece = tokio::task::spawn_blocking(move || piece.end())
        .await
        .map_err(|e| StorageError::io("read", ".", std::io::Error::other(e)))?;
    Ok((extent, piece.crc))
}

/// A file being streamed: its next piece, and its crc32c so far or why
/// it was refused.
struct Piece {
    file: std::fs::File,
    buf: Vec<u8>,
    crc: std::result::Result<u32, String>,
    /// The file's length when it was opened.
    len: u64,
}

impl Piece {
    /// Reads the next `want` bytes into the buffer (zeros once the file
    /// has failed) and folds them into the crc.
    fn next(mut self, want: usize) -> Self {
        use std::io::Read;
        self.buf.clear();
        self.buf.resize(want, 0);
        if let Ok(crc) = self.crc {
            self.crc = match self.file.read_exact(&mut self.buf) {
                Ok(()) => Ok(crc32c::crc32c_append(crc, &self.buf)),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    Err(changed(self.len, 0))
                }
                Err(e) => Err(format!("cannot read: {e}")),
            };
            if self.crc.is_err() {
                self.buf.fill(0);
            }
        }
        self
    }

    /// Checks that the file ends where it ended when opened.
    fn end(mut self) -> Self {
        use std::io::Read;
        if self.crc.is_ok() && self.file.read(&mut [0u8; 1]).is_ok_and(|n| n > 0) {
            self.crc = Err(changed(self.len, self.len + 1));
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::alloc::ChunkAllocator;
    use crate::device::{DeviceOptions, create_device_file, file::FileDevice};
    use crate::space::Space;

    /// A file that shrinks or grows between its open and its last piece is
    /// that object's error, and the writer goes on whole.
    #[tokio::test]
    async fn a_file_that_changes_while_streamed_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let dev_path = dir.path().join("d.img");
        create_device_file(&dev_path, 64 << 20).unwrap();
        let dev: Arc<dyn crate::device::Device> =
            Arc::new(FileDevice::open(&dev_path, &DeviceOptions::default()).unwrap());
        let space = Space::new(ChunkAllocator::new(64)).reserve();
        let mut w = ExtentWriter::new(dev, space, 1 << 20, "t");
        let len = (PIECE_BYTES * 2 + 100) as u64;
        let path = dir.path().join("f");
        for (cut, want) in [(PIECE_BYTES as u64 + 7, "shrank"), (len + 3, "grew")] {
            std::fs::write(&path, vec![1u8; len as usize]).unwrap();
            let f = std::fs::File::open(&path).unwrap();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(cut)
                .unwrap();
            let (extent, crc) = stream_file(&mut w, f, len).await.unwrap();
            assert_eq!(extent.length, len);
            let err = crc.unwrap_err();
            assert!(err.contains(want), "{err}");
            assert!(err.contains(&format!("{len} bytes when opened")), "{err}");
        }
        std::fs::write(&path, vec![2u8; len as usize]).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let (_, crc) = stream_file(&mut w, f, len).await.unwrap();
        assert_eq!(crc.unwrap(), crc32c::crc32c(&vec![2u8; len as usize]));
        w.finish().await.unwrap();
    }
}
