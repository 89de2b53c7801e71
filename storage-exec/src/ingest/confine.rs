//! [`Confinement`]: ingest reads only beneath the roots it was given.
//!
//! A server that ingests on a client's behalf (`POST /v1/datasets`) checks
//! the directory or manifest it was asked for against its `--ingest-root`s,
//! but a manifest's *rows* are paths too: absolute ones, `../..` ones, and
//! ones through a directory symlink inside a root that points out of it.
//! Every object an ingest reads is therefore opened relative to a root's
//! directory descriptor with `openat2(RESOLVE_BENEATH)`: the kernel walks
//! the path and refuses (`EXDEV`) any step — `..`, a relative link — that
//! would leave the root, and every absolute link (even one pointing inside), so no check can be raced by
//! a rename between checking and reading. The last component is opened
//! with `O_NOFOLLOW`: a file symlink is refused even when it points inside
//! the root, as the directory walk always did.
//!
//! Where the kernel has no `openat2` (before Linux 5.6) the path is
//! canonicalized and checked against the canonical roots before an
//! `O_NOFOLLOW` open: the same rule, with a window between the check and
//! the open that `openat2` does not have.
//!
//! A refused row is named by its path and the reason; nothing of the file
//! (not a byte, not whether it exists outside the roots) is reported.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::error::{Result, StorageError};

/// The roots an ingest may read beneath.
#[derive(Debug)]
pub struct Confinement {
    roots: Vec<Root>,
    /// The roots as given (a path is first checked against these, without
    /// asking the filesystem).
    given: Vec<PathBuf>,
}

#[derive(Debug)]
struct Root {
    /// The root, canonical (symlinks resolved).
    path: PathBuf,
    /// An `O_PATH` descriptor of it, for `openat2`.
    fd: OwnedFd,
}

/// `struct open_how` of `linux/openat2.h` (libc's is `non_exhaustive`).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

impl Confinement {
    /// Confinement to `roots` (each must be an existing directory).
    pub fn new(roots: &[PathBuf]) -> Result<Self> {
        let mut out = Vec::with_capacity(roots.len());
        for r in roots {
            let path = r
                .canonicalize()
                .map_err(|e| StorageError::io("open ingest root", r, e))?;
            let fd = open_dir(&path).map_err(|e| StorageError::io("open ingest root", r, e))?;
            out.push(Root { path, fd });
        }
        Ok(Self {
            roots: out,
            given: roots.to_vec(),
        })
    }

    /// `path` (an ingest source: a directory or a manifest) resolved, if
    /// it lies under one of the roots. A path outside them is refused the
    /// same way whether or not it exists on the host (nothing is learnt
    /// about the host's files): [`StorageError::OutsideRoots`]; inside, a
    /// missing one is [`StorageError::BadSource`].
    ///
    /// A glob in the last part (`shards/train-*.tar`) is admitted by its
    /// directory; what it matches is opened beneath the roots when read.
    pub fn admit(&self, path: &Path) -> Result<PathBuf> {
        if let (Some(dir), Some(pattern)) = (path.parent(), path.file_name())
            && pattern.to_string_lossy().contains(['*', '?', '['])
        {
            return Ok(self.admit(dir)?.join(pattern));
        }
        let outside = || StorageError::OutsideRoots {
            path: path.to_owned(),
            roots: self
                .given
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        };
        let lexical = lexically_normal(path);
        if !self
            .given
            .iter()
            .any(|r| lexical.starts_with(lexically_normal(r)) || lexical.starts_with(r))
        {
            return Err(outside());
        }
        let real = path.canonicalize().map_err(|e| StorageError::BadSource {
            path: path.to_owned(),
            reason: format!("cannot read it: {e}"),
        })?;
        if self.roots().any(|r| real.starts_with(r)) {
            Ok(real)
        } else {
            Err(outside())
        }
    }

    /// Whether there are no roots (nothing local may be read).
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// The roots, canonical.
    pub fn roots(&self) -> impl Iterator<Item = &Path> {
        self.roots.iter().map(|r| r.path.as_path())
    }

