//! What SPDK's C hands back, made Rust's: its C strings copied, its
//! negative errnos as text, and the backend's one error kind.

use std::ffi::{CStr, c_int};

use crate::error::StorageError;

/// A C string SPDK owns, copied.
///
/// # Safety
/// `ptr` is null or a NUL-terminated string.
pub(super) unsafe fn cstr(ptr: *const std::ffi::c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

/// `strerror` text for an errno.
pub(super) fn errno_text(errno: c_int) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

/// An error of the SPDK backend.
pub(super) fn spdk_error(msg: String) -> StorageError {
    StorageError::Spdk(msg)
}
