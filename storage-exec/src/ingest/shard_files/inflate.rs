//! `.tar.gz` shards: inflated once, then read as a tar.
//!
//! An object is read as a range of a file, and a gzip stream has no ranges.
//! So a compressed shard is inflated, in one sequential pass, into an
//! unlinked temporary file (`O_TMPFILE`: nothing to clean up, gone when the
//! ingest lets go of it, even after a kill -9) in the scratch directory
//! (the data dir, which is on the disk sluice's device is; the temporary
//! directory for a listing). The tar's headers are then read from that
//! file and its objects read out of it by range, as from any `.tar`, under
//! the name of the `.tar.gz` (`OpenShards` keeps the file pinned under it).
//!
//! Images barely compress, so the file is about the shard's own size. A
//! shard that inflates past half the scratch filesystem's free space (a
//! gzip bomb, or a disk too full) is refused by name, its file dropped.
//! Concatenated gzip members (as `pigz` and `bgzip` write) are read whole.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

/// Inflates `gz` (a file, or a shard streamed from a store) into an
/// unlinked file in `scratch`; the file, rewound.
pub(crate) fn inflate(gz: impl Read, scratch: &Path) -> Result<File, String> {
    let limit = free_bytes(scratch).map_or(u64::MAX, |free| free / 2);
    inflate_at_most(gz, scratch, limit)
}

fn inflate_at_most(gz: impl Read, scratch: &Path, limit: u64) -> Result<File, String> {
    let mut out = tempfile::tempfile_in(scratch).map_err(|e| {
        format!(
            "cannot make a temporary file in {} to inflate into: {e}",
            scratch.display()
        )
    })?;
    let mut reader =
        flate2::read::MultiGzDecoder::new(std::io::BufReader::with_capacity(1 << 20, gz));
    let mut buf = vec![0u8; 1 << 20];
    let mut written = 0u64;
    loop {
        let n = reader.read(&mut buf).map_err(|e| {
            format!("not a gzip stream, or a damaged one, after {written} bytes inflated: {e}")
        })?;
        if n == 0 {
            break;
        }
        written += n as u64;
        if written > limit {
            return Err(format!(
                "inflates past {limit} bytes (half the free space under {}): not ingested",
                scratch.display()
            ));
        }
        out.write_all(&buf[..n])
            .map_err(|e| format!("cannot write the inflated shard: {e}"))?;
    }
    use std::io::Seek;
    out.rewind()
        .map_err(|e| format!("cannot read the inflated shard: {e}"))?;
    Ok(out)
}

/// Bytes free to an unprivileged writer under `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs writes the struct it is given and reads the
    // NUL-terminated path; both live for the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    (unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0)
        .then(|| st.f_bavail.saturating_mul(st.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gz(parts: &[&[u8]]) -> File {
        let mut f = tempfile::tempfile().unwrap();
        for p in parts {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(p).unwrap();
            f.write_all(&e.finish().unwrap()).unwrap();
        }
        f.rewind().unwrap();
        f
    }

    use std::io::Seek;

    #[test]
    fn inflates_every_member_into_a_file_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let mut out = inflate(gz(&[b"hello ", b"world"]), dir.path()).unwrap();
        let mut s = String::new();
        out.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello world");
        // Unlinked: nothing is left in the scratch directory.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn refuses_what_is_not_gzip_and_what_inflates_past_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let mut plain = tempfile::tempfile().unwrap();
        plain.write_all(b"not gzip at all").unwrap();
        plain.rewind().unwrap();
        let err = inflate(plain, dir.path()).unwrap_err();
        assert!(err.contains("not a gzip stream"), "{err}");
        let zeros = vec![0u8; 4 << 20];
        let err = inflate_at_most(gz(&[&zeros]), dir.path(), 1 << 20).unwrap_err();
        assert!(err.contains("inflates past 1048576 bytes"), "{err}");
    }
}
