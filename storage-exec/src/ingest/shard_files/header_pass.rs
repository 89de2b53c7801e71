//! [`HeaderPass`]: a tar shard read for its headers, its objects skipped
//! rather than read.
//!
//! Reading a shard through to find its headers copied every object's bytes
//! into the process only to throw them away (a fifth of an ingest's time,
//! in `read`). Here the `tar` crate skips an object with a seek
//! (`entries_with_seek`), which this reader turns into a move within its
//! small buffer when the next header is already there (small members,
//! such as a sample's `.cls` beside its `.jpg`) and into one `lseek`
//! otherwise. The kernel is asked to read the whole shard ahead into the
//! page cache (`POSIX_FADV_WILLNEED`): it reads it at the device's
//! sequential speed without copying it anywhere, and the objects' preads
//! that follow find it there. The position is kept here, so a seek costs
//! no system call to report it.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;

/// Bytes buffered: a header block and the small members after it.
const BUFFER: usize = 16 << 10;

/// See the module docs.
pub(crate) struct HeaderPass {
    inner: BufReader<File>,
    at: u64,
}

impl HeaderPass {
    /// Reads `file` from its start, asking the kernel to read it ahead.
    pub(crate) fn new(file: File) -> Self {
        // SAFETY: posix_fadvise only advises the kernel about this open
        // file's pages; it reads nothing from our memory. Advice that
        // fails changes nothing but speed, so its result is ignored.
        unsafe {
            libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED);
        }
        Self {
            inner: BufReader::with_capacity(BUFFER, file),
            at: 0,
        }
    }
}

impl Read for HeaderPass {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.at += n as u64;
        Ok(n)
    }
}

impl Seek for HeaderPass {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        let to = match pos {
            SeekFrom::Start(to) => to,
            SeekFrom::Current(by) => self.at.checked_add_signed(by).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "seek before the start")
            })?,
            SeekFrom::End(_) => {
                self.at = self.inner.seek(pos)?;
                return Ok(self.at);
            }
        };
        let by = i64::try_from(i128::from(to) - i128::from(self.at))
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "seek too far"))?;
        // Within the buffer: no system call; past it: one lseek.
        self.inner.seek_relative(by)?;
        self.at = to;
        Ok(to)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn seeks_and_reads_as_the_file_does() {
        let mut f = tempfile::tempfile().unwrap();
        let bytes: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&bytes).unwrap();
        f.rewind().unwrap();
        let mut r = HeaderPass::new(f);
        let mut b = [0u8; 10];
        r.read_exact(&mut b).unwrap();
        assert_eq!(&b, &bytes[..10]);
        // Within the buffer, past it, and back.
        for (by, at) in [(100i64, 110u64), (50_000, 50_120), (-50_120, 10)] {
            assert_eq!(r.seek(SeekFrom::Current(by)).unwrap(), at);
            r.read_exact(&mut b).unwrap();
            assert_eq!(&b, &bytes[at as usize..at as usize + 10]);
        }
        assert_eq!(r.seek(SeekFrom::Start(99_990)).unwrap(), 99_990);
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, &bytes[99_990..]);
        assert!(r.seek(SeekFrom::Current(-200_000)).is_err());
    }

    #[test]
    fn the_tar_crate_skips_objects_through_it() {
        let mut t = tar::Builder::new(Vec::new());
        for (name, len) in [("a.jpg", 70_000usize), ("a.cls", 1), ("b.jpg", 10)] {
            let mut h = tar::Header::new_gnu();
            h.set_size(len as u64);
            h.set_cksum();
            t.append_data(&mut h, name, &vec![7u8; len][..]).unwrap();
        }
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&t.into_inner().unwrap()).unwrap();
        f.rewind().unwrap();
        let mut archive = tar::Archive::new(HeaderPass::new(f));
        let names: Vec<(String, u64)> = archive
            .entries_with_seek()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.path().unwrap().display().to_string(), e.raw_file_position())
            })
            .collect();
        assert_eq!(
            names,
            [
                ("a.jpg".to_owned(), 512),
                ("a.cls".to_owned(), 512 + 70_144 + 512),
                ("b.jpg".to_owned(), 512 + 70_144 + 512 + 512 + 512),
            ]
        );
    }
}