    /// Opens `path` for reading if it lies beneath one of the roots without
    /// leaving it on the way; otherwise a reason that names only `path`.
    pub fn open(&self, path: &Path) -> std::result::Result<File, String> {
        let outside = || {
            format!(
                "{} is outside the ingest roots (rows may not leave them by absolute paths, \
                 '..' or symbolic links)",
                path.display()
            )
        };
        if !path.is_absolute() {
            return Err(outside());
        }
        for root in &self.roots {
            let Ok(rel) = path.strip_prefix(&root.path) else {
                continue;
            };
            if rel.as_os_str().is_empty() {
                return Err(format!("{} is a directory", path.display()));
            }
            return match open_beneath(&root.fd, rel) {
                Ok(f) => Ok(f),
                Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                    self.open_checked(path).ok_or_else(outside)?
                }
                Err(e) if e.raw_os_error() == Some(libc::EXDEV) => Err(outside()),
                Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                    Err("a symbolic link (links are not followed)".to_string())
                }
                Err(e) => Err(format!("cannot read {}: {e}", path.display())),
            };
        }
        Err(outside())
    }

    /// The fallback without `openat2`: `None` when `path` resolves outside
    /// the roots.
    fn open_checked(&self, path: &Path) -> Option<std::result::Result<File, String>> {
        let real = match path.parent().map(Path::canonicalize) {
            Some(Ok(parent)) => parent.join(path.file_name()?),
            Some(Err(e)) => return Some(Err(format!("cannot read {}: {e}", path.display()))),
            None => return None,
        };
        if !self.roots().any(|r| real.starts_with(r)) {
            return None;
        }
        Some(open_no_follow(&real))
    }
}

fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call; open(2)
    // reads it and returns a new descriptor or -1.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by open(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `openat2(dir, rel, O_RDONLY | O_NOFOLLOW, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`.
fn open_beneath(dir: &OwnedFd, rel: &Path) -> std::io::Result<File> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let how = OpenHow {
        flags: (libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: `c` is NUL-terminated and `how` a live `struct open_how`
    // whose size is passed with it; both outlive the call. The kernel only
    // reads them and returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a non-negative result of openat2 is a new descriptor that
    // nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

/// `path` made absolute and rid of `.` and `..` without asking the
/// filesystem.
fn lexically_normal(path: &Path) -> PathBuf {
    use std::path::Component;
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    let mut out = PathBuf::new();
    for c in absolute.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Opens a source file, refusing a symbolic link: a link inside an ingest
/// root may point anywhere on the host (`/etc/passwd`), and is never
/// followed.
pub(super) fn open_no_follow(path: &Path) -> std::result::Result<std::fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => "a symbolic link (links are not followed)".to_string(),
            _ => format!("cannot read {}: {e}", path.display()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_stay_beneath_the_root() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"secret").unwrap();
        let root = tempfile::tempdir().unwrap();
        let r = root.path().canonicalize().unwrap();
        std::fs::create_dir(r.join("in")).unwrap();
        std::fs::write(r.join("in/a.jpg"), b"a").unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("out")).unwrap();
        std::os::unix::fs::symlink("in", r.join("alias")).unwrap();
        std::os::unix::fs::symlink(r.join("in"), r.join("absolute")).unwrap();
        let c = Confinement::new(&[root.path().to_owned()]).unwrap();

        assert!(c.open(&r.join("in/a.jpg")).is_ok());
        // A relative directory link that stays inside is followed; an
        // absolute one is refused even when it points inside (the kernel
        // cannot tell where it would lead without leaving the root).
        assert!(c.open(&r.join("alias/a.jpg")).is_ok());
        assert!(c.open(&r.join("absolute/a.jpg")).is_err());
        for escape in [
            outside.path().join("secret"),
            r.join("in/../../")
                .join(outside.path().file_name().unwrap()),
            r.join("out/secret"),
            PathBuf::from("relative/a.jpg"),
        ] {
            let err = c.open(&escape).unwrap_err();
            assert!(
                err.contains("outside the ingest roots"),
                "{escape:?}: {err}"
            );
            assert!(!err.contains("secret\""), "{err}");
        }
        std::os::unix::fs::symlink(r.join("in/a.jpg"), r.join("link.jpg")).unwrap();
        let err = c.open(&r.join("link.jpg")).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
    }
}
